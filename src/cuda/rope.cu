// Partial rotary position embedding, NeoX pairing: within the first n_rot dims of a head, dim i
// pairs with i + n_rot/2 and rotates by pos * base^(-2i/n_rot). Dims past n_rot pass through.
// The angle is formed as the oracle (and ggml) form it: fp32, pos multiplied by theta_scale =
// base^(-2/n_rot) once per pair index, because at positions in the thousands the rounding of the
// angle is visible at the 1e-5 level.
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"

namespace rl::cuda {

namespace {

__global__ void rope_neox_kernel(float* x, int n_heads, int head_dim, size_t row_stride, int n_rot,
                                 float theta_scale, const int32_t* positions) {
  const int t = blockIdx.y, h = blockIdx.x;
  const int half = n_rot / 2;
  const float pos = (float)positions[t];
  float* xh = x + (size_t)t * row_stride + (size_t)h * head_dim;
  // cos/sin correctly rounded to fp32 (as the C library's cosf/sinf nearly always are), and the
  // products fused as the oracle's compiler fuses them (x86-64, -mfma): a*c - (b*s) and
  // a*s + (b*c) with the second product rounded first (rope_pair, math_device.cuh).
  for (int i = threadIdx.x; i < half; i += blockDim.x) rope_pair(xh, i, half, pos, theta_scale);
}

}  // namespace

void rope_neox(float* x, int T, int n_heads, int head_dim, size_t row_stride, int n_rot,
               float theta_scale, const int32_t* positions, cudaStream_t stream) {
  if (T == 0) return;
  rope_neox_kernel<<<dim3(n_heads, T), 64, 0, stream>>>(x, n_heads, head_dim, row_stride, n_rot,
                                                        theta_scale, positions);
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
