#!/usr/bin/env bash
# main's first figures on an H200 host (no H200 figure of the engine since 2026-12-02; export OUT,
# carry .deps/fixB .deps/debs .deps/base), ~4 min on a cold machine:
#   call.sh          one-token decode and prefill in chunks of 512 (all resident, fast tier), the
#                    bounded cache at 8 and 2 GiB (uniform) and at 8 GiB on the --router-skew 1.0
#                    model, with the commands' defaults (issues 20 and 22)
#   call.sh batch    then, on the warm machine: batched steps of 4 and 16 rows and the server's
#                    streams at 1, 4 and 16 (issue 21)
export SKIP_BASE=1 FIX_DIR=.deps/fixB
nvidia-smi --query-gpu=name --format=csv,noheader
case "${1:-figures}" in
  figures)
    bash scripts/device/ab.sh build-bin 2>&1 | grep -E "^== .*exit" | tail -2
    AB_NUMERICS=fast AB_ROUNDS=2 AB_FLAGS="--prefill-chunk 512" bash scripts/device/ab.sh main 2>&1 | grep -E "== .*(ab |exit [^0])"
    AB_ROUNDS=1 MISS_MODES=host MISS_MIBS="8192 2048" bash scripts/device/ab.sh miss-reads 2>&1 | grep -E "== .*(miss-reads |exit [^0])"
    AB_ROUNDS=1 MISS_MODEL=skew MISS_MODES=host bash scripts/device/ab.sh miss-reads 2>&1 | grep -E "== .*(miss-reads |exit [^0])"
    ;;
  batch)
    BATCHES="4 16" AB_ROUNDS=2 bash scripts/device/ab.sh batch 2>&1 | grep -E "== .*(batch [0-9a-z-]+ [0-9]+:|exit [^0])"
    STREAMS=1,4,16 PARALLEL_N=128 bash scripts/device/ab.sh parallel 2>&1 | grep -E '^parallel: |exit [^0]'
    ;;
  *) echo "call.sh: unknown call $1 (figures, batch)"; exit 2 ;;
esac
