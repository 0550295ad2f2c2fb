// Reference dequantisation and dot products of the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K):
// 256-value super-blocks with an fp16 super-scale and small per-sub-block scales. Every value is
// computed with the same float operations, in the same order, as ggml's dequantize_row_<type>
// (sub-block scale = super-scale * integer scale, rounded to float first; then scale * q - min),
// so the results match it bit for bit.

// ggml's reference is compiled without FMA; with -mfma the compiler may fuse `dl*q - ml` (Q2_K,
// Q4_K, Q5_K) here. That cannot change a result: dl = fp16 scale (11 significant bits) * a 4- or
// 6-bit sub-block scale, q has at most 5 bits, so dl*q is exact in fp32 and the only rounding is
// the subtraction's, fused or not. test_quant checks it on the zoo.

#include "common/fp16.h"
#include "quant/block_dot.h"
#include "quant/blocks.h"
#include "quant/quant_kernels.h"

namespace rl {

namespace {

// The 16-value sub-block types (Q2_K, Q3_K, Q6_K) work in two stages: unpack the 256 integer
// quants of a super-block into q[256], then scale each sub-block of 16. Each stage is a plain loop
// over contiguous arrays, which the compiler vectorises; the float operations are ggml's.

// ---- Q2_K: 16 sub-blocks of 16, 2-bit q, 4-bit scale and min per sub-block ------------------

// qs holds two 128-value halves of 32 bytes; within half h, bits 2k..2k+1 of qs[32h + l] are
// value 128h + 32k + l.
inline void unpack_q2_K_quants(const uint8_t* qs, int8_t* q) {
  for (int half = 0; half < 2; half++)
    for (int k = 0; k < 4; k++)
      RL_VECTORIZE_LOOP
      for (int l = 0; l < 32; l++) q[128 * half + 32 * k + l] = (int8_t)((qs[32 * half + l] >> (2 * k)) & 3);
}

// scales[s]: low nibble scales sub-block s, high nibble is its min. y = (d*sc) * q - (dmin*m).
inline void dequantize_block_q2_K(const BlockQ2_K& b, float* y) {
  const float d = half_to_f32(b.d);
  const float dmin = half_to_f32(b.dmin);
  int8_t q[kQK_K];
  unpack_q2_K_quants(b.qs, q);
  for (int sub = 0; sub < 16; sub++) {
    const float dl = d * (float)(b.scales[sub] & 0x0F);
    const float ml = dmin * (float)(b.scales[sub] >> 4);
    RL_VECTORIZE_LOOP
    for (int l = 0; l < 16; l++) y[16 * sub + l] = dl * (float)q[16 * sub + l] - ml;
  }
}

// ---- Q3_K: 16 sub-blocks of 16, 3-bit q (2 low bits in qs, high bit in hmask), 6-bit scales --

// Low 2 bits laid out as Q2_K; the high bit of value 128h + 32k + l is bit 4h + k of hmask[l]
// (set: q, clear: q - 4).
inline void unpack_q3_K_quants(const uint8_t* qs, const uint8_t* hmask, int8_t* q) {
  for (int half = 0; half < 2; half++)
    for (int k = 0; k < 4; k++) {
      const int bit = 4 * half + k;
      RL_VECTORIZE_LOOP
      for (int l = 0; l < 32; l++) {
        const int low = (qs[32 * half + l] >> (2 * k)) & 3;
        const int high_clear = ((hmask[l] >> bit) & 1) ^ 1;
        q[128 * half + 32 * k + l] = (int8_t)(low - 4 * high_clear);
      }
    }
}

// scales[12] -> 16 signed scales: low 4 bits in bytes 0..7 (sub-blocks 0..7 in the low nibbles,
// 8..15 in the high nibbles), high 2 bits in bytes 8..11 (byte 8 + s%4, bit pair s/4).
inline void unpack_q3_K_scales(const uint8_t* packed, int* scales) {
  for (int s = 0; s < 16; s++) {
    const int low = s < 8 ? packed[s] & 0x0F : packed[s - 8] >> 4;
    const int high = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
    scales[s] = (low | (high << 4)) - 32;
  }
}

// y = (d * scale) * q.
inline void dequantize_block_q3_K(const BlockQ3_K& b, float* y) {
  const float d = half_to_f32(b.d);
  int scales[16];
  unpack_q3_K_scales(b.scales, scales);
  int8_t q[kQK_K];
  unpack_q3_K_quants(b.qs, b.hmask, q);
  for (int sub = 0; sub < 16; sub++) {
    const float dl = d * (float)scales[sub];
    RL_VECTORIZE_LOOP
    for (int l = 0; l < 16; l++) y[16 * sub + l] = dl * (float)q[16 * sub + l];
  }
}

// ---- Q4_K / Q5_K: 8 sub-blocks of 32, 6-bit scale and min per sub-block --------------------

// (scale, min) of sub-block s from the 12 packed bytes: sub-blocks 0..3 keep 6 bits in bytes
// 0..3 (scale) and 4..7 (min); sub-blocks 4..7 keep 4 low bits in bytes 8..11 and borrow the top
// 2 bits of bytes 0..7.
inline void scale_min_k4(int s, const uint8_t* packed, int* scale, int* min) {
  if (s < 4) {
    *scale = packed[s] & 63;
    *min = packed[s + 4] & 63;
  } else {
    *scale = (packed[s + 4] & 0x0F) | ((packed[s - 4] >> 6) << 4);
    *min = (packed[s + 4] >> 4) | ((packed[s] >> 6) << 4);
  }
}

// Scales and mins of sub-blocks 2c and 2c + 1 of a Q4_K/Q5_K block, as ggml forms them.
struct ChunkScales {
  float d1, m1, d2, m2;
};
inline ChunkScales chunk_scales_k4(int chunk, const uint8_t* packed, float d, float dmin) {
  int sc, m;
  ChunkScales c;
  scale_min_k4(2 * chunk, packed, &sc, &m);
  c.d1 = d * (float)sc;
  c.m1 = dmin * (float)m;
  scale_min_k4(2 * chunk + 1, packed, &sc, &m);
  c.d2 = d * (float)sc;
  c.m2 = dmin * (float)m;
  return c;
}

// qs: 4 chunks of 32 bytes; low nibbles are sub-block 2c, high nibbles sub-block 2c + 1.
inline void dequantize_block_q4_K(const BlockQ4_K& b, float* y) {
  const float d = half_to_f32(b.d);
  const float dmin = half_to_f32(b.dmin);
  const uint8_t* q = b.qs;
  for (int chunk = 0; chunk < 4; chunk++) {
    const auto [d1, m1, d2, m2] = chunk_scales_k4(chunk, b.scales, d, dmin);
    RL_VECTORIZE_LOOP
    for (int l = 0; l < 32; l++) y[l] = d1 * (float)(q[l] & 0x0F) - m1;
    RL_VECTORIZE_LOOP
    for (int l = 0; l < 32; l++) y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
    y += 64;
    q += 32;
  }
}

// As Q4_K; bit 2c of qh[l] is the fifth bit of value l of chunk c's low nibbles, bit 2c + 1 that
// of its high nibbles.
inline void dequantize_block_q5_K(const BlockQ5_K& b, float* y) {
  const float d = half_to_f32(b.d);
  const float dmin = half_to_f32(b.dmin);
  const uint8_t* ql = b.qs;
  for (int chunk = 0; chunk < 4; chunk++) {
    const auto [d1, m1, d2, m2] = chunk_scales_k4(chunk, b.scales, d, dmin);
    const uint8_t bit_lo = (uint8_t)(1u << (2 * chunk));
    const uint8_t bit_hi = (uint8_t)(2u << (2 * chunk));
    RL_VECTORIZE_LOOP
    for (int l = 0; l < 32; l++)
      y[l] = d1 * (float)((ql[l] & 0x0F) + ((b.qh[l] & bit_lo) ? 16 : 0)) - m1;
    RL_VECTORIZE_LOOP
    for (int l = 0; l < 32; l++)
      y[l + 32] = d2 * (float)((ql[l] >> 4) + ((b.qh[l] & bit_hi) ? 16 : 0)) - m2;
    y += 64;
    ql += 32;
  }
}

// ---- Q6_K: 16 sub-blocks of 16, 6-bit q (4 low bits in ql, 2 high in qh), int8 scales --------

// Per 128-value half h (ql + 64h, qh + 32h): ql[l] low/high nibble = values l / l+64,
// ql[l+32] low/high nibble = values l+32 / l+96; qh[l] bit pairs 0,2,4,6 = values l, l+32, l+64,
// l+96. Stored with an offset of 32.
inline void unpack_q6_K_quants(const uint8_t* ql, const uint8_t* qh, int8_t* q) {
  for (int half = 0; half < 2; half++) {
    const uint8_t* lo = ql + 64 * half;
    const uint8_t* hi = qh + 32 * half;
    int8_t* out = q + 128 * half;
    RL_VECTORIZE_LOOP
    for (int l = 0; l < 32; l++) {
      out[l] = (int8_t)(((lo[l] & 0x0F) | (((hi[l] >> 0) & 3) << 4)) - 32);
      out[l + 32] = (int8_t)(((lo[l + 32] & 0x0F) | (((hi[l] >> 2) & 3) << 4)) - 32);
      out[l + 64] = (int8_t)(((lo[l] >> 4) | (((hi[l] >> 4) & 3) << 4)) - 32);
      out[l + 96] = (int8_t)(((lo[l + 32] >> 4) | (((hi[l] >> 6) & 3) << 4)) - 32);
    }
  }
}

// y = (d * scale) * q, the product d * scale rounded first as in ggml's `d * sc[is] * q`.
inline void dequantize_block_q6_K(const BlockQ6_K& b, float* y) {
  const float d = half_to_f32(b.d);
  int8_t q[kQK_K];
  unpack_q6_K_quants(b.ql, b.qh, q);
  for (int sub = 0; sub < 16; sub++) {
    const float dl = d * (float)b.scales[sub];
    RL_VECTORIZE_LOOP
    for (int l = 0; l < 16; l++) y[16 * sub + l] = dl * (float)q[16 * sub + l];
  }
}

// Row = consecutive super-blocks. src: [n / 256] blocks; y: [n].
template <class Block, class DequantizeBlock>
inline void dequantize_by_blocks(const void* src, float* y, int64_t n, DequantizeBlock dequantize_block) {
  const Block* blocks = static_cast<const Block*>(src);
  const int64_t n_blocks = n / kQK_K;
  for (int64_t b = 0; b < n_blocks; b++) dequantize_block(blocks[b], y + b * kQK_K);
}

}  // namespace

#define RL_DEFINE_K_ROW_FUNCTIONS(name, Block)                                                  \
  void dequantize_row_##name(const void* src, float* dst, int64_t n) {                        \
    dequantize_by_blocks<Block>(src, dst, n, [](const Block& b, float* y) {                   \
      dequantize_block_##name(b, y);                                                           \
    });                                                                                        \
  }                                                                                            \
  float dot_row_##name(const void* src, const float* x, int64_t n) {                          \
    return dot_by_blocks<Block, kQK_K>(src, x, n, [](const Block& b, float* y) {              \
      dequantize_block_##name(b, y);                                                           \
    });                                                                                        \
  }

RL_DEFINE_K_ROW_FUNCTIONS(q2_K, BlockQ2_K)
RL_DEFINE_K_ROW_FUNCTIONS(q3_K, BlockQ3_K)
RL_DEFINE_K_ROW_FUNCTIONS(q4_K, BlockQ4_K)
RL_DEFINE_K_ROW_FUNCTIONS(q5_K, BlockQ5_K)
RL_DEFINE_K_ROW_FUNCTIONS(q6_K, BlockQ6_K)

#undef RL_DEFINE_K_ROW_FUNCTIONS

}  // namespace rl
