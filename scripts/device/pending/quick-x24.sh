#!/usr/bin/env bash
# The prefill-only A/B of x24-super-stage.patch for a session short of device time (no tests):
# the tree's redlite, then the patched one by an incremental rebuild, the 80B seed-mix, and
# bench --prefill-chunk 512 (fast tier) alternating, rounds until the call's time runs out.
set -u
ROOT=$(pwd); source scripts/device/deps.sh
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
t0=$SECONDS; lg() { echo "== $((SECONDS - t0)) s $*" | tee -a $OUT/summary.txt; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $OUT/summary.txt
rl_configure . /tmp/b || { lg configure failed; exit 1; }
ninja -C /tmp/b -j16 redlite > $OUT/build-tree.log 2>&1 || { lg build failed; tail -20 $OUT/build-tree.log; exit 1; }
cp /tmp/b/redlite /tmp/rl-tree; lg tree built
(/tmp/rl-tree synth --preset 80b --recipe seed-mix --seed 1 --out /dev/shm/80b.gguf > $OUT/synth.log 2>&1; echo synth done >> $OUT/synth.log) &
patch -p1 < scripts/device/pending/x24-super-stage.patch > /dev/null || { lg patch failed; exit 1; }
ninja -C /tmp/b -j16 redlite > $OUT/build-x24.log 2>&1 || { lg x24 build failed; tail -20 $OUT/build-x24.log; patch -R -p1 < scripts/device/pending/x24-super-stage.patch; exit 1; }
cp /tmp/b/redlite /tmp/rl-x24; patch -R -p1 < scripts/device/pending/x24-super-stage.patch > /dev/null; lg x24 built
wait; lg model made
for r in 1 2 3 4; do
  for b in tree x24; do
    [ $((r % 2)) = 0 ] && b=$([ $b = tree ] && echo x24 || echo tree)
    timeout 120 /tmp/rl-$b bench -m /dev/shm/80b.gguf --backend cuda --reps 1 --json --numerics fast --prefill-chunk 512 --decode-tokens 32 > $OUT/bench-$b-$r.log 2>&1
    lg "round $r $b: prefill $(grep '"prefill_tok_s"' $OUT/bench-$b-$r.log | tr -dc '0-9.') decode $(grep '"decode_tok_s"' $OUT/bench-$b-$r.log | tr -dc '0-9.')"
  done
done
