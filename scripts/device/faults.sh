#!/usr/bin/env bash
# Deliberate faults the GPU tests must catch (issue 18), in one call on the GPU host. Each fault is
# one exact text replacement in a CUDA source of a scratch copy of the tree (never the tree
# itself); the copy's test_cuda is rebuilt (only the patched file recompiles) and each of the
# fault's tests runs alone. A fault is caught (PASS) when every one of its tests fails, and not
# caught (FAIL) when one passes or is skipped. The clean copy's run of the same tests comes first
# and must pass.
#
#   scripts/device/faults.sh [--dry-run] [--list] [FAULT...]     (no FAULT: all, in this order)
#     router-fp32  the router's decode product (the F32 matvec, matvec.cu lane_dot) sums in fp32
#     dense-fp32   the Q4_K/Q5_K decode products (matvec.cu kquant_unit) sum in fp32
#     wrong-slot   route_topk (moe.cu) hands each selected expert its neighbour's slot
#     no-backups   the decode graph (decode_graph.cpp) takes no backup of the DeltaNet states, so a
#                  discarded token restores stale states
#     kv-q8-scale  a q8_0 KV block's scale is max|x| / 126 (kv_cache_device.cuh store_row_warp)
#     kv-bf16-load a bf16 KV quad's second value is read as its first (kv_cache_device.cuh KvQuad)
#     kv-q8-head   a q8_0 KV row ignores its head's column offset (kv_cache_device.cuh KvPlane::row)
#     q8-round     quantize_q8 (matvec_q8.cu) rounds halves away from zero instead of to even
#     q8-nan       quantize_q8 gives a block holding a NaN or an infinity a finite scale
#     q8-kmin      the Q4_K/Q5_K Q8 products drop the min term (dmin·m·block sums)
#     q8-q6-scale  the Q6_K Q8 product takes the first 16 values' scale for the second 16 as well
#     q8-iq-bias   the IQ types' Q8 products drop the bias term s·b·Σq
#     q8-unaligned the 2-byte aligned weight words (Q6_K, Q8_0) are read as if 4-byte aligned
#     q8-lane-sum  a row's lane sums skip the first shuffle step (half the lanes summed)
#     q8-expert-input the routed down products read expert 0's Q8 values for every expert
#     prefetch-real-buffers  the next layer's prediction (expert_prefetch.cpp) writes its top-k
#                  weights over the real routing's (--prefetch early: the layer's combine reads them)
#     --dry-run    apply each patch to a scratch copy of its file and print the diff, then stop (no
#                  build, no GPU: runs on any machine)
#     --list       each fault, its file and the tests that must catch it
#
# A patch whose text does not occur exactly as often as stated stops the script before anything is
# built. Results: $OUT/summary.txt (one line a test, then a verdict a fault), the logs and the
# applied diffs in $OUT/logs.tgz. The scratch tree and build are /tmp/rl-faults (kept, so a warm
# machine rebuilds little); the carried .deps/debs and .deps/fix (model B, for the CudaBackend tests)
# are used as check.sh uses them. FAULTS_BUDGET_S (default 480) stops starting new faults after that
# many seconds, so the summary comes back within a 600-second call.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
W=/tmp/rl-faults
SRC=$W/src BUILD=$W/build
FIX=$ROOT/${FIX_DIR:-.deps/fix}

# ---- the faults -------------------------------------------------------------------------------------
ALL_FAULTS=(router-fp32 dense-fp32 wrong-slot no-backups kv-q8-scale kv-bf16-load kv-q8-head
            q8-round q8-nan q8-kmin q8-q6-scale q8-iq-bias q8-unaligned q8-lane-sum q8-expert-input
            prefetch-real-buffers)
declare -A F_FILE F_OLD F_NEW F_COUNT F_TESTS
F_FILE[router-fp32]=src/cuda/matvec.cu
F_OLD[router-fp32]='for (int j = 0; j < 8; j++) acc[r] = fma((double)v[j], xd[j], acc[r]);'
F_NEW[router-fp32]='for (int j = 0; j < 8; j++) acc[r] = T == GgmlType::F32 ? (double)__fmaf_rn(v[j], (float)xd[j], (float)acc[r]) : fma((double)v[j], xd[j], acc[r]);'
F_COUNT[router-fp32]=1
F_TESTS[router-fp32]="ExactTier.MatchesTheOracleOnThe80BRoutingShapeAtEveryBudget CudaKernels.MatvecMatchesCpuForEveryTypeAndShape"

F_FILE[dense-fp32]=src/cuda/matvec.cu
F_OLD[dense-fp32]='acc[r] = fma((double)v, xd[4 * k + b], acc[r]);'
F_NEW[dense-fp32]='acc[r] = (double)__fmaf_rn(v, (float)xd[4 * k + b], (float)acc[r]);'
F_COUNT[dense-fp32]=1
F_TESTS[dense-fp32]="ExactTier.MatchesTheOracleOnThe80BRoutingShapeAtEveryBudget CudaBackend.MatchesOracleAtSeveralBudgets CudaKernels.MatvecMatchesCpuForEveryTypeAndShape"

F_FILE[wrong-slot]=src/cuda/moe.cu
F_OLD[wrong-slot]='const uint64_t addr = res[e];'
F_NEW[wrong-slot]='const uint64_t addr = res[(e + 1) % E];'
F_COUNT[wrong-slot]=1
F_TESTS[wrong-slot]="CudaGpuRouting.TopKMatchesTheRuleWithTiesAndResidency CudaBackend.GpuRoutedDecodeEqualsSynchronousPath ExactTier.MatchesTheOracleOnThe80BRoutingShapeAtEveryBudget"

F_FILE[no-backups]=src/cuda/decode_graph.cpp
F_OLD[no-backups]=$'  try {\n    if (token_backs_up(e)) copy_recurrent_states(e, st, true);'
F_NEW[no-backups]=$'  try {\n    // fault: the graph takes no backup of the recurrent states'
F_COUNT[no-backups]=1
F_TESTS[no-backups]="CudaBackend.GpuRoutedDecodeEqualsSynchronousPath"

F_FILE[kv-q8-scale]=src/cuda/kv_cache_device.cuh
F_OLD[kv-q8-scale]='const float d = amax / 127.0f;'
F_NEW[kv-q8-scale]='const float d = amax / 126.0f;'
F_COUNT[kv-q8-scale]=1
F_TESTS[kv-q8-scale]="CudaKvTypes.CacheStoresMatchTheCpuBackend CudaFastAttention.DecodeOverEachKvType"

F_FILE[kv-bf16-load]=src/cuda/kv_cache_device.cuh
F_OLD[kv-bf16-load]='__uint_as_float(r.x & 0xffff0000u)'
F_NEW[kv-bf16-load]='__uint_as_float(r.x << 16)'
F_COUNT[kv-bf16-load]=1
F_TESTS[kv-bf16-load]="CudaFastAttention.DecodeOverEachKvType CudaFastAttention.PrefillOverEachKvType"

F_FILE[prefetch-real-buffers]=src/cuda/expert_prefetch.cpp
F_OLD[prefetch-real-buffers]='ws.predict_ids.get<int32_t>(), ws.predict_weights.f(), stream,'
F_NEW[prefetch-real-buffers]='ws.predict_ids.get<int32_t>(), ws.route_weights.f(), stream,'
F_COUNT[prefetch-real-buffers]=1
F_TESTS[prefetch-real-buffers]="CudaBackend.PrefetchLeavesLogitsUnchanged CudaBackend.PrefetchMatchesOracleAtSeveralBudgets"

F_FILE[kv-q8-head]=src/cuda/kv_cache_device.cuh
F_OLD[kv-q8-head]='const size_t at = pos * width + off;'
F_NEW[kv-q8-head]='const size_t at = pos * width;'
F_COUNT[kv-q8-head]=1
F_TESTS[kv-q8-head]="CudaKvTypes.CacheStoresMatchTheCpuBackend CudaFastAttention.DecodeOverEachKvType CudaFastAttention.PrefillOverEachKvType"

# The fast tier's Q8 decode products (matvec_q8.cu).
Q8_PRODUCT_TESTS="CudaQ8.DenseProductsWithinTheTierBound CudaQ8.ExpertProductsWithinTheTierBound"
for f in q8-round q8-kmin q8-q6-scale q8-iq-bias q8-unaligned q8-lane-sum q8-expert-input; do
  F_FILE[$f]=src/cuda/matvec_q8.cu
  F_COUNT[$f]=1
done
F_OLD[q8-round]='const int qi = finite && d > 0.0f ? __float2int_rn(__fdiv_rn(v, d)) : 0;'
F_NEW[q8-round]='const int qi = finite && d > 0.0f ? (int)roundf(__fdiv_rn(v, d)) : 0;'
F_TESTS[q8-round]="CudaQ8.QuantizationMatchesItsDefinition"
F_FILE[q8-nan]=src/cuda/matvec_q8.cu
F_COUNT[q8-nan]=1
F_OLD[q8-nan]='const float d = finite ? __fdiv_rn(amax, 127.0f) : __int_as_float(0x7fc00000);'
F_NEW[q8-nan]='const float d = __fdiv_rn(amax, 127.0f);'
F_TESTS[q8-nan]="CudaQ8.QuantizationMatchesItsDefinition CudaQ8.NanActivationsPropagate"
F_OLD[q8-kmin]='return fmaf(d, scaled, -dmin * mins);'
F_NEW[q8-kmin]='return d * scaled;'
F_TESTS[q8-kmin]=$Q8_PRODUCT_TESTS
F_OLD[q8-q6-scale]='reinterpret_cast<const int8_t*>(b + 192) + 8 * n + h;'
F_NEW[q8-q6-scale]='reinterpret_cast<const int8_t*>(b + 192) + 8 * n;'
F_TESTS[q8-q6-scale]=$Q8_PRODUCT_TESTS
F_OLD[q8-iq-bias]='acc = fmaf(k.s, fmaf(-k.b, (float)x.sum[c], (float)s), acc);'
F_NEW[q8-iq-bias]='acc = fmaf(k.s, (float)s, acc);'
F_TESTS[q8-iq-bias]="$Q8_PRODUCT_TESTS CudaQ8.ExpertPairOfTwoTypes"
F_OLD[q8-unaligned]='w[i] = __funnelshift_r(a[i], a[i + 1], odd ? 16 : 0);'
F_NEW[q8-unaligned]='w[i] = __funnelshift_r(a[i], a[i + 1], 0);'
F_TESTS[q8-unaligned]=$Q8_PRODUCT_TESTS
F_OLD[q8-lane-sum]='for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);'
F_NEW[q8-lane-sum]='for (int o = G / 4; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);'
F_TESTS[q8-lane-sum]="$Q8_PRODUCT_TESTS CudaQ8.ExpertPairOfTwoTypes"
F_OLD[q8-expert-input]='jobs[e].xq = xq + (size_t)e * x_rows_per_expert * cols;'
F_NEW[q8-expert-input]='jobs[e].xq = xq;'
F_TESTS[q8-expert-input]="CudaQ8.ExpertProductsWithinTheTierBound"

# ---- arguments ----------------------------------------------------------------------------------------
DRY_RUN=0
SELECTED=()
for a in "$@"; do
  case "$a" in
    --dry-run) DRY_RUN=1 ;;
    --list)
      for f in "${ALL_FAULTS[@]}"; do echo "$f: ${F_FILE[$f]}; must fail: ${F_TESTS[$f]}"; done
      exit 0 ;;
    -*) echo "faults.sh: unknown option $a (--dry-run, --list)" >&2; exit 2 ;;
    *)
      if [ -z "${F_FILE[$a]+x}" ]; then echo "faults.sh: no fault named $a (known: ${ALL_FAULTS[*]})" >&2; exit 2; fi
      SELECTED+=("$a") ;;
  esac
done
[ ${#SELECTED[@]} -gt 0 ] || SELECTED=("${ALL_FAULTS[@]}")

log() { echo "== $(date +%T) $*" | tee -a "$OUT/summary.txt"; }

# replace_exact FILE COUNT OLD NEW: OLD (exact text, not a pattern) must occur COUNT times in FILE;
# each becomes NEW. Otherwise FILE is left alone and the exit status is 1.
replace_exact() {
  local file=$1 count=$2 old=$3 new=$4 text rest found
  IFS= read -rd '' text < "$file"  # the whole file, newlines kept (read ends at EOF with status 1)
  rest=${text//"$old"/}
  found=$(( (${#text} - ${#rest}) / ${#old} ))
  if [ "$found" != "$count" ]; then
    printf '%s: the fault text occurs %s times, expected %s:\n%s\n' "$file" "$found" "$count" "$old" >&2
    return 1
  fi
  printf '%s' "${text//"$old"/"$new"}" > "$file"
}

# apply_fault NAME DIR: the fault's patch applied to DIR (a copy of the tree); its diff in
# $OUT/fault-NAME.diff.
apply_fault() {
  local f=$1 dir=$2 file=${F_FILE[$1]}
  replace_exact "$dir/$file" "${F_COUNT[$f]}" "${F_OLD[$f]}" "${F_NEW[$f]}" || return 1
  diff -u --label "a/$file" --label "b/$file" "$ROOT/$file" "$dir/$file" > "$OUT/fault-$f.diff"
  [ $? = 1 ] || { echo "$file: the patch of $f changed nothing" >&2; return 1; }
}

# Every patch is checked against the tree before anything is built.
CHECK=$(mktemp -d)
bad=0
for f in "${SELECTED[@]}"; do
  mkdir -p "$CHECK/$(dirname "${F_FILE[$f]}")"
  cp "$ROOT/${F_FILE[$f]}" "$CHECK/${F_FILE[$f]}"
  if apply_fault "$f" "$CHECK"; then
    echo "-- $f: applies (${F_COUNT[$f]} match in ${F_FILE[$f]}); must fail: ${F_TESTS[$f]}"
    [ $DRY_RUN = 1 ] && cat "$OUT/fault-$f.diff"
  else
    echo "-- $f: the patch does not apply to ${F_FILE[$f]}" >&2
    bad=1
  fi
done
rm -rf "$CHECK"
[ $bad = 0 ] || exit 1
[ $DRY_RUN = 1 ] && exit 0

# ---- the scratch tree and its build --------------------------------------------------------------------
source "$ROOT/scripts/device/deps.sh"
T0=$SECONDS
rm -rf $SRC && mkdir -p $SRC
(cd "$ROOT" && tar --exclude=./.deps --exclude=./.git --exclude='./build*' --exclude=./out -cf - .) | tar -xf - -C $SRC
# The files the faults patch recompile in the clean build too: a build dir kept on a warm machine
# may hold objects of a fault whose source was older than them.
for f in "${ALL_FAULTS[@]}"; do touch "$SRC/${F_FILE[$f]}"; done
rl_configure $SRC $BUILD || { log "configure failed"; exit 1; }

build() {  # build NAME: test_cuda of the scratch tree, logged as build-NAME
  local t0=$SECONDS
  timeout 400 ninja -C $BUILD -j16 test_cuda > "$OUT/build-$1.log" 2>&1
  local rc=$?
  log "build $1: exit $rc ($((SECONDS - t0)) s)"
  [ $rc = 0 ] || tail -n 20 "$OUT/build-$1.log"
  return $rc
}

# run_test NAME TEST: TEST alone on the scratch build (log NAME-TEST.log); prints its outcome:
# passed, failed, skipped, crashed (no result line, or a non-zero exit after OK), timeout, or
# missing (the filter ran no such test).
run_test() {
  local logf="$OUT/$1-$2.log"
  REDLITE_FIXTURES=$FIX timeout ${TEST_TIMEOUT:-180} "$BUILD/test_cuda" --gtest_filter="$2" > "$logf" 2>&1
  local rc=$?
  if ! grep -qF "[ RUN      ] $2" "$logf"; then echo missing
  elif grep -qF "[       OK ] $2 (" "$logf"; then [ $rc = 0 ] && echo passed || echo crashed
  elif grep -qF "[  FAILED  ] $2 (" "$logf"; then echo failed
  elif grep -qF "[  SKIPPED ] $2 (" "$logf"; then echo skipped
  elif [ $rc = 124 ]; then echo timeout
  else echo crashed
  fi
}
# What test TEST printed under NAME that says how far off it was (the exact tier's figures, the
# discarded tokens, the first failure), indented into the summary.
excerpt() {  # excerpt NAME TEST
  { grep -E "rel rms|discarded" "$OUT/$1-$2.log" | head -n 6; grep -m 1 -A 3 "Failure" "$OUT/$1-$2.log"; } |
    sed 's/^/     /' | tee -a "$OUT/summary.txt"
}

status=0
TESTS=$(for f in "${SELECTED[@]}"; do echo ${F_TESTS[$f]}; done | tr ' ' '\n' | sort -u)
if build clean; then
  for t in $TESTS; do
    r=$(run_test clean "$t")
    # A backend test over the fixture models ends skipped after running on the ones carried.
    [ "$r" = skipped ] && grep -q "ran on the fixture models present" "$OUT/clean-$t.log" && r="passed (then skipped: not every fixture carried)"
    log "clean $t: $r"
    excerpt clean "$t"
    case "$r" in passed*) ;; *) status=1 ;; esac
  done
else
  status=1
fi
[ $status = 0 ] && log "clean: PASS (every test passed)" || log "clean: FAIL (the clean tree does not pass; the faults' verdicts mean little)"

prev=""
for f in "${SELECTED[@]}"; do
  if [ $((SECONDS - T0)) -gt "${FAULTS_BUDGET_S:-480}" ]; then
    log "fault $f: NOT RUN (past FAULTS_BUDGET_S=${FAULTS_BUDGET_S:-480} s)"; status=1; continue
  fi
  [ -n "$prev" ] && cp "$ROOT/${F_FILE[$prev]}" "$SRC/${F_FILE[$prev]}"  # the previous fault undone
  prev=$f
  apply_fault "$f" $SRC || { log "fault $f: the patch did not apply"; status=1; continue; }
  build "$f" || { log "fault $f: FAIL (the faulted tree did not build)"; status=1; continue; }
  missed=""
  for t in ${F_TESTS[$f]}; do
    r=$(run_test "$f" "$t")
    log "fault $f, $t: $r"
    excerpt "$f" "$t"
    case "$r" in failed|crashed|timeout) ;; *) missed="$missed $t ($r)" ;; esac
  done
  if [ -z "$missed" ]; then log "fault $f: PASS (caught by every test: ${F_TESTS[$f]})"
  else log "fault $f: FAIL (not caught by:$missed)"; status=1
  fi
done
[ -n "$prev" ] && cp "$ROOT/${F_FILE[$prev]}" "$SRC/${F_FILE[$prev]}"
log "faults.sh: $([ $status = 0 ] && echo PASS || echo FAIL) ($((SECONDS - T0)) s)"
# At most 8 files come back: the logs and diffs go as one archive beside the summary.
(cd "$OUT" && tar -czf logs.tgz --remove-files *.log *.diff 2>/dev/null)
exit $status
