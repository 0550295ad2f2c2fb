// Fast dot products of the IQ codebook types of the project's files (IQ2_XXS, IQ2_XS, IQ1_M)
// with Q8_K activations. Each group of 8 weights is a grid point (8 bytes, quant/iq_grids.h);
// four groups make one 32-byte vector that is dotted with 32 activation bytes as integers:
//   IQ2: magnitudes (unsigned) times the activations with the group's signs applied to them;
//   IQ1: 8 * grid + delta sign (a small signed integer) times the activations, so the grid's
//        shift by ±1/8 is exact in integers and the block's 1/8 goes into the float scale.
// Integer sub-block scales (2s + 1) weight the int16 pair sums; fp32 scales once per 32 values.
// Layouts: quant/blocks_iq.h and the dequantisers in quant/quant_iq.cpp.
#include "common/fp16.h"
#include "cpu/activation_quant.h"
#include "cpu/fast_dot.h"
#include "cpu/fast_simd.h"
#include "quant/blocks_iq.h"
#include "quant/iq_grids.h"

namespace rl::cpu {
namespace {

using namespace simd;

// The 8-bit sign masks of ksigns_iq2xs as byte multipliers: byte j = -1 where bit j is set, +1
// elsewhere (for _mm256_sign_epi8).
struct SignBytes {
  uint64_t of[128];
  SignBytes() {
    for (int k = 0; k < 128; k++) {
      uint64_t v = 0;
      for (int j = 0; j < 8; j++) v |= (uint64_t)((ksigns_iq2xs[k] >> j) & 1 ? 0xFF : 0x01) << (8 * j);
      of[k] = v;
    }
  }
};
const SignBytes kSignBytes;

inline __m256i four_points(uint64_t p0, uint64_t p1, uint64_t p2, uint64_t p3) {
  return _mm256_set_epi64x((int64_t)p3, (int64_t)p2, (int64_t)p1, (int64_t)p0);
}

}  // namespace

float fast_dot_iq2_xxs(const void* row, const void* act, int64_t n) {
  const BlockIQ2_XXS* w = static_cast<const BlockIQ2_XXS*>(row);
  const ActivationQ8K* a = static_cast<const ActivationQ8K*>(act);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 256; b++) {
    const uint8_t* q = reinterpret_cast<const uint8_t*>(w[b].qs);
    // x = d * (0.5 + s) * 0.25 * grid = d * (2s + 1) / 8 * grid
    const float d = fp16_to_f32(w[b].d) * 0.125f;
    for (int ib32 = 0; ib32 < 8; ib32++, q += 8) {
      // 4 grid indices (bytes), then 4 x 7 sign bits and the 4-bit scale s in the top bits.
      const uint32_t idx = load_u32(q), ss = load_u32(q + 4);
      const __m256i magnitudes = four_points(iq2xxs_grid[idx & 255], iq2xxs_grid[(idx >> 8) & 255],
                                             iq2xxs_grid[(idx >> 16) & 255], iq2xxs_grid[idx >> 24]);
      const __m256i signs = four_points(kSignBytes.of[ss & 127], kSignBytes.of[(ss >> 7) & 127],
                                        kSignBytes.of[(ss >> 14) & 127], kSignBytes.of[(ss >> 21) & 127]);
      const int16_t scale = (int16_t)(2 * (ss >> 28) + 1);
      const __m256i x = _mm256_sign_epi8(load32(a[b].qs + 32 * ib32), signs);
      const __m256i p = dot_u8_s8_scaled(magnitudes, x, scale, scale);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a[b].d[ib32]), _mm256_cvtepi32_ps(p), acc);
    }
  }
  return hsum(acc);
}

float fast_dot_iq2_xs(const void* row, const void* act, int64_t n) {
  const BlockIQ2_XS* w = static_cast<const BlockIQ2_XS*>(row);
  const ActivationQ8K* a = static_cast<const ActivationQ8K*>(act);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 256; b++) {
    const float d = fp16_to_f32(w[b].d) * 0.125f;
    for (int ib32 = 0; ib32 < 8; ib32++) {
      // Per group of 8: 9-bit grid index, 7-bit sign index; one 4-bit scale per 16 values.
      const uint16_t* q = w[b].qs + 4 * ib32;
      const __m256i magnitudes =
          four_points(iq2xs_grid[q[0] & 511], iq2xs_grid[q[1] & 511], iq2xs_grid[q[2] & 511], iq2xs_grid[q[3] & 511]);
      const __m256i signs = four_points(kSignBytes.of[q[0] >> 9], kSignBytes.of[q[1] >> 9],
                                        kSignBytes.of[q[2] >> 9], kSignBytes.of[q[3] >> 9]);
      const uint8_t s = w[b].scales[ib32];
      const __m256i x = _mm256_sign_epi8(load32(a[b].qs + 32 * ib32), signs);
      const __m256i p = dot_u8_s8_scaled(magnitudes, x, (int16_t)(2 * (s & 15) + 1), (int16_t)(2 * (s >> 4) + 1));
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a[b].d[ib32]), _mm256_cvtepi32_ps(p), acc);
    }
  }
  return hsum(acc);
}

float fast_dot_iq1_m(const void* row, const void* act, int64_t n) {
  const BlockIQ1_M* w = static_cast<const BlockIQ1_M*>(row);
  const ActivationQ8K* a = static_cast<const ActivationQ8K*>(act);
  const __m256i eight = _mm256_set1_epi8(8);
  constexpr uint64_t kPlusOne = 0x0101010101010101ull, kMinusOne = ~0ull;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 256; b++) {
    uint16_t words[4];  // 3-bit scales per 16 values, the fp16 super-scale in the top nibbles
    std::memcpy(words, w[b].scales, sizeof(words));
    const uint16_t d_bits = (uint16_t)((words[0] >> 12) | ((words[1] >> 8) & 0x00f0) | ((words[2] >> 4) & 0x0f00) |
                                       (words[3] & 0xf000));
    // x = d * (2s + 1) * (grid ± 1/8) = d * (2s + 1) * (8 grid ± 1) / 8
    const float d = fp16_to_f32(d_bits) * 0.125f;
    for (int ib32 = 0; ib32 < 8; ib32++) {
      const uint8_t* qs = w[b].qs + 4 * ib32;
      const uint8_t* qh = w[b].qh + 2 * ib32;
      uint64_t points[4], deltas[4];
      for (int l = 0; l < 4; l++) {
        // Group l's nibble: 3 high index bits and the delta's sign (bit 3: negative).
        const uint8_t nibble = (uint8_t)((qh[l / 2] >> (4 * (l % 2))) & 0xf);
        points[l] = iq1s_grid[qs[l] | ((nibble & 7) << 8)];
        deltas[l] = (nibble & 8) ? kMinusOne : kPlusOne;
      }
      // 8 * grid (grid bytes are -1, 0, +1) plus the group's delta sign: values in [-9, 9].
      const __m256i values = _mm256_add_epi8(
          _mm256_sign_epi8(eight, four_points(points[0], points[1], points[2], points[3])),
          four_points(deltas[0], deltas[1], deltas[2], deltas[3]));
      const __m256i x = load32(a[b].qs + 32 * ib32);
      const int shift = 6 * (ib32 % 2);
      const int16_t s0 = (int16_t)(2 * ((words[ib32 / 2] >> shift) & 7) + 1);
      const int16_t s1 = (int16_t)(2 * ((words[ib32 / 2] >> (shift + 3)) & 7) + 1);
      const __m256i p = dot_u8_s8_scaled(_mm256_abs_epi8(values), _mm256_sign_epi8(x, values), s0, s1);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a[b].d[ib32]), _mm256_cvtepi32_ps(p), acc);
    }
  }
  return hsum(acc);
}

}  // namespace rl::cpu
