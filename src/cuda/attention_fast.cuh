// Device helpers and internal launchers shared by the fast tier's attention files
// (attention_fast.cu: the chunk kernel and the public launchers; attention_fast_decode.cu: the
// decode step and the fold of split partials).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels.h"
#include "cuda/kv_cache_device.cuh"

namespace rl::cuda::fast_attention {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxHeadDimF = 256;

__device__ __forceinline__ float sigmoid_fast(float x) { return 1.0f / (1.0f + __expf(-x)); }

__device__ __forceinline__ void fma4(float4& acc, float w, float4 v) {
  acc.x = fmaf(w, v.x, acc.x);
  acc.y = fmaf(w, v.y, acc.y);
  acc.z = fmaf(w, v.z, acc.z);
  acc.w = fmaf(w, v.w, acc.w);
}
__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}
__device__ __forceinline__ float warp_max_f(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum_f(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- attention_fast_decode.cu ----
// A decode step over a cache of element type E (scale_log2 = scale·log2(e)): the split kernel,
// then the fold with the gate. Instantiated for the four element types in that file.
template <class E>
void decode_step(const float* q, const float* gate, KvPlane<E> kc, KvPlane<E> vc, float* out, int n_head, int n_kv,
                 int hd, int pos0, const int32_t* pos_dev, float scale_log2, const AttentionSplitsF& sp,
                 cudaStream_t stream);
// Folds a split chunk's partials: output row r (token, head) = t·n_head + h has n_splits partials
// at sp.acc + (r·n_splits + s)·hd and sp.ml + (r·n_splits + s)·2.
void fold_chunk_splits(const AttentionSplitsF& sp, const float* gate, float* out, int rows, int hd, int n_splits,
                       cudaStream_t stream);
// The splits a decode step at most uses with buffers made for n_ctx tokens.
int max_decode_splits(int n_ctx);

}  // namespace rl::cuda::fast_attention
