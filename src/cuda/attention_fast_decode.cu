// The fast tier's decode attention (attention_fast.cu has the function and the chunk kernel).
//
// Decode (T = 1): flash-decoding on tensor cores. The keys 0 .. pos go in at most max_splits (≤
// kFastDecodeMaxSplits) splits of at least kMinSplitKeys keys: as many as fill the GPU at short
// depth, longer ones at long depth, so the split buffers do not grow with the context. A block takes
// one split and up to 8 query heads of one KV head (each key read once for all of them); its warps
// take the split's keys 8 at a time, round robin, each with its own running softmax, all in
// registers straight from the cache (no shared-memory staging):
//   S = Q·Kᵀ by mma.m16n8k16, M = the block's heads (padded to 16), N = the 8 keys, K = dims:
//     lane (g, q) (g = lane/4, q = lane%4) loads dims 8(4i + q) .. +7 of key g for i < hd/32, which
//     are mma's B fragments of two dim steps (a dim step's 16 dims are any 16 the A and B fragments
//     agree on), and holds the same dims of head g's query as A fragments for the whole split;
//   P = exp2(S - m) in fp32 (the running maximum m and sum per head, reduced over the 4 lanes of a
//     head), rounded to fp16: lane (g, q) holds P[head g][keys 2q, 2q + 1], mma's B fragment of
//   Oᵀ += Vᵀ·Pᵀ by mma.m16n8k8, M = 16 dims, N = heads, K = the 8 keys: lane (g, q) loads dims
//     64j + 8g .. +7 of keys 2q and 2q + 1 and pairs them (byte_perm) into A fragments, dim
//     64j + 8g + 2u being row g of m-tile (j, u) and the next dim row g + 8. The output is fully
//     used (rows are dims), where the score mma wastes half its rows on padding heads.
// At the end the warps' partials are folded in shared memory into the block's partial maximum, sum
// and weighted values, and a second kernel folds the splits and applies the gate. The position is
// read from pos_dev when given, so a captured graph replays at any depth.
//
// The caches are of any --kv-type, read through kv_cache_device.cuh's accessor (KvOct: eight
// values as fp16 pairs).
//
// Accuracy: as the prefill (attention_fast.cu): q, k, v and p rounded to fp16, fp32 sums: ~1e-3
// relative RMS for scores of spread 2.
#include "cuda/attention_fast.cuh"
#include "cuda/cuda_check.h"
#include "cuda/math_device.cuh"

#include <algorithm>

namespace rl::cuda::fast_attention {

namespace {

constexpr int kDecodeThreads = 256;    // the combine kernel's block
constexpr int kSplitWarps = 4;         // warps a split block; each takes every 4th round of 8 keys
constexpr int kSplitThreads = 32 * kSplitWarps;
constexpr int kStepKeys = 8;           // keys a warp takes at once (one score mma's N)
constexpr int kMinSplitKeys = 64;      // shortest split: below it a block's fixed costs dominate
constexpr int kMaxDecodeHeadsF = 8;    // query heads of one KV head a block (the score mma's 16 rows hold them)
constexpr int kCombineUnroll = 8;      // split partials a combine thread loads at once
static_assert(kFastDecodeMaxSplits <= kFastSplitPartials, "a decode step's partials fit the buffers");

// The splits of a step at n keys, and split s's first key: n·s/ns, so none is empty (ns ≤ n).
__host__ __device__ __forceinline__ int decode_splits(int n_keys, int max_splits) {
  const int by_length = (n_keys + kMinSplitKeys - 1) / kMinSplitKeys;
  return by_length < max_splits ? by_length : max_splits;
}
__device__ __forceinline__ int split_begin(int s, int n_keys, int ns) {
  return (int)((long long)s * n_keys / ns);
}

// Shared memory of a split block: each warp's maximum and sum per head and its weighted values
// [head][dim] (unnormalised, against its own maximum), folded at the end.
template <int TIER>
struct SplitSmem {
  float m[kSplitWarps][kMaxDecodeHeadsF], l[kSplitWarps][kMaxDecodeHeadsF];
  float acc[kSplitWarps][kMaxDecodeHeadsF][TIER];
};

// Block (head group, split): query heads h0 .. h0 + gb - 1 (one KV head, gb ≤ 8) over the split's
// keys, head dims up to TIER (a multiple of 64; dims from hd to TIER load as zeros). With `rows`
// (a batched decode step): blockIdx.z is the row, whose query is row z of q, its cache, split
// buffers and position rows[z]'s and pos_dev[z].
template <int TIER, class E>
__global__ void __launch_bounds__(kSplitThreads) attention_decode_split_fast_kernel(
    const float* __restrict__ q, KvPlane<E> kc, KvPlane<E> vc, float* __restrict__ part_acc,
    float* __restrict__ part_ml, int n_head, int n_kv, int hd, int gb, int pos0, const int32_t* __restrict__ pos_dev,
    float scale_log2, int max_splits, const AttentionRow* __restrict__ rows) {
  constexpr int kChunks = TIER / 32, kGroups = TIER / 64;
  if (rows) {
    const AttentionRow& r = rows[blockIdx.z];
    kc = KvPlane<E>::of(r.cache.k, r.cache.n_ctx, (size_t)n_kv * hd);
    vc = KvPlane<E>::of(r.cache.v, r.cache.n_ctx, (size_t)n_kv * hd);
    part_acc = r.splits.acc;
    part_ml = r.splits.ml;
    max_splits = r.splits.max_splits;
    q += (size_t)blockIdx.z * n_head * hd;
    pos0 = pos_dev[blockIdx.z];
  } else if (pos_dev) {
    pos0 = pos_dev[0];
  }
  const int n_keys = pos0 + 1, ns = decode_splits(n_keys, max_splits), split = blockIdx.y;
  if (split >= ns) return;
  const int jb = split_begin(split, n_keys, ns), je = split_begin(split + 1, n_keys, ns);
  const int h0 = blockIdx.x * gb, kv_off = (h0 / (n_head / n_kv)) * hd;
  const size_t kv_row = (size_t)n_kv * hd;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, fq = lane % 4;
  __shared__ SplitSmem<TIER> sm;

  // Head g's query, dims 8(4i + q) .. +7, times scale·log2(e), as fp16 pairs (zero past hd and gb).
  uint4 qf[kChunks];
#pragma unroll
  for (int i = 0; i < kChunks; i++) {
    const int d = 8 * (4 * i + fq);
    qf[i] = make_uint4(0u, 0u, 0u, 0u);
    if (d < hd && g < gb) {
      const float* qr = q + (size_t)(h0 + g) * hd + d;
      const float4 a = *reinterpret_cast<const float4*>(qr), b = *reinterpret_cast<const float4*>(qr + 4);
      qf[i] = make_uint4(pack_half2(a.x * scale_log2, a.y * scale_log2), pack_half2(a.z * scale_log2, a.w * scale_log2),
                         pack_half2(b.x * scale_log2, b.y * scale_log2), pack_half2(b.z * scale_log2, b.w * scale_log2));
    }
  }
  // Oᵀ: o[j][u] = {O[2q][r], O[2q + 1][r], O[2q][r + 1], O[2q + 1][r + 1]}, r = 64j + 8g + 2u.
  float o[kGroups][4][4];
#pragma unroll
  for (int j = 0; j < kGroups; j++)
#pragma unroll
    for (int u = 0; u < 4; u++) o[j][u][0] = o[j][u][1] = o[j][u][2] = o[j][u][3] = 0.0f;
  float m_run = -INFINITY, l_run = 0.0f;  // head g's (l: over this lane's keys)

  for (int j0 = jb + warp * kStepKeys; j0 < je; j0 += kSplitWarps * kStepKeys) {
    // Loads: key j0 + g's dims for the scores, keys j0 + 2q and + 1's for the values (keys past the
    // split repeat its last one and are masked).
    const int last = je - 1;
    const auto krow = kc.row(min(j0 + g, last), kv_row, kv_off);
    const auto va_row = vc.row(min(j0 + 2 * fq, last), kv_row, kv_off);
    const auto vb_row = vc.row(min(j0 + 2 * fq + 1, last), kv_row, kv_off);
    uint4 kf[kChunks], va[kGroups], vb[kGroups];
#pragma unroll
    for (int i = 0; i < kChunks; i++) {
      const int d = 8 * (4 * i + fq);
      kf[i] = d < hd ? KvOct<E>::load(krow, d) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int j = 0; j < kGroups; j++) {
      const int d = 64 * j + 8 * g;
      va[j] = d < hd ? KvOct<E>::load(va_row, d) : make_uint4(0u, 0u, 0u, 0u);
      vb[j] = d < hd ? KvOct<E>::load(vb_row, d) : make_uint4(0u, 0u, 0u, 0u);
    }
    // s = {S[head g][key 2q], S[head g][key 2q + 1], padding rows}.
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kChunks; i++) {
      if (8 * 4 * i >= hd) break;
      const uint32_t a0[4] = {qf[i].x, 0u, qf[i].y, 0u}, a1[4] = {qf[i].z, 0u, qf[i].w, 0u};
      mma_f16(s, a0, kf[i].x, kf[i].y);
      mma_f16(s, a1, kf[i].z, kf[i].w);
    }
    const int key = j0 + 2 * fq;
    const float s0 = key < je ? s[0] : -INFINITY, s1 = key + 1 < je ? s[1] : -INFINITY;
    float mx = fmaxf(s0, s1);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run, mx);  // finite: key j0 < je is in every step
    const float alpha = exp2f(m_run - m_new), p0 = exp2f(s0 - m_new), p1 = exp2f(s1 - m_new);
    l_run = fmaf(l_run, alpha, p0 + p1);
    m_run = m_new;
    // The rescale of heads 2q and 2q + 1, whose alphas lanes 8q and 8q + 4 hold.
    const float a_lo = __shfl_sync(0xffffffffu, alpha, 8 * fq), a_hi = __shfl_sync(0xffffffffu, alpha, 8 * fq + 4);
    const uint32_t pb = pack_half2(p0, p1);
#pragma unroll
    for (int j = 0; j < kGroups; j++) {
      if (64 * j >= hd) break;
      const uint32_t wa[4] = {va[j].x, va[j].y, va[j].z, va[j].w}, wb[4] = {vb[j].x, vb[j].y, vb[j].z, vb[j].w};
#pragma unroll
      for (int u = 0; u < 4; u++) {
        o[j][u][0] *= a_lo, o[j][u][1] *= a_hi, o[j][u][2] *= a_lo, o[j][u][3] *= a_hi;
        mma_f16_k8(o[j][u], __byte_perm(wa[u], wb[u], 0x5410), __byte_perm(wa[u], wb[u], 0x7632), pb);
      }
    }
  }

  // The warps' partials into shared memory, then the block's fold of them.
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  if (fq == 0) sm.m[warp][g] = m_run, sm.l[warp][g] = l_run;
#pragma unroll
  for (int j = 0; j < kGroups; j++)
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int r = 64 * j + 8 * g + 2 * u;
      *reinterpret_cast<float2*>(&sm.acc[warp][2 * fq][r]) = make_float2(o[j][u][0], o[j][u][2]);
      *reinterpret_cast<float2*>(&sm.acc[warp][2 * fq + 1][r]) = make_float2(o[j][u][1], o[j][u][3]);
    }
  __syncthreads();
  for (int x = tid; x < gb * hd; x += kSplitThreads) {
    const int i = x / hd, d = x % hd;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kSplitWarps; w++) mx = fmaxf(mx, sm.m[w][i]);  // finite: warp 0 has keys
    float acc = 0.0f, l = 0.0f;
#pragma unroll
    for (int w = 0; w < kSplitWarps; w++) {
      const float f = exp2f(sm.m[w][i] - mx);  // 0 for a warp without keys
      acc = fmaf(f, sm.acc[w][i][d], acc);
      l = fmaf(f, sm.l[w][i], l);
    }
    const size_t at = (size_t)(h0 + i) * max_splits + split;
    part_acc[at * hd + d] = acc;
    if (d == 0) part_ml[2 * at] = mx, part_ml[2 * at + 1] = l;
  }
}

// Second kernel of a decode step (and of a split chunk): block h folds output row h's splits (a
// head of the step, or (token, head) t·n_head + h of a chunk), w_s = 2^(m_s - M) with M their
// maximum, out = Σ w_s·acc_s / Σ w_s·l_s · sigmoid(gate). Thread (group, quad) sums dims 4·quad
// over the splits ≡ group (mod groups), then the groups are added. The partials of row h are
// max_splits apart; a decode step uses decode_splits of them (n_splits = 0), a chunk n_splits.
// With `rows` (a batched decode step): blockIdx.y is the row, its partials rows[y]'s, its position
// pos_dev[y], its gate and output rows y of gate and out.
__global__ void __launch_bounds__(kDecodeThreads) attention_combine_fast_kernel(
    const float* __restrict__ part_acc, const float* __restrict__ part_ml, const float* __restrict__ gate,
    float* __restrict__ out, int hd, int pos0, const int32_t* __restrict__ pos_dev, int max_splits, int n_splits,
    const AttentionRow* __restrict__ rows) {
  pdl_trigger();  // the output projection follows
  if (rows) {
    const AttentionRow& r = rows[blockIdx.y];
    part_acc = r.splits.acc;
    part_ml = r.splits.ml;
    max_splits = r.splits.max_splits;
    const size_t row = (size_t)blockIdx.y * gridDim.x * hd;
    gate += row;
    out += row;
    pos0 = pos_dev[blockIdx.y];
  } else if (pos_dev) {
    pos0 = pos_dev[0];
  }
  const int h = blockIdx.x, tid = threadIdx.x;
  const int ns = n_splits > 0 ? n_splits : decode_splits(pos0 + 1, max_splits);
  __shared__ float w[kFastDecodeMaxSplits];
  __shared__ float total;
  __shared__ alignas(16) float red[4 * kDecodeThreads];
  const float* ml = part_ml + (size_t)h * max_splits * 2;
  if (tid < 32) {
    float mx = -INFINITY;
    for (int sp = tid; sp < ns; sp += 32) mx = fmaxf(mx, ml[2 * sp]);
    mx = warp_max_f(mx);
    float sum = 0.0f;
    for (int sp = tid; sp < ns; sp += 32) {
      const float f = exp2f(ml[2 * sp] - mx);
      w[sp] = f;
      sum = fmaf(f, ml[2 * sp + 1], sum);
    }
    sum = warp_sum_f(sum);
    if (tid == 0) total = sum;
  }
  __syncthreads();
  const int quads = hd / 4, groups = kDecodeThreads / quads, group = tid / quads, quad = tid % quads;
  if (group < groups) {
    const float* a = part_acc + (size_t)h * max_splits * hd + 4 * quad;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = group; s0 < ns; s0 += groups * kCombineUnroll) {
      float4 v[kCombineUnroll];
#pragma unroll
      for (int u = 0; u < kCombineUnroll; u++) {
        const int sp = s0 + u * groups;
        v[u] = sp < ns ? *reinterpret_cast<const float4*>(a + (size_t)sp * hd) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < kCombineUnroll; u++) {
        const int sp = s0 + u * groups;
        if (sp < ns) fma4(acc, w[sp], v[u]);
      }
    }
    *reinterpret_cast<float4*>(&red[group * hd + 4 * quad]) = acc;
  }
  __syncthreads();
  const float inv = 1.0f / total;
  for (int d = tid; d < hd; d += kDecodeThreads) {
    float sum = 0.0f;
    for (int gr = 0; gr < groups; gr++) sum += red[gr * hd + d];
    const size_t o = (size_t)h * hd + d;
    out[o] = sum * inv * sigmoid_fast(gate[o]);
  }
}

// Query heads a decode block: the largest divisor of the group up to kMaxDecodeHeadsF.
int decode_heads_per_block(int group) {
  int g = std::min(group, kMaxDecodeHeadsF);
  while (group % g != 0) g--;
  return g;
}

template <int TIER, class E>
void launch_decode_split(const float* q, KvPlane<E> kc, KvPlane<E> vc, int n_head, int n_kv, int hd, int pos0,
                         const int32_t* pos_dev, float scale_log2, const AttentionSplitsF& sp,
                         cudaStream_t stream) {
  const int gb = decode_heads_per_block(n_head / n_kv);
  // With the position on the device every split a context could use gets a block; the ones past
  // the step's splits exit at once.
  const int grid_splits = pos_dev ? sp.max_splits : decode_splits(pos0 + 1, sp.max_splits);
  attention_decode_split_fast_kernel<TIER, E><<<dim3(n_head / gb, grid_splits), kSplitThreads, 0, stream>>>(
      q, kc, vc, sp.acc, sp.ml, n_head, n_kv, hd, gb, pos0, pos_dev, scale_log2, sp.max_splits,
      static_cast<const AttentionRow*>(nullptr));
  RL_CUDA_LAUNCH_CHECK();
}

template <class E>
void attention_decode_fast(const float* q, const float* gate, KvPlane<E> kc, KvPlane<E> vc, float* out,
                           int n_head, int n_kv, int hd, int pos0, const int32_t* pos_dev, float scale_log2,
                           const AttentionSplitsF& sp, cudaStream_t stream) {
  if (hd <= 64)
    launch_decode_split<64>(q, kc, vc, n_head, n_kv, hd, pos0, pos_dev, scale_log2, sp, stream);
  else if (hd <= 128)
    launch_decode_split<128>(q, kc, vc, n_head, n_kv, hd, pos0, pos_dev, scale_log2, sp, stream);
  else
    launch_decode_split<256>(q, kc, vc, n_head, n_kv, hd, pos0, pos_dev, scale_log2, sp, stream);
  attention_combine_fast_kernel<<<n_head, kDecodeThreads, 0, stream>>>(sp.acc, sp.ml, gate, out, hd, pos0, pos_dev,
                                                                        sp.max_splits, 0, nullptr);
  RL_CUDA_LAUNCH_CHECK();
}

template <int TIER, class E>
void launch_rows_split(const float* q, const AttentionRow* rows, int max_splits, int B, int n_head, int n_kv, int hd,
                       const int32_t* pos_dev, float scale_log2, cudaStream_t stream) {
  const int gb = decode_heads_per_block(n_head / n_kv);
  // Every split any row's context could use gets a block; the ones past a row's splits exit.
  attention_decode_split_fast_kernel<TIER, E><<<dim3(n_head / gb, max_splits, B), kSplitThreads, 0, stream>>>(
      q, KvPlane<E>{}, KvPlane<E>{}, nullptr, nullptr, n_head, n_kv, hd, gb, 0, pos_dev, scale_log2, 0, rows);
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <class E>
void decode_rows(const float* q, const float* gate, const AttentionRow* rows, int max_splits, float* out, int B,
                 int n_head, int n_kv, int hd, const int32_t* pos_dev, float scale_log2, cudaStream_t stream) {
  if (hd <= 64)
    launch_rows_split<64, E>(q, rows, max_splits, B, n_head, n_kv, hd, pos_dev, scale_log2, stream);
  else if (hd <= 128)
    launch_rows_split<128, E>(q, rows, max_splits, B, n_head, n_kv, hd, pos_dev, scale_log2, stream);
  else
    launch_rows_split<256, E>(q, rows, max_splits, B, n_head, n_kv, hd, pos_dev, scale_log2, stream);
  attention_combine_fast_kernel<<<dim3(n_head, B), kDecodeThreads, 0, stream>>>(nullptr, nullptr, gate, out, hd, 0,
                                                                                 pos_dev, 0, 0, rows);
  RL_CUDA_LAUNCH_CHECK();
}
#define RL_DECODE_ROWS(E)                                                                                         \
  template void decode_rows<E>(const float*, const float*, const AttentionRow*, int, float*, int, int, int, int, \
                               const int32_t*, float, cudaStream_t);
RL_DECODE_ROWS(float)
RL_DECODE_ROWS(__half)
RL_DECODE_ROWS(__nv_bfloat16)
RL_DECODE_ROWS(KvQ8)
#undef RL_DECODE_ROWS

int max_decode_splits(int n_ctx) {
  return std::clamp((n_ctx + kMinSplitKeys - 1) / kMinSplitKeys, 1, kFastDecodeMaxSplits);
}

template <class E>
void decode_step(const float* q, const float* gate, KvPlane<E> kc, KvPlane<E> vc, float* out, int n_head, int n_kv,
                 int hd, int pos0, const int32_t* pos_dev, float scale_log2, const AttentionSplitsF& sp,
                 cudaStream_t stream) {
  attention_decode_fast(q, gate, kc, vc, out, n_head, n_kv, hd, pos0, pos_dev, scale_log2, sp, stream);
}
#define RL_DECODE_STEP(E)                                                                                          \
  template void decode_step<E>(const float*, const float*, KvPlane<E>, KvPlane<E>, float*, int, int, int, int,   \
                               const int32_t*, float, const AttentionSplitsF&, cudaStream_t);
RL_DECODE_STEP(float)
RL_DECODE_STEP(__half)
RL_DECODE_STEP(__nv_bfloat16)
RL_DECODE_STEP(KvQ8)
#undef RL_DECODE_STEP

void fold_chunk_splits(const AttentionSplitsF& sp, const float* gate, float* out, int rows, int hd, int n_splits,
                       cudaStream_t stream) {
  attention_combine_fast_kernel<<<rows, kDecodeThreads, 0, stream>>>(sp.acc, sp.ml, gate, out, hd, 0, nullptr,
                                                                      n_splits, n_splits, nullptr);
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda::fast_attention
