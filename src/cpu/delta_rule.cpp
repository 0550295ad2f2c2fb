#include "cpu/delta_rule.h"

#include <vector>

#include "cpu/fast_simd.h"
#include "cpu/ops.h"

namespace rl::cpu {

void delta_rule_step_exact(float* S, const float* q, const float* k, const float* v, double decay, double beta,
                           int dk, int dv, float* o) {
  thread_local std::vector<double> d_store;
  d_store.resize(dv);
  double* const d = d_store.data();
  for (int i = 0; i < dv * dk; i++) S[i] = (float)(S[i] * decay);
  for (int i = 0; i < dv; i++) d[i] = ((double)v[i] - dot(S + (size_t)i * dk, k, dk)) * beta;
  for (int i = 0; i < dv; i++)
    for (int c = 0; c < dk; c++) S[(size_t)i * dk + c] = (float)(S[(size_t)i * dk + c] + d[i] * k[c]);
  for (int i = 0; i < dv; i++) o[i] = (float)dot(S + (size_t)i * dk, q, dk);
}

void delta_rule_step_fast(float* S, const float* q, const float* k, const float* v, float decay, float beta, int dk,
                          int dv, float* o) {
  const __m256 decay8 = _mm256_set1_ps(decay);
  for (int i = 0; i < dv; i++) {
    float* row = S + (size_t)i * dk;
    // The decay, and the row's product with k.
    __m256 acc = _mm256_setzero_ps();
    int c = 0;
    for (; c + 8 <= dk; c += 8) {
      const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(row + c), decay8);
      _mm256_storeu_ps(row + c, r);
      acc = _mm256_fmadd_ps(r, _mm256_loadu_ps(k + c), acc);
    }
    float sk = simd::hsum(acc);
    for (; c < dk; c++) sk += (row[c] *= decay) * k[c];
    // The update, and the row's product with q.
    const float d = (v[i] - sk) * beta;
    const __m256 d8 = _mm256_set1_ps(d);
    acc = _mm256_setzero_ps();
    for (c = 0; c + 8 <= dk; c += 8) {
      const __m256 r = _mm256_fmadd_ps(d8, _mm256_loadu_ps(k + c), _mm256_loadu_ps(row + c));
      _mm256_storeu_ps(row + c, r);
      acc = _mm256_fmadd_ps(r, _mm256_loadu_ps(q + c), acc);
    }
    float sq = simd::hsum(acc);
    for (; c < dk; c++) sq += (row[c] += d * k[c]) * q[c];
    o[i] = sq;
  }
}

}  // namespace rl::cpu
