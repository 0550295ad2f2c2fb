#!/usr/bin/env python3
"""Summarise check.sh's per-kernel GPU times (ncu-kernels.csv[.gz], `NCU=1`) by forward pass.

A pass starts at each embedding lookup (get_rows_kernel): the bench's 16-token prompt, its decode
tokens, then the prefill chunks. For every pass: the total, the kernels grouped by kind (matmul
products split into routed experts, i.e. grid z > 1, and dense products by weight type), and the
largest kernels by name and grid.

    scripts/device/ncu_summary.py OUT/ncu-kernels.csv.gz [--top N]
"""
import argparse
import collections
import csv
import gzip
import re
import sys


# ggml type numbers as they appear in the kernels' template arguments.
GGML_TYPES = {0: "F32", 1: "F16", 8: "Q8_0", 10: "Q2_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
              16: "IQ2_XXS", 17: "IQ2_XS", 29: "IQ1_M", 30: "BF16"}


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        sys.exit(f"{path}: {e.strerror or e}")
    if not rows:
        sys.exit(f"{path}: empty")
    head = rows[0]
    col = {name: i for i, name in enumerate(head)}
    need = ("Kernel Name", "Grid Size", "gpu__time_duration.sum")
    missing = [n for n in need if n not in col]
    if missing:
        sys.exit(f"{path}: no column {', '.join(missing)} (not an `ncu --csv --metrics gpu__time_duration.sum` export?)")
    out = []
    for r in rows[1:]:
        value = r[col["gpu__time_duration.sum"]].replace(",", "")
        if not value.replace(".", "").isdigit():
            continue  # the units row
        out.append((r[col["Kernel Name"]], r[col["Grid Size"]], float(value)))
    return out


def short_name(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(.*$", "", name)
    return re.sub(r"^(unnamed>::|rl::cuda::)+", "", name)


def kind(name, grid):
    base = short_name(name)
    if base.startswith("matmul_kernel"):
        z = int(grid.strip("()").split(",")[2])
        number = re.search(r"matmul_kernel<(\d+)", base)
        weight_type = GGML_TYPES.get(int(number.group(1)), number.group(1)) if number else "?"
        return "routed experts" if z > 1 else f"dense products, {weight_type}"
    return re.sub(r"<.*$", "", base)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu-kernels.csv or ncu-kernels.csv.gz")
    ap.add_argument("--top", type=int, default=12, help="largest kernels listed per pass (default 12)")
    args = ap.parse_args()
    passes = []
    for name, grid, ns in read_rows(args.csv):
        if "get_rows_kernel" in name or not passes:
            passes.append([])
        passes[-1].append((name, grid, ns))
    for i, p in enumerate(passes):
        total = sum(ns for _, _, ns in p) / 1e6
        tokens = p[0][1].strip("()").split(",")[1].strip() if "get_rows_kernel" in p[0][0] else "?"
        print(f"pass {i}: {tokens} tokens, {len(p)} kernels, {total:.2f} ms")
        by_kind = collections.defaultdict(float)
        by_name = collections.defaultdict(lambda: [0, 0.0])
        for name, grid, ns in p:
            by_kind[kind(name, grid)] += ns / 1e6
            key = f"{short_name(name)} {grid}"
            by_name[key][0] += 1
            by_name[key][1] += ns / 1e6
        for k, ms in sorted(by_kind.items(), key=lambda x: -x[1]):
            if ms >= 0.05:
                print(f"  {ms:9.2f} ms  {k}")
        print("  largest:")
        for key, (n, ms) in sorted(by_name.items(), key=lambda x: -x[1][1])[: args.top]:
            print(f"  {ms:9.2f} ms  {n:5d}x  {key}")


if __name__ == "__main__":
    main()
