#!/usr/bin/env python3
"""Where a kernel's warps wait, from an Nsight Compute CSV (--csv --page raw --print-units base, the
WarpStateStats, SchedulerStats, Occupancy, SpeedOfLight, InstructionStats and
MemoryWorkloadAnalysis_Tables sections): per launch its time, grid, registers, occupancy, issue
activity and instructions, the L1 and DRAM throughput, shared-memory bank conflicts and global
sectors per request, then the stall reasons in cycles per issued instruction, largest first.

usage: scripts/device/ncu_stall.py NCU.csv [--top N]
"""
import argparse, csv, re, signal, sys

# (label, metric name): printed where the CSV has the metric.
FIELDS = [
    ("ns", "gpu__time_duration.sum"),
    ("grid", "launch__grid_size"),
    ("block", "launch__block_size"),
    ("regs", "launch__registers_per_thread"),
    ("occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active"),
    ("issue active %", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
    ("warp instructions", "smsp__inst_executed.sum"),
    ("cycles a warp instruction", "smsp__average_warp_latency_per_inst_issued.ratio"),
    ("SM %", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("L1 %", "l1tex__throughput.avg.pct_of_peak_sustained_active"),
    ("DRAM %", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("shared ld wavefronts", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"),
    ("shared ld bank conflicts", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"),
    ("global ld requests", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"),
    ("global ld sectors", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"),
]
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")


def number(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    ap = argparse.ArgumentParser(usage=__doc__.split("usage: ", 1)[1].splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    rows = [r for r in csv.reader(open(args.csv, errors="replace")) if len(r) > 10]
    if not rows:
        sys.exit("no CSV rows in " + args.csv)
    head = rows[0]
    col = {h: i for i, h in enumerate(head)}
    name = col.get("Kernel Name")
    if name is None:
        sys.exit("no 'Kernel Name' column in " + args.csv)
    stalls = [(m.group(1), i) for h, i in col.items() if (m := STALL.match(h))]
    for r in rows[1:]:
        if not r[0].isdigit():
            continue
        kernel = re.sub(r"\(anonymous namespace\)::|<unnamed>::|void |rl::cuda::", "", r[name])
        print(f"launch {r[0]}: {kernel[:160]}")
        for label, metric in FIELDS:
            if metric in col:
                print(f"  {label:28s} {r[col[metric]]}")
        waits = sorted(((number(r[i]) or 0.0, s) for s, i in stalls), reverse=True)
        total = sum(v for v, _ in waits)
        print(f"  stalls, cycles an issued instruction (sum {total:.2f}): " +
              ", ".join(f"{s} {v:.2f}" for v, s in waits[: args.top]))


if __name__ == "__main__":
    main()
