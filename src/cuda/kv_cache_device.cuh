// How the attention kernels read and write a KV cache of each --kv-type (model/kv_type.h): one
// element type per cache type (float, __half, __nv_bfloat16, KvQ8) and, for each, the row a key
// position addresses (KvRow), four consecutive values loaded at once (KvQuad: the raw load, then
// fp32 or packed fp16 for the tensor cores) and a warp writing one head's row (store_row_warp).
// Every kernel that touches a cache is a template on the element type and goes through these,
// so the four types share one kernel body each.
//
// A q8_0 cache (KvCacheRef in kernels.h) holds the int8 values of every row [n_ctx][width] and
// then their fp16 scales [n_ctx][width / 32]; a block is 32 consecutive values of one row, which
// never straddles two heads (check_kv_type: head_dim a multiple of 32). Quantisation is ggml's
// quantize_row_q8_0_ref with the CPU backend's operations (cpu/kv_cache.cpp), so both backends
// store the same bits.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels.h"

namespace rl::cuda {

struct KvQ8 {};  // the element tag of a q8_0 cache

// The first value of row pos's head at column off: a pointer for the plain types; for q8_0 the
// row's values and its block scales.
template <class E>
struct KvRowOf {
  using type = E*;
};
struct KvRowQ8 {
  int8_t* q;
  __half* d;  // d[i] scales values 32i .. 32i + 31 of q
};
template <>
struct KvRowOf<KvQ8> {
  using type = KvRowQ8;
};
template <class E>
using KvRow = typename KvRowOf<E>::type;

// One of a layer's two caches (K or V), rows of `width` values.
template <class E>
struct KvPlane {
  E* values;
  static __host__ __device__ KvPlane of(void* base, int, size_t) { return {static_cast<E*>(base)}; }
  __device__ __forceinline__ E* row(size_t pos, size_t width, int off) const { return values + pos * width + off; }
};
template <>
struct KvPlane<KvQ8> {
  int8_t* q;
  __half* d;
  static __host__ __device__ KvPlane of(void* base, int n_ctx, size_t width) {
    int8_t* q = static_cast<int8_t*>(base);
    return {q, reinterpret_cast<__half*>(q + (size_t)n_ctx * width)};
  }
  __device__ __forceinline__ KvRowQ8 row(size_t pos, size_t width, int off) const {
    const size_t at = pos * width + off;
    return {q + at, d + at / kKvQ8Block};
  }
};

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);  // lo in the low 16 bits: mma's lower column
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Four consecutive values of a row (or of a query row: float) at column d, d a multiple of 4.
template <class E>
struct KvQuad;
template <>
struct KvQuad<float> {
  using Raw = float4;
  static __device__ __forceinline__ Raw load(const float* row, int d) {
    return __ldg(reinterpret_cast<const float4*>(row + d));
  }
  static __device__ __forceinline__ Raw zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
  static __device__ __forceinline__ float4 to_float(Raw r) { return r; }
  static __device__ __forceinline__ uint2 to_half(Raw r) {
    return make_uint2(pack_half2(r.x, r.y), pack_half2(r.z, r.w));
  }
};
// The 16-bit types: four values are one 8-byte load.
template <class H>
struct KvQuadBits16 {
  using Raw = uint2;
  static __device__ __forceinline__ Raw load(const H* row, int d) { return __ldg(reinterpret_cast<const uint2*>(row + d)); }
  static __device__ __forceinline__ Raw zero() { return make_uint2(0u, 0u); }
};
template <>
struct KvQuad<__half> : KvQuadBits16<__half> {
  static __device__ __forceinline__ float4 to_float(Raw r) {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&r.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&r.y));
    return make_float4(a.x, a.y, b.x, b.y);
  }
  static __device__ __forceinline__ uint2 to_half(Raw r) { return r; }
};
template <>
struct KvQuad<__nv_bfloat16> : KvQuadBits16<__nv_bfloat16> {
  // A bf16 is the high half of its fp32.
  static __device__ __forceinline__ float4 to_float(Raw r) {
    return make_float4(__uint_as_float(r.x << 16), __uint_as_float(r.x & 0xffff0000u), __uint_as_float(r.y << 16),
                       __uint_as_float(r.y & 0xffff0000u));
  }
  static __device__ __forceinline__ uint2 to_half(Raw r) { return KvQuad<float>::to_half(to_float(r)); }
};
template <>
struct KvQuad<KvQ8> {
  struct Raw {
    uint32_t q;  // four int8 values, the first in the low byte
    float d;
  };
  static __device__ __forceinline__ Raw load(const KvRowQ8& row, int d) {
    return {__ldg(reinterpret_cast<const uint32_t*>(row.q + d)), __half2float(__ldg(row.d + d / kKvQ8Block))};
  }
  static __device__ __forceinline__ Raw zero() { return {0u, 0.0f}; }
  // ggml's dequantisation: value = q · d in fp32.
  static __device__ __forceinline__ float4 to_float(Raw r) {
    return make_float4((float)(int8_t)(r.q & 0xff) * r.d, (float)(int8_t)((r.q >> 8) & 0xff) * r.d,
                       (float)(int8_t)((r.q >> 16) & 0xff) * r.d, (float)(int8_t)(r.q >> 24) * r.d);
  }
  static __device__ __forceinline__ uint2 to_half(Raw r) { return KvQuad<float>::to_half(to_float(r)); }
};

// Eight consecutive values of a row at column d (d a multiple of 8: one q8_0 block holds them all)
// as four packed fp16 pairs, value 2i in the low half of word i: the decode kernel's mma operands.
template <class E>
struct KvOct {
  static __device__ __forceinline__ uint4 load(KvRow<E> row, int d) {
    const uint2 lo = KvQuad<E>::to_half(KvQuad<E>::load(row, d)), hi = KvQuad<E>::to_half(KvQuad<E>::load(row, d + 4));
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
  }
};
template <>
struct KvOct<__half> {
  static __device__ __forceinline__ uint4 load(const __half* row, int d) {
    return __ldg(reinterpret_cast<const uint4*>(row + d));
  }
};
template <>
struct KvOct<KvQ8> {
  static __device__ __forceinline__ uint4 load(const KvRowQ8& row, int d) {
    const uint2 q = __ldg(reinterpret_cast<const uint2*>(row.q + d));
    const float s = __half2float(__ldg(row.d + d / kKvQ8Block));
    const auto pair = [s](uint32_t w, int at) {
      return pack_half2((float)(int8_t)((w >> at) & 0xff) * s, (float)(int8_t)((w >> (at + 8)) & 0xff) * s);
    };
    return make_uint4(pair(q.x, 0), pair(q.x, 16), pair(q.y, 0), pair(q.y, 16));
  }
};

// A cache value from fp32: itself, or rounded to nearest even.
__device__ __forceinline__ void to_cache(float& dst, float x) { dst = x; }
__device__ __forceinline__ void to_cache(__half& dst, float x) { dst = __float2half_rn(x); }
__device__ __forceinline__ void to_cache(__nv_bfloat16& dst, float x) { dst = __float2bfloat16_rn(x); }

// A warp writes the n values src[0 .. n) (any memory the warp can read) into a row.
template <class E>
__device__ __forceinline__ void store_row_warp(E* row, const float* src, int n, int lane) {
  for (int i = lane; i < n; i += 32) to_cache(row[i], src[i]);
}
// q8_0: lane j quantises value j of each block of 32 (n a multiple of 32), as
// cpu::quantize_kv_block_q8_0: d = max|x| / 127, q = round(x · (1 / d)), d stored as fp16.
__device__ __forceinline__ void store_row_warp(const KvRowQ8& row, const float* src, int n, int lane) {
  for (int b = 0; b < n; b += kKvQ8Block) {
    const float x = src[b + lane];
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    row.q[b + lane] = (int8_t)roundf(x * inverse);
    if (lane == 0) row.d[b / kKvQ8Block] = __float2half_rn(d);
  }
}

// Calls f(E{}) with the element type of a cache type (host side: the launchers' one switch).
template <class F>
void with_kv_element(KvType t, F&& f) {
  switch (t) {
    case KvType::kF32: f(float{}); return;
    case KvType::kF16: f(__half{}); return;
    case KvType::kBF16: f(__nv_bfloat16{}); return;
    case KvType::kQ8_0: f(KvQ8{}); return;
  }
}

}  // namespace rl::cuda
