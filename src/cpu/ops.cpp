#include "cpu/ops.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace rl::cpu {

double dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  double sum = 0.0;
#if defined(__AVX2__) && defined(__FMA__)
  // Four double lanes, two accumulators; the order is fixed for a given n, so every caller
  // (prefill of many tokens, decode of one) gets bit-identical results.
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    const __m256 va = _mm256_loadu_ps(a + i), vb = _mm256_loadu_ps(b + i);
    acc0 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(va)),
                           _mm256_cvtps_pd(_mm256_castps256_ps128(vb)), acc0);
    acc1 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(va, 1)),
                           _mm256_cvtps_pd(_mm256_extractf128_ps(vb, 1)), acc1);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(acc0, acc1));
  sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
  for (; i < n; i++) sum += (double)a[i] * (double)b[i];
  return sum;
}

namespace {

#if defined(__AVX2__) && defined(__FMA__)
inline double hsum(__m256d acc0, __m256d acc1) {
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(acc0, acc1));
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}
#endif

// out[j] = dot(rows[j], x, n) for four rows, each summed in exactly dot()'s order (so results are
// bit-identical to dot()); x is loaded and widened once for the four rows.
void dot4(const float* const rows[4], const float* x, int64_t n, double out[4]) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256d lo[4], hi[4];
  for (int j = 0; j < 4; j++) lo[j] = hi[j] = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    const __m256 vx = _mm256_loadu_ps(x + i);
    const __m256d xlo = _mm256_cvtps_pd(_mm256_castps256_ps128(vx));
    const __m256d xhi = _mm256_cvtps_pd(_mm256_extractf128_ps(vx, 1));
    for (int j = 0; j < 4; j++) {
      const __m256 vr = _mm256_loadu_ps(rows[j] + i);
      lo[j] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(vr)), xlo, lo[j]);
      hi[j] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(vr, 1)), xhi, hi[j]);
    }
  }
  for (int j = 0; j < 4; j++) out[j] = hsum(lo[j], hi[j]);
#else
  for (int j = 0; j < 4; j++) out[j] = 0.0;
#endif
  for (int j = 0; j < 4; j++)
    for (int64_t k = i; k < n; k++) out[j] += (double)rows[j][k] * (double)x[k];
}

// Rows dequantised together: 16 rows of a 2048-wide matrix are 128 KiB of fp32, small enough to
// stay in L2 while every token of the batch is dotted with them.
constexpr int64_t kRowTile = 16;
// Below this many multiply-adds a matmul runs on the calling thread: waking the pool costs more.
constexpr int64_t kMinParallelWork = 1 << 16;
}  // namespace

void matmul(ThreadPool& pool, const TensorView& W, const float* x, int n_tokens, float* out) {
  const int64_t n_in = W.row_length(), n_out = W.n_rows();
  const int64_t n_tiles = (n_out + kRowTile - 1) / kRowTile;
  const DequantizeRowFn dequantize = quant_type(W.type).dequantize_row;
  auto tile = [&](int64_t t_idx) {
    thread_local std::vector<float> rows;
    const int64_t r0 = t_idx * kRowTile, nr = std::min(kRowTile, n_out - r0);
    rows.resize((size_t)(kRowTile * n_in));
    for (int64_t r = 0; r < nr; r++) dequantize(W.row(r0 + r), rows.data() + r * n_in, n_in);
    for (int t = 0; t < n_tokens; t++) {
      const float* xt = x + (int64_t)t * n_in;
      float* ot = out + (int64_t)t * n_out + r0;
      int64_t r = 0;
      for (; r + 4 <= nr; r += 4) {
        const float* const quad[4] = {rows.data() + r * n_in, rows.data() + (r + 1) * n_in,
                                      rows.data() + (r + 2) * n_in, rows.data() + (r + 3) * n_in};
        double d[4];
        dot4(quad, xt, n_in, d);
        for (int j = 0; j < 4; j++) ot[r + j] = (float)d[j];
      }
      for (; r < nr; r++) ot[r] = (float)dot(rows.data() + r * n_in, xt, n_in);
    }
  };
  if (n_in * n_out * n_tokens < kMinParallelWork) {
    for (int64_t i = 0; i < n_tiles; i++) tile(i);
  } else {
    pool.run(n_tiles, tile);
  }
}

void rmsnorm(const float* x, const float* weight, float eps, int64_t n, float* y) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  const double scale = 1.0 / std::sqrt(ss / (double)n + (double)eps);
  for (int64_t i = 0; i < n; i++)
    y[i] = weight ? (float)(x[i] * scale * weight[i]) : (float)(x[i] * scale);
}

void l2norm(float* x, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  const double scale = 1.0 / std::sqrt(ss + (double)eps);
  for (int64_t i = 0; i < n; i++) x[i] = (float)(x[i] * scale);
}

}  // namespace rl::cpu
