// Decode products: y = W·x for one token, on weights of any supported ggml type.
//
// One warp per row; lane i dequantises the 8-value chunks i, i+32, ... of the row (quant_device.cuh)
// and multiplies them with x read as two float4. A 2048-column row is 256 chunks, 8 per lane, so
// every lane has several independent loads in flight; the warp's partial sums meet in a shuffle
// reduction. Weights are read once; x stays in L1/L2.
//
// Products and sums are in double, as the oracle's dot (cpu/ops.h): an fp32 product is exact in
// double, so the result rounded to fp32 does not depend on the summation order except in the
// rarest ties, and the GPU reproduces the oracle's values bit for bit almost everywhere. That is
// what keeps the router's top-k identical when two experts' logits nearly tie.
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/quant_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;  // 128 threads: enough blocks for 512-row expert matrices

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp's dot product of a quantised row with x (double sum, see above); every lane gets it.
template <GgmlType T>
__device__ __forceinline__ double warp_row_dot(const uint8_t* wr, const float* xe, int cols, int lane) {
  double acc = 0.0;
  const int n_chunks = cols / 8;
  // Unrolled so that several chunks' loads are in flight at once (a 512-row matrix is less than
  // one wave, so each warp's load latency is the kernel's time); the sum order is unchanged.
#pragma unroll 4
  for (int c = lane; c < n_chunks; c += 32) {
    float v[8];
    Dequant<T>::chunk8(wr, c, v);
    const float4 a = *reinterpret_cast<const float4*>(xe + 8 * c);
    const float4 b = *reinterpret_cast<const float4*>(xe + 8 * c + 4);
    const float xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int j = 0; j < 8; j++) acc = fma((double)v[j], (double)xs[j], acc);
  }
  return warp_sum(acc);
}

template <GgmlType T>
__global__ void matvec_kernel(const uint8_t* w, const uint8_t* const* slot_ptrs, size_t w_offset,
                              size_t row_bytes, int rows, int cols, const float* x, size_t x_stride,
                              float* y) {
  const int e = blockIdx.y;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const uint8_t* base = slot_ptrs ? slot_ptrs[e] + w_offset : w;
  const double acc = warp_row_dot<T>(base + (size_t)row * row_bytes, x + (size_t)e * x_stride, cols, lane);
  if (lane == 0) y[(size_t)e * rows + row] = (float)acc;
}

// Gate and up of n experts in one grid: blockIdx.y = which * n + e (which 0: gate, 1: up).
template <GgmlType T>
__global__ void matvec_gate_up_kernel(const uint8_t* const* slot_ptrs, size_t up_offset, size_t rb_gate,
                                      size_t rb_up, int rows, int cols, const float* x, float* g, float* u,
                                      int n) {
  const int which = blockIdx.y / n, e = blockIdx.y % n;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const uint8_t* base = slot_ptrs[e] + (which ? up_offset : 0);
  const size_t rb = which ? rb_up : rb_gate;
  const double acc = warp_row_dot<T>(base + (size_t)row * rb, x, cols, lane);
  if (lane == 0) (which ? u : g)[(size_t)e * rows + row] = (float)acc;
}

void launch(GgmlType t, const void* w, const uint8_t* const* slot_ptrs, size_t w_offset,
            size_t row_bytes, int rows, int cols, const float* x, size_t x_stride, float* y, int n,
            cudaStream_t stream) {
  if (cols % 32 != 0) throw_error("matvec: " + std::to_string(cols) + " columns is not a multiple of 32");
  if (rows == 0 || n == 0) return;
  const dim3 grid((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, n);
  const bool ok = dispatch_type(t, [&]<GgmlType T>() {
    matvec_kernel<T><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(
        static_cast<const uint8_t*>(w), slot_ptrs, w_offset, row_bytes, rows, cols, x, x_stride, y);
  });
  if (!ok) throw_error(std::string("matvec: weight type ") + type_name(t) + " is not supported by the CUDA backend");
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace

RL_QUANT_TABLES_UPLOADER(upload_quant_tables_matvec)

namespace {
struct TypeProbe {
  template <GgmlType>
  void operator()() const {}
};
}  // namespace

bool weight_type_supported(GgmlType t) { return dispatch_type(t, TypeProbe{}); }

void matvec(GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const float* x,
            float* y, cudaStream_t stream) {
  launch(t, w, nullptr, 0, row_bytes, rows, cols, x, 0, y, 1, stream);
}

void matvec_experts(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes,
                    int rows, int cols, const float* x, size_t x_stride, float* y, int n,
                    cudaStream_t stream) {
  launch(t, nullptr, slot_ptrs, w_offset, row_bytes, rows, cols, x, x_stride, y, n, stream);
}

void matvec_experts_gate_up(GgmlType t_gate, GgmlType t_up, const uint8_t* const* slot_ptrs,
                            size_t up_offset, size_t row_bytes_gate, size_t row_bytes_up, int rows,
                            int cols, const float* x, float* g, float* u, int n, cudaStream_t stream) {
  if (t_gate != t_up) {  // one kernel per type
    launch(t_gate, nullptr, slot_ptrs, 0, row_bytes_gate, rows, cols, x, 0, g, n, stream);
    launch(t_up, nullptr, slot_ptrs, up_offset, row_bytes_up, rows, cols, x, 0, u, n, stream);
    return;
  }
  if (cols % 32 != 0) throw_error("matvec: " + std::to_string(cols) + " columns is not a multiple of 32");
  if (rows == 0 || n == 0) return;
  const dim3 grid((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 2 * n);
  const bool ok = dispatch_type(t_gate, [&]<GgmlType T>() {
    matvec_gate_up_kernel<T><<<grid, 32 * kWarpsPerBlock, 0, stream>>>(slot_ptrs, up_offset, row_bytes_gate,
                                                                        row_bytes_up, rows, cols, x, g, u, n);
  });
  if (!ok) throw_error(std::string("matvec: weight type ") + type_name(t_gate) + " is not supported by the CUDA backend");
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
