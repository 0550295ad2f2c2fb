#!/usr/bin/env bash
# The next calls (export OUT; carry .deps/fixB .deps/debs .deps/base), each under the 600 s limit:
#   call.sh figures  main's figures on an H200 host (none of the current engine since 2026-12-02):
#                    one-token decode and prefill in chunks of 512 and in passes of 2 048, the
#                    bounded cache at 8 and 2 GiB (uniform) and at 8 GiB on the --router-skew 1.0
#                    model (issues 20 and 22); ~5 min on a cold machine
#   call.sh batch    then, on the warm machine: batched steps of 4 and 16 rows and the server's
#                    streams at 1, 4 and 16 (issue 21)
#   call.sh patches  the patches named in $PATCHES (paths under the tree), each built and tested
#                    (the X24/X8, Q8, fast-tier, exact-tier and prefill-batch tests), then timed
#                    against the tree in chunks of 512 (2 rounds)
export SKIP_BASE=1 FIX_DIR=.deps/fixB
A=scripts/device/ab.sh
nvidia-smi --query-gpu=name --format=csv,noheader
case "${1:-figures}" in
  figures)
    bash $A build-bin 2>&1 | grep -E "^== .*exit" | tail -2
    AB_NUMERICS=fast AB_ROUNDS=2 AB_FLAGS="--prefill-chunk 512" bash $A main 2>&1 | grep -E "== .*(ab |exit [^0])"
    AB_NUMERICS=fast AB_ROUNDS=1 bash $A main 2>&1 | grep -E "== .*(ab |exit [^0])"
    AB_ROUNDS=1 MISS_MODES=host MISS_MIBS="8192 2048" bash $A miss-reads 2>&1 | grep -E "== .*(miss-reads |exit [^0])"
    AB_ROUNDS=1 MISS_MODEL=skew MISS_MODES=host bash $A miss-reads 2>&1 | grep -E "== .*(miss-reads |exit [^0])"
    ;;
  batch)
    BATCHES="4 16" AB_ROUNDS=2 bash $A batch 2>&1 | grep -E "== .*(batch [0-9a-z-]+ [0-9]+:|exit [^0])"
    STREAMS=1,4,16 PARALLEL_N=128 bash $A parallel 2>&1 | grep -E '^parallel: |exit [^0]'
    ;;
  patches)
    [ -n "${PATCHES:-}" ] || { echo "call.sh patches: set PATCHES"; exit 2; }
    export PATCHES
    bash $A build 2>&1 | grep -E "^== .*exit" | tail -1
    TEST_FILTER='CudaX24.*:CudaQ8.*:CudaFastTier.*:ExactTier.*:CudaPrefillBatch.*' bash $A patch-both 2>&1 |
      grep -E "^== .*exit|PASSED|FAILED|tests ran" | tail -24
    AB_NUMERICS=fast AB_ROUNDS=2 AB_FLAGS="--prefill-chunk 512" bash $A main 2>&1 | grep -E "== .*(ab |exit [^0])"
    ;;
  *) echo "call.sh: unknown call $1 (figures, batch, patches)"; exit 2 ;;
esac
