#!/usr/bin/env bash
# Tuning on the GPU host: bench_cuda_kernels of the tree and of variants of it, each a copy of the
# tree with one sed script applied to one file, built side by side (through ccache, so only what
# the edit touches recompiles) and run one after another with the same --filter. An experiment
# that leaves no switch in the code: the winner is then written into the source, citing the table.
#
#   VARIANTS='NAME|FILE|SED ...' scripts/device/kernel_variants.sh [FILTER]
#     each variant: a name, a file of the tree and a sed script, separated by '|'; variants are
#     separated by newlines (a sed script may hold spaces)
#     FILTER       bench_cuda_kernels --filter (default: decode/.*fast)
#   KV_REPS        --reps (default 200)
# Results: $OUT/variants.txt (each case's time per build side by side; "tree" is the tree as
# carried) and $OUT/variants-logs.tgz (each build's log and bench_cuda_kernels table, the diffs).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
source "$ROOT/scripts/device/deps.sh"
FILTER=${1:-decode/.*fast}
names=(tree)
declare -A SRC=([tree]=$ROOT)
while IFS='|' read -r name file script; do
  [ -n "$name" ] || continue
  src=/tmp/rl-kv-src-$name
  rm -rf "$src" && mkdir -p "$src"
  (cd "$ROOT" && tar --exclude=./.deps --exclude=./.git --exclude='./build*' --exclude=./out -cf - .) | tar -xf - -C "$src"
  sed -i "$script" "$src/$file"
  if cmp -s "$ROOT/$file" "$src/$file"; then echo "variant $name: the sed script changed nothing in $file" >&2; exit 2; fi
  diff "$ROOT/$file" "$src/$file" > "$OUT/variant-$name.diff"
  names+=("$name"); SRC[$name]=$src
done <<< "${VARIANTS:-}"
pids=()
for n in "${names[@]}"; do
  (rl_configure "${SRC[$n]}" /tmp/rl-kv-build-$n &&
    ninja -C /tmp/rl-kv-build-$n -j16 bench_cuda_kernels > "$OUT/build-$n.log" 2>&1) &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait $p || status=1; done
[ $status = 0 ] || { echo "a build failed:"; tail -n 20 "$OUT"/build-*.log; exit 1; }
for n in "${names[@]}"; do
  /tmp/rl-kv-build-$n/bench_cuda_kernels --filter "$FILTER" --reps "${KV_REPS:-200}" > "$OUT/kernels-$n.txt" 2>&1 || status=1
done
# Side by side: the case name, then each build's time in microseconds.
python3 - "$OUT" "${names[@]}" > "$OUT/variants.txt" <<'EOF'
import re, sys
out, names = sys.argv[1], sys.argv[2:]
times = {}
order = []
for n in names:
    for line in open(f"{out}/kernels-{n}.txt"):
        m = re.match(r"^(decode/\S.*?|prefill/\S.*?)\s{2,}([0-9.]+)\s", line)
        if not m: continue
        case = m.group(1).strip()
        if case not in times: times[case] = {}; order.append(case)
        times[case][n] = float(m.group(2))
print(f"{'case':66s}" + "".join(f"{n:>12s}" for n in names))
for case in order:
    print(f"{case:66s}" + "".join(f"{times[case].get(n, float('nan')):12.2f}" for n in names))
print(f"{'sum':66s}" + "".join(f"{sum(t.get(n, 0) for t in times.values()):12.2f}" for n in names))
EOF
cat "$OUT/variants.txt"
# At most 8 files come back from the GPU host: the per-build files go as one archive.
(cd "$OUT" && tar -czf variants-logs.tgz --remove-files build-*.log kernels-*.txt variant-*.diff 2>/dev/null)
exit $status
