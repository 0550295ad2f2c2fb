// Small elementwise kernels: residual add, the split of attn_q's interleaved output, and a spin
// kernel for the profiler.
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"

namespace rl::cuda {

namespace {

__global__ void add_kernel(float* x, const float* y, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

__global__ void split_q_gate_kernel(const float* qg, float* q, float* gate, int n_head, int hd) {
  const int t = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // index within [n_head][hd]
  if (i >= n_head * hd) return;
  const int h = i / hd, d = i % hd;
  const float* src = qg + (size_t)t * n_head * 2 * hd + (size_t)h * 2 * hd;
  q[(size_t)t * n_head * hd + i] = src[d];
  gate[(size_t)t * n_head * hd + i] = src[hd + d];
}

__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

}  // namespace

void gpu_spin(long long cycles, cudaStream_t stream) {
  spin_kernel<<<1, 1, 0, stream>>>(cycles);
  RL_CUDA_LAUNCH_CHECK();
}

void add_inplace(float* x, const float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, n);
  RL_CUDA_LAUNCH_CHECK();
}

void split_q_gate(const float* qg, float* q, float* gate, int T, int n_head, int hd,
                  cudaStream_t stream) {
  if (T == 0) return;
  split_q_gate_kernel<<<dim3((n_head * hd + 255) / 256, T), 256, 0, stream>>>(qg, q, gate, n_head, hd);
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
