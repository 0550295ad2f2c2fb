// Gated causal attention with GQA over an fp32 KV cache, for one token (decode) or a chunk
// (prefill), in double as in the oracle (cpu/forward.cpp attention_layer), without a score buffer
// of context length: the keys go in splits of kSplitKeys, each split's softmax is formed whole
// (maximum, exponentials, sum, weighted values) and the splits are folded in key order into a
// running maximum, sum and output (flash attention's rescaling).
//
// Decode (flash-decoding): one block per split and G query heads of a KV head, so a token at
// depth n runs n / kSplitKeys × n_kv blocks and reads each key once for its G heads; a second
// kernel folds the splits. Prefill: one block per head and 4 query tokens walks the splits itself.
// Both form a split and fold it with the same device functions in the same order, so a token's
// output is the same bits whichever kernel computes it (the chunked prefill of a prompt equals
// its token-by-token decode, which the tests check).
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/kv_cache_device.cuh"
#include "cuda/math_device.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

namespace rl::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;  // >= head dim: thread d owns output dim d
constexpr int kMaxHeadDim = 256;

// store_kv: one warp per (KV head, token), writing the head's key and value rows as
// store_row_warp does for the cache's type.
template <class E>
__global__ void __launch_bounds__(32) store_kv_kernel(const float* k, const float* v, KvPlane<E> kc, KvPlane<E> vc,
                                                      int n_kv, int hd, int pos0, const int32_t* pos_dev) {
  if (pos_dev) pos0 = pos_dev[0];
  const int j = blockIdx.x, t = blockIdx.y;
  const size_t width = (size_t)n_kv * hd, src = (size_t)t * width + (size_t)j * hd;
  store_row_warp(kc.row(pos0 + t, width, j * hd), k + src, hd, threadIdx.x);
  store_row_warp(vc.row(pos0 + t, width, j * hd), v + src, hd, threadIdx.x);
}

// attention_prep: one warp per (head, token). Query heads (blockIdx.x < n_head): split the query
// from attn_q's output, RMSNorm it with q_norm, rotate; key/value heads: RMSNorm and rotate the key
// into the cache row pos_dev[0] + t, copy the value. The norm forms its sum of squares as rms_norm's
// warp-per-row kernel does (float4 groups, lane-strided) and rope_pair is rope_neox's arithmetic,
// so the result equals the six separate kernels bit for bit. A cache of another type gets the fp32
// key (formed in shared memory) and value stored as store_kv stores them.
__device__ __forceinline__ void warp_rms_norm_row(const float* src, const float* __restrict__ w, float* dst, int hd,
                                                  float eps, int lane) {
  double ss = 0.0;
  for (int i = 4 * lane; i < hd; i += 128) {
    const float4 a = *reinterpret_cast<const float4*>(src + i);
    double s4 = (double)a.x * a.x;
    s4 = fma((double)a.y, (double)a.y, s4);
    s4 = fma((double)a.z, (double)a.z, s4);
    ss += fma((double)a.w, (double)a.w, s4);
  }
  ss = warp_sum_d(ss);
  const double scale = 1.0 / sqrt(ss / (double)hd + (double)eps);
  for (int i = 4 * lane; i < hd; i += 128) {
    const float4 a = *reinterpret_cast<const float4*>(src + i);
    const float4 b = *reinterpret_cast<const float4*>(w + i);
    *reinterpret_cast<float4*>(dst + i) = make_float4((float)(a.x * scale * b.x), (float)(a.y * scale * b.y),
                                                      (float)(a.z * scale * b.z), (float)(a.w * scale * b.w));
  }
}

template <class E>
__global__ void __launch_bounds__(32) attention_prep_kernel(
    const float* __restrict__ qg, const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ q,
    float* __restrict__ gate, const float* __restrict__ q_norm, const float* __restrict__ k_norm, KvPlane<E> kc,
    KvPlane<E> vc, int n_head, int n_kv, int hd, float eps, int n_rot, float theta_scale,
    const int32_t* __restrict__ pos_dev, const AttentionRow* __restrict__ rows) {
  constexpr bool kF32 = std::is_same_v<E, float>;
  __shared__ __align__(16) float key_f32[kF32 ? 1 : kMaxHeadDim];  // the key before it is stored
  const int hh = blockIdx.x, t = blockIdx.y, lane = threadIdx.x, half = n_rot / 2;
  const float pos = (float)pos_dev[t];
  const size_t width = (size_t)n_kv * hd;
  // Where token t's key and value go: position pos_dev[0] + t of the one cache, or (rows: a
  // batched decode step) position pos_dev[t] of row t's session's cache.
  int store = pos_dev[0] + t;
  if (rows) {
    const KvCacheRef c = rows[t].cache;
    kc = KvPlane<E>::of(c.k, c.n_ctx, width);
    vc = KvPlane<E>::of(c.v, c.n_ctx, width);
    store = pos_dev[t];
  }
  float* dst;
  if (hh < n_head) {
    const float* src = qg + ((size_t)t * n_head + hh) * 2 * hd;
    dst = q + ((size_t)t * n_head + hh) * hd;
    float* g = gate + ((size_t)t * n_head + hh) * hd;
    for (int i = lane; i < hd; i += 32) g[i] = src[hd + i];
    warp_rms_norm_row(src, q_norm, dst, hd, eps, lane);
  } else {
    const int j = hh - n_head;
    if constexpr (kF32)
      dst = kc.row(store, width, j * hd);
    else
      dst = key_f32;
    store_row_warp(vc.row(store, width, j * hd), v + ((size_t)t * n_kv + j) * hd, hd, lane);
    warp_rms_norm_row(k + ((size_t)t * n_kv + j) * hd, k_norm, dst, hd, eps, lane);
  }
  __syncwarp();  // the rotation pairs values other lanes wrote
  for (int i = lane; i < half; i += 32) rope_pair(dst, i, half, pos, theta_scale);
  if constexpr (!kF32) {
    __syncwarp();
    if (hh >= n_head) store_row_warp(kc.row(store, width, (hh - n_head) * hd), dst, hd, lane);
  }
}

constexpr int kKeysPerWarp = 4;
constexpr int kRoundKeys = kWarps * kKeysPerWarp;  // keys scored per round, 4 by each warp
constexpr int kPrefillQueries = 4;                 // query tokens per block for T > 1
constexpr int kMaxDecodeHeads = 8;                 // query heads of one KV head per decode block
constexpr int kCombineChunk = 1024;                // splits whose factors the combine stages at once
static_assert(kSplitKeys % kRoundKeys == 0, "a split is whole rounds");

// One block's view of NQ queries that share a KV head: their vectors in double, and per split the
// scores, then the probabilities, of the split's keys, and each query's split maximum and sum.
template <int NQ>
struct SplitSmem {
  double qs[NQ][kMaxHeadDim];
  double p[NQ][kSplitKeys];
  double m[NQ], l[NQ];
};

// Scores of keys j0 .. j0 + n - 1 (n <= kSplitKeys) for the NQ queries, times scale, into s.p.
// Warp w takes keys 4w .. 4w + 3 of each round of 32, the 4 × NQ dot products side by side (lane
// holds dims lane + 32i), summed by warp_sum_scatter (each sum in warp_sum_d's tree, so the score
// of a query and a key does not depend on NQ).
template <int NQ>
__device__ __forceinline__ void split_scores(SplitSmem<NQ>& s, const float* kc, size_t kv_row, int kv_off, int hd,
                                             int j0, int n, double scale, int warp, int lane) {
  constexpr int kDimSteps = kMaxHeadDim / 32;
  for (int base = warp * kKeysPerWarp; base < n; base += kRoundKeys) {
    // The round's four key rows into registers first, so all their loads are in flight at once.
    float kr[kKeysPerWarp][kDimSteps];
#pragma unroll
    for (int kk = 0; kk < kKeysPerWarp; kk++) {
      const float* row = kc + (size_t)(j0 + min(base + kk, n - 1)) * kv_row + kv_off;
#pragma unroll
      for (int t = 0; t < kDimSteps; t++) kr[kk][t] = lane + 32 * t < hd ? row[lane + 32 * t] : 0.0f;
    }
    double acc[kKeysPerWarp * NQ] = {};  // key kk, query i at kk·NQ + i
#pragma unroll
    for (int t = 0; t < kDimSteps; t++) {
      if (lane + 32 * t >= hd) break;
#pragma unroll
      for (int i = 0; i < NQ; i++) {
        const double qv = s.qs[i][lane + 32 * t];
#pragma unroll
        for (int kk = 0; kk < kKeysPerWarp; kk++) acc[kk * NQ + i] = fma(qv, (double)kr[kk][t], acc[kk * NQ + i]);
      }
    }
    int p;
    const double v = warp_sum_scatter(acc, lane, p);
    const int key = base + p / NQ;
    if (lane % (32 / (kKeysPerWarp * NQ)) == 0 && key < n) s.p[p % NQ][key] = v * scale;
  }
}

// Query i (warp i) sees the first lim keys of the split: their maximum m, p = exp(score - m)
// (0 for the keys it does not see), and l = the sum of its p (each lane its keys in order, then
// the warp's tree). lim >= 1.
template <int NQ>
__device__ __forceinline__ void split_softmax(SplitSmem<NQ>& s, int i, int lim, int lane) {
  double mx = -INFINITY;
  for (int j = lane; j < lim; j += 32) mx = fmax(mx, s.p[i][j]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  double sum = 0.0;
  for (int j = lane; j < kSplitKeys; j += 32) {
    const double e = j < lim ? exp(s.p[i][j] - mx) : 0.0;
    s.p[i][j] = e;
    sum += e;
  }
  sum = warp_sum_d(sum);
  if (lane == 0) s.m[i] = mx, s.l[i] = sum;
}

// Thread d's weighted sums of the split's values for the NQ queries, keys in order, 32 keys' loads
// in flight at a time. A key a query does not see, and a key past n, has p = 0 (split_softmax) and
// adds fma(0, v, acc) = acc (v finite; past n, v = 0).
template <int NQ>
__device__ __forceinline__ void split_values(const SplitSmem<NQ>& s, const float* vc, size_t kv_row, int kv_off,
                                             int j0, int n, int d, double (&acc)[NQ]) {
#pragma unroll
  for (int i = 0; i < NQ; i++) acc[i] = 0.0;
  const float* vd = vc + (size_t)j0 * kv_row + kv_off + d;
  for (int jb = 0; jb < n; jb += 32) {
    float vv[32];
#pragma unroll
    for (int w = 0; w < 32; w++) vv[w] = jb + w < n ? vd[(size_t)(jb + w) * kv_row] : 0.0f;
#pragma unroll
    for (int w = 0; w < 32; w++)
#pragma unroll
      for (int i = 0; i < NQ; i++) acc[i] = fma(s.p[i][jb + w], (double)vv[w], acc[i]);
  }
}

// Folds a split (maximum m, sum l, weighted values a) into a query's running maximum M, sum L and
// output acc, splits in key order. The decode combine and the prefill kernel both fold with this,
// so a query gives the same bits either way.
struct Fold {
  double a, b;  // exp(M - M'), exp(m - M') with M' = max(M, m)
};
__device__ __forceinline__ Fold fold_factors(double& M, double m) {
  const double M_new = fmax(M, m);
  const Fold f{exp(M - M_new), exp(m - M_new)};
  M = M_new;
  return f;
}
__device__ __forceinline__ double fold(double run, double split, Fold f) { return fma(split, f.b, run * f.a); }

// Prefill: QT consecutive query tokens of head h per block (blockIdx.y = token tile). The keys go
// in splits of kSplitKeys; query t sees keys 0 .. pos0 + t, so a split past its last key is not
// folded into it, and in its last split it sees only its own keys: each query's arithmetic is
// what the decode kernels do for that token alone.
template <int QT>
__global__ void __launch_bounds__(kThreads) gated_attention_prefill_kernel(
    const float* q, const float* gate, const float* kc, const float* vc, float* out, int T, int n_head,
    int n_kv, int hd, int pos0, const int32_t* pos_dev, double scale) {
  pdl_trigger();  // the output projection follows
  if (pos_dev) pos0 = pos_dev[0];
  const int h = blockIdx.x, t0 = blockIdx.y * QT, nq = min(QT, T - t0);
  const int kv_off = (h / (n_head / n_kv)) * hd;
  const size_t kv_row = (size_t)n_kv * hd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = threadIdx.x;
  __shared__ SplitSmem<QT> s;
  for (int i = threadIdx.x; i < QT * hd; i += kThreads) {
    const int qi = i / hd, c = i % hd;
    s.qs[qi][c] = qi < nq ? (double)q[((size_t)(t0 + qi) * n_head + h) * hd + c] : 0.0;
  }
  int n_keys[QT];  // query i sees keys 0 .. pos0 + t0 + i (a missing query repeats the last one)
#pragma unroll
  for (int i = 0; i < QT; i++) n_keys[i] = pos0 + t0 + min(i, nq - 1) + 1;
  const int n_all = n_keys[QT - 1];
  double M[QT], L[QT], acc[QT];
#pragma unroll
  for (int i = 0; i < QT; i++) M[i] = -INFINITY, L[i] = 0.0, acc[i] = 0.0;
  for (int j0 = 0; j0 < n_all; j0 += kSplitKeys) {
    const int n = min(kSplitKeys, n_all - j0);
    __syncthreads();  // q is staged; the previous split's p and m, l are read
    split_scores(s, kc, kv_row, kv_off, hd, j0, n, scale, warp, lane);
    __syncthreads();
    if (warp < QT) {
      int lim = n_keys[0] - j0;  // n_keys[warp], without indexing registers by a run-time value
#pragma unroll
      for (int k = 1; k < QT; k++)
        if (warp == k) lim = n_keys[k] - j0;
      if (lim > 0) split_softmax(s, warp, min(lim, kSplitKeys), lane);
    }
    __syncthreads();
    if (d < hd) {
      double a[QT];
      split_values(s, vc, kv_row, kv_off, j0, n, d, a);
#pragma unroll
      for (int i = 0; i < QT; i++) {
        if (n_keys[i] <= j0) continue;  // the split is past query i's keys
        const Fold f = fold_factors(M[i], s.m[i]);
        L[i] = fold(L[i], s.l[i], f);
        acc[i] = fold(acc[i], a[i], f);
      }
    }
  }
  if (d < hd) {
#pragma unroll
    for (int i = 0; i < QT; i++) {
      if (i >= nq) break;
      const size_t o = ((size_t)(t0 + i) * n_head + h) * hd + d;
      out[o] = __fmul_rn((float)(acc[i] / L[i]), sigmoid_f(gate[o]));
    }
  }
}

// Decode, first kernel (flash-decoding): block (head group, split) takes G query heads of one KV
// head over one split of keys, each key read once for the G heads; it writes each head's split
// maximum, sum and weighted values. Splits past the sequence (read from pos_dev, so a captured
// graph replays at any position) exit at once.
template <int G>
__global__ void __launch_bounds__(kThreads) attention_decode_split_kernel(
    const float* q, const float* kc, const float* vc, double* part_acc, double* part_ml, int n_head, int n_kv,
    int hd, int pos0, const int32_t* pos_dev, double scale, int max_splits, int min_splits_used,
    int max_splits_used) {
  if (pos_dev) pos0 = pos_dev[0];
  const int n_keys = pos0 + 1, split = blockIdx.y, j0 = split * kSplitKeys;
  const int n_splits = (n_keys + kSplitKeys - 1) / kSplitKeys;
  // Another launch of this step covers this many splits (attention_decode's two head groupings).
  if (n_splits < min_splits_used || n_splits > max_splits_used) return;
  if (j0 >= n_keys) return;
  const int h0 = blockIdx.x * G, kv_off = (h0 / (n_head / n_kv)) * hd, n = min(kSplitKeys, n_keys - j0);
  const size_t kv_row = (size_t)n_kv * hd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = threadIdx.x;
  __shared__ SplitSmem<G> s;
  for (int i = threadIdx.x; i < G * hd; i += kThreads) s.qs[i / hd][i % hd] = (double)q[(size_t)h0 * hd + i];
  __syncthreads();
  split_scores(s, kc, kv_row, kv_off, hd, j0, n, scale, warp, lane);
  __syncthreads();
  if (warp < G) split_softmax(s, warp, n, lane);
  __syncthreads();
  if (d < hd) {
    double a[G];
    split_values(s, vc, kv_row, kv_off, j0, n, d, a);
#pragma unroll
    for (int i = 0; i < G; i++) part_acc[((size_t)(h0 + i) * max_splits + split) * hd + d] = a[i];
  }
  if (threadIdx.x < G) {
    const size_t o = ((size_t)(h0 + threadIdx.x) * max_splits + split) * 2;
    part_ml[o] = s.m[threadIdx.x];
    part_ml[o + 1] = s.l[threadIdx.x];
  }
}

// Decode, second kernel: head h's splits folded in key order (fold_factors' maxima by a warp
// scan, the factors for up to kCombineChunk splits at once in shared memory), then the gate.
__global__ void __launch_bounds__(kThreads) attention_decode_combine_kernel(
    const double* part_acc, const double* part_ml, const float* gate, float* out, int hd, int pos0,
    const int32_t* pos_dev, int max_splits) {
  pdl_trigger();  // the output projection follows
  if (pos_dev) pos0 = pos_dev[0];
  const int h = blockIdx.x, n_splits = (pos0 + 1 + kSplitKeys - 1) / kSplitKeys;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = threadIdx.x;
  __shared__ Fold f[kCombineChunk];
  __shared__ double l_split[kCombineChunk];
  const double* ml = part_ml + (size_t)h * max_splits * 2;
  double M_run = -INFINITY;  // warp 0: the running maximum before this chunk
  double L = 0.0, acc = 0.0;
  for (int c0 = 0; c0 < n_splits; c0 += kCombineChunk) {
    const int nc = min(kCombineChunk, n_splits - c0);
    __syncthreads();  // the previous chunk's factors are read
    if (warp == 0) {
      for (int b = 0; b < nc; b += 32) {
        // Lane k: fold_factors on the running maximum before split c0 + b + k, which is the
        // maximum of M_run and the splits before it (a max scan: exact in any order).
        const int sp = b + lane;
        const double m = sp < nc ? ml[(size_t)(c0 + sp) * 2] : -INFINITY;
        double incl = m;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const double up = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o) incl = fmax(incl, up);
        }
        double before = __shfl_up_sync(0xffffffffu, incl, 1);
        before = lane == 0 ? M_run : fmax(M_run, before);
        if (sp < nc) {
          f[sp] = fold_factors(before, m);
          l_split[sp] = ml[(size_t)(c0 + sp) * 2 + 1];
        }
        M_run = fmax(M_run, __shfl_sync(0xffffffffu, incl, 31));
      }
    }
    __syncthreads();
    if (d < hd) {
      const double* a = part_acc + ((size_t)h * max_splits + c0) * hd + d;
      for (int b = 0; b < nc; b += 32) {
        double av[32];  // 32 splits' loads in flight at once
#pragma unroll
        for (int k = 0; k < 32; k++) av[k] = b + k < nc ? a[(size_t)(b + k) * hd] : 0.0;
#pragma unroll
        for (int k = 0; k < 32; k++) {
          if (b + k >= nc) break;
          L = fold(L, l_split[b + k], f[b + k]);
          acc = fold(acc, av[k], f[b + k]);
        }
      }
    }
  }
  if (d < hd) {
    const size_t o = (size_t)h * hd + d;
    out[o] = __fmul_rn((float)(acc / L), sigmoid_f(gate[o]));
  }
}

// Query heads per decode block at depth: the largest power of two up to kMaxDecodeHeads dividing
// the group, so each key is read once for them.
int decode_heads_per_block(int group) {
  int g = kMaxDecodeHeads;
  while (group % g != 0) g /= 2;
  return g;
}

template <int G>
void launch_decode_split(const float* q, const float* kc, const float* vc, int n_head, int n_kv, int hd, int pos0,
                         const int32_t* pos_dev, double scale, const AttentionSplits& sp, int grid_splits,
                         int min_used, int max_used, cudaStream_t stream) {
  attention_decode_split_kernel<G><<<dim3(n_head / G, grid_splits), kThreads, 0, stream>>>(
      q, kc, vc, sp.acc, sp.ml, n_head, n_kv, hd, pos0, pos_dev, scale, sp.max_splits, min_used, max_used);
  RL_CUDA_LAUNCH_CHECK();
}

// A decode step: up to kShortSplits splits (2,048 keys) one query head per block, so a short
// context still spreads over n_head × splits blocks; past that G heads per block, each key read
// once for them. With the position on the device (a captured graph) both launches are made and the
// one whose range excludes the step's split count exits at once. Either grouping gives the same
// bits: a head's arithmetic does not depend on its block's other heads.
constexpr int kShortSplits = 8;
void attention_decode(const float* q, const float* gate, const float* kc, const float* vc, float* out, int n_head,
                      int n_kv, int hd, int pos0, const int32_t* pos_dev, double scale, const AttentionSplits& sp,
                      cudaStream_t stream) {
  const int short_grid = std::min(sp.max_splits, kShortSplits);
  const int host_splits = pos0 / kSplitKeys + 1;
  if (pos_dev || host_splits <= kShortSplits)
    launch_decode_split<1>(q, kc, vc, n_head, n_kv, hd, pos0, pos_dev, scale, sp, short_grid, 1, kShortSplits,
                           stream);
  if (sp.max_splits > kShortSplits && (pos_dev || host_splits > kShortSplits)) {
    const int g = decode_heads_per_block(n_head / n_kv), lo = kShortSplits + 1, hi = sp.max_splits;
    switch (g) {
      case 8: launch_decode_split<8>(q, kc, vc, n_head, n_kv, hd, pos0, pos_dev, scale, sp, hi, lo, hi, stream); break;
      case 4: launch_decode_split<4>(q, kc, vc, n_head, n_kv, hd, pos0, pos_dev, scale, sp, hi, lo, hi, stream); break;
      case 2: launch_decode_split<2>(q, kc, vc, n_head, n_kv, hd, pos0, pos_dev, scale, sp, hi, lo, hi, stream); break;
      default: launch_decode_split<1>(q, kc, vc, n_head, n_kv, hd, pos0, pos_dev, scale, sp, hi, lo, hi, stream);
    }
  }
  attention_decode_combine_kernel<<<n_head, kThreads, 0, stream>>>(sp.acc, sp.ml, gate, out, hd, pos0, pos_dev,
                                                                   sp.max_splits);
}

// The head and rotary dims attention_prep takes.
void check_prep_shape(int hd, int n_rot) {
  if (hd % 4 != 0 || hd > kMaxHeadDim || n_rot > hd || n_rot % 2 != 0)
    throw_error("attention_prep: head dim " + std::to_string(hd) + " / rotary dims " + std::to_string(n_rot));
}

void check_kv_cache(const KvCacheRef& cache, int hd, const char* who) {
  if (cache.type == KvType::kQ8_0 && hd % kKvQ8Block != 0)
    throw_error(std::string(who) + ": a q8_0 cache needs a head dim that is a multiple of 32, not " +
                std::to_string(hd));
}

}  // namespace

void attention_prep(const float* qg, const float* k, const float* v, float* q, float* gate, const float* q_norm,
                    const float* k_norm, const KvCacheRef& cache, int T, int n_head, int n_kv, int hd,
                    float eps, int n_rot, float theta_scale, const int32_t* pos_dev, cudaStream_t stream) {
  check_prep_shape(hd, n_rot);
  check_kv_cache(cache, hd, "attention_prep");
  if (T == 0) return;
  with_kv_element(cache.type, [&](auto element) {
    using E = decltype(element);
    const size_t width = (size_t)n_kv * hd;
    attention_prep_kernel<E><<<dim3(n_head + n_kv, T), 32, 0, stream>>>(
        qg, k, v, q, gate, q_norm, k_norm, KvPlane<E>::of(cache.k, cache.n_ctx, width),
        KvPlane<E>::of(cache.v, cache.n_ctx, width), n_head, n_kv, hd, eps, n_rot, theta_scale, pos_dev,
        static_cast<const AttentionRow*>(nullptr));
  });
  RL_CUDA_LAUNCH_CHECK();
}
void attention_prep_rows(const float* qg, const float* k, const float* v, float* q, float* gate, const float* q_norm,
                         const float* k_norm, const AttentionRow* rows, KvType kv_type, int B, int n_head, int n_kv,
                         int hd, float eps, int n_rot, float theta_scale, const int32_t* pos_dev, cudaStream_t stream) {
  check_prep_shape(hd, n_rot);
  check_kv_cache(KvCacheRef{nullptr, nullptr, kv_type, 0}, hd, "attention_prep");
  if (B == 0) return;
  if (!rows || !pos_dev) throw_error("attention_prep: a batched step needs its rows and positions on the device");
  with_kv_element(kv_type, [&](auto element) {
    using E = decltype(element);
    attention_prep_kernel<E><<<dim3(n_head + n_kv, B), 32, 0, stream>>>(
        qg, k, v, q, gate, q_norm, k_norm, KvPlane<E>{}, KvPlane<E>{}, n_head, n_kv, hd, eps, n_rot, theta_scale,
        pos_dev, rows);
  });
  RL_CUDA_LAUNCH_CHECK();
}
void attention_prep(const float* qg, const float* k, const float* v, float* q, float* gate, const float* q_norm,
                    const float* k_norm, float* k_cache, float* v_cache, int T, int n_head, int n_kv, int hd,
                    float eps, int n_rot, float theta_scale, const int32_t* pos_dev, cudaStream_t stream) {
  attention_prep(qg, k, v, q, gate, q_norm, k_norm, KvCacheRef{k_cache, v_cache, KvType::kF32, 0}, T, n_head, n_kv,
                 hd, eps, n_rot, theta_scale, pos_dev, stream);
}

void store_kv(const float* k, const float* v, const KvCacheRef& cache, int T, int n_kv, int hd, int pos0,
              cudaStream_t stream, const int32_t* pos_dev) {
  check_kv_cache(cache, hd, "store_kv");
  if (T == 0) return;
  with_kv_element(cache.type, [&](auto element) {
    using E = decltype(element);
    const size_t width = (size_t)n_kv * hd;
    store_kv_kernel<E><<<dim3(n_kv, T), 32, 0, stream>>>(k, v, KvPlane<E>::of(cache.k, cache.n_ctx, width),
                                                         KvPlane<E>::of(cache.v, cache.n_ctx, width), n_kv, hd, pos0,
                                                         pos_dev);
  });
  RL_CUDA_LAUNCH_CHECK();
}
void store_kv(const float* k, const float* v, float* k_cache, float* v_cache, int T, int n_kv,
              int hd, int pos0, cudaStream_t stream, const int32_t* pos_dev) {
  store_kv(k, v, KvCacheRef{k_cache, v_cache, KvType::kF32, 0}, T, n_kv, hd, pos0, stream, pos_dev);
}

size_t AttentionSplits::bytes(int n_ctx, int n_head, int hd) {
  const size_t splits = (size_t)(n_ctx + kSplitKeys - 1) / kSplitKeys;
  return splits * n_head * (hd + 2) * sizeof(double);
}

AttentionSplits AttentionSplits::within(void* storage, int n_ctx, int n_head, int hd) {
  AttentionSplits s;
  s.max_splits = (n_ctx + kSplitKeys - 1) / kSplitKeys;
  s.acc = static_cast<double*>(storage);
  s.ml = s.acc + (size_t)s.max_splits * n_head * hd;
  return s;
}

void gated_attention(const float* q, const float* gate, const float* k_cache, const float* v_cache,
                     float* out, int T, int n_head, int n_kv, int hd, int pos0, float scale,
                     cudaStream_t stream, const int32_t* pos_dev, const AttentionSplits* splits) {
  if (hd > kMaxHeadDim || hd % 4 != 0)
    throw_error("attention: head dim " + std::to_string(hd) + " is not a multiple of 4 up to 256");
  if (n_kv <= 0 || n_head % n_kv != 0)
    throw_error("attention: " + std::to_string(n_head) + " heads do not group over " +
                std::to_string(n_kv) + " KV heads");
  if (T == 0) return;
  if (T == 1) {
    if (!splits || !splits->acc || splits->max_splits <= 0)
      throw_error("attention: a decode step needs the split buffers (AttentionSplits)");
    if (!pos_dev && pos0 >= splits->max_splits * kSplitKeys)
      throw_error("attention: position " + std::to_string(pos0) + " is past the split buffers' " +
                  std::to_string(splits->max_splits * kSplitKeys) + " keys");
    attention_decode(q, gate, k_cache, v_cache, out, n_head, n_kv, hd, pos0, pos_dev, (double)scale, *splits,
                     stream);
  } else {
    gated_attention_prefill_kernel<kPrefillQueries>
        <<<dim3(n_head, (T + kPrefillQueries - 1) / kPrefillQueries), kThreads, 0, stream>>>(
            q, gate, k_cache, v_cache, out, T, n_head, n_kv, hd, pos0, pos_dev, (double)scale);
  }
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
