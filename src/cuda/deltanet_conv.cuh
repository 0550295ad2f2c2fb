// The causal depthwise conv + SiLU and the gates of Gated DeltaNet (DESIGN.md §1) as device
// functions over an arithmetic: ConvExact is the oracle's (products and sums in double, rounded
// once; deltanet.cu), ConvFast the fast tier's fp32 (deltanet_fast.cu). The data flow is one.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/math_device.cuh"

namespace rl::cuda {

constexpr int kMaxConvKernel = 8;

struct ConvExact {
  using Sum = double;
  __device__ static double mul(float w, float x) { return (double)w * x; }
  __device__ static double fma(float w, float x, double s) { return ::fma((double)w, (double)x, s); }
  __device__ static float silu(double s) { return silu_f((float)s); }
  __device__ static float sigmoid(float x) { return sigmoid_f(x); }
  __device__ static float softplus(float x) { return softplus_f(x); }
};

struct ConvFast {
  using Sum = float;
  __device__ static float mul(float w, float x) { return __fmul_rn(w, x); }
  __device__ static float fma(float w, float x, float s) { return fmaf(w, x, s); }
  __device__ static float silu(float s) { return s / (1.0f + expf(-s)); }
  __device__ static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
  __device__ static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
};

// Short chunks (decode): one thread per channel c steps through the T tokens with the window of
// the K-1 previous inputs in registers, and advances the state [K-1][C] itself.
template <class A>
__device__ __forceinline__ void conv1d_silu_channel(const float* x, size_t x_stride, float* out, float* state,
                                                    const float* w, int T, int C, int K, int c) {
  if (c >= C) return;
  float win[kMaxConvKernel];  // previous K-1 inputs, oldest first
  float wc[kMaxConvKernel];
#pragma unroll
  for (int i = 0; i < kMaxConvKernel; i++) {
    win[i] = i < K - 1 ? state[(size_t)i * C + c] : 0.f;
    wc[i] = i < K ? w[(size_t)c * K + i] : 0.f;
  }
  for (int t = 0; t < T; t++) {
    const float xt = x[(size_t)t * x_stride + c];
    // The oracle's order: the current tap first, then the state oldest to newest.
    typename A::Sum s = A::mul(wc[K - 1], xt);
#pragma unroll
    for (int i = 0; i < kMaxConvKernel; i++)
      if (i < K - 1) s = A::fma(wc[i], win[i], s);
#pragma unroll
    for (int i = 0; i < kMaxConvKernel - 1; i++)
      if (i < K - 2) win[i] = win[i + 1];
    win[K - 2] = xt;
    out[(size_t)t * C + c] = A::silu(s);
  }
#pragma unroll
  for (int i = 0; i < kMaxConvKernel; i++)
    if (i < K - 1) state[(size_t)i * C + c] = win[i];
}

// Long chunks: the output of token t, channel c, reading the K-1 previous inputs from x or,
// before the chunk, from the state (conv_state_advance moves the state on afterwards).
template <class A>
__device__ __forceinline__ float conv1d_silu_token(const float* __restrict__ x, size_t x_stride,
                                                   const float* __restrict__ state, const float* __restrict__ w,
                                                   int t, int C, int K, int c) {
  typename A::Sum s = A::mul(w[(size_t)c * K + K - 1], x[(size_t)t * x_stride + c]);
  for (int i = 0; i < K - 1; i++) {
    const int tau = t - (K - 1) + i;  // input time of tap i
    const float in = tau < 0 ? state[(size_t)(K - 1 + tau) * C + c] : x[(size_t)tau * x_stride + c];
    s = A::fma(w[(size_t)c * K + i], in, s);
  }
  return A::silu(s);
}

// beta = sigmoid(b), g = softplus(a + dt_bias) * ssm_a for token t, value head j (ba [T][nk][2r]).
template <class A>
__device__ __forceinline__ void deltanet_gate(const float* ba, const float* dt_bias, const float* ssm_a, float* beta,
                                              float* g, int nk, int nv, int t, int j) {
  const int r = nv / nk, kh = j / r, sub = j % r;
  const float* row = ba + (size_t)t * nk * 2 * r + (size_t)kh * 2 * r;
  beta[(size_t)t * nv + j] = A::sigmoid(row[sub]);
  g[(size_t)t * nv + j] = __fmul_rn(A::softplus(__fadd_rn(row[r + sub], dt_bias[j])), ssm_a[j]);
}

// state[i] = input at time T-(K-1)+i after a chunk of T tokens (a copy of inputs: one for both
// tiers; deltanet.cu).
void conv_state_advance(const float* x, size_t x_stride, float* state, int T, int C, int K, cudaStream_t stream);

}  // namespace rl::cuda
