#!/usr/bin/env bash
# An A/B of two builds on the GPU host, in one call: the tree and a base tree carried as a source
# tarball (made here with `git archive --format=tar.gz -o .deps/base/base-src.tgz COMMIT`). Both
# are built (in /tmp, so a warm machine reuses them), the 80B seed-mix model is made once in
# /dev/shm, and the benches alternate between the two binaries so that drift falls on both alike.
#
#   scripts/device/ab.sh STEP...     steps, in order:
#     build        build both (redlite; the tree's test_cuda too); SKIP_BASE=1: the tree only
#     build-bin    the tree's redlite alone (no tests, no base): with `patches main`, an A/B for a call
#                  short of device time, e.g. PATCHES=P AB_NUMERICS=fast ab.sh build-bin patches main
#     test         the tree's test_cuda (REDLITE_FIXTURES=$FIX); TEST_FILTER: a --gtest_filter
#     unpack-a     fixture A and its references from .deps/fixApack (the gguf as .xz, the two
#                  reference JSONs as refs-json.tar.xz, the last-logits files, loose or as logits.tar.xz) into
#                  /tmp/rl-fix-a, with fixture B's files from .deps/fixB where an earlier call left them
#                  (the CudaBackend tests that compare the two skip without both):
#                  with the tree they fit a call's 64 MiB only without .deps/debs, so run it on a
#                  warm machine right after a call that built, e.g.
#                  FIX_DIR=/tmp/rl-fix-a ab.sh unpack-a test parity parity-fast   (carry .deps/fixApack)
#     parity       the tree's `parity --backend cuda` on each carried fixture model vs the oracle,
#                  prompts up to $PARITY_TOKENS (default 40) tokens, budgets 1, 0.5, 0.1
#     parity-fast  the tree's fast tier against each carried fixture's F32 reference (<model>.ref-f32.json
#                  and .ref.json beside it): the bar of llama.cpp's native path
#     parity-80b-fast  the fast tier against the oracle on the 80B model (report)
#     tiers        AB_ROUNDS rounds of `bench --reps 1` on the tree, --numerics exact then fast
#     fast-decode  AB_ROUNDS rounds of `bench --reps 1` on the tree, --numerics fast with
#                  --fast-decode f32 then q8 (the decode products' two forms), alternating
#     profile      `bench --profile` on the tree per tier in $PROFILE_TIERS (default: exact fast)
#     parity-80b   the tree's parity on the 80B model at budgets 1, 0.5, 0.1, with and without
#                  --x32-always (the parity prompts are too short for the default to use X32)
#     bench-8g     the tree's bench with --cache-mib 8192 (one rep)
#     prefetch     AB_ROUNDS rounds of the tree's bench-8g (--miss-reads copy) with each --prefetch MODE[:N] of
#                  $PREFETCH_MODES (default "off on"; e.g. "off on on:10 late:10": N is
#                  --prefetch-experts), the order alternating by round; a line a run: decode tok/s,
#                  hit rate, prediction accuracy, prefetched / used / wasted
#     miss-reads   AB_ROUNDS rounds of the tree's bench at each --cache-mib of $MISS_MIBS (default
#                  8192) with each MODE of $MISS_MODES (default "copy host:16 host:0"; host:N[:P[:E]] is
#                  --miss-reads host --miss-admit N [--prefetch P [--prefetch-experts E]], an empty
#                  field leaving its flag to the commands' default, e.g. host or host::off), the
#                  order alternating by round; MISS_MODEL=skew
#                  uses the 80B with --router-skew 1.0 (made once in /dev/shm); a line a run: decode
#                  tok/s, hit rate, misses read in place and bypassed, copy GB/s; after step
#                  patches, each patch's binary runs the host modes beside the tree's
#     parity-synth the tree's parity on a tiny model of recipe $SYNTH_RECIPE (default all-types)
#     recipes      per recipe in $RECIPES (default: the realistic ones, which together hold all 23
#                  types): its 80B made in /dev/shm (removed after), `bench --reps 1` exact then
#                  fast; a summary line per recipe and tier
#     parity-recipes  per recipe in $RECIPES: `parity --backend cuda` on its tiny model, exact
#                  (budgets 1, 0.5, 0.1; PASS/FAIL) and fast (report: teacher-forced figures)
#     cpu-experts  bench_fast_decode (the CPU fast tier's one-token products by kind) on a 4-layer 80B-wide
#                  model at each of CPU_THREADS (default "16 8"): the host's rates for missed experts
#     handoff      bench_host_handoff: a layer's cost of handing work to the CPU in the decode graph (host
#                  node, or spinning on mapped flags) with HANDOFF_WORK_US (default "0 20") of CPU work
#     cpu-fast     the 80B on the CPU backend's fast tier, 16 threads (32 decode tokens, 64-token prefill);
#                  CPU_THREADS (default 16) may list several counts, e.g. "16 8 4"; $OUT/cpu-fast-N.log
#     main         AB_ROUNDS (default 2) rounds of `bench --reps 1` on each binary (the base's where built), alternating
#                  (--numerics $AB_NUMERICS, default exact: the base may know only that tier; $AB_FLAGS
#                  added, e.g. "--prefill-chunk 512");
#                  AB_VARIANT=1 adds the variant's binary (step variant) to each round; the
#                  binaries of step patches ($PATCHES) join each round too
#     depths       `bench --depths $DEPTHS` on the tree's binary (default 0,4096,16384,32768,65536)
#     base-depths  the same on the base binary with $BASE_DEPTHS (default: $DEPTHS); the base must
#                  know --depths
#     variant      a copy of the tree with $VARIANT_SED (a sed script) applied to $VARIANT_FILE, built
#                  as the variant's redlite (an experiment that leaves no switch in the code)
#     variant-depths  `bench --depths $DEPTHS` on the variant's binary
#     patches      each patch of $PATCHES (unified diffs of the tree, -p1, paths relative to the
#                  tree, e.g. carried in .deps) applied to the tree in turn and built incrementally
#                  in the tree's build as /tmp/rl-bin-NAME (NAME: the file name less .patch), then
#                  reverted; the tree's redlite is rebuilt last. Several experiments, one call
#     patch-test   each patch of $PATCHES applied in turn, the tree's test_cuda rebuilt and run
#                  (TEST_FILTER), then reverted; the tree's test_cuda is rebuilt last
#     patch-both   steps patches and patch-test at once: each patch's build of redlite and test_cuda
#                  (one compile of what it changes), its binary kept and its test_cuda run
#     ncu-detail   Nsight Compute's detailed sections for the first $NCU_COUNT (default 2) kernels
#                  matching $NCU_RE after the prefill of depth $NCU_DETAIL_DEPTH (default 32768)
#     ncu-stall    where the warps of the kernels matching $NCU_RE (default gate_up_q8_kernel) wait: Nsight
#                  Compute's warp-state, scheduler, occupancy, instruction and memory-table sections of
#                  launches $NCU_SKIP.. ($NCU_COUNT, default 2) of `bench $NCU_BENCH_FLAGS` (default a 16-token
#                  prompt, 2 decode tokens), summed up by ncu_stall.py ($OUT/ncu-stall-$NCU_TAG.txt); $NCU_RE
#                  matches the demangled name, e.g. 'gate_up_q8_kernel<.rl::GgmlType.17, .int.1, .int.1, .bool.1>'
#                  (IQ2_XS, one column, the derived pairs)
#     ncu          GPU time of each kernel matching $NCU_RE (default: attention) over 2 decode tokens
#                  after each of $NCU_DEPTHS (default 0,32768), tree's binary ($OUT/ncu-*.csv)
#     mask         issue 25's mask overhead: the 80B seed-mix with the real vocabulary of the carried
#                  fixture model (synth --vocab-from), `redlite run --backend cuda --chat -n 256` with no
#                  constraint and with each schema of bench/schemas (seeds 1 and 2, --temp 0.7)
#     batch        `bench --batch N` on the tree for each N of $BATCHES (default "4 8 16"), 128 steps, $AB_ROUNDS
#                  reps, $BATCH_ROUNDS (default 1) rounds, $BATCH_FLAGS added (e.g. --batch-prefill): the batched
#                  step without the server (compare with step parallel)
#     patch-batch  the same on the tree and each binary of step patches ($PATCHES), in turn each round
#     ncu-pass     GPU time and grid of the first $NCU_COUNT (default 1400) kernels of `bench --prefill-tokens
#                  $NCU_PASS_TOKENS (default 4) --decode-tokens 2`, summed per kernel and grid ($OUT/ncu-pass.txt);
#                  NCU_PASS_INDEX=N: the passes' launches and times, then the sums of pass N alone (0 the
#                  first; e.g. NCU_PASS_TOKENS=512 NCU_COUNT=3400 NCU_PASS_INDEX=0, one whole 512-token pass)
#     ncu-batch    the same over the first batched steps of `bench --batch $NCU_BATCH` (default 16), the
#                  prefills skipped ($NCU_SKIP launches), cut into passes ($OUT/ncu-batch.txt)
#     parallel     issue 21's concurrent streams: bench/server_parallel.py through `redlite serve --parallel N`
#                  on the 80B seed-mix with the carried fixture's vocabulary, --streams $STREAMS
#                  (default 1,4,8), -n $PARALLEL_N (default 64), serve flags $PARALLEL_FLAGS (e.g.
#                  "--prefill-chunk 1": one after another); the model is kept for a later mask step
#     base-parallel  the same on the base binary
#     patch-parallel the same on each binary of step patches ($PATCHES), after it
#     ttft         issue 19's time to first token: bench/server_ttft.py through `redlite serve` on the 80B
#                  seed-mix with the carried fixture's vocabulary, prompts of $TTFT_TOKENS (default
#                  4096,32768) token ids, -n 32; the model is kept for a later mask step
#     kernels      bench_cuda_kernels of the tree (built here if needed) with $KERNELS_FLAGS (e.g.
#                  "--filter decode/ --reps 200"); its table in $OUT/kernels.txt
# Results: $OUT/summary.txt and the steps' logs in $OUT/logs-N.tgz (N: the script's run in the call). STEP_TIMEOUT (s) bounds each bench (default 240).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
source "$ROOT/scripts/device/deps.sh"
BUILD=/tmp/rl-build-tree BASE_SRC=/tmp/rl-base-src BASE_BUILD=/tmp/rl-build-base
case "${FIX_DIR:-.deps/fix}" in /*) FIX=$FIX_DIR ;; *) FIX=$ROOT/${FIX_DIR:-.deps/fix} ;; esac
M80=/dev/shm/redlite/80b-seed-mix.gguf
DEPTHS=${DEPTHS:-0,4096,16384,32768,65536}
# The recipes modelled on published files (docs/synth.md); together they hold all 23 types.
RECIPES=${RECIPES:-seed-mix q4km-shexp-f16 iq3xxs q3km iq4xs iq4nl legacy mxfp4 iq1s}
status=0
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
step() {  # step NAME CMD...: runs under STEP_TIMEOUT, logs to $OUT/NAME.log
  local name=$1; shift
  log "$name: $*"
  local t0=$SECONDS
  timeout "${STEP_TIMEOUT:-240}" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc ($((SECONDS - t0)) s)"
  tail -n 12 "$OUT/$name.log" | cut -c1-300
  [ $rc -eq 0 ] || status=1
  return $rc
}
configure() { rl_configure "$@"; }  # configure SRC BUILD (deps.sh)
round_order() { [ $(($2 % 2)) = 0 ] && echo $1 | tr ' ' '\n' | tac | tr '\n' ' ' || echo $1; }  # round_order "A B C" R: reversed in even rounds
json_num() { grep "\"$2\"" "$1" | head -1 | tr -dc '0-9.'; }  # json_num LOG KEY: a bench --json number
speeds() { echo "prefill $(json_num "$1" prefill_tok_s) decode $(json_num "$1" decode_tok_s) (host argmax $(json_num "$1" decode_argmax_ms) ms a token)"; }  # speeds LOG
model() {
  mkdir -p "$(dirname $M80)"
  [ -e $M80 ] || STEP_TIMEOUT=400 step synth-80b "$BUILD/redlite" synth --preset 80b --recipe seed-mix --seed 1 --out $M80
}
# The 80B seed-mix with the real vocabulary of the carried fixture model, in $MV (text prompts).
MV=/dev/shm/redlite/80b-seed-mix-vocab.gguf
vocab_model() {
  mkdir -p "$(dirname $MV)"
  [ -e $MV ] || STEP_TIMEOUT=400 step synth-80b-vocab "$BUILD/redlite" synth --preset 80b --recipe seed-mix --seed 1 \
    --vocab-from "$(ls "$FIX"/*.gguf | head -1)" --out $MV
}
# each_patch TARGET FN: each patch of $PATCHES applied to the tree in turn (-p1), TARGET rebuilt in the
# tree's build and `FN NAME` run (NAME: the file name less .patch), then the patch reverted;
# TARGET is rebuilt for the tree last.
each_patch() {
  local targets=$1 fn=$2 p n t=${1// /+}
  for p in ${PATCHES:-}; do
    n=$(basename "$p" .patch)
    (cd "$ROOT" && patch -p1 --forward < "$ROOT/$p") > "$OUT/patch-$t-$n.log" 2>&1 || { log "patch $n: does not apply"; status=1; continue; }
    STEP_TIMEOUT=400 step "build-$t-$n" ninja -C $BUILD -j16 $targets && $fn "$n"
    (cd "$ROOT" && patch -R -p1 < "$ROOT/$p") >> "$OUT/patch-$t-$n.log" 2>&1 || { log "patch $n: does not revert"; exit 1; }
  done
  STEP_TIMEOUT=400 step "build-$t-tree-again" ninja -C $BUILD -j16 $targets || exit 1
}
keep_patch_bin() { cp $BUILD/redlite "/tmp/rl-bin-$1"; }
keep_and_test_patch() { keep_patch_bin "$1"; test_patch "$1"; }
ncu_bin() { command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1; }  # Nsight Compute
test_patch() { REDLITE_FIXTURES=$FIX STEP_TIMEOUT=400 step "test_cuda-$1" "$BUILD/test_cuda" ${TEST_FILTER:+--gtest_filter=$TEST_FILTER}; }
for s in "$@"; do
  case "$s" in
    build-bin)
      configure "$ROOT" $BUILD || { log "configure failed"; exit 1; }
      STEP_TIMEOUT=500 step build-bin ninja -C $BUILD -j16 redlite || exit 1
      ;;
    build)
      if [ "${SKIP_BASE:-0}" = 1 ]; then
        configure "$ROOT" $BUILD || { log "configure failed"; exit 1; }
        STEP_TIMEOUT=500 step build ninja -C $BUILD -j16 redlite test_cuda test_cache || exit 1
      else
        if [ ! -d $BASE_SRC ]; then mkdir -p $BASE_SRC && tar -xzf "$ROOT/.deps/base/base-src.tgz" -C $BASE_SRC; fi
        configure "$ROOT" $BUILD && configure $BASE_SRC $BASE_BUILD || { log "configure failed"; exit 1; }
        STEP_TIMEOUT=500 step build bash -c "ninja -C $BUILD -j16 redlite test_cuda test_cache & p=\$!; ninja -C $BASE_BUILD -j16 redlite; r=\$?; wait \$p && exit \$r" || exit 1
      fi
      ;;
    test) REDLITE_FIXTURES=$FIX STEP_TIMEOUT=400 step test_cuda "$BUILD/test_cuda" ${TEST_FILTER:+--gtest_filter=$TEST_FILTER} ;;
    unpack-a)
      P=$ROOT/.deps/fixApack A=/tmp/rl-fix-a
      mkdir -p $A && xz -dc $P/tiny-qwen3next-iq2xxs.gguf.xz > $A/tiny-qwen3next-iq2xxs.gguf &&
        tar -xJf $P/refs-json.tar.xz -C $A &&
        { [ -f $P/logits.tar.xz ] && tar -xJf $P/logits.tar.xz -C $A || cp $P/*.last_logits.f32 $A/; } &&
        { [ ! -d $ROOT/.deps/fixB ] || cp $ROOT/.deps/fixB/* $A/; } && log "unpack-a: $(ls $A | wc -l) files in $A" ||
        { log "unpack-a failed"; status=1; }
      ;;
    parity)
      for m in "$FIX"/*.gguf; do
        STEP_TIMEOUT=400 step "parity-$(basename "$m" .gguf)" "$BUILD/redlite" parity -m "$m" --backend cuda --repeat 2 \
          --prompt-tokens "${PARITY_TOKENS:-40}" --budget-fractions 1,0.5,0.1 --numerics exact
      done
      ;;
    parity-fast)
      for m in "$FIX"/*.gguf; do
        ref=${m%.gguf}.ref-f32.json
        [ -e "$ref" ] || { log "parity-fast: no $ref"; continue; }
        STEP_TIMEOUT=400 step "parity-fast-$(basename "$m" .gguf)" "$BUILD/redlite" parity -m "$m" --backend cuda \
          --numerics fast --ref "$ref"
      done
      ;;
    parity-80b-fast)
      model
      STEP_TIMEOUT=300 step parity-80b-fast "$BUILD/redlite" parity -m $M80 --backend cuda --numerics fast --repeat 1 \
        --prompt-tokens 64 --budget-fractions 1
      ;;
    tiers)
      model
      for r in $(seq "${AB_ROUNDS:-2}"); do
        for n in exact fast; do
          step "tier-$n-$r" "$BUILD/redlite" bench -m $M80 --backend cuda --numerics $n --reps 1 --json
          log "tier $n $r: $(speeds "$OUT/tier-$n-$r.log")"
        done
      done
      ;;
    fast-decode)
      model
      for r in $(seq "${AB_ROUNDS:-2}"); do
        for f in f32 q8; do
          step "fast-decode-$f-$r" "$BUILD/redlite" bench -m $M80 --backend cuda --numerics fast --fast-decode $f --reps 1 --json
          log "fast-decode $f $r: $(speeds "$OUT/fast-decode-$f-$r.log")"
        done
      done
      ;;
    profile)
      model
      for n in ${PROFILE_TIERS:-exact fast}; do
        step "profile-$n" "$BUILD/redlite" bench -m $M80 --backend cuda --numerics $n --reps 1 --profile
      done
      ;;
    parity-80b)
      model
      STEP_TIMEOUT=300 step parity-80b "$BUILD/redlite" parity -m $M80 --backend cuda --repeat 2 --prompt-tokens 24 \
        --budget-fractions 1,0.5,0.1 --numerics exact
      STEP_TIMEOUT=300 step parity-80b-x32 "$BUILD/redlite" parity -m $M80 --backend cuda --repeat 2 --prompt-tokens 24 \
        --budget-fractions 1,0.5,0.1 --x32-always --numerics exact
      ;;
    parity-synth)
      "$BUILD/redlite" synth --preset tiny --recipe "${SYNTH_RECIPE:-all-types}" --out /tmp/rl-synth.gguf > /dev/null &&
        step parity-synth "$BUILD/redlite" parity -m /tmp/rl-synth.gguf --backend cuda --repeat 2 --prompt-tokens 40 \
          --budget-fractions 1,0.5,0.1 --numerics exact
      ;;
    recipes)
      for r in $RECIPES; do
        f=/dev/shm/redlite/80b-$r.gguf
        if [ "$r" = seed-mix ]; then model; f=$M80; else
          mkdir -p "$(dirname $f)"
          step "synth-80b-$r" "$BUILD/redlite" synth --preset 80b --recipe "$r" --seed 1 --out $f || { rm -f $f $f.tmp; continue; }
        fi
        for n in exact fast; do
          step "recipe-$r-$n" "$BUILD/redlite" bench -m $f --backend cuda --numerics $n --reps 1 --json
          log "recipe $r $n: $(speeds "$OUT/recipe-$r-$n.log")"
        done
        [ $f = $M80 ] || rm -f $f
      done
      ;;
    parity-recipes)
      for r in $RECIPES; do
        t=/tmp/rl-synth-$r.gguf
        "$BUILD/redlite" synth --preset tiny --recipe "$r" --out $t > /dev/null || { log "parity-recipes: synth $r failed"; status=1; continue; }
        step "parity-$r-exact" "$BUILD/redlite" parity -m $t --backend cuda --repeat 2 --prompt-tokens 40 \
          --budget-fractions 1,0.5,0.1 --numerics exact
        log "parity $r exact: $(tail -n 1 "$OUT/parity-$r-exact.log")"
        step "parity-$r-fast" "$BUILD/redlite" parity -m $t --backend cuda --repeat 1 --prompt-tokens 40 \
          --budget-fractions 1 --numerics fast
        # Teacher-forced figures over both prompts (report; CudaFastTier's bar is top-1 >= 0.85, rel rms <= 0.075).
        log "parity $r fast: $(awk '/teacher-forced/ { split($7, a, "/"); t += a[1]; n += a[2]; r += $NF; k++ }
          END { if (n) printf "top-1 %d/%d = %.3f, mean rel rms %.3e (mean of %d prompts)", t, n, t / n, r / k, k; else print "no figures" }' \
          "$OUT/parity-$r-fast.log")"
        rm -f $t
      done
      ;;
    cpu-fast)
      model
      for t in ${CPU_THREADS:-16}; do
        STEP_TIMEOUT=300 step cpu-fast-$t "$BUILD/redlite" bench -m $M80 --backend cpu --numerics fast --threads $t \
          --reps 1 --decode-tokens 32 --prefill-tokens 64 --json
        log "cpu-fast $t threads: $(speeds "$OUT/cpu-fast-$t.log")"
      done
      ;;
    cpu-experts)
      # The CPU fast tier's one-token products by kind on a 4-layer model of the 80B's widths (its
      # IQ2_XS and IQ1_M experts, Q4_K projections), at each of CPU_THREADS (default "16 8"): how fast
      # the host's cores could compute missed experts (issue 22 item 4).
      configure "$ROOT" $BUILD && STEP_TIMEOUT=400 step build-bench-fast-decode ninja -C $BUILD -j16 bench_fast_decode
      m4=/dev/shm/redlite/80b-4l.gguf
      [ -e $m4 ] || step synth-80b-4l "$BUILD/redlite" synth --preset 80b --recipe seed-mix --seed 1 --n-layer 4 --out $m4
      for t in ${CPU_THREADS:-16 8}; do
        step cpu-experts-$t "$BUILD/bench_fast_decode" $m4 $t
        grep -E "experts|thread pool" "$OUT/cpu-experts-$t.log" | sed "s/^/cpu-experts $t threads: /" | tee -a "$OUT/summary.txt"
      done
      ;;
    handoff)
      # What a layer pays to hand work to the CPU inside the decode graph and take the result back
      # (bench/host_handoff): a host node, or a CPU thread and the GPU spinning on mapped flags, with
      # each of HANDOFF_WORK_US (default "0 20") microseconds of CPU work a layer.
      configure "$ROOT" $BUILD && STEP_TIMEOUT=400 step build-handoff ninja -C $BUILD -j16 bench_host_handoff
      for w in ${HANDOFF_WORK_US:-0 20}; do
        step handoff-$w "$BUILD/bench_host_handoff" --layers 48 --work-us $w --reps 200
        grep -E "token|failed" "$OUT/handoff-$w.log" | sed "s/^/handoff work $w us: /" | tee -a "$OUT/summary.txt"
      done
      ;;
    bench-8g) model; step bench-80b-8g "$BUILD/redlite" bench -m $M80 --backend cuda --cache-mib 8192 --reps 1 --json ;;
    prefetch)
      model
      modes=${PREFETCH_MODES:-off on}
      for r in $(seq "${AB_ROUNDS:-2}"); do
        order=$(round_order "$modes" $r)
        for p in $order; do
          flags="--prefetch ${p%%:*}"; case $p in *:*) flags="$flags --prefetch-experts ${p#*:}" ;; esac
          f="$OUT/prefetch-${p/:/-}-$r.log"
          step "prefetch-${p/:/-}-$r" "$BUILD/redlite" bench -m $M80 --backend cuda --cache-mib 8192 --miss-reads copy $flags --reps 1 --json
          log "prefetch $p $r: decode $(json_num "$f" decode_tok_s) hit rate $(json_num "$f" hit_rate) accuracy $(json_num "$f" prediction_accuracy) prefetched $(json_num "$f" prefetched) used $(json_num "$f" prefetch_hits) wasted $(json_num "$f" prefetch_wasted)"
        done
      done
      ;;
    miss-reads)
      model
      mm=$M80
      if [ "${MISS_MODEL:-}" = skew ]; then
        mm=/dev/shm/redlite/80b-skew.gguf
        [ -e $mm ] || STEP_TIMEOUT=400 step synth-80b-skew "$BUILD/redlite" synth --preset 80b --recipe seed-mix --seed 1 \
          --router-skew 1.0 --out $mm
      fi
      modes=${MISS_MODES:-copy host:16 host:0}
      bins="tree=$BUILD/redlite"  # with step patches before: each patch's binary too, its host modes
      for p in ${PATCHES:-}; do n=$(basename "$p" .patch); [ -x /tmp/rl-bin-$n ] && bins="$bins $n=/tmp/rl-bin-$n"; done
      for mib in ${MISS_MIBS:-8192}; do
        for r in $(seq "${AB_ROUNDS:-2}"); do
          order=$(round_order "$modes" $r)
          for m in $order; do
            for b in $bins; do
              [ "${b%%=*}" != tree ] && [ "${m%%:*}" = copy ] && continue  # the copy path: the tree's only
              IFS=: read -r mode admit pre experts <<< "$m"
              flags="--miss-reads $mode${admit:+ --miss-admit $admit}${pre:+ --prefetch $pre}${experts:+ --prefetch-experts $experts}"
              n="miss-${MISS_MODEL:-uniform}-$mib-${m//:/-}-${b%%=*}-$r"
              step "$n" "${b#*=}" bench -m $mm --backend cuda --cache-mib $mib $flags --reps 1 --json
              f="$OUT/$n.log"
              log "miss-reads ${MISS_MODEL:-uniform} $mib MiB $m ${b%%=*} $r: decode $(json_num "$f" decode_tok_s) hit rate $(json_num "$f" hit_rate) in place $(json_num "$f" misses_read_in_place) bypassed $(json_num "$f" misses_bypassed) copy GB/s $(json_num "$f" copy_gb_s) fallbacks $(json_num "$f" gpu_routed_fallbacks)"
            done
          done
        done
      done
      ;;
    main)
      model
      for r in $(seq "${AB_ROUNDS:-2}"); do
        order="tree base"; [ $((r % 2)) = 0 ] && order="base tree"
        [ -x $BASE_BUILD/redlite ] || order=tree  # SKIP_BASE=1: the tree and the patches only
        [ "${AB_VARIANT:-0}" = 1 ] && order="$order variant"
        for p in ${PATCHES:-}; do [ -x "/tmp/rl-bin-$(basename "$p" .patch)" ] && order="$order $(basename "$p" .patch)"; done
        for b in $order; do
          case $b in
            tree) bin=$BUILD/redlite ;; base) bin=$BASE_BUILD/redlite ;; variant) bin=/tmp/rl-build-variant/redlite ;;
            *) bin=/tmp/rl-bin-$b ;;
          esac
          step "ab-$b-$r" "$bin" bench -m $M80 --backend cuda --reps 1 --json --numerics ${AB_NUMERICS:-exact} ${AB_FLAGS:-}
          log "ab $b $r: $(speeds "$OUT/ab-$b-$r.log")"
        done
      done
      ;;
    depths) model; step depths-tree "$BUILD/redlite" bench -m $M80 --backend cuda --reps 1 --depths "$DEPTHS" ;;
    base-depths) model; step depths-base "$BASE_BUILD/redlite" bench -m $M80 --backend cuda --reps 1 --depths "${BASE_DEPTHS:-$DEPTHS}" ;;
    variant)
      rm -rf /tmp/rl-variant-src && mkdir -p /tmp/rl-variant-src
      (cd "$ROOT" && tar --exclude=./.deps --exclude=./.git --exclude='./build*' --exclude=./out -cf - .) | tar -xf - -C /tmp/rl-variant-src
      sed -i "$VARIANT_SED" "/tmp/rl-variant-src/$VARIANT_FILE" && diff <(cd "$ROOT" && cat "$VARIANT_FILE") "/tmp/rl-variant-src/$VARIANT_FILE" > "$OUT/variant.diff"
      configure /tmp/rl-variant-src /tmp/rl-build-variant && STEP_TIMEOUT=400 step build-variant ninja -C /tmp/rl-build-variant -j16 redlite
      ;;
    patches)
      for p in ${PATCHES:-}; do rm -f "/tmp/rl-bin-$(basename "$p" .patch)"; done
      each_patch redlite keep_patch_bin
      ;;
    patch-test) each_patch test_cuda test_patch ;;
    patch-both)
      for p in ${PATCHES:-}; do rm -f "/tmp/rl-bin-$(basename "$p" .patch)"; done
      each_patch "redlite test_cuda" keep_and_test_patch
      ;;
    variant-depths) model; step depths-variant /tmp/rl-build-variant/redlite bench -m $M80 --backend cuda --reps 1 --depths "$DEPTHS" ;;
    ncu-detail)
      model
      NCU_BIN=$(ncu_bin)
      STEP_TIMEOUT=400 step ncu-detail "$NCU_BIN" --clock-control none --set detailed --import-source no -k "regex:${NCU_RE:-attention_decode}" \
        --launch-skip ${NCU_SKIP:-0} --launch-count ${NCU_COUNT:-2} --csv --page details "$BUILD/redlite" bench -m $M80 \
        --backend cuda --reps 1 --depth-decode-tokens 2 --depths "${NCU_DETAIL_DEPTH:-32768}"
      ;;
    ncu-stall)
      model
      NCU_BIN=$(ncu_bin)
      STEP_TIMEOUT=400 step ncu-stall "$NCU_BIN" --clock-control none --section WarpStateStats --section SchedulerStats \
        --section Occupancy --section SpeedOfLight --section InstructionStats --section MemoryWorkloadAnalysis_Tables \
        --csv --page raw --print-units base --kernel-name-base demangled -k "regex:${NCU_RE:-gate_up_q8_kernel}" --launch-skip ${NCU_SKIP:-0} \
        --launch-count ${NCU_COUNT:-2} "$BUILD/redlite" bench -m $M80 --backend cuda --reps 1 \
        ${NCU_BENCH_FLAGS:---prefill-tokens 16 --decode-tokens 2}
      python3 "$ROOT/scripts/device/ncu_stall.py" "$OUT/ncu-stall.log" > "$OUT/ncu-stall-${NCU_TAG:-0}.txt"
      cat "$OUT/ncu-stall-${NCU_TAG:-0}.txt"
      ;;
    ncu)
      model
      NCU_BIN=$(ncu_bin)
      STEP_TIMEOUT=400 step ncu "$NCU_BIN" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
        -k "regex:${NCU_RE:-attention}" "$BUILD/redlite" bench -m $M80 --backend cuda --reps 1 --depth-decode-tokens 2 \
        --depths "${NCU_DEPTHS:-0,32768}"
      grep -E '"[0-9]+"' "$OUT/ncu.log" | awk -F'","' '{print $5, $(NF)}' | sed 's/"//g' > "$OUT/ncu-times.txt"
      ;;
    batch|patch-batch)
      model
      bins=tree; [ "$s" = patch-batch ] && bins="tree $(for p in ${PATCHES:-}; do basename "$p" .patch; done)"
      for r in $(seq "${BATCH_ROUNDS:-1}"); do
        for b in $bins; do
          bin=/tmp/rl-bin-$b; [ $b = tree ] && bin=$BUILD/redlite
          for n in ${BATCHES:-4 8 16}; do
            L=$OUT/batch-$b-$n-$r.log
            step "batch-$b-$n-$r" "$bin" bench -m $M80 --backend cuda --reps ${AB_ROUNDS:-2} --batch $n --decode-tokens 129 --json ${BATCH_FLAGS:-} &&
              log "batch $b $n: $(json_num $L decode_tok_s) tok/s in all, $(json_num $L step_ms) ms a step (first $(json_num $L first_step_ms); later calls $(json_num $L later_step_call_ms): graph $(json_num $L batched_graph_ms), copies $(json_num $L batched_copy_ms); argmax $(json_num $L argmax_ms)); prompts $(json_num $L prefill_ms) ms"
          done
        done
      done
      ;;
    ncu-pass)
      model
      NCU_BIN=$(ncu_bin)
      STEP_TIMEOUT=400 step ncu-pass "$NCU_BIN" --clock-control none --metrics gpu__time_duration.sum \
        --csv --page raw --print-units base --launch-count ${NCU_COUNT:-1400} "$BUILD/redlite" bench -m $M80 --backend cuda --reps 1 \
        --prompt-tokens ${NCU_PASS_TOKENS:-4} --prefill-tokens ${NCU_PASS_TOKENS:-4} --decode-tokens 2
      python3 "$ROOT/scripts/device/ncu_sum.py" "$OUT/ncu-pass.log" ${NCU_PASS_INDEX:+--passes --pass $NCU_PASS_INDEX} |
        tee "$OUT/ncu-pass.txt" | head -40
      ;;
    ncu-batch)
      # The prefills of the NCU_BATCH sequences run unprofiled: NCU_SKIP launches (a 16-token
      # prefill of the 80B is 1,397), a little short of them so the first step is whole.
      model
      NCU_BIN=$(ncu_bin)
      nb=${NCU_BATCH:-16}
      STEP_TIMEOUT=400 step ncu-batch "$NCU_BIN" --clock-control none --metrics gpu__time_duration.sum \
        --csv --page raw --print-units base --launch-skip ${NCU_SKIP:-$((nb * 1397 - 100))} --launch-count ${NCU_COUNT:-3200} \
        "$BUILD/redlite" bench -m $M80 --backend cuda --reps 1 --batch $nb --decode-tokens 4
      python3 "$ROOT/scripts/device/ncu_sum.py" "$OUT/ncu-batch.log" --passes | tee "$OUT/ncu-batch.txt" | head -40
      ;;
    parallel|base-parallel|patch-parallel)
      vocab_model
      bins=("$BUILD/redlite"); names=(parallel)
      [ "$s" = base-parallel ] && bins=("$BASE_BUILD/redlite") names=(base-parallel)
      if [ "$s" = patch-parallel ]; then
        bins=() names=()
        for p in ${PATCHES:-}; do n=$(basename "$p" .patch); bins+=("/tmp/rl-bin-$n"); names+=("parallel-$n"); done
      fi
      for i in "${!bins[@]}"; do
        STEP_TIMEOUT=${PARALLEL_TIMEOUT_S:-300} step "${names[$i]}" python3 "$ROOT/bench/server_parallel.py" --bin "${bins[$i]}" \
          -m $MV --backend cuda --streams "${STREAMS:-1,4,8}" -n "${PARALLEL_N:-64}" ${PARALLEL_FLAGS:+-- $PARALLEL_FLAGS}
        grep -E '^[{]"streams"' "$OUT/${names[$i]}.log" | sed "s/^/${names[$i]}: /" | cut -c1-420 | tee -a "$OUT/summary.txt"
      done
      ;;
    ttft)
      vocab_model
      STEP_TIMEOUT=${TTFT_TIMEOUT_S:-300} step ttft python3 "$ROOT/bench/server_ttft.py" --bin "$BUILD/redlite" -m $MV \
        --backend cuda --prompt-tokens "${TTFT_TOKENS:-4096,32768}" -n 32
      grep '"ttft_s"' "$OUT/ttft.log" | tee -a "$OUT/summary.txt"
      ;;
    mask)
      vocab_model
      for seed in 1 2; do
        for sc in none "$ROOT"/bench/schemas/*.json; do
          name=$(basename "$sc" .json)
          flags=(); [ "$sc" = none ] || flags=(--json-schema "$sc")
          step "mask-$name-$seed" "$BUILD/redlite" run -m $MV --backend cuda --chat -n 256 --temp 0.7 --seed $seed \
            -p "Describe a city park as JSON." "${flags[@]}"
          log "mask $name seed $seed: $(grep -E 'tok/s|constraint' "$OUT/mask-$name-$seed.log" | tr '\n' ' ')"
        done
      done
      rm -f $MV
      ;;
    kernels)
      configure "$ROOT" $BUILD && STEP_TIMEOUT=400 step build-kernels ninja -C $BUILD -j16 bench_cuda_kernels &&
        STEP_TIMEOUT=400 step kernels "$BUILD/bench_cuda_kernels" ${KERNELS_FLAGS:-}
      cp "$OUT/kernels.log" "$OUT/kernels.txt" 2>/dev/null && cat "$OUT/kernels.txt"
      ;;
    *) log "unknown step $s"; status=1 ;;
  esac
done
# At most 8 files come back: the logs go as one archive beside the summary, one archive a run of
# this script (a call that runs it several times keeps every run's logs).
(cd "$OUT" && n=1 && while [ -e logs-$n.tgz ]; do n=$((n + 1)); done && tar -czf logs-$n.tgz --remove-files *.log 2>/dev/null)
exit $status
