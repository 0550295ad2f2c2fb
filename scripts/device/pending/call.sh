#!/usr/bin/env bash
# The waiting patches' device call (carry .deps/fixB .deps/debs; export OUT), ~8 min on a cold
# machine: the three prefill patches together (.deps/combined.patch, their concatenation, made
# here) and q8-f32-input, each built and tested (test_cuda: their kernels' tests, the fast tier
# at the 80B's widths, the backend, batched decode, GPU routing), then timed against the tree
# (`bench --reps 1 --numerics fast`, alternating) in chunks of 512 (two rounds) and passes of 2048.
export SKIP_BASE=1 FIX_DIR=.deps/fixB
P=scripts/device/pending C=.deps/combined.patch
mkdir -p .deps && cat $P/bf16-split-k.patch $P/x8-q4k-32.patch $P/x24-unroll2.patch > $C
F='Bf16Product*:CudaX24.*:CudaFastTier.*:CudaKernels.*:CudaBackend.*:CudaQ8*:CudaBatchedDecode.*:CudaGpuRouting.*:CudaPrefillBatch.*'
nvidia-smi --query-gpu=name --format=csv,noheader
bash scripts/device/ab.sh build 2>&1 | grep -E "^== .*exit|error" | tail -4
PATCHES="$C $P/q8-f32-input.patch" TEST_FILTER=$F bash scripts/device/ab.sh patch-both 2>&1 | grep -E "^== |FAILED|PASSED|tests ran" | tail -24
PATCHES="$C $P/q8-f32-input.patch" AB_NUMERICS=fast AB_ROUNDS=2 AB_FLAGS="--prefill-chunk 512" bash scripts/device/ab.sh main 2>&1 | grep "== .*ab "
PATCHES="$C $P/q8-f32-input.patch" AB_NUMERICS=fast AB_ROUNDS=1 bash scripts/device/ab.sh main 2>&1 | grep "== .*ab "
