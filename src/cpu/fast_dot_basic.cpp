// The fast tier's decoder table, its one integer dot kernel, the Q8_0 decoder and the float
// kernels.
#include <cmath>

#include "cpu/activation_quant.h"
#include "cpu/fast_dot.h"
#include "cpu/fast_simd.h"
#include "quant/blocks.h"

namespace rl::cpu {

using namespace simd;

DecodeBlockFn fast_decoder(GgmlType type) {
  switch (type) {
    case GgmlType::Q8_0: return decode_q8_0;
    case GgmlType::Q4_K: return decode_q4_K;
    case GgmlType::Q5_K: return decode_q5_K;
    case GgmlType::Q6_K: return decode_q6_K;
    case GgmlType::IQ2_XXS: return decode_iq2_xxs;
    case GgmlType::IQ2_XS: return decode_iq2_xs;
    case GgmlType::IQ1_M: return decode_iq1_m;
    default: return nullptr;
  }
}

namespace {

template <int kTokens>
void dot_decoded_n(const DecodedBlock* w, const ActivationQ8K* const* a, int64_t n_blocks, float* out) {
  __m256 acc[kTokens];
  float mins[kTokens];
  for (int t = 0; t < kTokens; t++) acc[t] = _mm256_setzero_ps(), mins[t] = 0.0f;
  for (int64_t b = 0; b < n_blocks; b++) {
    const __m256 wd = _mm256_loadu_ps(w[b].d);
    __m256 dd[kTokens];  // weight scale times activation scale, per 32 values
    for (int t = 0; t < kTokens; t++) dd[t] = _mm256_mul_ps(wd, _mm256_loadu_ps(a[t][b].d));
    for (int ib32 = 0; ib32 < 8; ib32++) {
      // |w| (<= 128 for every decoder) times x with w's sign: maddubs cannot saturate.
      const __m256i q = load32(w[b].q + 32 * ib32);
      const __m256i magnitude = _mm256_abs_epi8(q);
      const __m256i scale = load32(w[b].scale[ib32]);
      const __m256i lane = _mm256_set1_epi32(ib32);
      for (int t = 0; t < kTokens; t++) {
        const __m256i x = _mm256_sign_epi8(load32(a[t][b].qs + 32 * ib32), q);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, x), scale);
        acc[t] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dd[t], lane), _mm256_cvtepi32_ps(p), acc[t]);
      }
    }
    if (w[b].dmin != 0.0f) {
      // The min term: dmin * m * (sum of the 32 activations it multiplies). Explicit fma, so the
      // compiler cannot contract it differently for different token counts: a token's dot is
      // then the same whatever else the call computes.
      for (int t = 0; t < kTokens; t++) {
        float sum = 0.0f;
        for (int s = 0; s < 8; s++)
          sum = std::fma(a[t][b].d[s], (float)(w[b].min[s] * (a[t][b].bsums[2 * s] + a[t][b].bsums[2 * s + 1])), sum);
        mins[t] = std::fma(w[b].dmin, sum, mins[t]);
      }
    }
  }
  for (int t = 0; t < kTokens; t++) out[t] = hsum(acc[t]) - mins[t];
}

}  // namespace

void dot_decoded(const DecodedBlock* w, const ActivationQ8K* const* a, int n_tokens, int64_t n_blocks, float* out) {
  switch (n_tokens) {
    case 1: return dot_decoded_n<1>(w, a, n_blocks, out);
    case 2: return dot_decoded_n<2>(w, a, n_blocks, out);
    case 3: return dot_decoded_n<3>(w, a, n_blocks, out);
    default: return dot_decoded_n<4>(w, a, n_blocks, out);
  }
}

// Eight Q8_0 blocks of 32: x = d * q, one fp16 scale per block.
void decode_q8_0(const uint8_t* row, int64_t b, DecodedBlock* out) {
  const BlockQ8_0* w = reinterpret_cast<const BlockQ8_0*>(row) + 8 * b;
  for (int i = 0; i < 8; i++) {
    store32(out->q + 32 * i, load32(w[i].qs));
    out->d[i] = half_to_f32(w[i].d);
  }
  for (int s = 0; s < 16; s++) set_scale(out, s, 1);
  out->dmin = 0.0f;
}

float fast_dot_f32(const float* a, const float* b, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; k++)
      acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * k), _mm256_loadu_ps(b + i + 8 * k), acc[k]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[0]);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; i++) sum += a[i] * b[i];
  return sum;
}

float fast_dot_f16(const uint16_t* w, const float* x, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = load32(w + i);
    acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), _mm256_loadu_ps(x + i + 8), acc1);
  }
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; i++) sum += half_to_f32(w[i]) * x[i];
  return sum;
}

}  // namespace rl::cpu
