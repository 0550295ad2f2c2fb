// Device-side dequantisation of the ggml block types, eight values at a time.
//
// Every kernel that reads quantised weights (matvec.cu, matmul.cu, get_rows) goes through
// Dequant<T>::chunk8(row, c, out): the values 8c .. 8c+7 of a row, computed with the same
// arithmetic as ggml's reference dequantisation (quant/quant_kernels.h on the CPU), so a GPU
// product differs from the CPU oracle's only in the order of the fp32 sums.
// Block layouts: quant/blocks.h. Rows start at arbitrary block multiples, so reads are at most
// 16-bit wide (several block sizes are only 2-byte aligned).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/cuda_check.h"
#include "quant/quant.h"

namespace rl::cuda {

// Codebooks of the IQ types (quant/iq_grids.h), as uploaded by quant_tables.cu.
struct QuantTablesHost {
  uint64_t iq2xxs_grid[256];
  uint64_t iq2xs_grid[512];
  uint64_t iq1s_grid[2048];
  uint8_t ksigns_iq2xs[128];
};

// The device copies. The library is built without separable compilation, so a __device__ variable
// is private to its translation unit: every .cu that dequantises has its own copy, filled by its
// own upload function (RL_QUANT_TABLES_UPLOADER), all called from upload_quant_tables().
static __device__ uint64_t g_iq2xxs_grid[256];
static __device__ uint64_t g_iq2xs_grid[512];
static __device__ uint64_t g_iq1s_grid[2048];
static __device__ uint8_t g_ksigns_iq2xs[128];

#define RL_QUANT_TABLES_UPLOADER(fn)                                                    \
  void fn(const QuantTablesHost& h) {                                                   \
    RL_CUDA_CHECK(cudaMemcpyToSymbol(g_iq2xxs_grid, h.iq2xxs_grid, sizeof h.iq2xxs_grid)); \
    RL_CUDA_CHECK(cudaMemcpyToSymbol(g_iq2xs_grid, h.iq2xs_grid, sizeof h.iq2xs_grid));    \
    RL_CUDA_CHECK(cudaMemcpyToSymbol(g_iq1s_grid, h.iq1s_grid, sizeof h.iq1s_grid));       \
    RL_CUDA_CHECK(cudaMemcpyToSymbol(g_ksigns_iq2xs, h.ksigns_iq2xs, sizeof h.ksigns_iq2xs)); \
  }
// The units that dequantise.
void upload_quant_tables_matvec(const QuantTablesHost& h);
void upload_quant_tables_matmul(const QuantTablesHost& h);

__device__ __forceinline__ float half_bits_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t load_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

template <GgmlType T>
struct Dequant;

template <>
struct Dequant<GgmlType::F32> {
  static constexpr int kValues = 1, kBytes = 4;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const float* p = reinterpret_cast<const float*>(row) + 8 * c;
#pragma unroll
    for (int j = 0; j < 8; j++) out[j] = p[j];
  }
};

template <>
struct Dequant<GgmlType::F16> {
  static constexpr int kValues = 1, kBytes = 2;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + 8 * c;
#pragma unroll
    for (int j = 0; j < 8; j++) out[j] = half_bits_to_f32(p[j]);
  }
};

template <>
struct Dequant<GgmlType::BF16> {
  static constexpr int kValues = 1, kBytes = 2;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + 8 * c;
#pragma unroll
    for (int j = 0; j < 8; j++) out[j] = __uint_as_float((uint32_t)p[j] << 16);
  }
};

// x = d * q
template <>
struct Dequant<GgmlType::Q8_0> {
  static constexpr int kValues = 32, kBytes = 34;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 2) * kBytes;
    const float d = half_bits_to_f32(load_u16(b));
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2) + 8 * (c & 3);
#pragma unroll
    for (int j = 0; j < 8; j++) out[j] = d * (float)qs[j];
  }
};

// 16 sub-blocks of 16: x = d*(sc&15)*q - dmin*(sc>>4). Value v of the block: half n = v/128,
// shift 2*((v%128)/32), byte qs[32n + (v%32)], scale 8n + 2*((v%128)/32) + (v%32)/16.
template <>
struct Dequant<GgmlType::Q2_K> {
  static constexpr int kValues = 256, kBytes = 84;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int v0 = (c & 31) * 8;
    const int n = v0 >> 7, j = (v0 & 127) >> 5, l0 = v0 & 31;
    const uint8_t sc = b[8 * n + 2 * j + (l0 >> 4)];
    const float d = half_bits_to_f32(load_u16(b + 80)), dmin = half_bits_to_f32(load_u16(b + 82));
    const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
    const uint8_t* q = b + 16 + 32 * n + l0;
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = dl * (float)((q[i] >> (2 * j)) & 3) - ml;
  }
};

// The 6-bit (scale, min) pairs of Q4_K and Q5_K, packed in 12 bytes.
__device__ __forceinline__ void k4_scale_min(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// 8 sub-blocks of 32: x = d*sc*q - dmin*m. Value v: pair p = v/64, high nibble when (v%64) >= 32.
template <>
struct Dequant<GgmlType::Q4_K> {
  static constexpr int kValues = 256, kBytes = 144;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int v0 = (c & 31) * 8;
    const int p = v0 >> 6, hi = (v0 >> 5) & 1, l0 = v0 & 31;
    int sc, m;
    k4_scale_min(2 * p + hi, b + 4, sc, m);
    const float d = half_bits_to_f32(load_u16(b)) * (float)sc;
    const float mn = half_bits_to_f32(load_u16(b + 2)) * (float)m;
    const uint8_t* q = b + 16 + 32 * p + l0;
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = d * (float)(hi ? (q[i] >> 4) : (q[i] & 0xF)) - mn;
  }
};

// Q4_K plus a fifth bit: bit (2p + hi) of qh[l].
template <>
struct Dequant<GgmlType::Q5_K> {
  static constexpr int kValues = 256, kBytes = 176;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int v0 = (c & 31) * 8;
    const int p = v0 >> 6, hi = (v0 >> 5) & 1, l0 = v0 & 31;
    int sc, m;
    k4_scale_min(2 * p + hi, b + 4, sc, m);
    const float d = half_bits_to_f32(load_u16(b)) * (float)sc;
    const float mn = half_bits_to_f32(load_u16(b + 2)) * (float)m;
    const uint8_t* qh = b + 16 + l0;
    const uint8_t* q = b + 48 + 32 * p + l0;
    const int bit = 2 * p + hi;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const int lo = hi ? (q[i] >> 4) : (q[i] & 0xF);
      out[i] = d * (float)(lo + (((qh[i] >> bit) & 1) ? 16 : 0)) - mn;
    }
  }
};

// 16 sub-blocks of 16: x = d*sc*(q-32). Value v: half n = v/128, quarter k = (v%128)/32, l = v%32:
// low bits ql[64n + l + 32(k&1)] (high nibble for k >= 2), high bits (qh[32n + l] >> 2k) & 3,
// scale 8n + l/16 + 2k.
template <>
struct Dequant<GgmlType::Q6_K> {
  static constexpr int kValues = 256, kBytes = 210;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int v0 = (c & 31) * 8;
    const int n = v0 >> 7, k = (v0 & 127) >> 5, l0 = v0 & 31;
    const float d = half_bits_to_f32(load_u16(b + 208));
    const int8_t sc = reinterpret_cast<const int8_t*>(b + 192)[8 * n + (l0 >> 4) + 2 * k];
    const float ds = d * (float)sc;
    const uint8_t* ql = b + 64 * n + l0 + 32 * (k & 1);
    const uint8_t* qh = b + 128 + 32 * n + l0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const int lo = (k >= 2) ? (ql[i] >> 4) : (ql[i] & 0xF);
      const int q = (int)(int8_t)(lo | (((qh[i] >> (2 * k)) & 3) << 4)) - 32;
      out[i] = ds * (float)q;
    }
  }
};

// 8 groups of 32, each four 8-value grid points (byte indices) with 7-bit sign patterns and a
// 4-bit scale in the second 32-bit word: x = d*(0.5+ls)*0.25 * grid * sign.
template <>
struct Dequant<GgmlType::IQ2_XXS> {
  static constexpr int kValues = 256, kBytes = 66;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int ib = (c & 31) >> 2, l = c & 3;
    const uint8_t* q = b + 2 + 8 * ib;
    const uint32_t aux1 = (uint32_t)load_u16(q + 4) | ((uint32_t)load_u16(q + 6) << 16);
    const float d = half_bits_to_f32(load_u16(b));
    const float db = d * (0.5f + (float)(aux1 >> 28)) * 0.25f;
    const uint64_t grid = g_iq2xxs_grid[q[l]];
    const uint8_t signs = g_ksigns_iq2xs[(aux1 >> (7 * l)) & 127];
#pragma unroll
    for (int j = 0; j < 8; j++)
      out[j] = db * (float)((grid >> (8 * j)) & 0xFF) * ((signs >> j) & 1 ? -1.f : 1.f);
  }
};

// Like IQ2_XXS with 9-bit grid indices and two 4-bit scales per 32-value group.
template <>
struct Dequant<GgmlType::IQ2_XS> {
  static constexpr int kValues = 256, kBytes = 74;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int ib = (c & 31) >> 2, l = c & 3;
    const float d = half_bits_to_f32(load_u16(b));
    const uint8_t s = b[66 + ib];
    const float db = d * (0.5f + (float)((l < 2) ? (s & 0xF) : (s >> 4))) * 0.25f;
    const uint16_t qs = load_u16(b + 2 + 2 * (4 * ib + l));
    const uint64_t grid = g_iq2xs_grid[qs & 511];
    const uint8_t signs = g_ksigns_iq2xs[qs >> 9];
#pragma unroll
    for (int j = 0; j < 8; j++)
      out[j] = db * (float)((grid >> (8 * j)) & 0xFF) * ((signs >> j) & 1 ? -1.f : 1.f);
  }
};

// 8 groups of 32: four 11-bit indices into the ternary iq1s grid, a ±1/8 shift per 8 values and
// two 3-bit scales per group; the fp16 super-scale is spread over the scale words' top nibbles.
template <>
struct Dequant<GgmlType::IQ1_M> {
  static constexpr int kValues = 256, kBytes = 56;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int ib = (c & 31) >> 2, l = c & 3;
    const uint8_t* sc8 = b + 48;
    uint16_t sc[4];
#pragma unroll
    for (int i = 0; i < 4; i++) sc[i] = load_u16(sc8 + 2 * i);
    const uint16_t scale = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    const float d = half_bits_to_f32(scale);
    const int shift = 6 * (ib % 2) + (l < 2 ? 0 : 3);
    const float dl = d * (float)(2 * ((sc[ib / 2] >> shift) & 0x7) + 1);
    const uint8_t qh = b[32 + 2 * ib + (l >> 1)];
    const int idx = b[4 * ib + l] | (((l & 1) ? (qh << 4) : (qh << 8)) & 0x700);
    const float delta = (qh & ((l & 1) ? 0x80 : 0x08)) ? -0.125f : 0.125f;
    const uint64_t grid = g_iq1s_grid[idx];
#pragma unroll
    for (int j = 0; j < 8; j++) out[j] = dl * ((float)(int8_t)((grid >> (8 * j)) & 0xFF) + delta);
  }
};

// Calls f.template operator()<T>() for the weight types this backend runs; false for the others.
// The list is the types of the project's recipes and fixtures (DESIGN.md §2, issue 6).
template <class F>
bool dispatch_type(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::F32: f.template operator()<GgmlType::F32>(); return true;
    case GgmlType::F16: f.template operator()<GgmlType::F16>(); return true;
    case GgmlType::BF16: f.template operator()<GgmlType::BF16>(); return true;
    case GgmlType::Q8_0: f.template operator()<GgmlType::Q8_0>(); return true;
    case GgmlType::Q2_K: f.template operator()<GgmlType::Q2_K>(); return true;
    case GgmlType::Q4_K: f.template operator()<GgmlType::Q4_K>(); return true;
    case GgmlType::Q5_K: f.template operator()<GgmlType::Q5_K>(); return true;
    case GgmlType::Q6_K: f.template operator()<GgmlType::Q6_K>(); return true;
    case GgmlType::IQ2_XXS: f.template operator()<GgmlType::IQ2_XXS>(); return true;
    case GgmlType::IQ2_XS: f.template operator()<GgmlType::IQ2_XS>(); return true;
    case GgmlType::IQ1_M: f.template operator()<GgmlType::IQ1_M>(); return true;
    default: return false;
  }
}

}  // namespace rl::cuda
