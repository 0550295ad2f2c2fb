// Row normalisations: RMSNorm (model and per-head), the DeltaNet gated norm, per-head L2 norm.
// Arithmetic as the oracle's (math_device.cuh, cpu/ops.cpp rmsnorm/l2norm): squares summed in
// double (fp32 squares are exact in double, so the order of the sum moves the result by at most a
// unit of double rounding), the scale in double, each output rounded once.
//
// Launch shapes: rows of at least kBlockRowWidth values (the model's hidden rows) get a block of
// kBlockThreads each, every thread holding a few float4 of the row; narrower rows (per-head norms)
// get a warp each. A decode token's norm is one row of 2048 values: 512 threads read 4 values each,
// so the kernel is one round of loads instead of a warp walking the row.
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kBlockThreads = 512;
constexpr int kBlockRowWidth = 1024;
constexpr int kWarpRowsPerBlock = 4;

// The row's threads: a block (BLOCK) or a warp. Reduces a per-thread partial sum.
template <bool BLOCK>
struct RowGroup {
  __device__ static int size() { return BLOCK ? kBlockThreads : 32; }
  __device__ static int rank() { return BLOCK ? threadIdx.x : threadIdx.x % 32; }
  __device__ static int row() { return BLOCK ? blockIdx.x : blockIdx.x * kWarpRowsPerBlock + threadIdx.x / 32; }
  __device__ static double sum(double v) { return BLOCK ? block_sum_d<kBlockThreads>(v) : warp_sum_d(v); }
};

__device__ __forceinline__ double sq4(float4 a) {
  double s = (double)a.x * a.x;
  s = fma((double)a.y, (double)a.y, s);
  s = fma((double)a.z, (double)a.z, s);
  return fma((double)a.w, (double)a.w, s);
}

__device__ __forceinline__ float4 scale4(float4 a, double scale, const float* __restrict__ w, int i) {
  if (w) {
    const float4 b = *reinterpret_cast<const float4*>(w + i);
    return make_float4((float)(a.x * scale * b.x), (float)(a.y * scale * b.y), (float)(a.z * scale * b.z),
                       (float)(a.w * scale * b.w));
  }
  return make_float4((float)(a.x * scale), (float)(a.y * scale), (float)(a.z * scale), (float)(a.w * scale));
}

// out = RMSNorm(x (+ y when ADD, stored back to x)) * w. width % 4 == 0. With q given, out's Q8
// form too (q [n_rows][width], ds [n_rows][width / 32]); the launcher gives it only where a warp's
// lanes are all in or all out of each round (q8_fusable).
template <bool BLOCK, bool ADD>
__global__ void rms_norm_kernel(float* x, const float* __restrict__ y, const float* __restrict__ w,
                                float* out, int n_rows, int width, float eps, int8_t* __restrict__ q,
                                float2* __restrict__ ds) {
  pdl_trigger();  // a decode product follows (it waits for this grid before reading)
  pdl_wait();  // launched as a programmatic dependent: its inputs are the previous kernel's output
  using G = RowGroup<BLOCK>;
  const int row = G::row();
  if (row >= n_rows) return;
  float* xr = x + (size_t)row * width;
  const float* yr = ADD ? y + (size_t)row * width : nullptr;
  double ss = 0.0;
  for (int i = 4 * G::rank(); i < width; i += 4 * G::size()) {
    float4 a = *reinterpret_cast<const float4*>(xr + i);
    if (ADD) {
      const float4 b = *reinterpret_cast<const float4*>(yr + i);
      a = make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
      *reinterpret_cast<float4*>(xr + i) = a;
    }
    ss += sq4(a);
  }
  ss = G::sum(ss);
  const double scale = 1.0 / sqrt(ss / (double)width + (double)eps);
  float* o = out + (size_t)row * width;
  // Each thread reads back only the values it wrote itself above.
  for (int i = 4 * G::rank(); i < width; i += 4 * G::size()) {
    const float4 v = scale4(*reinterpret_cast<const float4*>(xr + i), scale, w, i);
    *reinterpret_cast<float4*>(o + i) = v;
    if (q) store_q8_quad(v, q + (size_t)row * width, ds + (size_t)row * (width / 32), i);
  }
}

// RMSNorm(o) * w first (rounded), then times SiLU(z): the oracle's two steps. With q given, the
// output's Q8 form too, as rms_norm_kernel's.
template <bool BLOCK>
__global__ void gated_rms_norm_kernel(const float* x, const float* __restrict__ z, const float* __restrict__ w,
                                      float* out, int n_rows, int width, float eps, int8_t* __restrict__ q,
                                      float2* __restrict__ ds) {
  pdl_trigger();
  pdl_wait();  // launched as a programmatic dependent: its inputs are the previous kernel's output
  using G = RowGroup<BLOCK>;
  const int row = G::row();
  if (row >= n_rows) return;
  const float* xr = x + (size_t)row * width;
  const float* zr = z + (size_t)row * width;
  double ss = 0.0;
  for (int i = 4 * G::rank(); i < width; i += 4 * G::size()) ss += sq4(*reinterpret_cast<const float4*>(xr + i));
  ss = G::sum(ss);
  const double scale = 1.0 / sqrt(ss / (double)width + (double)eps);
  float* o = out + (size_t)row * width;
  for (int i = 4 * G::rank(); i < width; i += 4 * G::size()) {
    const float4 n = scale4(*reinterpret_cast<const float4*>(xr + i), scale, w, i);
    const float4 zz = *reinterpret_cast<const float4*>(zr + i);
    const float4 v = make_float4(__fmul_rn(n.x, silu_f(zz.x)), __fmul_rn(n.y, silu_f(zz.y)),
                                 __fmul_rn(n.z, silu_f(zz.z)), __fmul_rn(n.w, silu_f(zz.w)));
    *reinterpret_cast<float4*>(o + i) = v;
    if (q) store_q8_quad(v, q + (size_t)row * width, ds + (size_t)row * (width / 32), i);
  }
}

template <bool BLOCK>
__global__ void l2_norm_kernel(float* x, int n_rows, int heads, int width, size_t token_stride, float eps,
                               float post_scale, int scaled_heads) {
  using G = RowGroup<BLOCK>;
  const int row = G::row();
  if (row >= n_rows) return;
  float* xr = x + (size_t)(row / heads) * token_stride + (size_t)(row % heads) * width;
  double ss = 0.0;
  for (int i = 4 * G::rank(); i < width; i += 4 * G::size()) ss += sq4(*reinterpret_cast<const float4*>(xr + i));
  ss = G::sum(ss);
  const double inv = 1.0 / sqrt(ss + (double)eps);
  if (scaled_heads >= 0 && row % heads >= scaled_heads) post_scale = 1.0f;
  for (int i = 4 * G::rank(); i < width; i += 4 * G::size()) {
    const float4 a = *reinterpret_cast<const float4*>(xr + i);
    *reinterpret_cast<float4*>(xr + i) =
        make_float4(__fmul_rn((float)(a.x * inv), post_scale), __fmul_rn((float)(a.y * inv), post_scale),
                    __fmul_rn((float)(a.z * inv), post_scale), __fmul_rn((float)(a.w * inv), post_scale));
  }
}

void check_width(int width, const char* what) {
  if (width % 4 != 0) throw_error(std::string(what) + ": row width " + std::to_string(width) + " is not a multiple of 4");
}

// Launches K<true> (a block per row) for wide rows, K<false> (a warp per row) for narrow ones.
template <class Launch>
void launch_rows(int n_rows, int width, Launch&& launch) {
  if (width >= kBlockRowWidth)
    launch(std::true_type{}, dim3(n_rows), dim3(kBlockThreads));
  else
    launch(std::false_type{}, dim3((n_rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock), dim3(32 * kWarpRowsPerBlock));
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace

void rms_norm(const float* x, const float* w, float* out, int n_rows, int width, float eps,
              cudaStream_t stream) {
  if (n_rows == 0) return;
  check_width(width, "rms_norm");
  launch_rows(n_rows, width, [&](auto block, dim3 grid, dim3 threads) {
    launch_dependent(rms_norm_kernel<decltype(block)::value, false>, grid, threads, stream, const_cast<float*>(x),
                     static_cast<const float*>(nullptr), w, out, n_rows, width, eps, static_cast<int8_t*>(nullptr),
                     static_cast<float2*>(nullptr));
  });
}

void add_rms_norm(float* x, const float* y, const float* w, float* out, int n_rows, int width,
                  float eps, cudaStream_t stream, int8_t* q8, float2* q8_ds) {
  if (n_rows == 0) return;
  check_width(width, "add_rms_norm");
  launch_with_q8_output("add_rms_norm", out, n_rows, width, q8, q8_ds, stream, [&](int8_t* q, float2* ds) {
    launch_rows(n_rows, width, [&](auto block, dim3 grid, dim3 threads) {
      launch_dependent(rms_norm_kernel<decltype(block)::value, true>, grid, threads, stream, x, y, w, out, n_rows,
                       width, eps, q, ds);
    });
  });
}

void gated_rms_norm(const float* o, const float* z, const float* w, float* out, int n_rows,
                    int width, float eps, cudaStream_t stream, int8_t* q8, float2* q8_ds) {
  if (n_rows == 0) return;
  check_width(width, "gated_rms_norm");
  launch_with_q8_output("gated_rms_norm", out, n_rows, width, q8, q8_ds, stream, [&](int8_t* q, float2* ds) {
    launch_rows(n_rows, width, [&](auto block, dim3 grid, dim3 threads) {
      launch_dependent(gated_rms_norm_kernel<decltype(block)::value>, grid, threads, stream, o, z, w, out, n_rows,
                       width, eps, q, ds);
    });
  });
}

void l2_norm(float* x, int T, int heads, int width, size_t token_stride, float eps, float scale,
             cudaStream_t stream, int scaled_heads) {
  const int n_rows = T * heads;
  if (n_rows == 0) return;
  check_width(width, "l2_norm");
  if (token_stride % 4 != 0) throw_error("l2_norm: token stride " + std::to_string(token_stride) + " is not a multiple of 4");
  launch_rows(n_rows, width, [&](auto block, dim3 grid, dim3 threads) {
    l2_norm_kernel<decltype(block)::value>
        <<<grid, threads, 0, stream>>>(x, n_rows, heads, width, token_stride, eps, scale, scaled_heads);
  });
}

}  // namespace rl::cuda
