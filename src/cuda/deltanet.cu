// Gated DeltaNet: the causal depthwise conv, the gates, and the recurrence (DESIGN.md §1).
//
// The recurrence runs one block per value head with one thread per row of the state S [dv][dk]:
// a thread keeps its row (dk floats) in registers for the whole chunk, so the state is read and
// written once per call, and tokens are processed in order exactly as the oracle does. A prefill
// chunk of 512 tokens is 512 dependent steps of ~3·dk multiply-adds per thread. The arithmetic is
// the oracle's (cpu/forward.cpp deltanet_layer): sums and the state update in double, the state
// stored as fp32 after each step.
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kMaxConvKernel = 8;

__global__ void conv1d_silu_kernel(const float* x, size_t x_stride, float* out, float* state,
                                   const float* w, int T, int C, int K) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
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
    double s = (double)wc[K - 1] * xt;
#pragma unroll
    for (int i = 0; i < kMaxConvKernel; i++)
      if (i < K - 1) s = fma((double)wc[i], (double)win[i], s);
#pragma unroll
    for (int i = 0; i < kMaxConvKernel - 1; i++)
      if (i < K - 2) win[i] = win[i + 1];
    win[K - 2] = xt;
    out[(size_t)t * C + c] = silu_f((float)s);
  }
#pragma unroll
  for (int i = 0; i < kMaxConvKernel; i++)
    if (i < K - 1) state[(size_t)i * C + c] = win[i];
}

__global__ void gates_kernel(const float* ba, const float* dt_bias, const float* ssm_a, float* beta,
                             float* g, int T, int nk, int nv) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= T * nv) return;
  const int t = i / nv, j = i % nv, r = nv / nk;
  const int kh = j / r, sub = j % r;
  const float* row = ba + (size_t)t * nk * 2 * r + (size_t)kh * 2 * r;
  const float b = row[sub], a = row[r + sub];
  beta[i] = sigmoid_f(b);
  g[i] = __fmul_rn(softplus_f(__fadd_rn(a, dt_bias[j])), ssm_a[j]);
}

template <int DK>
__global__ void recurrence_kernel(const float* q, const float* k, const float* v, size_t stride,
                                  const float* beta, const float* g, float* S, float* out, int T,
                                  int nk, int nv, int dv) {
  const int j = blockIdx.x;        // value head
  const int row = threadIdx.x;     // row of S (value dim)
  const int kh = j / (nv / nk);
  __shared__ float ks[DK], qs[DK];
  float s[DK];
  float* Sj = S + ((size_t)j * dv + row) * DK;
#pragma unroll
  for (int i = 0; i < DK; i++) s[i] = Sj[i];
  for (int t = 0; t < T; t++) {
    __syncthreads();
    for (int i = threadIdx.x; i < DK; i += blockDim.x) {
      ks[i] = k[(size_t)t * stride + (size_t)kh * DK + i];
      qs[i] = q[(size_t)t * stride + (size_t)kh * DK + i];
    }
    __syncthreads();
    const double decay = exp((double)g[(size_t)t * nv + j]);
    const double b = beta[(size_t)t * nv + j];
    double sk = 0.0;
#pragma unroll
    for (int i = 0; i < DK; i++) {
      s[i] = (float)(s[i] * decay);
      sk = fma((double)s[i], (double)ks[i], sk);
    }
    const double d = ((double)v[(size_t)t * stride + (size_t)j * dv + row] - sk) * b;
    double o = 0.0;
#pragma unroll
    for (int i = 0; i < DK; i++) {
      s[i] = (float)fma(d, (double)ks[i], (double)s[i]);
      o = fma((double)s[i], (double)qs[i], o);
    }
    out[((size_t)t * nv + j) * dv + row] = (float)o;
  }
#pragma unroll
  for (int i = 0; i < DK; i++) Sj[i] = s[i];
}

}  // namespace

void conv1d_silu(const float* x, size_t x_stride, float* out, float* state, const float* w, int T,
                 int C, int K, cudaStream_t stream) {
  if (K < 2 || K > kMaxConvKernel)
    throw_error("deltanet: conv kernel " + std::to_string(K) + " outside [2, 8]");
  if (T == 0) return;
  conv1d_silu_kernel<<<(C + 127) / 128, 128, 0, stream>>>(x, x_stride, out, state, w, T, C, K);
  RL_CUDA_LAUNCH_CHECK();
}

void deltanet_gates(const float* ba, const float* dt_bias, const float* ssm_a, float* beta,
                    float* g, int T, int nk, int nv, cudaStream_t stream) {
  if (T == 0) return;
  gates_kernel<<<(T * nv + 127) / 128, 128, 0, stream>>>(ba, dt_bias, ssm_a, beta, g, T, nk, nv);
  RL_CUDA_LAUNCH_CHECK();
}

void deltanet_recurrence(const float* q, const float* k, const float* v, size_t qkv_stride,
                         const float* beta, const float* g, float* S, float* out, int T, int nk,
                         int nv, int dk, int dv, cudaStream_t stream) {
  if (T == 0) return;
  if (dv > 1024) throw_error("deltanet: value head dim " + std::to_string(dv) + " > 1024");
  switch (dk) {
    case 64:
      recurrence_kernel<64><<<nv, dv, 0, stream>>>(q, k, v, qkv_stride, beta, g, S, out, T, nk, nv, dv);
      break;
    case 128:
      recurrence_kernel<128><<<nv, dv, 0, stream>>>(q, k, v, qkv_stride, beta, g, S, out, T, nk, nv, dv);
      break;
    default:
      throw_error("deltanet: key head dim " + std::to_string(dk) + " (supported: 64, 128)");
  }
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
