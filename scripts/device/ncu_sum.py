#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (--csv --page raw --print-units base, metric gpu__time_duration.sum) per kernel and grid: launches, total and mean GPU time, largest first.

usage: scripts/device/ncu_sum.py NCU.csv
"""
import collections, csv, re, signal, sys


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under head
    rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 10]
    if not rows:
        sys.exit("no CSV rows in " + sys.argv[1])
    head = rows[0]
    name, grid, time = (head.index(c) for c in ("Kernel Name", "Grid Size", "gpu__time_duration.sum"))
    launches = [r for r in rows[1:] if r[0].isdigit()]
    groups = collections.defaultdict(list)
    for r in launches:
        kernel = re.split(r"[<(]", r[name].replace("void ", "").replace("(anonymous namespace)::", "").replace("<unnamed>::", "").replace("unnamed>::", ""))[0]
        key = (kernel, r[grid].replace(",", ""))
        groups[key].append(float(r[time].replace(",", "")) / 1000)
    total = sum(sum(v) for v in groups.values())
    print(f"{len(launches)} launches, {total / 1000:.2f} ms of GPU time")
    print(f"{'us total':>10} {'launches':>8} {'us mean':>8} {'grid':>12}  kernel")
    for (name, grid), v in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(v):10.1f} {len(v):8d} {sum(v) / len(v):8.1f} {grid:>12}  {name}")


if __name__ == "__main__":
    main()
