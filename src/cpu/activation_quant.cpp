#include "cpu/activation_quant.h"

#include <immintrin.h>

namespace rl::cpu {

// Per 32 values: d = max |x| / 127, qs = round(x / d) (to nearest even, the cvtps default), all
// zero when the block is; then the sums of every 16 quantised values.
void quantize_activation_q8k(const float* x, int64_t n, ActivationQ8K* out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < n / 256; b++, x += 256) {
    ActivationQ8K& blk = out[b];
    for (int i = 0; i < 8; i++) {
      const float* v = x + 32 * i;
      __m256 in[4], amax = _mm256_setzero_ps();
      for (int k = 0; k < 4; k++) {
        in[k] = _mm256_loadu_ps(v + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_and_ps(in[k], abs_mask));
      }
      __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      m = _mm_max_ps(m, _mm_movehl_ps(m, m));
      m = _mm_max_ss(m, _mm_movehdup_ps(m));
      const float max_abs = _mm_cvtss_f32(m);
      blk.d[i] = max_abs / 127.0f;
      const __m256 inverse = _mm256_set1_ps(max_abs > 0.0f ? 127.0f / max_abs : 0.0f);
      __m256i q[4];
      for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(in[k], inverse));
      // Packing interleaves the 128-bit lanes; the permute puts the 32 bytes back in order.
      const __m256i q16_lo = _mm256_packs_epi32(q[0], q[1]), q16_hi = _mm256_packs_epi32(q[2], q[3]);
      const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16_lo, q16_hi),
                                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk.qs + 32 * i), q8);
    }
    for (int i = 0; i < 16; i++) {
      int sum = 0;
      for (int j = 0; j < 16; j++) sum += blk.qs[16 * i + j];
      blk.bsums[i] = (int16_t)sum;
    }
  }
}

}  // namespace rl::cpu
