// Row normalisations: RMSNorm (model and per-head), the DeltaNet gated norm, per-head L2 norm.
// One warp per row; rows are at most a few thousand values, so a warp reduction is enough.
// Arithmetic as the oracle's (math_device.cuh).
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kRowsPerBlock = 4;

// Sums of squares and scales in double, outputs rounded once: cpu/ops.cpp rmsnorm and l2norm.
__global__ void rms_norm_kernel(const float* x, const float* w, float* out, int n_rows, int width,
                                float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= n_rows) return;
  const float* xr = x + (size_t)row * width;
  double ss = 0.0;
  // Unrolled so a lane's loads overlap (a decode row of 2048 values is one warp's work); the sum
  // order is unchanged.
#pragma unroll 8
  for (int i = lane; i < width; i += 32) ss += (double)xr[i] * xr[i];
  ss = warp_sum_d(ss);
  const double scale = 1.0 / sqrt(ss / (double)width + (double)eps);
  float* o = out + (size_t)row * width;
#pragma unroll 8
  for (int i = lane; i < width; i += 32) o[i] = w ? (float)(xr[i] * scale * w[i]) : (float)(xr[i] * scale);
}

// add_inplace + rms_norm_kernel in one pass: each lane adds, stores and squares its own columns,
// then scales the values it stored (the same lane reads back what it wrote).
__global__ void add_rms_norm_kernel(float* x, const float* y, const float* w, float* out, int n_rows,
                                    int width, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= n_rows) return;
  float* xr = x + (size_t)row * width;
  const float* yr = y + (size_t)row * width;
  double ss = 0.0;
#pragma unroll 8
  for (int i = lane; i < width; i += 32) {
    const float v = __fadd_rn(xr[i], yr[i]);
    xr[i] = v;
    ss += (double)v * v;
  }
  ss = warp_sum_d(ss);
  const double scale = 1.0 / sqrt(ss / (double)width + (double)eps);
  float* o = out + (size_t)row * width;
#pragma unroll 8
  for (int i = lane; i < width; i += 32) o[i] = w ? (float)(xr[i] * scale * w[i]) : (float)(xr[i] * scale);
}

// RMSNorm(o) * w first (rounded), then times SiLU(z): the oracle's two steps.
__global__ void gated_rms_norm_kernel(const float* x, const float* z, const float* w, float* out,
                                      int n_rows, int width, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= n_rows) return;
  const float* xr = x + (size_t)row * width;
  const float* zr = z + (size_t)row * width;
  double ss = 0.0;
  for (int i = lane; i < width; i += 32) ss += (double)xr[i] * xr[i];
  ss = warp_sum_d(ss);
  const double scale = 1.0 / sqrt(ss / (double)width + (double)eps);
  float* o = out + (size_t)row * width;
  for (int i = lane; i < width; i += 32) {
    const float normed = (float)(xr[i] * scale * w[i]);
    o[i] = __fmul_rn(normed, silu_f(zr[i]));
  }
}

__global__ void l2_norm_kernel(float* x, int n_rows, int heads, int width, size_t token_stride,
                               float eps, float post_scale) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= n_rows) return;
  float* xr = x + (size_t)(row / heads) * token_stride + (size_t)(row % heads) * width;
  double ss = 0.0;
  for (int i = lane; i < width; i += 32) ss += (double)xr[i] * xr[i];
  ss = warp_sum_d(ss);
  const double inv = 1.0 / sqrt(ss + (double)eps);
  for (int i = lane; i < width; i += 32) xr[i] = __fmul_rn((float)(xr[i] * inv), post_scale);
}

unsigned blocks_for(int n_rows) { return (unsigned)((n_rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

void rms_norm(const float* x, const float* w, float* out, int n_rows, int width, float eps,
              cudaStream_t stream) {
  if (n_rows == 0) return;
  rms_norm_kernel<<<blocks_for(n_rows), 32 * kRowsPerBlock, 0, stream>>>(x, w, out, n_rows, width, eps);
  RL_CUDA_LAUNCH_CHECK();
}

void add_rms_norm(float* x, const float* y, const float* w, float* out, int n_rows, int width,
                  float eps, cudaStream_t stream) {
  if (n_rows == 0) return;
  add_rms_norm_kernel<<<blocks_for(n_rows), 32 * kRowsPerBlock, 0, stream>>>(x, y, w, out, n_rows, width,
                                                                             eps);
  RL_CUDA_LAUNCH_CHECK();
}

void gated_rms_norm(const float* o, const float* z, const float* w, float* out, int n_rows,
                    int width, float eps, cudaStream_t stream) {
  if (n_rows == 0) return;
  gated_rms_norm_kernel<<<blocks_for(n_rows), 32 * kRowsPerBlock, 0, stream>>>(o, z, w, out, n_rows,
                                                                               width, eps);
  RL_CUDA_LAUNCH_CHECK();
}

void l2_norm(float* x, int T, int heads, int width, size_t token_stride, float eps, float scale,
             cudaStream_t stream) {
  const int n_rows = T * heads;
  if (n_rows == 0) return;
  l2_norm_kernel<<<blocks_for(n_rows), 32 * kRowsPerBlock, 0, stream>>>(x, n_rows, heads, width,
                                                                        token_stride, eps, scale);
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
