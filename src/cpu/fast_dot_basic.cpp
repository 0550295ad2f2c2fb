// The fast tier's kernel table and its float and Q8_0 kernels.
#include "common/error.h"
#include "cpu/activation_quant.h"
#include "cpu/fast_dot.h"
#include "cpu/fast_simd.h"
#include "quant/blocks.h"

namespace rl::cpu {

using namespace simd;

FastKernel fast_kernel(GgmlType type) {
  using F = ActivationFormat;
  switch (type) {
    case GgmlType::F16: return {F::kF32, fast_dot_f16};
    case GgmlType::Q8_0: return {F::kQ8_0, fast_dot_q8_0};
    case GgmlType::Q4_K: return {F::kQ8K, fast_dot_q4_K};
    case GgmlType::Q5_K: return {F::kQ8K, fast_dot_q5_K};
    case GgmlType::Q6_K: return {F::kQ8K, fast_dot_q6_K};
    case GgmlType::IQ2_XXS: return {F::kQ8K, fast_dot_iq2_xxs};
    case GgmlType::IQ2_XS: return {F::kQ8K, fast_dot_iq2_xs};
    case GgmlType::IQ1_M: return {F::kQ8K, fast_dot_iq1_m};
    default: return {F::kF32, nullptr};  // F32 in place; any other type dequantised to fp32
  }
}

size_t activation_bytes(ActivationFormat format, int64_t n) {
  switch (format) {
    case ActivationFormat::kQ8K: return (size_t)(n / 256) * sizeof(ActivationQ8K);
    case ActivationFormat::kQ8_0: return (size_t)(n / 32) * sizeof(ActivationQ8_0);
    case ActivationFormat::kF32: break;
  }
  return (size_t)n * sizeof(float);
}

void quantize_activation(ActivationFormat format, const float* x, int64_t n, void* out) {
  switch (format) {
    case ActivationFormat::kQ8K: return quantize_activation_q8k(x, n, static_cast<ActivationQ8K*>(out));
    case ActivationFormat::kQ8_0: return quantize_activation_q8_0(x, n, static_cast<ActivationQ8_0*>(out));
    case ActivationFormat::kF32: std::memcpy(out, x, (size_t)n * sizeof(float)); return;
  }
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

float fast_dot_f16(const void* row, const void* act, int64_t n) {
  const uint16_t* w = static_cast<const uint16_t*>(row);
  const float* x = static_cast<const float*>(act);
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

float fast_dot_q8_0(const void* row, const void* act, int64_t n) {
  const BlockQ8_0* w = static_cast<const BlockQ8_0*>(row);
  const ActivationQ8_0* a = static_cast<const ActivationQ8_0*>(act);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; b++) {
    const __m256i p = dot_s8_s8(load32(w[b].qs), load32(a[b].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half_to_f32(w[b].d) * a[b].d), _mm256_cvtepi32_ps(p), acc);
  }
  return hsum(acc);
}

}  // namespace rl::cpu
