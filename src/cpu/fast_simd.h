// AVX2 building blocks of the fast tier's integer dot products (fast_dot_*.cpp).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace rl::cpu::simd {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline void store32(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }

// Eight int32 sums of four products each: sum over 4 bytes of u[i] * s[i], u unsigned (<= 128 on
// every caller, so the int16 pair sums of maddubs cannot saturate), s signed.
inline __m256i dot_u8_s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// As dot_u8_s8 for two signed vectors: |w| times a with w's sign (|w| <= 128, |a| <= 127).
inline __m256i dot_s8_s8(__m256i w, __m256i a) { return dot_u8_s8(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w)); }

// Eight int32 sums of u[i] * s[i] over 4 bytes, the first 16 bytes' pairs weighted by scale_lo
// and the last 16 bytes' by scale_hi (one scale per 16 values, as the K and IQ2 sub-blocks).
inline __m256i dot_u8_s8_scaled(__m256i u, __m256i s, int16_t scale_lo, int16_t scale_hi) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s),
                           _mm256_set_m128i(_mm_set1_epi16(scale_hi), _mm_set1_epi16(scale_lo)));
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace rl::cpu::simd
