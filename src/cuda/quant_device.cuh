// Device-side dequantisation of the ggml block types, eight values at a time.
//
// Every kernel that reads quantised weights (matvec.cu, matmul.cu, get_rows) goes through
// Dequant<T>::chunk8(row, c, out): the values 8c .. 8c+7 of a row, computed with the same
// arithmetic as ggml's reference dequantisation (quant/quant_kernels.h on the CPU), so a GPU
// product differs from the CPU oracle's only in the order of the fp32 sums.
// Block layouts: quant/blocks.h. Rows start at block multiples from a device allocation, so a
// block is 4-byte aligned when its size is (Q4_K 144, Q5_K 176: 32-bit loads) and 2-byte aligned
// otherwise (Q8_0 34, Q6_K 210, the IQ types: 16-bit loads). The types without a tuned form:
// quant_device_generic.cuh.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/cuda_check.h"
#include "quant/quant.h"

namespace rl::cuda {

// Codebooks of the IQ types and the 4-bit value tables of IQ4_NL / IQ4_XS and MXFP4
// (quant/iq_grids.h), as uploaded by quant_tables.cu.
struct QuantTablesHost {
  uint64_t iq2xxs_grid[256];
  uint64_t iq2xs_grid[512];
  uint64_t iq2s_grid[1024];
  uint32_t iq3xxs_grid[256];
  uint32_t iq3s_grid[512];
  uint64_t iq1s_grid[2048];
  uint8_t ksigns_iq2xs[128];
  int8_t kvalues_iq4nl[16];
  int8_t kvalues_mxfp4[16];
};

// The device copies. The library is built without separable compilation, so a __device__ variable
// is private to its translation unit: every .cu that dequantises has its own copy, filled by its
// own upload function (RL_QUANT_TABLES_UPLOADER), all called from upload_quant_tables().
static __device__ uint64_t g_iq2xxs_grid[256];
static __device__ uint64_t g_iq2xs_grid[512];
static __device__ uint64_t g_iq2s_grid[1024];
static __device__ uint32_t g_iq3xxs_grid[256];
static __device__ uint32_t g_iq3s_grid[512];
static __device__ uint64_t g_iq1s_grid[2048];
static __device__ uint8_t g_ksigns_iq2xs[128];
static __device__ int8_t g_kvalues_iq4nl[16];
static __device__ int8_t g_kvalues_mxfp4[16];

#define RL_QUANT_TABLE_UPLOAD(name) RL_CUDA_CHECK(cudaMemcpyToSymbol(g_##name, h.name, sizeof h.name))
#define RL_QUANT_TABLES_UPLOADER(fn)                                                      \
  void fn(const QuantTablesHost& h) {                                                     \
    RL_QUANT_TABLE_UPLOAD(iq2xxs_grid);                                                   \
    RL_QUANT_TABLE_UPLOAD(iq2xs_grid);                                                    \
    RL_QUANT_TABLE_UPLOAD(iq2s_grid);                                                     \
    RL_QUANT_TABLE_UPLOAD(iq3xxs_grid);                                                   \
    RL_QUANT_TABLE_UPLOAD(iq3s_grid);                                                     \
    RL_QUANT_TABLE_UPLOAD(iq1s_grid);                                                     \
    RL_QUANT_TABLE_UPLOAD(ksigns_iq2xs);                                                  \
    RL_QUANT_TABLE_UPLOAD(kvalues_iq4nl);                                                 \
    RL_QUANT_TABLE_UPLOAD(kvalues_mxfp4);                                                 \
  }
// The units that dequantise.
void upload_quant_tables_matvec(const QuantTablesHost& h);
void upload_quant_tables_matmul(const QuantTablesHost& h);
void upload_quant_tables_x24(const QuantTablesHost& h);
void upload_quant_tables_bf16(const QuantTablesHost& h);
void upload_quant_tables_matvec_q8(const QuantTablesHost& h);

__device__ __forceinline__ float half_bits_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t load_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
// 4N bytes at a 2-byte aligned address p as N little-endian words: 32-bit loads of the aligned
// words, joined by funnel shifts where p is not 4-byte aligned (the Q6_K, Q8_0 blocks every other
// block: matvec_q8.cu, matmul_q8.cu), never reading outside [p, p + 4N).
template <int N>
__device__ __forceinline__ void load_words_a2(const uint8_t* p, uint32_t (&w)[N]) {
  const bool odd = (reinterpret_cast<uintptr_t>(p) & 2) != 0;
  const uint8_t* base = p - (odd ? 2 : 0);
  uint32_t a[N + 1];
  a[0] = odd ? (uint32_t)load_u16(p) << 16 : load_u32(base);
#pragma unroll
  for (int i = 1; i < N; i++) a[i] = load_u32(base + 4 * i);
  a[N] = odd ? (uint32_t)load_u16(base + 4 * N) : 0u;
#pragma unroll
  for (int i = 0; i < N; i++) w[i] = __funnelshift_r(a[i], a[i + 1], odd ? 16 : 0);
}
__device__ __forceinline__ uint32_t load_word_a2(const uint8_t* p) {
  uint32_t w[1];
  load_words_a2<1>(p, w);
  return w[0];
}
// Eight bytes as two little-endian words, from a 4-byte (load8_a4) or 2-byte (load8_a2) aligned
// address: one or two wide loads instead of eight byte loads.
__device__ __forceinline__ uint2 load8_a4(const uint8_t* p) { return make_uint2(load_u32(p), load_u32(p + 4)); }
__device__ __forceinline__ uint2 load8_a2(const uint8_t* p) {
  return make_uint2((uint32_t)load_u16(p) | ((uint32_t)load_u16(p + 2) << 16),
                    (uint32_t)load_u16(p + 4) | ((uint32_t)load_u16(p + 6) << 16));
}
// (float)q for 0 <= q < 2^23 without the int -> float conversion instruction (slow on the GPU):
// 2^23 + q is exact in fp32 and so is the subtraction.
__device__ __forceinline__ float small_uint_to_float(int q) { return __int_as_float(0x4B000000 | q) - 8388608.0f; }
// The same for -2^22 < q < 2^22.
__device__ __forceinline__ float small_int_to_float(int q) {
  return __int_as_float(0x4B000000 | (q + 4194304)) - 12582912.0f;
}

// Byte i (0..7) of eight loaded bytes.
__device__ __forceinline__ int byte8(uint2 w, int i) { return (int)(((i < 4 ? w.x : w.y) >> (8 * (i & 3))) & 0xFF); }

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
    const uint2 qs = load8_a2(b + 2 + 8 * (c & 3));
#pragma unroll
    for (int j = 0; j < 8; j++) out[j] = d * small_int_to_float((int8_t)byte8(qs, j));
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

// The 6-bit (scale, min) pair j of Q4_K and Q5_K, packed in 12 bytes, from those bytes as three
// words w0..w2, or at q (4-byte aligned).
__device__ __forceinline__ void k4_scale_min_w(int j, uint32_t w0, uint32_t w1, uint32_t w2, int& sc, int& m) {
  auto byte = [&](int i) { return (int)(((i < 4 ? w0 : (i < 8 ? w1 : w2)) >> (8 * (i & 3))) & 0xFF); };
  if (j < 4) {
    sc = byte(j) & 63;
    m = byte(j + 4) & 63;
  } else {
    sc = (byte(j + 4) & 0xF) | ((byte(j - 4) >> 6) << 4);
    m = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
  }
}
__device__ __forceinline__ void k4_scale_min_w(int j, const uint8_t* q, int& sc, int& m) {
  k4_scale_min_w(j, load_u32(q), load_u32(q + 4), load_u32(q + 8), sc, m);
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
    k4_scale_min_w(2 * p + hi, b + 4, sc, m);
    const uint32_t dm = load_u32(b);
    const float d = half_bits_to_f32((uint16_t)(dm & 0xFFFF)) * (float)sc;
    const float mn = half_bits_to_f32((uint16_t)(dm >> 16)) * (float)m;
    const uint2 q = load8_a4(b + 16 + 32 * p + l0);
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = d * small_uint_to_float(hi ? (byte8(q, i) >> 4) : (byte8(q, i) & 0xF)) - mn;
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
    k4_scale_min_w(2 * p + hi, b + 4, sc, m);
    const uint32_t dm = load_u32(b);
    const float d = half_bits_to_f32((uint16_t)(dm & 0xFFFF)) * (float)sc;
    const float mn = half_bits_to_f32((uint16_t)(dm >> 16)) * (float)m;
    const uint2 qh = load8_a4(b + 16 + l0);
    const uint2 q = load8_a4(b + 48 + 32 * p + l0);
    const int bit = 2 * p + hi;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const int lo = hi ? (byte8(q, i) >> 4) : (byte8(q, i) & 0xF);
      out[i] = d * small_uint_to_float(lo + (((byte8(qh, i) >> bit) & 1) ? 16 : 0)) - mn;
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
    const uint2 ql = load8_a2(b + 64 * n + l0 + 32 * (k & 1));
    const uint2 qh = load8_a2(b + 128 + 32 * n + l0);
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const int lo = (k >= 2) ? (byte8(ql, i) >> 4) : (byte8(ql, i) & 0xF);
      const int q = (int)(int8_t)(lo | (((byte8(qh, i) >> (2 * k)) & 3) << 4)) - 32;
      out[i] = ds * small_int_to_float(q);
    }
  }
};

// ksigns_iq2xs[i]: the 7 sign bits i and an eighth that makes the parity even.
__device__ __forceinline__ uint8_t ksigns(int i) { return (uint8_t)(i | ((__popc(i) & 1) << 7)); }

// ---- The IQ types in integer form, for the decode products (matvec.cu) ----------------------------
// The eight values of a chunk are w_j = s * (u_j - b), exactly the fp32 values chunk8 gives, for an
// fp32 scale s, a bias b and small unsigned bytes u_j. Exact because s * g needs at most 24 bits:
// IQ2 s = d*(0.5+l)*0.25 has at most 16 significant bits (fp16 d, 2l+1 < 32) and |g| <= 43 six;
// IQ1_M s = d*(2l+1) at most 15 and g + delta in {±1/8, ±7/8, ±9/8} at most 4. So a chunk's part of
// a dot product is s * (Σ u_j x_j - b Σ x_j): exact products of small integers, which the kernel
// forms from the bytes without a conversion instruction per weight (the sums then round in double).
struct IqChunk {
  uint2 u;  // u_0..u_3 in u.x, u_4..u_7 in u.y
  float s, b;
};
// IQ2 bytes: u = 43 + sign * g for grid bytes g in {8, 25, 43} and sign bytes m (0 or 0xFF): per
// byte 43 + g - (m & 2g), which stays in 0..86, so no carry or borrow crosses a byte.
constexpr uint32_t kIq2Bias = 43;
__device__ __forceinline__ uint32_t iq2_signed_bytes(uint32_t g, uint32_t m) {
  return g + kIq2Bias * 0x01010101u - (m & (g << 1));
}
__device__ __forceinline__ uint2 iq2_signed_bytes(uint64_t grid, uint64_t masks) {
  return make_uint2(iq2_signed_bytes((uint32_t)grid, (uint32_t)masks),
                    iq2_signed_bytes((uint32_t)(grid >> 32), (uint32_t)(masks >> 32)));
}
// The same values as signed bytes s·g (no bias): (g ^ m) + (m & 1) per byte; g ≥ 8, so g ^ 0xFF ≤
// 247 and the +1 carries out of no byte.
__device__ __forceinline__ uint32_t iq2_s8(uint32_t g, uint32_t m) { return (g ^ m) + (m & 0x01010101u); }
__device__ __forceinline__ uint2 iq2_s8(uint64_t grid, uint64_t masks) {
  return make_uint2(iq2_s8((uint32_t)grid, (uint32_t)masks), iq2_s8((uint32_t)(grid >> 32), (uint32_t)(masks >> 32)));
}
// An IQ2 chunk in the integer form, u biased (b = 43, the exact tier's products and matvec.cu) or,
// kSigned, the signed bytes with b = 0 (matvec-q8's dp4a takes signed bytes).
template <bool kSigned>
__device__ __forceinline__ IqChunk iq2_chunk(uint64_t grid, uint64_t masks, float s) {
  if constexpr (kSigned) return {iq2_s8(grid, masks), s, 0.0f};
  else return {iq2_signed_bytes(grid, masks), s, (float)kIq2Bias};
}
// The byte masks of a 7-bit IQ2 sign code: byte j is 0xFF when ksigns(code) has bit j. Without a
// table or a loop: bit j < 4 of a nibble goes to bit 8j by one multiply (the nibble's four shifted
// copies do not overlap, so nothing carries), and each byte's 0 or 1 times 0xFF is its mask (the
// IQ2 kernel tests compare the decoded values with the CPU's). The decode products compute it
// instead of reading a shared-memory table, whose random 64-bit reads cost bank conflicts
// (PERF.md, Nsight Compute); the X24 kernels' table is filled with it.
__device__ __forceinline__ uint64_t iq2_sign_bytes(uint32_t code) {
  const uint32_t bits = ksigns((int)code);
  const uint32_t lo = (((bits & 0xFu) * 0x00204081u) & 0x01010101u) * 0xFFu;
  const uint32_t hi = (((bits >> 4) * 0x00204081u) & 0x01010101u) * 0xFFu;
  return (uint64_t)hi << 32 | lo;
}

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
  static constexpr int kGridEntries = 256;
  __device__ static const uint64_t* grid_table() { return g_iq2xxs_grid; }
  // Integer form (IqChunk): the loads of a chunk, then its decode with the codebook (the kernel's
  // shared-memory copy) and the sign masks (iq2_sign_bytes).
  struct Raw {
    uint32_t aux1;
    uint16_t d;
    uint8_t idx;
  };
  __device__ static Raw load(const uint8_t* row, int c) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const uint8_t* q = b + 2 + 8 * ((c & 31) >> 2);
    return {(uint32_t)load_u16(q + 4) | ((uint32_t)load_u16(q + 6) << 16), load_u16(b), q[c & 3]};
  }
  template <bool kSigned = false>
  __device__ static IqChunk decode(const Raw& r, int c, const uint64_t* grid) {
    const float d = half_bits_to_f32(r.d);
    const float db = d * (0.5f + (float)(r.aux1 >> 28)) * 0.25f;
    return iq2_chunk<kSigned>(grid[r.idx], iq2_sign_bytes((r.aux1 >> (7 * (c & 3))) & 127), db);
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
  static constexpr int kGridEntries = 512;
  __device__ static const uint64_t* grid_table() { return g_iq2xs_grid; }
  struct Raw {
    uint16_t d, qs;
    uint8_t sc;
  };
  __device__ static Raw load(const uint8_t* row, int c) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int ib = (c & 31) >> 2;
    return {load_u16(b), load_u16(b + 2 + 2 * (4 * ib + (c & 3))), b[66 + ib]};
  }
  template <bool kSigned = false>
  __device__ static IqChunk decode(const Raw& r, int c, const uint64_t* grid) {
    const float d = half_bits_to_f32(r.d);
    const float db = d * (0.5f + (float)(((c & 3) < 2) ? (r.sc & 0xF) : (r.sc >> 4))) * 0.25f;
    return iq2_chunk<kSigned>(grid[r.qs & 511], iq2_sign_bytes(r.qs >> 9u), db);
  }
};

// IQ1_M's fp16 super-scale, spread over the top nibbles of its four 16-bit scale words (read as
// two 32-bit words).
__device__ __forceinline__ float iq1m_super_scale(uint2 sc) {
  return half_bits_to_f32((uint16_t)(((sc.x & 0xFFFF) >> 12) | ((sc.x >> 24) & 0x00f0) | ((sc.y >> 4) & 0x0f00) |
                                     ((sc.y >> 16) & 0xf000)));
}

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
  // Integer form: grid bytes g in {-1, 0, 1} as u = g + 1 ((g ^ 0x80) - 0x7F per byte: no borrows),
  // w = dl * (g + delta) = dl * (u - (1 - delta)).
  static constexpr int kGridEntries = 2048;
  __device__ static const uint64_t* grid_table() { return g_iq1s_grid; }
  struct Raw {
    uint2 sc;  // the four scale words (blocks of 56 bytes: 8-byte aligned)
    uint8_t qh, qs;
  };
  __device__ static Raw load(const uint8_t* row, int c) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int ib = (c & 31) >> 2, l = c & 3;
    return {load8_a4(b + 48), b[32 + 2 * ib + (l >> 1)], b[4 * ib + l]};
  }
  __device__ static IqChunk decode(const Raw& r, int c, const uint64_t* grid) {
    const int ib = (c & 31) >> 2, l = c & 3;
    const uint32_t w0 = r.sc.x, w1 = r.sc.y;  // scale words 0, 1 and 2, 3
    const float d = iq1m_super_scale(r.sc);
    const uint32_t sw = ((ib < 4 ? w0 : w1) >> (16 * ((ib >> 1) & 1))) & 0xFFFF;
    const int shift = 6 * (ib % 2) + (l < 2 ? 0 : 3);
    const float dl = d * (float)(2 * ((sw >> shift) & 0x7) + 1);
    const int idx = r.qs | (((l & 1) ? (r.qh << 4) : (r.qh << 8)) & 0x700);
    const float delta = (r.qh & ((l & 1) ? 0x80 : 0x08)) ? -0.125f : 0.125f;
    const uint64_t g = grid[idx];
    const uint2 u = make_uint2(((uint32_t)g ^ 0x80808080u) - 0x7F7F7F7Fu,
                               ((uint32_t)(g >> 32) ^ 0x80808080u) - 0x7F7F7F7Fu);
    return {u, dl, 1.0f - delta};
  }
};

// Codebook entries of a type (0: none; the IQ types, which have the integer form). A kernel may
// stage grid_table() in shared memory (the lookups are random, which L1 serves one cache line at a
// time) and pass the copy to decode().
template <GgmlType T>
struct GridOf {
  static constexpr int kEntries = 0;
  __device__ static const uint64_t* table() { return nullptr; }
};
template <GgmlType T>
  requires requires { Dequant<T>::kGridEntries; }
struct GridOf<T> {
  static constexpr int kEntries = Dequant<T>::kGridEntries;
  __device__ static const uint64_t* table() { return Dequant<T>::grid_table(); }
};

// The types that take the integer form.
template <GgmlType T>
constexpr bool kIntegerForm = GridOf<T>::kEntries > 0;

// The type's codebook copied to shared memory (IQ types), and the IQ2 sign masks, for all the
// block's lookups; every thread of the block must construct it (it ends with a barrier). kStage =
// false leaves the codebook in global memory (for kernels whose shared memory has no room for it);
// kMasks stages the IQ2 sign masks, 1 KiB (the X24 kernels read them; the integer form's decode
// computes them, iq2_sign_bytes).
template <GgmlType T>
constexpr bool kSignMasks = T == GgmlType::IQ2_XXS || T == GgmlType::IQ2_XS;
template <GgmlType T, bool kStage = true, bool kMasks = kSignMasks<T>>
struct SharedTables {
  static constexpr int kN = GridOf<T>::kEntries;
  const uint64_t* grid = nullptr;
  const uint64_t* masks = nullptr;
  __device__ SharedTables() {
    if constexpr (kN > 0) {
      if constexpr (kStage) {
        __shared__ uint64_t g[kN];
        for (int i = threadIdx.x; i < kN; i += blockDim.x) g[i] = GridOf<T>::table()[i];
        grid = g;
      } else {
        grid = GridOf<T>::table();
      }
      if constexpr (kMasks && kSignMasks<T>) {
        __shared__ uint64_t m[128];
        for (int i = threadIdx.x; i < 128; i += blockDim.x) m[i] = iq2_sign_bytes(i);
        masks = m;
      }
      __syncthreads();
    }
  }
};

}  // namespace rl::cuda

#include "cuda/quant_device_generic.cuh"

namespace rl::cuda {

// Calls f.template operator()<T>() for the weight types this backend runs (every ggml type with
// a float view: the tuned forms above, the rest through quant_device_generic.cuh); false for the
// others (the storage types I8..F64, Q8_1, Q8_K and TQ1_0 / TQ2_0, and ids that are no type).
template <class F>
bool dispatch_type(GgmlType t, F&& f) {
  switch (t) {
#define RL_DISPATCH(T) \
  case GgmlType::T: f.template operator()<GgmlType::T>(); return true;
    RL_DISPATCH(F32) RL_DISPATCH(F16) RL_DISPATCH(BF16)
    RL_DISPATCH(Q4_0) RL_DISPATCH(Q4_1) RL_DISPATCH(Q5_0) RL_DISPATCH(Q5_1) RL_DISPATCH(Q8_0)
    RL_DISPATCH(IQ4_NL) RL_DISPATCH(MXFP4)
    RL_DISPATCH(Q2_K) RL_DISPATCH(Q3_K) RL_DISPATCH(Q4_K) RL_DISPATCH(Q5_K) RL_DISPATCH(Q6_K)
    RL_DISPATCH(IQ4_XS) RL_DISPATCH(IQ2_XXS) RL_DISPATCH(IQ2_XS) RL_DISPATCH(IQ2_S)
    RL_DISPATCH(IQ3_XXS) RL_DISPATCH(IQ3_S) RL_DISPATCH(IQ1_S) RL_DISPATCH(IQ1_M)
#undef RL_DISPATCH
    default: return false;
  }
}

}  // namespace rl::cuda
