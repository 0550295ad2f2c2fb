// AVX2 building blocks of the fast tier's integer dot products (fast_dot_*.cpp) and its fp32
// element-wise functions.
#pragma once
#include <immintrin.h>

#include <cstddef>
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

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// exp(x) in fp32, eight lanes: x clamped to [-87, 88] (so 2^n stays a normal float; exp(-87) is
// 1.6e-38), n = round(x·log2 e), r = x − n·ln 2 in two steps (ln 2's high part exact in 9 bits),
// exp(r) on |r| <= ln2/2 by Cephes' degree-7 minimax form 1 + r + r²·P(r), times 2^n built in
// the exponent bits. At most 1.18e-7 relative from exp over tests/cpu/silu_fast_test.cpp's sweep
// (bounded there by 1.8e-7); NaN in, an unspecified finite value out (silu8's division carries the
// NaN).
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// SiLU(x) = x / (1 + exp(−x)) in fp32, eight lanes: a NaN stays NaN, x below −88 (−∞ too) gives 0
// (the limit; exp8's clamp would otherwise leave x / exp(88), far from 0 for |x| near FLT_MAX).
inline __m256 silu8(__m256 x) {
  const __m256 y = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
  return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-88.0f), _CMP_LT_OQ), y);
}

// f(a, b) over n values in lanes of eight, out[i] = f(a[i], b[i]); the tail through the same lanes
// (zero-padded), so a value's result does not depend on where it lies in the array.
template <class F>
inline void map8(float* out, const float* a, const float* b, size_t n, F f) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, f(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  if (i == n) return;
  float ta[8] = {}, tb[8] = {}, to[8];
  std::memcpy(ta, a + i, (n - i) * sizeof(float));
  std::memcpy(tb, b + i, (n - i) * sizeof(float));
  _mm256_storeu_ps(to, f(_mm256_loadu_ps(ta), _mm256_loadu_ps(tb)));
  std::memcpy(out + i, to, (n - i) * sizeof(float));
}

// The fast tier's SwiGLU: g[i] = SiLU(g[i]) · u[i] over n values (fp32).
inline void swiglu_fast(float* g, const float* u, size_t n) {
  map8(g, g, u, n, [](__m256 x, __m256 y) { return _mm256_mul_ps(silu8(x), y); });
}

// The fast tier's gate of a DeltaNet output: o[i] *= SiLU(z[i]) over n values (fp32).
inline void mul_silu_fast(float* o, const float* z, size_t n) {
  map8(o, o, z, n, [](__m256 x, __m256 y) { return _mm256_mul_ps(x, silu8(y)); });
}

}  // namespace rl::cpu::simd
