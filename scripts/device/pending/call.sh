#!/usr/bin/env bash
# The waiting patches' device call (carry .deps/fixB .deps/debs; export OUT): three patches
# together (.deps/combined.patch, their concatenation, made here; `patch` applies it) tested —
# their kernel tests, the fast tier at the 80B's widths, where the routers split, the backend —
# then each alone and together timed against the tree in chunks of 512 and in passes of 2048,
# then the fast tier against the oracle on the 80B with them.
export SKIP_BASE=1 FIX_DIR=.deps/fixB
P=scripts/device/pending C=.deps/combined.patch
mkdir -p .deps && cat $P/bf16-split-k.patch $P/x8-q4k-32.patch $P/x24-unroll2.patch > $C
F='Bf16Products.*:Bf16ProductArguments.*:CudaX24.*:CudaFastTier.*:CudaKernels.*:CudaBackend.*'
nvidia-smi --query-gpu=name --format=csv,noheader
PATCHES="$C" TEST_FILTER=$F bash scripts/device/ab.sh build patch-both 2>&1 | grep -E "^== |FAILED|PASSED" | tail -30
PATCHES="$P/bf16-split-k.patch $P/x8-q4k-32.patch $P/x8-iq1m-2blocks.patch $P/x24-unroll2.patch" bash scripts/device/ab.sh patches 2>&1 | grep -E "== .*exit"
PATCHES="$P/bf16-split-k.patch $P/x8-q4k-32.patch $P/x8-iq1m-2blocks.patch $P/x24-unroll2.patch $C" AB_NUMERICS=fast AB_ROUNDS=2 AB_FLAGS="--prefill-chunk 512" bash scripts/device/ab.sh main 2>&1 | grep "== .*ab "
PATCHES="$C" AB_NUMERICS=fast AB_ROUNDS=1 bash scripts/device/ab.sh main 2>&1 | grep "== .*ab "
patch -p1 < $C > /dev/null && bash scripts/device/ab.sh build parity-80b-fast 2>&1 | grep -vE "^\[ +(RUN|OK) " | tail -12
