// The fast tier's integer dot kernel, shared by its two forms (cpu/fast_dot.h):
//   - from decoded blocks (a prefill tile decodes its rows once for all its tokens);
//   - straight from the packed row (a decode step: each block decoded into registers and dotted at
//     once, so a weight is read once from memory and nothing is written back).
// Each type's decoder (fast_dot_k.cpp, fast_dot_iq.cpp, fast_dot_basic.cpp) is a struct with
//   static void header(const uint8_t* row, int64_t b, BlockHeader* h);   // scales of block b
//   template <class Emit> static void groups(const uint8_t* row, int64_t b, Emit&& emit);
// where groups calls emit(ib32, q) for ib32 = 0..7 in order, q the 32 int8 values (|q| <= 128).
// Both forms run the same integer operations on the same values and accumulate in the same order,
// so a token's dot is bit-identical whichever form computed it (a batched decode step may take
// either, tests/cpu/fast_products_test.cpp).
#pragma once
#include <cmath>

#include "cpu/activation_quant.h"
#include "cpu/fast_dot.h"
#include "cpu/fast_simd.h"

namespace rl::cpu::kernel {

using namespace simd;

// The per-16 scale vector of values [32 ib32, 32 ib32 + 32), as madd_epi16 multiplies by it.
inline __m256i scale_vector(const int16_t* scale16, int ib32) {
  return _mm256_set_m128i(_mm_set1_epi16(scale16[2 * ib32 + 1]), _mm_set1_epi16(scale16[2 * ib32]));
}

// dd[t] = d_w * d_x per 32 values of block b.
template <int kTokens>
inline void block_scales(__m256 wd, const ActivationQ8K* const* a, int64_t b, __m256* dd) {
  for (int t = 0; t < kTokens; t++) dd[t] = _mm256_mul_ps(wd, _mm256_loadu_ps(a[t][b].d));
}

// acc[t] += d * (q . x[t]) over values [32 ib32, 32 ib32 + 32) of block b.
template <int kTokens>
inline void accumulate_group(__m256i q, __m256i scale, const __m256* dd, const ActivationQ8K* const* a, int64_t b,
                             int ib32, __m256* acc) {
  // |w| (<= 128 for every decoder) times x with w's sign: maddubs cannot saturate.
  const __m256i magnitude = _mm256_abs_epi8(q);
  const __m256i lane = _mm256_set1_epi32(ib32);
  for (int t = 0; t < kTokens; t++) {
    const __m256i x = _mm256_sign_epi8(load32(a[t][b].qs + 32 * ib32), q);
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, x), scale);
    acc[t] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dd[t], lane), _mm256_cvtepi32_ps(p), acc[t]);
  }
}

// The min term of block b: dmin * m * (sum of the 32 activations it multiplies). Explicit fma, so
// the compiler cannot contract it differently for different token counts.
template <int kTokens>
inline void accumulate_min(float dmin, const int16_t* min, const ActivationQ8K* const* a, int64_t b, float* mins) {
  for (int t = 0; t < kTokens; t++) {
    float sum = 0.0f;
    for (int s = 0; s < 8; s++)
      sum = std::fma(a[t][b].d[s], (float)(min[s] * (a[t][b].bsums[2 * s] + a[t][b].bsums[2 * s + 1])), sum);
    mins[t] = std::fma(dmin, sum, mins[t]);
  }
}

// One packed row against kTokens tokens, each block decoded into registers.
template <class Decoder, int kTokens>
void dot_row_n(const uint8_t* row, const ActivationQ8K* const* a, int64_t n_blocks, float* out) {
  __m256 acc[kTokens];
  float mins[kTokens];
  for (int t = 0; t < kTokens; t++) acc[t] = _mm256_setzero_ps(), mins[t] = 0.0f;
  for (int64_t b = 0; b < n_blocks; b++) {
    BlockHeader h;
    Decoder::header(row, b, &h);
    __m256 dd[kTokens];
    block_scales<kTokens>(_mm256_loadu_ps(h.d), a, b, dd);
    Decoder::groups(row, b, [&](int ib32, __m256i q) {
      accumulate_group<kTokens>(q, scale_vector(h.scale, ib32), dd, a, b, ib32, acc);
    });
    if (h.dmin != 0.0f) accumulate_min<kTokens>(h.dmin, h.min, a, b, mins);
  }
  for (int t = 0; t < kTokens; t++) out[t] = hsum(acc[t]) - mins[t];
}

template <class Decoder>
void dot_row(const uint8_t* row, const ActivationQ8K* const* a, int n_tokens, int64_t n_blocks, float* out) {
  switch (n_tokens) {
    case 1: return dot_row_n<Decoder, 1>(row, a, n_blocks, out);
    case 2: return dot_row_n<Decoder, 2>(row, a, n_blocks, out);
    case 3: return dot_row_n<Decoder, 3>(row, a, n_blocks, out);
    default: return dot_row_n<Decoder, 4>(row, a, n_blocks, out);
  }
}

// Block b of a row to the decoded form (prefill tiles).
template <class Decoder>
void decode_block(const uint8_t* row, int64_t b, DecodedBlock* out) {
  BlockHeader h;
  Decoder::header(row, b, &h);
  for (int i = 0; i < 8; i++) {
    out->d[i] = h.d[i];
    out->min[i] = h.min[i];
  }
  out->dmin = h.dmin;
  for (int ib32 = 0; ib32 < 8; ib32++) store32(out->scale[ib32], scale_vector(h.scale, ib32));
  Decoder::groups(row, b, [&](int ib32, __m256i q) { store32(out->q + 32 * ib32, q); });
}

template <class Decoder>
constexpr FastKernels kernels_of() {
  return {decode_block<Decoder>, dot_row<Decoder>};
}

}  // namespace rl::cpu::kernel
