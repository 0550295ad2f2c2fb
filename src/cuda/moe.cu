// Mixture-of-experts glue: router softmax, SwiGLU, and the weighted combine of routed and shared
// experts. The expert products themselves are matvec_experts / matmul_experts on slot pointers.
#include <cub/block/block_scan.cuh>

#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kSoftmaxThreads = 256;

__global__ void softmax_kernel(const float* logits, float* probs, int n) {
  const float* x = logits + (size_t)blockIdx.x * n;
  float* y = probs + (size_t)blockIdx.x * n;
  __shared__ float red[kSoftmaxThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kSoftmaxThreads) m = fmaxf(m, x[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < kSoftmaxThreads / 32; w++) m = fmaxf(m, red[w]);
  __syncthreads();
  float s = 0.f;
  for (int i = threadIdx.x; i < n; i += kSoftmaxThreads) s += expf(x[i] - m);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) red[warp] = s;
  __syncthreads();
  s = 0.f;
  for (int w = 0; w < kSoftmaxThreads / 32; w++) s += red[w];
  for (int i = threadIdx.x; i < n; i += kSoftmaxThreads) y[i] = expf(x[i] - m) / s;
}

__global__ void swiglu_kernel(const float* gate, const float* up, float* act, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  act[i] = __fmul_rn(silu_f(gate[i]), up[i]);
}

__global__ void combine_kernel(float* x, const float* y, const int32_t* assign, const float* weights,
                               int k, const float* shared, const float* shared_gate, int width) {
  const int t = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= width) return;
  // The oracle: routed sum in double, then (float)routed + shared * sigmoid(gate), which its
  // compiler fuses into one fma; the residual add is a separate fp32 add.
  double routed = 0.0;
  for (int j = 0; j < k; j++)
    routed = fma((double)weights[(size_t)t * k + j], (double)y[(size_t)assign[(size_t)t * k + j] * width + c], routed);
  const float sg = sigmoid_f(shared_gate[t]);
  const float mix = __fmaf_rn(shared[(size_t)t * width + c], sg, (float)routed);
  x[(size_t)t * width + c] = __fadd_rn(x[(size_t)t * width + c], mix);
}

// combine_kernel for one token row per block, then the next RMSNorm of the new x (the two kernels'
// arithmetic; the squares of the values this thread wrote, summed in double).
constexpr int kMaxRouteK = 64;
constexpr int kCombineNormThreads = 512;  // as norm.cu's block-per-row kernels
__global__ void __launch_bounds__(kCombineNormThreads)
    combine_norm_kernel(float* x, const float* __restrict__ y, const int32_t* __restrict__ assign,
                        const float* __restrict__ weights, int k, const float* __restrict__ shared,
                        const float* __restrict__ shared_gate, int width, const float* __restrict__ norm_w, float eps,
                        float* __restrict__ out, int8_t* __restrict__ q8, float2* __restrict__ q8_ds) {
  pdl_trigger();
  pdl_wait();  // launched as a programmatic dependent: its inputs are the previous kernel's output
  const int t = blockIdx.x;
  __shared__ int as[kMaxRouteK];
  __shared__ float ws[kMaxRouteK];
  if (threadIdx.x < k) as[threadIdx.x] = assign[(size_t)t * k + threadIdx.x], ws[threadIdx.x] = weights[(size_t)t * k + threadIdx.x];
  float* xr = x + (size_t)t * width;
  // This thread's first columns of x, the shared expert's output and the norm weight do not wait
  // for the selections: their loads are issued before the barrier.
  const int c_first = 4 * threadIdx.x;
  float4 x_first = make_float4(0.f, 0.f, 0.f, 0.f), sh_first = x_first, nw_first = x_first;
  if (c_first < width) {
    x_first = *reinterpret_cast<const float4*>(xr + c_first);
    sh_first = *reinterpret_cast<const float4*>(shared + (size_t)t * width + c_first);
    nw_first = *reinterpret_cast<const float4*>(norm_w + c_first);
  }
  const float sg = sigmoid_f(shared_gate[t]);
  __syncthreads();
  // Columns in float4 groups, as rms_norm's block-per-row kernel takes them, so that the sum of
  // squares is formed in the same order and the result equals combine + rms_norm bit for bit.
  // The experts' rows are read with the selections outermost, so a thread's loads are independent.
  double ss = 0.0;
  for (int c0 = c_first; c0 < width; c0 += 4 * kCombineNormThreads) {
    const bool first = c0 == c_first;
    const float4 xv = first ? x_first : *reinterpret_cast<const float4*>(xr + c0);
    const float4 sv = first ? sh_first : *reinterpret_cast<const float4*>(shared + (size_t)t * width + c0);
    const float xs4[4] = {xv.x, xv.y, xv.z, xv.w}, sh4[4] = {sv.x, sv.y, sv.z, sv.w};
    double routed[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll 10
    for (int j = 0; j < k; j++) {
      const float4 yv = *reinterpret_cast<const float4*>(y + (size_t)as[j] * width + c0);
      const double wj = ws[j];
      routed[0] = fma(wj, (double)yv.x, routed[0]);
      routed[1] = fma(wj, (double)yv.y, routed[1]);
      routed[2] = fma(wj, (double)yv.z, routed[2]);
      routed[3] = fma(wj, (double)yv.w, routed[3]);
    }
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float mix = __fmaf_rn(sh4[i], sg, (float)routed[i]);
      v[i] = __fadd_rn(xs4[i], mix);
    }
    *reinterpret_cast<float4*>(xr + c0) = make_float4(v[0], v[1], v[2], v[3]);
    double s4 = (double)v[0] * v[0];
    s4 = fma((double)v[1], (double)v[1], s4);
    s4 = fma((double)v[2], (double)v[2], s4);
    ss += fma((double)v[3], (double)v[3], s4);
    if (first) x_first = make_float4(v[0], v[1], v[2], v[3]);
  }
  ss = block_sum_d<kCombineNormThreads>(ss);
  const double scale = 1.0 / sqrt(ss / (double)width + (double)eps);
  // Each thread scales the columns it wrote (the first group from registers).
  for (int c0 = c_first; c0 < width; c0 += 4 * kCombineNormThreads) {
    const bool first = c0 == c_first;
    const float4 xv = first ? x_first : *reinterpret_cast<const float4*>(xr + c0);
    const float4 nw = first ? nw_first : *reinterpret_cast<const float4*>(norm_w + c0);
    const float4 o = make_float4((float)(xv.x * scale * nw.x), (float)(xv.y * scale * nw.y),
                                 (float)(xv.z * scale * nw.z), (float)(xv.w * scale * nw.w));
    *reinterpret_cast<float4*>(out + (size_t)t * width + c0) = o;
    // The output's Q8 form (the next layer's matvec-q8 input), where the launcher asks for it.
    if (q8) store_q8_quad(o, q8 + (size_t)t * width, q8_ds + (size_t)t * (width / 32), c0);
  }
}

__global__ void gather_kernel(const uint32_t* src, const int32_t* idx, uint32_t* dst, int width) {
  const int i = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < width) dst[(size_t)i * width + c] = src[(size_t)idx[i] * width + c];
}

constexpr int kMaxRouteExperts = 2048;

constexpr int kRouteThreads = 256;

// Where selection k (expert e) of a token reads its expert: its slot when resident (addr); else,
// with miss_stride 0, `fallback` (any slot: the host discards the token); with a host copy
// (--miss-reads host, fallback = the layer's experts there, miss_stride apart): the staging slot
// the prediction branch already filled when e was predicted and staged (pred), else that copy, or,
// with staging, staging slot k, which stage_misses fills from the copy (miss_src[k]; nullptr for a
// hit or a staged prediction, which stage_misses skips). One token a call (the decode graph's).
__device__ __forceinline__ const uint8_t* route_slot(uint64_t addr, int e, int k, const uint8_t* fallback,
                                                     size_t miss_stride, const uint8_t* staging,
                                                     const uint8_t** miss_src, const StagedPrediction& pred) {
  const uint8_t* slot = addr ? reinterpret_cast<const uint8_t*>(addr) : nullptr;
  for (int j = 0; !slot && j < pred.n; j++)
    if (pred.experts[j] == e) slot = pred.slots + (size_t)j * miss_stride;
  const uint8_t* copy = fallback + (size_t)e * miss_stride;  // the miss's source (host copy or any slot)
  if (staging) miss_src[k] = slot ? nullptr : copy;
  return slot ? slot : staging ? staging + (size_t)k * miss_stride : copy;
}

// One block per token (blockIdx.x; logits, ids, weights, slot_ptrs and miss_count advance by
// token). The block computes the exponentials (one double exp per expert, the slow part) and the
// sort keys; then one warp selects, with no further block barriers. Without a residency row only
// ids and weights are written.
//
// The oracle (cpu/forward.cpp, the MoE router) sums the exponentials sequentially in expert order;
// here they are summed as a tree in double. The two sums differ by at most a few units of double
// rounding, which moves an fp32 probability only if it lies within ~1e-16 (relative) of an fp32
// rounding boundary. The selection is exact: K rounds of arg-max over keys (fp32 probability bits,
// then the complement of the index), i.e. probability descending then index ascending — the order
// of the oracle's partial_sort.
__global__ void __launch_bounds__(kRouteThreads) route_kernel(
    const float* logits, int E, int K, float scale, const uint64_t* residency, const uint8_t* fallback,
    size_t miss_stride, const uint8_t* staging, const uint8_t** miss_src, StagedPrediction pred, int32_t* ids,
    float* weights, const uint8_t** slot_ptrs, int32_t* miss_count) {
  pdl_trigger();
  pdl_wait();  // launched as a programmatic dependent: its inputs are the previous kernel's output
  __shared__ unsigned long long keys[kMaxRouteExperts];
  __shared__ unsigned long long sel[kMaxRouteK];
  __shared__ uint64_t res[kMaxRouteExperts];  // the residency row, fetched while the exponentials run
  __shared__ float wmax[kRouteThreads / 32];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  logits += (size_t)blockIdx.x * E;
  ids += (size_t)blockIdx.x * K;
  weights += (size_t)blockIdx.x * K;
  if (residency)
    for (int e = tid; e < E; e += kRouteThreads) res[e] = residency[e];

  float m = -INFINITY;
  for (int e = tid; e < E; e += kRouteThreads) m = fmaxf(m, logits[e]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) wmax[warp] = m;
  __syncthreads();
  m = wmax[0];
  for (int w = 1; w < kRouteThreads / 32; w++) m = fmaxf(m, wmax[w]);
  const double max_l = m;
  constexpr int kPer = kMaxRouteExperts / kRouteThreads;
  double ex[kPer];
  double part = 0.0;
#pragma unroll
  for (int i = 0; i < kPer; i++) {
    const int e = tid + i * kRouteThreads;
    ex[i] = e < E ? exp((double)logits[e] - max_l) : 0.0;
    part += ex[i];
  }
  const double total = block_sum_d<kRouteThreads>(part);
#pragma unroll
  for (int i = 0; i < kPer; i++) {
    const int e = tid + i * kRouteThreads;
    if (e < E) {
      const float p = (float)(ex[i] / total);
      keys[e] = ((unsigned long long)__float_as_uint(p) << 32) | (0xFFFFFFFFu - (unsigned)e);
    }
  }
  __syncthreads();
  if (warp != 0) return;

  // Warp 0: lane l owns experts l, l+32, ...; it keeps its best key in a register. A round's
  // arg-max is two warp reductions (the hardware's 32-bit max): the largest probability bits, then
  // among the lanes that hold them the largest index complement (every real key's is > 0).
  unsigned long long best = 0;
  for (int e = lane; e < E; e += 32) best = keys[e] > best ? keys[e] : best;
  for (int k = 0; k < K; k++) {
    const unsigned hi = (unsigned)(best >> 32);
    const unsigned top_hi = __reduce_max_sync(0xffffffffu, hi);
    const unsigned top_lo = __reduce_max_sync(0xffffffffu, hi == top_hi ? (unsigned)best : 0u);
    const unsigned long long top = ((unsigned long long)top_hi << 32) | top_lo;
    if (lane == 0) sel[k] = top;
    const int e_top = (int)(0xFFFFFFFFu - top_lo);
    if ((e_top & 31) == lane) {  // the owner drops it and finds its next best
      keys[e_top] = 0;
      best = 0;
      for (int e = lane; e < E; e += 32) best = keys[e] > best ? keys[e] : best;
    }
  }
  __syncwarp();

  int misses = 0;
  for (int k0 = 0; k0 < K; k0 += 32) {
    const int k = k0 + lane;
    bool miss = false;
    if (k < K) {
      double selected = 0.0;  // the oracle's order: selection order
      for (int i = 0; i < K; i++) selected += __uint_as_float((unsigned)(sel[i] >> 32));
      const float p = __uint_as_float((unsigned)(sel[k] >> 32));
      const int e = (int)(0xFFFFFFFFu - (unsigned)(sel[k] & 0xFFFFFFFFu));
      double wk = p / selected;
      if (scale != 0.0f) wk *= scale;
      ids[k] = e;
      weights[k] = (float)wk;
      if (residency) {
        const uint64_t addr = res[e];
        miss = addr == 0;
        slot_ptrs[(size_t)blockIdx.x * K + k] = route_slot(addr, e, k, fallback, miss_stride, staging, miss_src, pred);
      }
    }
    misses += __popc(__ballot_sync(0xffffffffu, miss));
  }
  if (lane == 0 && residency) miss_count[blockIdx.x] = misses;
}


// group_by_expert in one block: counts per expert (shared-memory atomics), one block scan of the
// rows and of the groups per expert (packed in one 64-bit sum: rows above, groups below), then
// the group table (and the number of experts with rows), then each selection's row (a per-expert
// cursor).
constexpr int kGroupThreads = 512;
__global__ void __launch_bounds__(kGroupThreads) group_kernel(const int32_t* ids, int n, int k, int n_expert,
                                                                 const uint64_t* residency, int32_t* gather,
                                                                 int32_t* assign, const uint8_t** slot_ptrs,
                                                                 int32_t* group_off, int32_t* group_cnt,
                                                                 int n_groups, int32_t* n_distinct) {
  using Scan = cub::BlockScan<long long, kGroupThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int count[kMaxGroupExperts], start[kMaxGroupExperts], first_group[kMaxGroupExperts];
  __shared__ int used_groups, distinct;
  const int tid = threadIdx.x;
  for (int e = tid; e < n_expert; e += kGroupThreads) count[e] = 0;
  __syncthreads();
  for (int i = tid; i < n; i += kGroupThreads) atomicAdd(&count[ids[i]], 1);
  __syncthreads();
  constexpr int kPer = kMaxGroupExperts / kGroupThreads;  // experts per thread, consecutive
  long long mine = 0;
#pragma unroll
  for (int j = 0; j < kPer; j++) {
    const int e = tid * kPer + j;
    if (e < n_expert) mine += ((long long)count[e] << 32) + (count[e] + kExpertGroupRows - 1) / kExpertGroupRows;
  }
  long long before, all;
  Scan(scan_tmp).ExclusiveSum(mine, before, all);
  int row = (int)(before >> 32), group = (int)(before & 0xFFFFFFFF);
#pragma unroll
  for (int j = 0; j < kPer; j++) {
    const int e = tid * kPer + j;
    if (e < n_expert) {
      start[e] = row, first_group[e] = group;
      row += count[e], group += (count[e] + kExpertGroupRows - 1) / kExpertGroupRows;
    }
  }
  if (tid == 0) used_groups = (int)(all & 0xFFFFFFFF), distinct = 0;
  __syncthreads();
  for (int e = tid; e < n_expert; e += kGroupThreads) {
    const uint8_t* slot = reinterpret_cast<const uint8_t*>(residency[e]);
    if (count[e] > 0) atomicAdd(&distinct, 1);
    for (int r = 0, v = first_group[e]; r < count[e]; r += kExpertGroupRows, v++) {
      slot_ptrs[v] = slot;
      group_off[v] = start[e] + r;
      group_cnt[v] = min(kExpertGroupRows, count[e] - r);
    }
  }
  for (int v = used_groups + tid; v < n_groups; v += kGroupThreads) {
    slot_ptrs[v] = nullptr;
    group_off[v] = 0;
    group_cnt[v] = 0;
  }
  __syncthreads();
  if (tid == 0 && n_distinct) *n_distinct = distinct;
  for (int e = tid; e < n_expert; e += kGroupThreads) count[e] = start[e];  // the cursors
  __syncthreads();
  for (int i = tid; i < n; i += kGroupThreads) {
    const int a = atomicAdd(&count[ids[i]], 1);
    gather[a] = i / k;
    assign[i] = a;
  }
}


// The fast tier's routing (Sums::kFast): one warp per token, the same rule in fp32 — softmax with
// __expf and a warp-tree sum, the same keys (probability bits, then the index complement) and K
// rounds of arg-max, weights renormalised in fp32 — with no block barrier and no double
// arithmetic. A selection can differ from the exact tier's only where two probabilities lie within
// fp32 rounding of each other. Keys in shared memory (kMaxRouteExperts of them).
constexpr int kRouteWarpsF32 = 4;  // tokens per block (one warp each)
__global__ void __launch_bounds__(32 * kRouteWarpsF32) route_kernel_f32(
    const float* logits, int T, int E, int K, float scale, const uint64_t* residency, const uint8_t* fallback,
    size_t miss_stride, const uint8_t* staging, const uint8_t** miss_src, StagedPrediction pred, int32_t* ids,
    float* weights, const uint8_t** slot_ptrs, int32_t* miss_count) {
  pdl_trigger();
  pdl_wait();  // launched as a programmatic dependent: its inputs are the previous kernel's output
  __shared__ float probs[kRouteWarpsF32][kMaxRouteExperts];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int t = blockIdx.x * kRouteWarpsF32 + warp;
  if (t >= T) return;
  logits += (size_t)t * E;
  float* pr = probs[warp];
  // Every logit of the lane's share loaded at once (unrolled, predicated), so the loads overlap
  // instead of costing a memory round trip each.
  constexpr int kPerLane = kMaxRouteExperts / 32;
  float lv[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; i++) lv[i] = lane + 32 * i < E ? logits[lane + 32 * i] : -INFINITY;
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; i++) m = fmaxf(m, lv[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float part = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; i++)
    if (lane + 32 * i < E) {
      const float ex = __expf(lv[i] - m);
      pr[lane + 32 * i] = ex;
      part += ex;
    }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  const float inv = 1.0f / part;
  // Lane l owns experts l, l+32, ...: it keeps its best key in a register and rescans its own
  // share after giving one up; a round's arg-max is two warp max reductions.
  unsigned long long best = 0;
#pragma unroll 16
  for (int e = lane; e < E; e += 32) {
    const float p = pr[e] * inv;
    pr[e] = p;
    const unsigned long long key = ((unsigned long long)__float_as_uint(p) << 32) | (0xFFFFFFFFu - (unsigned)e);
    best = key > best ? key : best;
  }
  float my_p = 0.f, selected = 0.f;
  int my_e = 0;
  for (int k = 0; k < K; k++) {
    const unsigned hi = (unsigned)(best >> 32);
    const unsigned top_hi = __reduce_max_sync(0xffffffffu, hi);
    const unsigned top_lo = __reduce_max_sync(0xffffffffu, hi == top_hi ? (unsigned)best : 0u);
    const int e_top = (int)(0xFFFFFFFFu - top_lo);
    const float p_top = __uint_as_float(top_hi);
    selected += p_top;
    if (k % 32 == lane) my_p = p_top, my_e = e_top;
    if ((e_top & 31) == lane) {
      pr[e_top] = -1.0f;  // below every probability: never chosen again
      best = 0;
#pragma unroll 16
      for (int e = lane; e < E; e += 32) {
        const float p = pr[e];
        if (p < 0.f) continue;
        const unsigned long long key = ((unsigned long long)__float_as_uint(p) << 32) | (0xFFFFFFFFu - (unsigned)e);
        best = key > best ? key : best;
      }
    }
  }
  // K <= 32 (kMaxRouteK): lane k writes selection k.
  bool miss = false;
  if (lane < K) {
    float wk = my_p / selected;
    if (scale != 0.0f) wk *= scale;
    ids[(size_t)t * K + lane] = my_e;
    weights[(size_t)t * K + lane] = wk;
    if (residency) {
      const uint64_t addr = residency[my_e];
      miss = addr == 0;
      slot_ptrs[(size_t)t * K + lane] = route_slot(addr, my_e, lane, fallback, miss_stride, staging, miss_src, pred);
    }
  }
  const int misses = __popc(__ballot_sync(0xffffffffu, miss));
  if (lane == 0 && residency) miss_count[t] = misses;
}
}  // namespace

namespace {
void launch_route(const float* logits, int T, int n_expert, int k, float scale, const uint64_t* residency_row,
                  const uint8_t* fallback, size_t miss_stride, const uint8_t* staging, const uint8_t** miss_src,
                  StagedPrediction pred, int32_t* ids, float* weights, const uint8_t** slot_ptrs,
                  int32_t* miss_count, cudaStream_t stream, Sums sums) {
  if ((staging || pred.n) && (T != 1 || !residency_row || miss_stride == 0))
    throw_error("route_topk: staging takes one token with a residency row and a host copy");
  if (pred.n < 0 || pred.n > kMaxRouteK || (pred.n && (!pred.experts || !pred.slots)))
    throw_error("route_topk: a staged prediction of " + std::to_string(pred.n) + " experts without its buffers");
  if (k < 1 || k > kMaxRouteK || k > n_expert)
    throw_error("route_topk: " + std::to_string(k) + " experts per token out of 1.." +
                std::to_string(kMaxRouteK) + " (n_expert " + std::to_string(n_expert) + ")");
  if (n_expert > kMaxRouteExperts)
    throw_error("route_topk: " + std::to_string(n_expert) + " experts (at most " + std::to_string(kMaxRouteExperts) + ")");
  if (T == 0) return;
  if (sums == Sums::kFast) {
    if (k > 32) throw_error("route_topk: " + std::to_string(k) + " experts per token (the fast tier's routing takes 32)");
    launch_dependent(route_kernel_f32, dim3((T + kRouteWarpsF32 - 1) / kRouteWarpsF32), dim3(32 * kRouteWarpsF32),
                     stream, logits, T, n_expert, k, scale, residency_row, fallback, miss_stride, staging, miss_src,
                     pred, ids, weights, slot_ptrs, miss_count);
  } else {
    launch_dependent(route_kernel, dim3(T), dim3(kRouteThreads), stream, logits, n_expert, k, scale, residency_row,
                     fallback, miss_stride, staging, miss_src, pred, ids, weights, slot_ptrs, miss_count);
  }
  RL_CUDA_LAUNCH_CHECK();
}
}  // namespace

void route_topk(const float* logits, int n_expert, int k, float scale, const uint64_t* residency_row,
                const uint8_t* fallback, int32_t* ids, float* weights, const uint8_t** slot_ptrs,
                int32_t* miss_count, cudaStream_t stream, Sums sums, size_t miss_stride, const uint8_t* staging,
                const uint8_t** miss_src, StagedPrediction pred) {
  launch_route(logits, 1, n_expert, k, scale, residency_row, fallback, miss_stride, staging, miss_src, pred, ids,
               weights, slot_ptrs, miss_count, stream, sums);
}

namespace {
// The staging kernels' grids are (kStageBlocks, experts): the blocks of column j copy one expert,
// 16 bytes a thread a step, so every read over the link is a whole, aligned 16-byte piece of a row
// of loads.
constexpr int kStageBlocks = 64, kStageThreads = 256;
__device__ __forceinline__ void stage_expert(const uint8_t* from, uint8_t* to, size_t bytes) {
  const uint4* in = reinterpret_cast<const uint4*>(from);
  uint4* out = reinterpret_cast<uint4*>(to);
  const size_t n = bytes / sizeof(uint4);
  for (size_t i = (size_t)blockIdx.x * kStageThreads + threadIdx.x; i < n; i += (size_t)kStageBlocks * kStageThreads)
    out[i] = in[i];
}

// Column k: selection k's expert from its host copy (src[k], mapped host memory; nullptr: a hit,
// nothing to copy) to staging slot k.
__global__ void __launch_bounds__(kStageThreads)
    stage_misses_kernel(const uint8_t* const* src, uint8_t* staging, size_t bytes, size_t stride) {
  pdl_trigger();
  pdl_wait();  // src comes from the routing before it
  const uint8_t* from = src[blockIdx.y];
  if (from) stage_expert(from, staging + (size_t)blockIdx.y * stride, bytes);
}

// One warp: staged[j] = ids[j] where that predicted expert is not resident, else -1.
__global__ void name_predicted_misses_kernel(const int32_t* ids, int n, const uint64_t* residency, int32_t* staged) {
  pdl_trigger();
  pdl_wait();  // ids come from the prediction's routing before it
  for (int j = threadIdx.x; j < n; j += 32) staged[j] = residency[ids[j]] == 0 ? ids[j] : -1;
}

// Column j: predicted miss staged[j] (-1: none) from its host copy to staging slot j.
__global__ void __launch_bounds__(kStageThreads)
    stage_predicted_kernel(const int32_t* staged, const uint8_t* host, size_t bytes, size_t stride,
                           uint8_t* staging) {
  pdl_trigger();
  pdl_wait();  // staged comes from name_predicted_misses before it
  const int e = staged[blockIdx.y];
  if (e >= 0) stage_expert(host + (size_t)e * stride, staging + (size_t)blockIdx.y * stride, bytes);
}

void check_stage_shape(const char* what, size_t bytes, size_t stride, const void* staging) {
  if (bytes % sizeof(uint4) != 0 || stride % sizeof(uint4) != 0 || bytes > stride ||
      reinterpret_cast<uintptr_t>(staging) % sizeof(uint4) != 0)
    throw_error(std::string(what) + ": experts of " + std::to_string(bytes) + " bytes " + std::to_string(stride) +
                " apart must be whole 16-byte pieces, 16-byte aligned");
}

// The staging launchers' count of experts (what: the launcher; noun: what it counts).
void check_stage_count(const char* what, int n, const char* noun) {
  if (n < 1 || n > kMaxRouteK)
    throw_error(std::string(what) + ": " + std::to_string(n) + " " + noun + " out of 1.." + std::to_string(kMaxRouteK));
}
}  // namespace

void name_predicted_misses(const int32_t* ids, int n, const uint64_t* residency_row, int32_t* staged,
                           cudaStream_t stream) {
  check_stage_count("name_predicted_misses", n, "experts");
  launch_dependent(name_predicted_misses_kernel, dim3(1), dim3(32), stream, ids, n, residency_row, staged);
  RL_CUDA_LAUNCH_CHECK();
}

void stage_predicted(const int32_t* staged, int n, const uint8_t* host, size_t bytes, size_t stride,
                     uint8_t* staging, cudaStream_t stream) {
  check_stage_count("stage_predicted", n, "experts");
  check_stage_shape("stage_predicted", bytes, stride, staging);
  launch_dependent(stage_predicted_kernel, dim3(kStageBlocks, (unsigned)n), dim3(kStageThreads), stream, staged, host,
                   bytes, stride, staging);
  RL_CUDA_LAUNCH_CHECK();
}

void stage_misses(const uint8_t* const* src, uint8_t* staging, int k, size_t bytes, size_t stride,
                  cudaStream_t stream) {
  check_stage_count("stage_misses", k, "selections");
  check_stage_shape("stage_misses", bytes, stride, staging);
  launch_dependent(stage_misses_kernel, dim3(kStageBlocks, (unsigned)k), dim3(kStageThreads), stream, src, staging,
                   bytes, stride);
  RL_CUDA_LAUNCH_CHECK();
}

void route_tokens(const float* logits, int T, int n_expert, int k, float scale, int32_t* ids, float* weights,
                  cudaStream_t stream, Sums sums) {
  launch_route(logits, T, n_expert, k, scale, nullptr, nullptr, 0, nullptr, nullptr, StagedPrediction{}, ids, weights,
               nullptr, nullptr, stream, sums);
}

void softmax_rows(const float* logits, float* probs, int T, int n, cudaStream_t stream) {
  if (T == 0) return;
  softmax_kernel<<<T, kSoftmaxThreads, 0, stream>>>(logits, probs, n);
  RL_CUDA_LAUNCH_CHECK();
}

void swiglu(const float* gate, const float* up, float* act, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(gate, up, act, n);
  RL_CUDA_LAUNCH_CHECK();
}

void moe_combine(float* x, const float* y, const int32_t* assign, const float* weights, int k,
                 const float* shared, const float* shared_gate, int T, int width,
                 cudaStream_t stream) {
  if (T == 0) return;
  combine_kernel<<<dim3((width + 255) / 256, T), 256, 0, stream>>>(x, y, assign, weights, k, shared,
                                                                   shared_gate, width);
  RL_CUDA_LAUNCH_CHECK();
}

void moe_combine_norm(float* x, const float* y, const int32_t* assign, const float* weights, int k,
                      const float* shared, const float* shared_gate, int T, int width, const float* norm_w, float eps,
                      float* out, cudaStream_t stream, int8_t* q8, float2* q8_ds) {
  if (T == 0) return;
  if (width % 4 != 0) throw_error("moe_combine_norm: width " + std::to_string(width) + " is not a multiple of 4");
  if (k > kMaxRouteK) throw_error("moe_combine_norm: " + std::to_string(k) + " experts per token (at most " + std::to_string(kMaxRouteK) + ")");
  launch_with_q8_output("moe_combine_norm", out, T, width, q8, q8_ds, stream, [&](int8_t* q, float2* ds) {
    launch_dependent(combine_norm_kernel, dim3(T), dim3(kCombineNormThreads), stream, x, y, assign, weights, k,
                     shared, shared_gate, width, norm_w, eps, out, q, ds);
    RL_CUDA_LAUNCH_CHECK();
  });
}

namespace {
__global__ void pair_slots_kernel(const int32_t* __restrict__ ids, int n, const uint64_t* __restrict__ residency,
                                  const uint8_t* fallback, const uint8_t** slot_ptrs, int32_t* n_distinct) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const uint64_t addr = residency[ids[i]];
    slot_ptrs[i] = addr ? reinterpret_cast<const uint8_t*>(addr) : fallback;
  }
  if (i == 0 && n_distinct) *n_distinct = n;
}
}  // namespace

void pair_slots(const int32_t* ids, int n, const uint64_t* residency_row, const uint8_t* fallback,
                const uint8_t** slot_ptrs, int32_t* n_distinct, cudaStream_t stream) {
  if (n == 0) return;
  pair_slots_kernel<<<(unsigned)((n + 127) / 128), 128, 0, stream>>>(ids, n, residency_row, fallback, slot_ptrs,
                                                                     n_distinct);
  RL_CUDA_LAUNCH_CHECK();
}

void gather_words(const void* src, const int32_t* idx, void* dst, int n, int width, cudaStream_t stream) {
  if (n == 0 || width == 0) return;
  gather_kernel<<<dim3((width + 255) / 256, n), 256, 0, stream>>>(static_cast<const uint32_t*>(src), idx,
                                                                   static_cast<uint32_t*>(dst), width);
  RL_CUDA_LAUNCH_CHECK();
}

void gather_rows(const float* src, const int32_t* idx, float* dst, int n, int width, cudaStream_t stream) {
  gather_words(src, idx, dst, n, width, stream);
}

void group_by_expert(const int32_t* ids, int n, int k, int n_expert, const uint64_t* residency_row, int32_t* gather,
                     int32_t* assign, const uint8_t** slot_ptrs, int32_t* group_off, int32_t* group_cnt,
                     int n_groups, int32_t* n_distinct, cudaStream_t stream) {
  if (n_expert <= 0 || n_expert > kMaxGroupExperts)
    throw_error("group_by_expert: " + std::to_string(n_expert) + " experts (1 to " + std::to_string(kMaxGroupExperts) +
                " supported)");
  if (n < 0 || k <= 0 || n % k != 0) throw_error("group_by_expert: " + std::to_string(n) + " selections of " + std::to_string(k));
  if (n_groups < expert_group_bound(n, n_expert))
    throw_error("group_by_expert: " + std::to_string(n_groups) + " groups cannot hold " + std::to_string(n) +
                " selections of " + std::to_string(n_expert) + " experts");
  group_kernel<<<1, kGroupThreads, 0, stream>>>(ids, n, k, n_expert, residency_row, gather, assign, slot_ptrs,
                                                 group_off, group_cnt, n_groups, n_distinct);
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
