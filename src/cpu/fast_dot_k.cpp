// Fast dot products of the K-quant super-blocks (Q4_K, Q5_K, Q6_K) with Q8_K activations.
// Per super-block the weight quants are dotted with the activation bytes as integers (maddubs),
// weighted by the integer sub-block scales, and the block's float scales applied once:
//   Q4_K/Q5_K: x = d*sc*q - dmin*m  ->  sum over sub-blocks of d*da * sc * q.a - dmin*da * m * bsum
//   Q6_K:      x = d*sc*(q - 32)    ->  sum over sub-blocks of d*da * sc * (q.a - 32 * bsum)
// (da: the activations' scale of those 32 values).
// Layouts: quant/blocks.h and the dequantisers in quant/quant_k.cpp.
#include "cpu/activation_quant.h"
#include "cpu/fast_dot.h"
#include "cpu/fast_simd.h"
#include "quant/blocks.h"

namespace rl::cpu {
namespace {

using namespace simd;

// The 6-bit scales and mins of the 8 sub-blocks of a Q4_K/Q5_K block (12 packed bytes: sub-blocks
// 0..3 in the low 6 bits of bytes 0..3 / 4..7, sub-blocks 4..7 in bytes 8..11 plus the top 2
// bits of bytes 0..7).
void unpack_k4_scales(const uint8_t* packed, int16_t scale[8], int16_t min[8]) {
  for (int s = 0; s < 4; s++) {
    scale[s] = packed[s] & 63;
    min[s] = packed[s + 4] & 63;
    scale[s + 4] = (int16_t)((packed[s + 8] & 0x0F) | ((packed[s] >> 6) << 4));
    min[s + 4] = (int16_t)((packed[s + 8] >> 4) | ((packed[s + 4] >> 6) << 4));
  }
}

// sum over sub-blocks of 32 of min[s] * (sum of the activations of sub-block s).
float min_term(const int16_t min[8], const ActivationQ8K& a) {
  float sum = 0.0f;
  for (int s = 0; s < 8; s++) sum += a.d[s] * (float)(min[s] * (a.bsums[2 * s] + a.bsums[2 * s + 1]));
  return sum;
}

// Q4_K and Q5_K share everything but the fifth bit; high_bits(chunk, lo, hi) adds it.
template <class Block, class AddHighBits>
float dot_k4(const void* row, const void* act, int64_t n, AddHighBits add_high_bits) {
  const Block* w = static_cast<const Block*>(row);
  const ActivationQ8K* a = static_cast<const ActivationQ8K*>(act);
  const __m256i low_nibble = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t b = 0; b < n / 256; b++) {
    int16_t scale[8], min[8];
    unpack_k4_scales(w[b].scales, scale, min);
    mins += half_to_f32(w[b].dmin) * min_term(min, a[b]);
    const float d = half_to_f32(w[b].d);
    for (int chunk = 0; chunk < 4; chunk++) {
      // 32 bytes: low nibbles are sub-block 2*chunk, high nibbles sub-block 2*chunk + 1.
      const __m256i q = load32(w[b].qs + 32 * chunk);
      __m256i lo = _mm256_and_si256(q, low_nibble);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low_nibble);
      add_high_bits(w[b], chunk, lo, hi);
      const int8_t* x = a[b].qs + 64 * chunk;
      const __m256i p_lo = dot_u8_s8_scaled(lo, load32(x), scale[2 * chunk], scale[2 * chunk]);
      const __m256i p_hi = dot_u8_s8_scaled(hi, load32(x + 32), scale[2 * chunk + 1], scale[2 * chunk + 1]);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a[b].d[2 * chunk]), _mm256_cvtepi32_ps(p_lo), acc);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a[b].d[2 * chunk + 1]), _mm256_cvtepi32_ps(p_hi), acc);
    }
  }
  return hsum(acc) - mins;
}

}  // namespace

float fast_dot_q4_K(const void* row, const void* x, int64_t n) {
  return dot_k4<BlockQ4_K>(row, x, n, [](const BlockQ4_K&, int, __m256i&, __m256i&) {});
}

float fast_dot_q5_K(const void* row, const void* x, int64_t n) {
  return dot_k4<BlockQ5_K>(row, x, n, [](const BlockQ5_K& b, int chunk, __m256i& lo, __m256i& hi) {
    // Bit 2*chunk of qh[l] is the fifth bit of low-nibble value l, bit 2*chunk + 1 of high-nibble value l.
    const __m256i qh = load32(b.qh);
    const __m256i bit_lo = _mm256_set1_epi8((char)(1 << (2 * chunk)));
    const __m256i bit_hi = _mm256_set1_epi8((char)(2 << (2 * chunk)));
    const __m256i sixteen = _mm256_set1_epi8(16);
    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_lo), bit_lo), sixteen));
    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_hi), bit_hi), sixteen));
  });
}

float fast_dot_q6_K(const void* row, const void* act, int64_t n) {
  const BlockQ6_K* w = static_cast<const BlockQ6_K*>(row);
  const ActivationQ8K* a = static_cast<const ActivationQ8K*>(act);
  const __m256i low_nibble = _mm256_set1_epi8(0x0F), two_bits = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  float offsets = 0.0f;
  for (int64_t b = 0; b < n / 256; b++) {
    const int8_t* sc = w[b].scales;
    const float d = half_to_f32(w[b].d);
    float offset = 0.0f;  // sum over sub-blocks of 16 of scale * (activation sum): the "- 32" term
    for (int s = 0; s < 16; s++) offset += a[b].d[s / 2] * (float)(sc[s] * a[b].bsums[s]);
    offsets += 32.0f * d * offset;
    for (int half = 0; half < 2; half++) {
      // Per 128-value half: ql[l] low/high nibble = values l / l+64, ql[l+32] = values l+32 / l+96,
      // qh[l] bit pairs 0, 2, 4, 6 = the high bits of values l, l+32, l+64, l+96.
      const uint8_t* ql = w[b].ql + 64 * half;
      const __m256i qh = load32(w[b].qh + 32 * half);
      const __m256i ql0 = load32(ql), ql1 = load32(ql + 32);
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, low_nibble), _mm256_slli_epi16(_mm256_and_si256(qh, two_bits), 4)),
          _mm256_or_si256(_mm256_and_si256(ql1, low_nibble),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two_bits), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low_nibble),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two_bits), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low_nibble),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two_bits), 4)),
      };
      const int8_t* x = a[b].qs + 128 * half;
      const int8_t* s = sc + 8 * half;
      for (int k = 0; k < 4; k++) {
        const __m256i p = dot_u8_s8_scaled(q[k], load32(x + 32 * k), s[2 * k], s[2 * k + 1]);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a[b].d[4 * half + k]), _mm256_cvtepi32_ps(p), acc);
      }
    }
  }
  return hsum(acc) - offsets;
}

}  // namespace rl::cpu
