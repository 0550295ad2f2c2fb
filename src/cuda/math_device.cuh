// The oracle's scalar functions (cpu/ops.h), evaluated the same way on the device: in double,
// rounded once to fp32. Sharing the formulas keeps GPU activations bit-identical to the oracle's
// almost everywhere (see matvec.cu).
#pragma once

namespace rl::cuda {

__device__ __forceinline__ float sigmoid_f(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }
__device__ __forceinline__ float silu_f(float x) { return (float)((double)x / (1.0 + exp(-(double)x))); }
__device__ __forceinline__ float softplus_f(float x) {
  const double d = x;
  return (float)(d > 20.0 ? d : log1p(exp(d)));
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace rl::cuda
