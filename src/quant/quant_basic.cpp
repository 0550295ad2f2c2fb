// Reference dequantisation and dot products of the float types and the 32-value block types:
// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, and IQ4_XS (a 256-value super-block
// that shares IQ4_NL's codebook). Every value is computed with the same float operations, in the
// same order, as ggml's dequantize_row_<type>, so the results match it bit for bit.

// ggml's reference is compiled without FMA; with -mfma the compiler may fuse `q*d + m` (Q4_1,
// Q5_1) here. That cannot change a result: d is an fp16 value (11 significant bits) and q has at
// most 5 bits, so q*d is exact in fp32 and the only rounding is the addition's, fused or not.
// test_quant checks it on the zoo.

#include <algorithm>
#include <cstring>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "common/fp16.h"
#include "quant/block_dot.h"
#include "quant/blocks.h"
#include "quant/iq_grids.h"
#include "quant/quant_kernels.h"

namespace rl {

namespace {

// 2^(e - 128): half of the E8M0 scale 2^(e - 127). e = 0 and 1 give subnormals.
inline float e8m0_to_f32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// ---- float element types: converted in chunks so the dot product can use the lanes ----------

constexpr int kChunk = 64;  // values per stack chunk of the float-type dot products

// n fp16 values to fp32. F16C's conversion is exact, like fp16_to_f32 (NaN payloads aside).
inline void convert_f16(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src + i))));
#endif
  for (; i < n; i++) dst[i] = half_to_f32(src[i]);
}

inline void convert_bf16(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const uint32_t bits = (uint32_t)src[i] << 16;
    std::memcpy(dst + i, &bits, 4);
  }
}

// Dot of n elements converted by convert(src + i, float* [count], count) with x: [n].
template <class Element, class Convert>
float dot_by_chunks(const Element* src, const float* x, int64_t n, Convert convert) {
  DotLanes lanes;
  alignas(32) float values[kChunk];
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    convert(src + i, values, kChunk);
    accumulate_dot_lanes(lanes, values, x + i, kChunk);
  }
  const int tail = (int)(n - i);
  convert(src + i, values, tail);
  for (int j = 0; j < tail; j++) lanes.add_one(j, values[j], x[i + j]);
  return lanes.total();
}

// ---- 32-value blocks: y[0..31] from one block ------------------------------------------------
//
// Low nibble of qs[j] is value j, high nibble is value j + 16 (all 4-bit block types). Each half
// is its own contiguous loop, kept a loop (RL_VECTORIZE_LOOP) so the vectoriser takes it.

inline void dequantize_block_q4_0(const BlockQ4_0& b, float* y) {
  const float d = half_to_f32(b.d);
  RL_VECTORIZE_LOOP
  for (int j = 0; j < 16; j++) y[j] = (float)((b.qs[j] & 0x0F) - 8) * d;
  RL_VECTORIZE_LOOP
  for (int j = 0; j < 16; j++) y[j + 16] = (float)((b.qs[j] >> 4) - 8) * d;
}

inline void dequantize_block_q4_1(const BlockQ4_1& b, float* y) {
  const float d = half_to_f32(b.d);
  const float m = half_to_f32(b.m);
  RL_VECTORIZE_LOOP
  for (int j = 0; j < 16; j++) y[j] = (float)(b.qs[j] & 0x0F) * d + m;
  RL_VECTORIZE_LOOP
  for (int j = 0; j < 16; j++) y[j + 16] = (float)(b.qs[j] >> 4) * d + m;
}

// Bit j of the little-endian 32-bit qh is bit 4 of value j.
inline uint32_t load_fifth_bits(const uint8_t* qh_bytes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  return qh;
}

inline void dequantize_block_q5_0(const BlockQ5_0& b, float* y) {
  const float d = half_to_f32(b.d);
  const uint32_t qh = load_fifth_bits(b.qh);
  RL_VECTORIZE_LOOP
  for (int j = 0; j < 16; j++) y[j] = (float)(((b.qs[j] & 0x0F) | (int)(((qh >> j) & 1) << 4)) - 16) * d;
  RL_VECTORIZE_LOOP
  for (int j = 0; j < 16; j++) y[j + 16] = (float)(((b.qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16) * d;
}

inline void dequantize_block_q5_1(const BlockQ5_1& b, float* y) {
  const float d = half_to_f32(b.d);
  const float m = half_to_f32(b.m);
  const uint32_t qh = load_fifth_bits(b.qh);
  RL_VECTORIZE_LOOP
  for (int j = 0; j < 16; j++) y[j] = (float)((b.qs[j] & 0x0F) | (int)(((qh >> j) & 1) << 4)) * d + m;
  RL_VECTORIZE_LOOP
  for (int j = 0; j < 16; j++) y[j + 16] = (float)((b.qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) * d + m;
}

inline void dequantize_block_q8_0(const BlockQ8_0& b, float* y) {
  const float d = half_to_f32(b.d);
  RL_VECTORIZE_LOOP
  for (int j = 0; j < kQK32; j++) y[j] = (float)b.qs[j] * d;
}

// Codebook lookup of one 32-value block's nibbles: values[j] = codebook[low nibble of qs[j]],
// values[j + 16] = codebook[high nibble]. With AVX2 it is one byte shuffle per 16 values (the
// scalar table reads measured about 3x slower).
inline void lookup_nibbles(const uint8_t* qs, const int8_t* codebook, int8_t* values) {
#if defined(__AVX2__)
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codebook));
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low_nibble = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(packed, low_nibble);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low_nibble);
  // One 32-byte store: the float loop that follows reads it back with wide loads, which two
  // 16-byte stores could not forward.
  const __m256i both = _mm256_set_m128i(_mm_shuffle_epi8(table, hi), _mm_shuffle_epi8(table, lo));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(values), both);
#else
  for (int j = 0; j < 16; j++) {
    values[j] = codebook[qs[j] & 0x0F];
    values[j + 16] = codebook[qs[j] >> 4];
  }
#endif
}

inline void dequantize_block_iq4_nl(const BlockIQ4_NL& b, float* y) {
  const float d = half_to_f32(b.d);
  int8_t values[kQK32];
  lookup_nibbles(b.qs, kvalues_iq4nl, values);
  for (int j = 0; j < kQK32; j++) y[j] = d * (float)values[j];
}

inline void dequantize_block_mxfp4(const BlockMXFP4& b, float* y) {
  const float d = e8m0_to_f32_half(b.e);
  int8_t values[kQK32];
  lookup_nibbles(b.qs, kvalues_mxfp4, values);
  for (int j = 0; j < kQK32; j++) y[j] = (float)values[j] * d;
}

// ---- IQ4_XS: 8 sub-blocks of 32 with 6-bit scales, IQ4_NL's codebook -----------------------

inline void dequantize_block_iq4_xs(const BlockIQ4_XS& b, float* y) {
  const float d = half_to_f32(b.d);
  for (int sub = 0; sub < kQK_K / 32; sub++) {
    const int scale_lo = (b.scales_l[sub / 2] >> (4 * (sub % 2))) & 0x0F;
    const int scale_hi = (b.scales_h >> (2 * sub)) & 3;
    const float dl = d * (float)((scale_lo | (scale_hi << 4)) - 32);
    int8_t values[32];
    lookup_nibbles(b.qs + 16 * sub, kvalues_iq4nl, values);  // nibble layout of a 32-value block
    for (int j = 0; j < 32; j++) y[32 * sub + j] = dl * (float)values[j];
  }
}

// Row = consecutive blocks. src: [n / kBlockValues] blocks; y: [n].
template <class Block, int kBlockValues, class DequantizeBlock>
inline void dequantize_by_blocks(const void* src, float* y, int64_t n, DequantizeBlock dequantize_block) {
  const Block* blocks = static_cast<const Block*>(src);
  const int64_t n_blocks = n / kBlockValues;
  for (int64_t b = 0; b < n_blocks; b++) dequantize_block(blocks[b], y + b * kBlockValues);
}

}  // namespace

// ---- float types ----------------------------------------------------------------------------

void dequantize_row_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, (size_t)n * 4); }

// F32 needs no conversion: the lanes read the row in place.
float dot_row_f32(const void* src, const float* x, int64_t n) {
  const float* a = static_cast<const float*>(src);
  DotLanes lanes;
  const int64_t whole = n - n % kDotLanes;
  for (int64_t i = 0; i < whole; i += kChunk)
    accumulate_dot_lanes(lanes, a + i, x + i, (int)std::min<int64_t>(kChunk, whole - i));
  for (int64_t i = whole; i < n; i++) lanes.add_one((int)(i - whole), a[i], x[i]);
  return lanes.total();
}

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  convert_f16(static_cast<const uint16_t*>(src), dst, n);
}

float dot_row_f16(const void* src, const float* x, int64_t n) {
  return dot_by_chunks(static_cast<const uint16_t*>(src), x, n, convert_f16);
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
  convert_bf16(static_cast<const uint16_t*>(src), dst, n);
}

float dot_row_bf16(const void* src, const float* x, int64_t n) {
  return dot_by_chunks(static_cast<const uint16_t*>(src), x, n, convert_bf16);
}

// ---- block types ----------------------------------------------------------------------------

#define RL_DEFINE_BLOCK_ROW_FUNCTIONS(name, Block, block_values)                               \
  void dequantize_row_##name(const void* src, float* dst, int64_t n) {                        \
    dequantize_by_blocks<Block, block_values>(src, dst, n, [](const Block& b, float* y) {     \
      dequantize_block_##name(b, y);                                                           \
    });                                                                                        \
  }                                                                                            \
  float dot_row_##name(const void* src, const float* x, int64_t n) {                          \
    return dot_by_blocks<Block, block_values>(src, x, n, [](const Block& b, float* y) {      \
      dequantize_block_##name(b, y);                                                           \
    });                                                                                        \
  }

RL_DEFINE_BLOCK_ROW_FUNCTIONS(q4_0, BlockQ4_0, kQK32)
RL_DEFINE_BLOCK_ROW_FUNCTIONS(q4_1, BlockQ4_1, kQK32)
RL_DEFINE_BLOCK_ROW_FUNCTIONS(q5_0, BlockQ5_0, kQK32)
RL_DEFINE_BLOCK_ROW_FUNCTIONS(q5_1, BlockQ5_1, kQK32)
RL_DEFINE_BLOCK_ROW_FUNCTIONS(q8_0, BlockQ8_0, kQK32)
RL_DEFINE_BLOCK_ROW_FUNCTIONS(iq4_nl, BlockIQ4_NL, kQK32)
RL_DEFINE_BLOCK_ROW_FUNCTIONS(mxfp4, BlockMXFP4, kQK32)
RL_DEFINE_BLOCK_ROW_FUNCTIONS(iq4_xs, BlockIQ4_XS, kQK_K)

#undef RL_DEFINE_BLOCK_ROW_FUNCTIONS

}  // namespace rl
