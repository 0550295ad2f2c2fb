#!/usr/bin/env bash
# One command on the GPU host: build with CUDA, run the GPU tests, check the CUDA backend against
# the CPU oracle on the fixture models and on an 80B-shaped model made with `redlite synth`, and
# run the bench protocol. Results go to $OUT (logs and JSON).
#
#   scripts/device/check.sh [quick|full|fixtures|bench]
#     quick     build, test_cache, test_cuda, parity on the carried fixture models
#     fixtures  parity on the carried fixture models only (build reused when present)
#     full      quick + 80B seed-mix model: parity at three budgets, bench all resident,
#               bench --cache-mib 8192 uniform and with --router-skew
#     bench     build + the 80B benches only (no tests, no parity)
#
#   ONLY_MAIN_BENCH=1 runs only the all-resident bench (no profile, sync or 8 GiB runs).
#   BENCH_REPS=N sets the all-resident bench's --reps (default 3).
#   NCU=1 adds per-kernel GPU times with Nsight Compute over a short bench ($OUT/ncu-kernels.csv.gz,
#   summarised per forward pass in $OUT/ncu-summary.txt by ncu_summary.py; NCU_PREFILL sets its
#   prefill tokens, NCU_COUNT the most kernels profiled).
#   NCU_DETAIL=1 (or =decode, =prefill for one of them) adds Nsight Compute's detailed sections
#   for the decode products and the prefill
#   kernels (NCU_DECODE_RE / NCU_PREFILL_RE pick kernels by name, NCU_*_COUNT how many,
#   NCU_PREFILL_SKIP how many matching launches to pass over first: the bench's 16-token prompt
#   and decode come before its prefill).
#   SASS=1 writes the products' and the recurrence's machine code (cuobjdump) to $OUT.
#   BENCH_FLAGS_B="--flag ..." repeats the all-resident bench with those redlite flags (A/B), e.g.
#   BENCH_FLAGS_B="--speculation off".
#   EXTRA_FLAGS="--flag ..." adds redlite flags to every parity and bench run (default none).
#   VARIANT="DIR ..." (carried, git-ignored folders; stages full and bench only): after the 80B
#   benches and profiles, for each DIR in turn the files under it replace or join their
#   counterparts in the tree (same relative paths), redlite and test_cuda are rebuilt, test_cuda
#   runs, and the all-resident bench is repeated as bench-80b-variant-NAME; then the files are put
#   back. At the end the tree's own binaries are rebuilt. Folder names must differ and not be
#   "base". A call killed in the middle leaves the tree overlaid on that machine.
#   VARIANT_PARITY=1: each variant's build also runs the parity checks (the carried fixtures and the
#   80B model) as parity-MODEL-NAME.
#   AB_ROUNDS=N: instead of each variant's bench, N rounds of one-rep benches alternating the
#   tree's binary and each variant's, in reverse order every other round (ab-NAME-ROUND.log;
#   summary.txt lists each binary's prefill and decode figures round by round).
#   AB_FLAGS="NAME=--flag[,--flag=value...] ...": with AB_ROUNDS, NAME joins the alternation: the
#   tree's binary run with those flags (commas separate them; no rebuild), e.g.
#   AB_FLAGS="sync=--speculation=off".
#   SKIP_SKEW=1 leaves out the second 80B model (--router-skew 1.0) and its bench.
#   The profiled bench splits the GPU-routed token by stage (launched kernel by kernel, so its
#   tok/s is not a speed figure; --profile); bench-80b-sync is the synchronous path
#   (--speculation off).
#
# What the GPU host lacks travels in git-ignored folders named in the call's `carry`:
#   .deps/debs   Debian packages of PCRE2, cpp-httplib, brotli/ssl/zlib headers (DEVICE.md)
#   .deps/fix    fixture models (*.gguf) to check; each call carries what fits in 64 MiB
#                (FIX_DIR=.deps/fixA selects another carried folder)
set -uo pipefail
STAGE=${1:-quick}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
BUILD=$ROOT/build-device
BIN=$BUILD/redlite
SHM=/dev/shm/redlite
FIX=$ROOT/${FIX_DIR:-.deps/fix}
mkdir -p $SHM
status=0
log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }
step() {  # step NAME CMD...: runs, logs to $OUT/NAME.log, records the exit code
  local name=$1; shift
  log "$name: $*"
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc ($((SECONDS - t0)) s)"
  tail -n 25 "$OUT/$name.log"
  [ $rc -eq 0 ] || status=1
  return $rc
}
# The parity checks against the CPU oracle, logged as parity-MODEL or parity-MODEL-SUFFIX: on the
# carried fixture models, and on the 80B model ($M80, set below). Each runs a second time with
# --x32-always (logged with -x32): the parity prompts are too short for the default to put the
# dense Q4_K products on X32, so that run checks them (DENSE_PARITY=0 leaves it out).
parity_both() {  # parity_both NAME ARGS...
  local name=$1; shift
  step "$name" "$BIN" parity "$@" ${EXTRA_FLAGS:-}
  [ "${DENSE_PARITY:-1}" = 1 ] && step "$name-x32" "$BIN" parity "$@" --x32-always ${EXTRA_FLAGS:-}
  return 0
}
parity_fixtures() {  # parity_fixtures [SUFFIX]
  local m
  for m in "$FIX"/*.gguf; do
    [ -e "$m" ] || continue
    parity_both "parity-$(basename "$m" .gguf)${1:+-$1}" -m "$m" --backend cuda --repeat 2 --prompt-tokens 40 \
      --budget-fractions 1,0.5,0.1
  done
}
parity_80b() {  # parity_80b [SUFFIX]
  parity_both "parity-80b${1:+-$1}" -m "$M80" --backend cuda --repeat 2 --prompt-tokens 24 --budget-fractions 1,0.5,0.1
}

# --- dependencies: unpack the carried .debs into a prefix (deps.sh sets RL_DEPS_LIBDIR) -------
source "$ROOT/scripts/device/deps.sh"
LIBDIR=$RL_DEPS_LIBDIR

# --- build ---------------------------------------------------------------------------------------
if [ "$STAGE" != fixtures ] || [ ! -x "$BIN" ]; then
  step configure cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DREDLITE_BENCH=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_LIBRARY_PATH=$LIBDIR || exit 1
  step build ninja -C "$BUILD" -j16 redlite test_cache test_cuda || exit 1
fi
# SASS=1: the machine code of the products (fp64, X24, X32) and the recurrence ($OUT/sass-*.txt.gz), for instruction counts.
if [ "${SASS:-0}" = 1 ]; then
  for f in matvec matmul matmul_x24 matmul_x32 deltanet; do
    cuobjdump -sass "$BUILD/CMakeFiles/rl_cuda.dir/src/cuda/$f.cu.o" > "$OUT/sass-$f.txt" 2>&1
    gzip -f "$OUT/sass-$f.txt"
  done
fi
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv > "$OUT/gpu.txt" 2>&1

# --- tests -----------------------------------------------------------------------------------------
if [ "$STAGE" = quick ] || [ "$STAGE" = full ]; then
  step test_cache "$BUILD/test_cache"
  REDLITE_FIXTURES=$FIX step test_cuda "$BUILD/test_cuda"
fi

# --- parity on the fixture models -----------------------------------------------------------------------
[ "$STAGE" = bench ] || parity_fixtures
[ "$STAGE" = full ] || [ "$STAGE" = bench ] || exit $status

# --- the 80B-shaped seed-mix model -------------------------------------------------------------------------
M80=$SHM/80b-seed-mix.gguf
[ -e $M80 ] || step synth-80b "$BIN" synth --preset 80b --recipe seed-mix --seed 1 --out $M80
[ "$STAGE" = full ] && parity_80b
[ "${ONLY_MAIN_BENCH:-0}" = 1 ] || step bench-80b-profile "$BIN" bench -m $M80 --backend cuda --reps 1 --json --profile ${EXTRA_FLAGS:-}
step bench-80b "$BIN" bench -m $M80 --backend cuda --reps ${BENCH_REPS:-3} --json ${EXTRA_FLAGS:-}
# BENCH_FLAGS_B="--flag ...": the same bench again with those flags (an A/B on one machine).
[ -n "${BENCH_FLAGS_B:-}" ] && step bench-80b-b "$BIN" bench -m $M80 --backend cuda --reps ${BENCH_REPS:-3} --json ${EXTRA_FLAGS:-} $BENCH_FLAGS_B
[ "${ONLY_MAIN_BENCH:-0}" = 1 ] || step bench-80b-sync "$BIN" bench -m $M80 --backend cuda --reps 1 --json --speculation off ${EXTRA_FLAGS:-}
[ "${ONLY_MAIN_BENCH:-0}" = 1 ] || step bench-80b-8g "$BIN" bench -m $M80 --backend cuda --cache-mib 8192 --reps 1 --json ${EXTRA_FLAGS:-}
# Per-kernel GPU times of the decode (GPU-routed graph nodes), when Nsight Systems is installed.
NSYS_BIN=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ "${NSYS:-0}" = 1 ] && [ -n "$NSYS_BIN" ]; then
  step nsys-80b "$NSYS_BIN" profile -t cuda --cuda-graph-trace=node -f true -o /tmp/rl-decode "$BIN" bench -m $M80 --backend cuda --reps 1 --prefill-tokens 64 --json
  "$NSYS_BIN" stats -q --report cuda_gpu_kern_sum --format csv -o /tmp/rl-decode /tmp/rl-decode.nsys-rep > /dev/null 2>&1
  cut -d, -f1-9 /tmp/rl-decode_cuda_gpu_kern_sum.csv | head -40 > "$OUT/nsys-kernels.csv"
  cat "$OUT/nsys-kernels.csv"
elif [ "${NSYS:-0}" = 1 ]; then
  log "nsys: not installed"
fi
# Per-kernel GPU times with Nsight Compute (one metric, no cache flush, clocks left alone): a short
# bench (prefill chunk of NCU_PREFILL tokens, 3 decode tokens); $OUT/ncu-kernels.csv.
if [ "${NCU:-0}" = 1 ]; then
  NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  step ncu-80b timeout 300 "$NCU_BIN" --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --csv --print-units base --launch-count ${NCU_COUNT:-6000} -o /tmp/rl-ncu -f \
    "$BIN" bench -m $M80 --backend cuda --reps 1 --decode-tokens 3 --prefill-tokens ${NCU_PREFILL:-512} --json
  "$NCU_BIN" --import /tmp/rl-ncu.ncu-rep --csv --print-units base --page raw \
    --metrics gpu__time_duration.sum > "$OUT/ncu-kernels.csv" 2> "$OUT/ncu-import.err"
  gzip -f "$OUT/ncu-kernels.csv"
  # Per pass (prompt, decode tokens, prefill chunks): totals by kernel kind, the largest kernels.
  command -v python3 > /dev/null && python3 "$ROOT/scripts/device/ncu_summary.py" "$OUT/ncu-kernels.csv.gz" \
    > "$OUT/ncu-summary.txt" 2>&1
fi
# Nsight Compute detail sections (occupancy, stall reasons, pipes, memory) for the decode products
# and the prefill kernels: $OUT/ncu-detail-{decode,prefill}.csv.gz.
if [ "${NCU_DETAIL:-0}" != 0 ]; then
  NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [ "$NCU_DETAIL" = prefill ] || step ncu-detail-decode timeout 400 "$NCU_BIN" --set detailed --import-source no -k "regex:${NCU_DECODE_RE:-gate_up_kernel|matvec_kernel|route_kernel|combine_norm}" \
    --launch-count ${NCU_DECODE_COUNT:-150} -o /tmp/rl-ncu-d -f \
    "$BIN" bench -m $M80 --backend cuda --reps 1 --decode-tokens 2 --prefill-tokens 16 --json
  [ "$NCU_DETAIL" = prefill ] || "$NCU_BIN" --import /tmp/rl-ncu-d.ncu-rep --csv --page details > "$OUT/ncu-detail-decode.csv" 2>&1
  [ "$NCU_DETAIL" = decode ] || step ncu-detail-prefill timeout 400 "$NCU_BIN" --set detailed --section WarpStateStats --section SchedulerStats --section InstructionStats --import-source no -k "regex:${NCU_PREFILL_RE:-matmul_kernel|recurrence|gated_attention}" \
    --launch-skip ${NCU_PREFILL_SKIP:-0} --launch-count ${NCU_PREFILL_COUNT:-40} -o /tmp/rl-ncu-p -f \
    "$BIN" bench -m $M80 --backend cuda --reps 1 --decode-tokens 2 --prefill-tokens 512 --json
  [ "$NCU_DETAIL" = decode ] || "$NCU_BIN" --import /tmp/rl-ncu-p.ncu-rep --csv --page details > "$OUT/ncu-detail-prefill.csv" 2>&1
  # Every metric of those kernels (the stall reasons among them).
  [ "$NCU_DETAIL" = decode ] || "$NCU_BIN" --import /tmp/rl-ncu-p.ncu-rep --csv --page raw > "$OUT/ncu-raw-prefill.csv" 2>&1
  for f in "$OUT"/ncu-detail-*.csv "$OUT"/ncu-raw-*.csv; do [ -e "$f" ] && gzip -f "$f"; done
fi
# Variants: each built (with test_cuda, run on it), its binary kept; with AB_ROUNDS=N the benches
# then alternate between the tree's binary and the variants' (--reps 1 each, N rounds), so that a
# machine's drift during the call falls on all of them alike.
if [ -n "${VARIANT:-}${AB_FLAGS:-}" ]; then
  rm -rf /tmp/rl-bin && mkdir -p /tmp/rl-bin  # a warm machine keeps an earlier call's binaries
  cp "$BIN" /tmp/rl-bin/base
fi
AB_BINS=base
# AB_FLAGS="NAME=--flag[,--flag=value...] ...": NAME takes part in the alternation as the tree's binary
# with those flags after the command's own arguments.
for e in ${AB_FLAGS:-}; do
  name=${e%%=*} flags=${e#*=}
  case "$name" in ''|base|*[!A-Za-z0-9_-]*) log "AB_FLAGS $e: the name is empty, base, or not [A-Za-z0-9_-]"; status=1; continue ;; esac
  case "$e" in *=--*) ;; *) log "AB_FLAGS $e: expected NAME=--flag[,--flag...]"; status=1; continue ;; esac
  bad=0
  for f in ${flags//,/ }; do case "$f" in --[a-z]*) ;; *) bad=1 ;; esac; done
  if [ $bad = 1 ]; then log "AB_FLAGS $e: each flag must start with --"; status=1; continue; fi
  if [ -e "/tmp/rl-bin/$name" ]; then log "AB_FLAGS $e: the name $name is taken"; status=1; continue; fi
  printf '#!/bin/sh\nexec /tmp/rl-bin/base "$@"' > "/tmp/rl-bin/$name"
  for f in ${flags//,/ }; do printf ' %q' "$f" >> "/tmp/rl-bin/$name"; done
  printf '\n' >> "/tmp/rl-bin/$name"
  chmod +x "/tmp/rl-bin/$name" && AB_BINS="$AB_BINS $name"
done
for V in ${VARIANT:-}; do
  name=$(basename "$V")
  if [ ! -d "$ROOT/$V" ] || [ "$name" = base ] || [ -e "/tmp/rl-bin/$name" ]; then
    log "variant $V: no such folder, or its name is base or taken"; status=1; continue
  fi
  files=$(cd "$ROOT/$V" && find . -type f)
  mkdir -p "/tmp/rl-orig-$name"
  for f in $files; do  # a file the tree lacks is added, and removed again afterwards
    log "variant $name: $f"
    mkdir -p "$(dirname "/tmp/rl-orig-$name/$f")" "$(dirname "$ROOT/$f")"
    if [ -e "$ROOT/$f" ]; then cp "$ROOT/$f" "/tmp/rl-orig-$name/$f"; else rm -f "/tmp/rl-orig-$name/$f"; fi
    cp "$ROOT/$V/$f" "$ROOT/$f"
  done
  if step "build-variant-$name" ninja -C "$BUILD" -j16 redlite test_cuda; then
    REDLITE_FIXTURES=$FIX step "test_cuda-$name" "$BUILD/test_cuda"
    [ "${VARIANT_PARITY:-0}" = 1 ] && { parity_fixtures "$name"; parity_80b "$name"; }
    cp "$BIN" "/tmp/rl-bin/$name" && AB_BINS="$AB_BINS $name"
    [ -n "${AB_ROUNDS:-}" ] || step "bench-80b-variant-$name" "$BIN" bench -m $M80 --backend cuda --reps ${BENCH_REPS:-3} --json
  fi
  for f in $files; do  # the next variant starts from the tree
    if [ -e "/tmp/rl-orig-$name/$f" ]; then cp "/tmp/rl-orig-$name/$f" "$ROOT/$f"; else rm -f "$ROOT/$f"; fi
  done
done
if [ -n "${AB_ROUNDS:-}" ] && [ -n "${VARIANT:-}${AB_FLAGS:-}" ]; then
  reverse=$(echo $AB_BINS | tr ' ' '\n' | tac | tr '\n' ' ')
  for r in $(seq "$AB_ROUNDS"); do
    [ $((r % 2)) = 0 ] && order=$reverse || order=$AB_BINS
    for b in $order; do step "ab-$b-$r" /tmp/rl-bin/$b bench -m $M80 --backend cuda --reps 1 --json; done
  done
  figure() {  # figure KEY LOG: the value of "KEY" in a bench's JSON, or - when the bench failed
    local v
    v=$(grep "\"$1\"" "$2" 2>/dev/null | tr -dc '0-9.')
    echo "${v:0:7}" | sed 's/^$/-/'
  }
  for b in $AB_BINS; do
    pre="" dec=""
    for r in $(seq "$AB_ROUNDS"); do
      pre="$pre $(figure prefill_tok_s "$OUT/ab-$b-$r.log")" dec="$dec $(figure decode_tok_s "$OUT/ab-$b-$r.log")"
    done
    log "ab $b: prefill$pre  decode$dec"
  done
fi
# Whatever follows (the skew bench, a later call on this machine) runs the tree's own code again.
if [ -n "${VARIANT:-}" ]; then
  step build-restored ninja -C "$BUILD" -j16 redlite test_cuda || { log "the tree's own build failed after the variants"; exit 1; }
fi
rm -f $M80
[ "${SKIP_SKEW:-0}" = 1 ] && exit $status
M80S=$SHM/80b-seed-mix-skew.gguf
[ -e $M80S ] || step synth-80b-skew "$BIN" synth --preset 80b --recipe seed-mix --seed 1 --router-skew 1.0 --out $M80S
step bench-80b-8g-skew "$BIN" bench -m $M80S --backend cuda --cache-mib 8192 --reps 1 --json
rm -f $M80S
exit $status
