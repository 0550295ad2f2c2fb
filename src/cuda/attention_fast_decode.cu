// The fast tier's decode attention (attention_fast.cu has the function and the chunk kernel).
//
// Decode (T = 1): flash-decoding in fp32. The keys 0 .. pos go in at most max_splits (≤
// kFastDecodeMaxSplits) splits of at least kMinSplitKeys keys: as many as fill the GPU at short depth,
// longer ones at long depth, so the split buffers do not grow with the context. A block takes one
// split and G query heads of one KV head (each key read once for them, float4 loads) and keeps a
// running softmax over tiles of kDecodeTile keys; it writes its heads' partial maximum, sum and
// weighted values, and a second kernel folds the splits and applies the gate. The position is read
// from pos_dev when given, so a captured graph replays at any depth.
//
// The caches are of any --kv-type, read through kv_cache_device.cuh's accessor.
//
// Accuracy: fp32 operands and sums; a score's error is ~2^-24·√(hd/2) of the scores' spread and a
// value sum of n keys ~2^-24·√(n/2) relative, n ≤ 2,048 a thread: ~1e-6 relative RMS.
#include "cuda/attention_fast.cuh"
#include "cuda/cuda_check.h"
#include "cuda/math_device.cuh"

#include <algorithm>

namespace rl::cuda::fast_attention {

namespace {

constexpr int kDecodeThreads = 256;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeKeysPerWarp = 4;  // key rows a warp loads at once in the score pass
constexpr int kDecodeTile = 256;       // keys whose scores a block holds in shared memory at a time
constexpr int kMinSplitKeys = 64;      // shortest split: below it a block's fixed costs dominate
constexpr int kMaxDecodeHeadsF = 8;    // query heads of one KV head a block (the 80B's group)
constexpr int kValueUnroll = 4;        // value rows a thread loads at once
constexpr int kCombineUnroll = 8;      // split partials a combine thread loads at once
static_assert(kDecodeTile % (kDecodeWarps * kDecodeKeysPerWarp) == 0, "a tile is whole score rounds");
static_assert(kFastDecodeMaxSplits <= kFastSplitPartials, "a decode step's partials fit the buffers");

// The splits of a step at n keys, and split s's first key: n·s/ns, so none is empty (ns ≤ n).
__host__ __device__ __forceinline__ int decode_splits(int n_keys, int max_splits) {
  const int by_length = (n_keys + kMinSplitKeys - 1) / kMinSplitKeys;
  return by_length < max_splits ? by_length : max_splits;
}
__device__ __forceinline__ int split_begin(int s, int n_keys, int ns) {
  return (int)((long long)s * n_keys / ns);
}

// One decode block's shared memory: its G queries (times scale·log2(e)), per tile the scores and
// then the probabilities, and at the end the key groups' partial value sums (groups·hd ≤
// 4·kDecodeThreads, since a group is hd/4 threads); the running maximum, sum and rescale factor.
template <int G>
struct alignas(16) DecodeSmem {
  float q[G][kMaxHeadDimF];
  union {
    float p[G][kDecodeTile];
    float red[G * 4 * kDecodeThreads];
  };
  float m[G], l[G], alpha[G];
};

// Block (head group, split): query heads h0 .. h0 + G - 1 (one KV head) over the split's keys.
// Score pass: warp w scores keys 4w .. 4w + 3 of each round of 32, lane holding dims 4(lane + 32c)
// of each, the 4·G dot products summed at once by warp_sum_scatter. Value pass: thread (group,
// quad) accumulates dims 4·quad of its heads over keys ≡ group (mod groups).
template <int G, class E>
__global__ void __launch_bounds__(kDecodeThreads) attention_decode_split_fast_kernel(
    const float* __restrict__ q, KvPlane<E> kc, KvPlane<E> vc,
    float* __restrict__ part_acc, float* __restrict__ part_ml, int n_head, int n_kv, int hd, int pos0,
    const int32_t* __restrict__ pos_dev, float scale_log2, int max_splits) {
  using Q = KvQuad<E>;
  constexpr int kChunks = kMaxHeadDimF / 128, kRound = kDecodeWarps * kDecodeKeysPerWarp;
  if (pos_dev) pos0 = pos_dev[0];
  const int n_keys = pos0 + 1, ns = decode_splits(n_keys, max_splits), split = blockIdx.y;
  if (split >= ns) return;
  const int jb = split_begin(split, n_keys, ns), je = split_begin(split + 1, n_keys, ns);
  const int h0 = blockIdx.x * G, kv_off = (h0 / (n_head / n_kv)) * hd;
  const size_t kv_row = (size_t)n_kv * hd;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  __shared__ DecodeSmem<G> s;
  for (int i = tid; i < G * hd; i += kDecodeThreads) s.q[i / hd][i % hd] = q[(size_t)h0 * hd + i] * scale_log2;
  if (tid < G) s.m[tid] = -INFINITY, s.l[tid] = 0.0f;

  const int quads = hd / 4, groups = kDecodeThreads / quads, group = tid / quads, quad = tid % quads;
  float4 acc[G];
#pragma unroll
  for (int i = 0; i < G; i++) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  for (int t0 = jb; t0 < je; t0 += kDecodeTile) {
    const int nt = min(kDecodeTile, je - t0);
    __syncthreads();  // q and m, l are set; the previous tile's p are read
    for (int base = warp * kDecodeKeysPerWarp; base < nt; base += kRound) {
      typename Q::Raw kr[kDecodeKeysPerWarp][kChunks];
#pragma unroll
      for (int kk = 0; kk < kDecodeKeysPerWarp; kk++) {
        const auto row = kc.row(t0 + min(base + kk, nt - 1), kv_row, kv_off);
#pragma unroll
        for (int c = 0; c < kChunks; c++) {
          const int d = 4 * (lane + 32 * c);
          kr[kk][c] = d < hd ? Q::load(row, d) : Q::zero();
        }
      }
      float a[kDecodeKeysPerWarp * G];  // key kk, head i at kk·G + i
#pragma unroll
      for (int i = 0; i < kDecodeKeysPerWarp * G; i++) a[i] = 0.0f;
#pragma unroll
      for (int c = 0; c < kChunks; c++) {
        const int d = 4 * (lane + 32 * c);
        if (d >= hd) break;
#pragma unroll
        for (int i = 0; i < G; i++) {
          const float4 qv = *reinterpret_cast<const float4*>(&s.q[i][d]);
#pragma unroll
          for (int kk = 0; kk < kDecodeKeysPerWarp; kk++)
            a[kk * G + i] = dot4(qv, Q::to_float(kr[kk][c]), a[kk * G + i]);
        }
      }
      int p;
      const float v = warp_sum_scatter(a, lane, p);
      const int key = base + p / G;
      if (lane % (32 / (kDecodeKeysPerWarp * G)) == 0 && key < nt) s.p[p % G][key] = v;
    }
    __syncthreads();
    if (warp < G) {  // warp i: head i's tile softmax, folded into its running maximum and sum
      float mx = -INFINITY;
      for (int j = lane; j < nt; j += 32) mx = fmaxf(mx, s.p[warp][j]);
      mx = warp_max_f(mx);
      const float m_old = s.m[warp], m_new = fmaxf(m_old, mx);  // finite: the tile has a key
      float sum = 0.0f;
      for (int j = lane; j < nt; j += 32) {
        const float e = exp2f(s.p[warp][j] - m_new);
        s.p[warp][j] = e;
        sum += e;
      }
      sum = warp_sum_f(sum);
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_new);
        s.alpha[warp] = alpha;
        s.l[warp] = fmaf(s.l[warp], alpha, sum);
        s.m[warp] = m_new;
      }
    }
    __syncthreads();
    if (group < groups) {
#pragma unroll
      for (int i = 0; i < G; i++) {
        const float al = s.alpha[i];
        acc[i].x *= al, acc[i].y *= al, acc[i].z *= al, acc[i].w *= al;
      }
      for (int j = group; j < nt; j += groups * kValueUnroll) {
        typename Q::Raw vv[kValueUnroll];
#pragma unroll
        for (int u = 0; u < kValueUnroll; u++) {
          const int jj = j + u * groups;
          vv[u] = jj < nt ? Q::load(vc.row(t0 + jj, kv_row, kv_off), 4 * quad) : Q::zero();
        }
#pragma unroll
        for (int u = 0; u < kValueUnroll; u++) {
          const int jj = j + u * groups;
          if (jj >= nt) break;
          const float4 v4 = Q::to_float(vv[u]);
#pragma unroll
          for (int i = 0; i < G; i++) fma4(acc[i], s.p[i][jj], v4);
        }
      }
    }
  }
  __syncthreads();  // the last tile's p are read: red overlays them
  if (group < groups)
#pragma unroll
    for (int i = 0; i < G; i++) *reinterpret_cast<float4*>(&s.red[(group * G + i) * hd + 4 * quad]) = acc[i];
  __syncthreads();
  for (int x = tid; x < G * hd; x += kDecodeThreads) {
    const int i = x / hd, d = x % hd;
    float sum = 0.0f;
    for (int gr = 0; gr < groups; gr++) sum += s.red[(gr * G + i) * hd + d];
    part_acc[((size_t)(h0 + i) * max_splits + split) * hd + d] = sum;
  }
  if (tid < G) {
    const size_t o = ((size_t)(h0 + tid) * max_splits + split) * 2;
    part_ml[o] = s.m[tid];
    part_ml[o + 1] = s.l[tid];
  }
}

// Second kernel of a decode step (and of a split chunk): block h folds output row h's splits (a
// head of the step, or (token, head) t·n_head + h of a chunk), w_s = 2^(m_s - M) with M their
// maximum, out = Σ w_s·acc_s / Σ w_s·l_s · sigmoid(gate). Thread (group, quad) sums dims 4·quad
// over the splits ≡ group (mod groups), then the groups are added. The partials of row h are
// max_splits apart; a decode step uses decode_splits of them (n_splits = 0), a chunk n_splits.
__global__ void __launch_bounds__(kDecodeThreads) attention_combine_fast_kernel(
    const float* __restrict__ part_acc, const float* __restrict__ part_ml, const float* __restrict__ gate,
    float* __restrict__ out, int hd, int pos0, const int32_t* __restrict__ pos_dev, int max_splits, int n_splits) {
  pdl_trigger();  // the output projection follows
  if (pos_dev) pos0 = pos_dev[0];
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

// Query heads a decode block: the largest power of two up to kMaxDecodeHeadsF dividing the group.
int decode_heads_per_block(int group) {
  int g = kMaxDecodeHeadsF;
  while (group % g != 0) g /= 2;
  return g;
}

template <int G, class E>
void launch_decode_split(const float* q, KvPlane<E> kc, KvPlane<E> vc, int n_head, int n_kv, int hd, int pos0,
                         const int32_t* pos_dev, float scale_log2, const AttentionSplitsF& sp,
                         cudaStream_t stream) {
  // With the position on the device every split a context could use gets a block; the ones past
  // the step's splits exit at once.
  const int grid_splits = pos_dev ? sp.max_splits : decode_splits(pos0 + 1, sp.max_splits);
  attention_decode_split_fast_kernel<G, E><<<dim3(n_head / G, grid_splits), kDecodeThreads, 0, stream>>>(
      q, kc, vc, sp.acc, sp.ml, n_head, n_kv, hd, pos0, pos_dev, scale_log2, sp.max_splits);
  RL_CUDA_LAUNCH_CHECK();
}

template <class E>
void attention_decode_fast(const float* q, const float* gate, KvPlane<E> kc, KvPlane<E> vc, float* out,
                           int n_head, int n_kv, int hd, int pos0, const int32_t* pos_dev, float scale_log2,
                           const AttentionSplitsF& sp, cudaStream_t stream) {
  switch (decode_heads_per_block(n_head / n_kv)) {
    case 8: launch_decode_split<8>(q, kc, vc, n_head, n_kv, hd, pos0, pos_dev, scale_log2, sp, stream); break;
    case 4: launch_decode_split<4>(q, kc, vc, n_head, n_kv, hd, pos0, pos_dev, scale_log2, sp, stream); break;
    case 2: launch_decode_split<2>(q, kc, vc, n_head, n_kv, hd, pos0, pos_dev, scale_log2, sp, stream); break;
    default: launch_decode_split<1>(q, kc, vc, n_head, n_kv, hd, pos0, pos_dev, scale_log2, sp, stream);
  }
  attention_combine_fast_kernel<<<n_head, kDecodeThreads, 0, stream>>>(sp.acc, sp.ml, gate, out, hd, pos0, pos_dev,
                                                                        sp.max_splits, 0);
  RL_CUDA_LAUNCH_CHECK();
}


}  // namespace

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
                                                                      n_splits, n_splits);
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda::fast_attention
