#!/usr/bin/env bash
# The waiting patch's device call (carry .deps/fixB .deps/debs; export OUT): bf16-split-k tested
# (its kernel tests, the fast tier at the 80B's widths, where the routers split) and timed against
# the tree in chunks of 512 and in passes of 2048, then the fast tier against the oracle on the 80B.
export SKIP_BASE=1 FIX_DIR=.deps/fixB
P=scripts/device/pending
F='Bf16Products.*:Bf16ProductArguments.*:CudaFastTier.*:CudaKernels.*:CudaBackend.*'
nvidia-smi --query-gpu=name --format=csv,noheader
PATCHES="$P/bf16-split-k.patch" TEST_FILTER=$F bash scripts/device/ab.sh build patch-both 2>&1 | grep -E "^== |FAILED|PASSED" | tail -30
PATCHES="$P/bf16-split-k.patch" AB_NUMERICS=fast AB_ROUNDS=2 AB_FLAGS="--prefill-chunk 512" bash scripts/device/ab.sh main 2>&1 | grep "== .*ab "
PATCHES="$P/bf16-split-k.patch" AB_NUMERICS=fast AB_ROUNDS=1 bash scripts/device/ab.sh main 2>&1 | grep "== .*ab "
patch -p1 < $P/bf16-split-k.patch > /dev/null && bash scripts/device/ab.sh build parity-80b-fast 2>&1 | grep -vE "^\[ +(RUN|OK) " | tail -12
