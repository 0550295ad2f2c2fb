#!/usr/bin/env bash
# The waiting patches' device calls (export OUT), each within a call's 10 minutes:
#   call.sh 1  (carry .deps/fixB .deps/debs; ~7 min cold) main's whole test_cuda (last run whole at
#              3c26a45); each pending patch built and tested (test_cuda: the bf16, X24 and Q8 products,
#              the fast tier and attention, the backend, batched decode), then timed against the tree
#              (`bench --reps 1 --numerics fast`, alternating) in chunks of 512 (two rounds: prefill
#              and the decode after it) and in passes of 2048.
#   call.sh 2  (the same machine, warm) batched steps of 4 and 16 rows with each patch (issue 21); a
#              variant build sending the dense Q4_K prefill products to the bf16 tiles (128 rows x 64
#              tokens, decoded once a tile) instead of the X8 form (32 tokens a block), timed against
#              the tree in chunks of 512.
export SKIP_BASE=1 FIX_DIR=.deps/fixB
P=scripts/device/pending L="$P/split-k-last.patch $P/x8-iq1m-2blocks.patch $P/attn-q8.patch"
F='Bf16Product*:CudaX24.*:CudaFastTier.*:CudaKernels.*:CudaBackend.*:CudaQ8*:CudaFastAttention.*:CudaBatchedDecode.*'
nvidia-smi --query-gpu=name --format=csv,noheader
case "${1:-1}" in
  1)
    bash scripts/device/ab.sh build test 2>&1 | grep -E "^== .*exit|error|FAILED|PASSED|SKIPPED \]" | tail -8
    PATCHES="$L" TEST_FILTER=$F bash scripts/device/ab.sh patch-both 2>&1 | grep -E "^== |FAILED|PASSED|tests ran" | tail -24
    PATCHES="$L" AB_NUMERICS=fast AB_ROUNDS=2 AB_FLAGS="--prefill-chunk 512" bash scripts/device/ab.sh main 2>&1 | grep "== .*ab "
    PATCHES="$L" AB_NUMERICS=fast AB_ROUNDS=1 bash scripts/device/ab.sh main 2>&1 | grep "== .*ab "
    ;;
  2)
    PATCHES="$L" AB_ROUNDS=2 BATCHES="4 16" bash scripts/device/ab.sh patch-batch 2>&1 | grep "== .*batch "
    VARIANT_FILE=src/cuda/plan.cpp VARIANT_SED='s/return forms.use_x32(w, rows) ? forms.x32_kernel() : forms.prefill_matmul();/return forms.prefill_matmul();/' \
      bash scripts/device/ab.sh variant 2>&1 | grep -E "== .*exit"
    AB_VARIANT=1 AB_NUMERICS=fast AB_ROUNDS=2 AB_FLAGS="--prefill-chunk 512" bash scripts/device/ab.sh main 2>&1 | grep "== .*ab "
    ;;
esac
