// The primitives of the CPU oracle. Activations are row-major fp32 [n_tokens][width]; weights are
// read through TensorViews and dequantised on the fly, one tile of rows at a time.
#pragma once
#include <cmath>
#include <cstdint>

#include "cpu/thread_pool.h"
#include "model/model.h"

namespace rl::cpu {

// sum_i a[i]*b[i], products and sum in double (fp32 inputs are exact in double, so the only
// rounding is the final cast: results do not depend on how a caller batches its work).
double dot(const float* a, const float* b, int64_t n);

// out[t][r] = W[r] . x[t] for t < n_tokens, r < W.n_rows()   (x: [n_tokens][W.row_length()],
// out: [n_tokens][W.n_rows()]). This is where the oracle spends its time: each tile of weight
// rows is dequantised once and dotted with every token, spread over the pool's threads.
void matmul(ThreadPool& pool, const TensorView& W, const float* x, int n_tokens, float* out);

// y = x / sqrt(mean(x^2) + eps) * weight   (weight may be nullptr: plain RMSNorm); y may be x.
void rmsnorm(const float* x, const float* weight, float eps, int64_t n, float* y);

// x / sqrt(sum(x^2) + eps), in place.
void l2norm(float* x, int64_t n, float eps);

inline float sigmoid(float x) { return (float)(1.0 / (1.0 + std::exp(-(double)x))); }
inline float silu(float x) { return (float)((double)x / (1.0 + std::exp(-(double)x))); }
// log(1 + e^x), evaluated without overflow.
inline float softplus(float x) {
  const double d = x;
  return (float)(d > 20.0 ? d : std::log1p(std::exp(d)));
}

}  // namespace rl::cpu
