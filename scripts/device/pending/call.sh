#!/usr/bin/env bash
# The waiting patches' device call (carry .deps/fixB .deps/debs; export OUT): host-scratch-handoff
# applied to the tree for the whole call (its tests run in every build below), x24-super-stage
# tested and timed first (prefill in chunks of 512), then the decode patches and the handoff bench.
export SKIP_BASE=1 FIX_DIR=.deps/fixB
P=scripts/device/pending
patch -p1 < $P/host-scratch-handoff.patch > /dev/null || echo "host-scratch-handoff.patch does not apply"
F='CudaX24.*:CudaQ8.*:CudaKernels.*:CudaGpuRouting.*:CudaFastTier.*:CudaBackend.MissesReadInPlace*'
nvidia-smi --query-gpu=name --format=csv,noheader
PATCHES="$P/x24-super-stage.patch" TEST_FILTER=$F bash scripts/device/ab.sh build patch-both 2>&1 | grep -E "^== |FAILED|PASSED" | tail -30
PATCHES="$P/x24-super-stage.patch" AB_NUMERICS=fast AB_ROUNDS=1 AB_FLAGS="--prefill-chunk 512" bash scripts/device/ab.sh main 2>&1 | grep "== .*ab "
PATCHES="$P/gate-up-two-pairs.patch $P/q8-nibble.patch" TEST_FILTER=$F bash scripts/device/ab.sh patch-both handoff 2>&1 | grep -E "^== |FAILED|PASSED|handoff work" | tail -30
PATCHES="$P/x24-super-stage.patch $P/gate-up-two-pairs.patch $P/q8-nibble.patch" AB_NUMERICS=fast AB_ROUNDS=1 bash scripts/device/ab.sh main 2>&1 | grep "== .*ab "
