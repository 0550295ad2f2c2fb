#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (--csv --page raw --print-units base, metric gpu__time_duration.sum) per kernel and grid: launches, total and mean GPU time, largest first.

usage: scripts/device/ncu_sum.py NCU.csv [--passes [--pass N]]
  --passes  the launches cut into passes where each embedding (get_rows) begins one: each pass's
            launches and GPU time (a batched decode step's pass marked: several rows embedded, and the
            decode attention's split kernel, not the prefill's),
            then the table of the first batched pass that has a pass after it (or of all launches)
  --pass N  with --passes: the table of pass N (0 the first) instead
"""
import argparse, collections, csv, re, signal, sys


def short(kernel_name):
    return re.split(r"[<(]", kernel_name.replace("void ", "").replace("(anonymous namespace)::", "")
                    .replace("<unnamed>::", "").replace("unnamed>::", ""))[0]


def table(launches, name, grid, time):
    groups = collections.defaultdict(list)
    for r in launches:
        groups[(short(r[name]), r[grid].replace(",", ""))].append(float(r[time].replace(",", "")) / 1000)
    total = sum(sum(v) for v in groups.values())
    print(f"{len(launches)} launches, {total / 1000:.2f} ms of GPU time")
    print(f"{'us total':>10} {'launches':>8} {'us mean':>8} {'grid':>12}  kernel")
    for (kernel, g), v in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(v):10.1f} {len(v):8d} {sum(v) / len(v):8.1f} {g:>12}  {kernel}")


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under head
    ap = argparse.ArgumentParser(usage=__doc__.split("\n\n", 1)[1].splitlines()[0][len("usage: "):])
    ap.add_argument("csv")
    ap.add_argument("--passes", action="store_true")
    ap.add_argument("--pass", dest="pass_index", type=int)
    args = ap.parse_args()
    if args.pass_index is not None and not args.passes:
        ap.error("--pass takes --passes")
    rows = [r for r in csv.reader(open(args.csv, errors="replace")) if len(r) > 10]
    if not rows:
        sys.exit("no CSV rows in " + args.csv)
    head = rows[0]
    name, grid, time = (head.index(c) for c in ("Kernel Name", "Grid Size", "gpu__time_duration.sum"))
    launches = [r for r in rows[1:] if r[0].isdigit()]
    if not args.passes:
        table(launches, name, grid, time)
        return
    passes, cur = [], []
    for r in launches:
        if short(r[name]) == "get_rows_kernel" and cur:
            passes.append(cur)
            cur = []
        cur.append(r)
    passes.append(cur)
    def batched(p):
        rows = re.findall(r"\d+", p[0][grid])
        return (short(p[0][name]) == "get_rows_kernel" and len(rows) > 1 and int(rows[1]) > 1 and
                any(short(r[name]) == "fast_attention::attention_decode_split_fast_kernel" or
                    short(r[name]) == "attention_decode_split_fast_kernel" for r in p))
    for i, p in enumerate(passes):
        us = sum(float(r[time].replace(",", "")) for r in p) / 1000
        print(f"pass {i}: {len(p)} launches, {us / 1000:.2f} ms{' (batched)' if batched(p) else ''}"
              f"{' (cut short)' if i in (0, len(passes) - 1) else ''}")
    if args.pass_index is not None:
        if not 0 <= args.pass_index < len(passes):
            sys.exit(f"--pass takes a pass number below {len(passes)}")
        table(passes[args.pass_index], name, grid, time)
        return
    whole = [p for p in passes[1:-1] if batched(p)]
    table(whole[0] if whole else launches, name, grid, time)


if __name__ == "__main__":
    main()
