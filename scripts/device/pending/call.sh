#!/usr/bin/env bash
# The waiting patches' device calls (export OUT; carry .deps/fixB .deps/debs), each within a call's
# 10 minutes, the second and third on the machine the first left warm:
#   call.sh 1  (~8 min cold) the tree with miss-inline.patch built and tested (test_cuda: the Q8
#              products, the backend, GPU routing, batched decode, the fast tier), then the 80B at
#              --cache-mib 8192 with --miss-staging blocks and kernel alternating (issue 22).
#   call.sh 2  the same A/B at --cache-mib 2048 and on the --router-skew 1.0 model at 8192; main's
#              binary (carry .deps/base too) against --miss-staging kernel, the staging kernels' copy loop.
#   call.sh 3  the tree with iq-repack.patch: its test, bench_cuda_kernels' expert cases (the ggml
#              layout and the repacked one side by side), then gate-up-5 and gate-up-4w (made against
#              that tree) timed against it in the one-token decode (issue 20).
# A call's tree is a fresh copy: each applies its patch again (the build in /tmp is reused).
export SKIP_BASE=1 FIX_DIR=.deps/fixB
P=scripts/device/pending M=/dev/shm/redlite/80b-seed-mix.gguf S=/dev/shm/redlite/80b-skew.gguf B=/tmp/rl-build-tree/redlite
nvidia-smi --query-gpu=name --format=csv,noheader
# staging_ab MODEL MIB: bench with --miss-staging blocks and kernel, alternating, two rounds.
staging_ab() {
  local i=0 s
  for s in blocks kernel kernel blocks; do
    i=$((i + 1))
    "$B" bench -m "$1" --backend cuda --cache-mib "$2" --miss-staging $s --reps 1 --json > "$OUT/mi-$(basename "$1" .gguf)-$2-$i-$s.json" 2>&1
    echo "$(basename "$1") $2 MiB $s: $(grep -oE '"(decode_tok_s|hit_rate|copy_gb_s|misses_read_in_place)": [0-9.]+' \
      "$OUT/mi-$(basename "$1" .gguf)-$2-$i-$s.json" | tr '\n' ' ')"
  done
}
case "${1:-1}" in
  1)
    patch -p1 < $P/miss-inline.patch > /dev/null || { echo "miss-inline.patch does not apply"; exit 1; }
    TEST_FILTER='CudaQ8.*:CudaBackend.*:CudaGpuRouting.*:CudaBatchedDecode.*:CudaFastTier.*' \
      bash scripts/device/ab.sh build test 2>&1 | grep -E "^== .*exit|FAILED|PASSED|SKIPPED \]" | tail -10
    mkdir -p /dev/shm/redlite
    [ -e $M ] || "$B" synth --preset 80b --recipe seed-mix --seed 1 --out $M > /dev/null
    staging_ab $M 8192
    ;;
  2)
    [ -e $S ] || "$B" synth --preset 80b --recipe seed-mix --seed 1 --router-skew 1.0 --out $S > /dev/null
    staging_ab $M 2048
    staging_ab $S 8192
    # The staging kernels' own change (copy_pieces_16): main's binary (.deps/base/base-src.tgz of
    # main) against the tree's --miss-staging kernel at 8192.
    patch -p1 < $P/miss-inline.patch > /dev/null
    SKIP_BASE=0 bash scripts/device/ab.sh build 2>&1 | grep -E "^== .*exit" | tail -2
    for b in /tmp/rl-build-base/redlite "$B" /tmp/rl-build-base/redlite "$B"; do
      f=$([ "$b" = "$B" ] && echo "--miss-staging kernel")
      echo "$b: $("$b" bench -m $M --backend cuda --cache-mib 8192 $f --reps 1 --json 2>&1 | grep -oE '"(decode_tok_s|copy_gb_s)": [0-9.]+' | tr '\n' ' ')"
    done
    ;;
  3)
    patch -p1 < $P/iq-repack.patch > /dev/null || { echo "iq-repack.patch does not apply"; exit 1; }
    TEST_FILTER='CudaQ8.*' bash scripts/device/ab.sh build test 2>&1 | grep -E "^== .*exit|FAILED|PASSED" | tail -6
    KERNELS_FLAGS='--filter decode/experts --reps 200' bash scripts/device/ab.sh kernels 2>&1 | grep -E "experts" | tail -40
    PATCHES="$P/gate-up-5.patch $P/gate-up-4w.patch" AB_NUMERICS=fast AB_ROUNDS=2 \
      bash scripts/device/ab.sh patches main 2>&1 | grep -E "== .*(ab |exit [^0])"
    ;;
  4)
    # main's binary with gate-up-5, gate-up-4w (now against main) and miss-inline built beside it:
    # the one-token decode and prefill in chunks of 512, and the
    # 2 GiB uniform bounded cache with --miss-staging blocks / kernel against main's binary.
    find src tests bench -type f -exec touch {} +  # a warm machine's build dir saw other trees: rebuild all
    bash scripts/device/ab.sh build-bin 2>&1 | grep -E "^== .*exit" | tail -2
    PATCHES="$P/gate-up-5.patch $P/gate-up-4w.patch $P/miss-inline.patch" bash scripts/device/ab.sh patches 2>&1 | grep -E "^== .*exit|does not" | tail -5
    PATCHES="$P/gate-up-5.patch $P/gate-up-4w.patch" AB_NUMERICS=fast AB_ROUNDS=2 AB_FLAGS="--prefill-chunk 512" \
      bash scripts/device/ab.sh main 2>&1 | grep -E "== .*(ab |exit [^0])"
    MI=/tmp/rl-bin-miss-inline i=0
    for s in blocks kernel main blocks kernel; do
      i=$((i + 1)); b=$MI f="--miss-staging $s"; [ $s = main ] && b=$B f=
      timeout 120 "$b" bench -m $M --backend cuda --cache-mib 2048 $f --reps 1 --json > "$OUT/mi-2048-$i-$s.json" 2>&1
      echo "2048 MiB $s: $(grep -oE '"(decode_tok_s|hit_rate|copy_gb_s)": [0-9.]+' "$OUT/mi-2048-$i-$s.json" | tr '\n' ' ')"
    done
    ;;
  5)
    # call 4 without miss-inline (a call of ~5 min): the gate/up occupancy patches against main.
    find src tests bench -type f -exec touch {} +
    bash scripts/device/ab.sh build-bin 2>&1 | grep -E "^== .*exit" | tail -2
    PATCHES="$P/gate-up-5.patch $P/gate-up-4w.patch" bash scripts/device/ab.sh patches 2>&1 | grep -E "^== .*exit|does not" | tail -5
    PATCHES="$P/gate-up-5.patch $P/gate-up-4w.patch" AB_NUMERICS=fast AB_ROUNDS=2 AB_FLAGS="--prefill-chunk 512" \
      bash scripts/device/ab.sh main 2>&1 | grep -E "== .*(ab |exit [^0])"
    ;;
esac
