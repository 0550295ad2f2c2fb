// The fast tier's kernel table, the Q8_0 decoder and the float kernels.
#include <cmath>

#include "cpu/activation_quant.h"
#include "cpu/fast_dot.h"
#include "cpu/fast_kernel.h"
#include "cpu/fast_simd.h"
#include "quant/blocks.h"

namespace rl::cpu {

using namespace simd;

const FastKernels* fast_kernels(GgmlType type) {
  switch (type) {
    case GgmlType::Q8_0: return &kQ8_0Kernels;
    case GgmlType::Q4_K: return &kQ4_KKernels;
    case GgmlType::Q5_K: return &kQ5_KKernels;
    case GgmlType::Q6_K: return &kQ6_KKernels;
    case GgmlType::IQ2_XXS: return &kIQ2_XXSKernels;
    case GgmlType::IQ2_XS: return &kIQ2_XSKernels;
    case GgmlType::IQ1_M: return &kIQ1_MKernels;
    default: return nullptr;
  }
}

namespace {

// Eight Q8_0 blocks of 32: x = d * q, one fp16 scale per block.
struct Q8_0Decoder {
  static constexpr bool kSigned = true, kHasMin = false;
  static const BlockQ8_0* blocks(const uint8_t* row, int64_t b) { return reinterpret_cast<const BlockQ8_0*>(row) + 8 * b; }
  static void header(const uint8_t* row, int64_t b, BlockHeader* h) {
    const BlockQ8_0* w = blocks(row, b);
    h->d = _mm256_cvtph_ps(_mm_setr_epi16((short)w[0].d, (short)w[1].d, (short)w[2].d, (short)w[3].d, (short)w[4].d,
                                          (short)w[5].d, (short)w[6].d, (short)w[7].d));
    h->scale = _mm256_set1_epi16(1);
  }
  template <class Emit>
  static void groups(const uint8_t* row, int64_t b, Emit&& emit) {
    const BlockQ8_0* w = blocks(row, b);
    for (int i = 0; i < 8; i++) {
      const __m256i q = load32(w[i].qs);
      emit(i, _mm256_abs_epi8(q), q);
    }
  }
};

}  // namespace

const FastKernels kQ8_0Kernels = kernel::kernels_of<Q8_0Decoder>();

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
