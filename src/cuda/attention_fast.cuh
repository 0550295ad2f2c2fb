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

__device__ __forceinline__ void fma4(float4& acc, float w, float4 v) {
  acc.x = fmaf(w, v.x, acc.x);
  acc.y = fmaf(w, v.y, acc.y);
  acc.z = fmaf(w, v.z, acc.z);
  acc.w = fmaf(w, v.w, acc.w);
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

// D += A·B, one mma.m16n8k16 (fp16 A 16×16 row-major, B 16×8 column-major, fp32 D). Fragments
// (PTX ISA), g = lane/4, q = lane%4: a = {A[g][2q..], A[g+8][2q..], A[g][2q+8..], A[g+8][2q+8..]},
// b = {B[2q..][g], B[2q+8..][g]}, d = {D[g][2q], D[g][2q+1], D[g+8][2q], D[g+8][2q+1]}.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// D += A·B, one mma.m16n8k8 (A 16×8, B 8×8): a = {A[g][2q..], A[g+8][2q..]}, b = B[2q..][g], d as above.
__device__ __forceinline__ void mma_f16_k8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b));
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
// A batched decode step's rows (gated_attention_fast_rows, kernels.h): the split and combine
// kernels over rows[r]'s cache, splits and pos_dev[r] per row.
template <class E>
void decode_rows(const float* q, const float* gate, const AttentionRow* rows, int max_splits, float* out, int B,
                 int n_head, int n_kv, int hd, const int32_t* pos_dev, float scale_log2, cudaStream_t stream);
void fold_chunk_splits(const AttentionSplitsF& sp, const float* gate, float* out, int rows, int hd, int n_splits,
                       cudaStream_t stream);
// The splits a decode step at most uses with buffers made for n_ctx tokens.
int max_decode_splits(int n_ctx);

}  // namespace rl::cuda::fast_attention
