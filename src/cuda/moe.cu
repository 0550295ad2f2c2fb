// Mixture-of-experts glue: router softmax, SwiGLU, and the weighted combine of routed and shared
// experts. The expert products themselves are matvec_experts / matmul_experts on slot pointers.
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kSoftmaxThreads = 256;

__global__ void softmax_kernel(const float* logits, float* probs, int n) {
  const float* x = logits + (size_t)blockIdx.x * n;
  float* y = probs + (size_t)blockIdx.x * n;
  __shared__ float red[kSoftmaxThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kSoftmaxThreads) m = fmaxf(m, x[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < kSoftmaxThreads / 32; w++) m = fmaxf(m, red[w]);
  __syncthreads();
  float s = 0.f;
  for (int i = threadIdx.x; i < n; i += kSoftmaxThreads) s += expf(x[i] - m);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) red[warp] = s;
  __syncthreads();
  s = 0.f;
  for (int w = 0; w < kSoftmaxThreads / 32; w++) s += red[w];
  for (int i = threadIdx.x; i < n; i += kSoftmaxThreads) y[i] = expf(x[i] - m) / s;
}

__global__ void swiglu_kernel(const float* gate, const float* up, float* act, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  act[i] = __fmul_rn(silu_f(gate[i]), up[i]);
}

__global__ void combine_kernel(float* x, const float* y, const int32_t* assign, const float* weights,
                               int k, const float* shared, const float* shared_gate, int width) {
  const int t = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= width) return;
  // The oracle: routed sum in double, then (float)routed + shared * sigmoid(gate), which its
  // compiler fuses into one fma; the residual add is a separate fp32 add.
  double routed = 0.0;
  for (int j = 0; j < k; j++)
    routed = fma((double)weights[(size_t)t * k + j], (double)y[(size_t)assign[(size_t)t * k + j] * width + c], routed);
  const float sg = sigmoid_f(shared_gate[t]);
  const float mix = __fmaf_rn(shared[(size_t)t * width + c], sg, (float)routed);
  x[(size_t)t * width + c] = __fadd_rn(x[(size_t)t * width + c], mix);
}

__global__ void gather_kernel(const float* src, const int32_t* idx, float* dst, int width) {
  const int i = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < width) dst[(size_t)i * width + c] = src[(size_t)idx[i] * width + c];
}

}  // namespace

void softmax_rows(const float* logits, float* probs, int T, int n, cudaStream_t stream) {
  if (T == 0) return;
  softmax_kernel<<<T, kSoftmaxThreads, 0, stream>>>(logits, probs, n);
  RL_CUDA_LAUNCH_CHECK();
}

void swiglu(const float* gate, const float* up, float* act, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(gate, up, act, n);
  RL_CUDA_LAUNCH_CHECK();
}

void moe_combine(float* x, const float* y, const int32_t* assign, const float* weights, int k,
                 const float* shared, const float* shared_gate, int T, int width,
                 cudaStream_t stream) {
  if (T == 0) return;
  combine_kernel<<<dim3((width + 255) / 256, T), 256, 0, stream>>>(x, y, assign, weights, k, shared,
                                                                   shared_gate, width);
  RL_CUDA_LAUNCH_CHECK();
}

void gather_rows(const float* src, const int32_t* idx, float* dst, int n, int width,
                 cudaStream_t stream) {
  if (n == 0) return;
  gather_kernel<<<dim3((width + 255) / 256, n), 256, 0, stream>>>(src, idx, dst, width);
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
