// Device helpers and internal launchers shared by the fast tier's attention files
// (attention_fast.cu: the chunk kernel and the public launchers; attention_fast_decode.cu: the
// decode step and the fold of split partials).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels.h"

namespace rl::cuda::fast_attention {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxHeadDimF = 256;

__device__ __forceinline__ float sigmoid_fast(float x) { return 1.0f / (1.0f + __expf(-x)); }

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);  // lo in the low 16 bits: mma's lower column
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Four consecutive values of a cache (or query) row: the load and its conversions.
template <class Cache>
struct Quad;
template <>
struct Quad<float> {
  using Raw = float4;
  static __device__ __forceinline__ Raw load(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
  static __device__ __forceinline__ Raw zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
  static __device__ __forceinline__ float4 to_float(Raw r) { return r; }
  static __device__ __forceinline__ uint2 to_half(Raw r) {
    return make_uint2(pack_half2(r.x, r.y), pack_half2(r.z, r.w));
  }
};

template <>
struct Quad<__half> {
  using Raw = uint2;
  static __device__ __forceinline__ Raw load(const __half* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
  static __device__ __forceinline__ Raw zero() { return make_uint2(0u, 0u); }
  static __device__ __forceinline__ float4 to_float(Raw r) {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&r.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&r.y));
    return make_float4(a.x, a.y, b.x, b.y);
  }
  static __device__ __forceinline__ uint2 to_half(Raw r) { return r; }
};

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
// A decode step over fp32 or f16 caches (scale_log2 = scale·log2(e)): the split kernel, then the
// fold with the gate.
void decode_step(const float* q, const float* gate, const float* kc, const float* vc, float* out, int n_head, int n_kv,
                 int hd, int pos0, const int32_t* pos_dev, float scale_log2, const AttentionSplitsF& sp,
                 cudaStream_t stream);
void decode_step(const float* q, const float* gate, const __half* kc, const __half* vc, float* out, int n_head,
                 int n_kv, int hd, int pos0, const int32_t* pos_dev, float scale_log2, const AttentionSplitsF& sp,
                 cudaStream_t stream);
// Folds a split chunk's partials: output row r (token, head) = t·n_head + h has n_splits partials
// at sp.acc + (r·n_splits + s)·hd and sp.ml + (r·n_splits + s)·2.
void fold_chunk_splits(const AttentionSplitsF& sp, const float* gate, float* out, int rows, int hd, int n_splits,
                       cudaStream_t stream);
// The splits a decode step at most uses with buffers made for n_ctx tokens.
int max_decode_splits(int n_ctx);

}  // namespace rl::cuda::fast_attention
