// The oracle's scalar functions (cpu/ops.h), evaluated the same way on the device: in double,
// rounded once to fp32. Sharing the formulas keeps GPU activations bit-identical to the oracle's
// almost everywhere (see matvec.cu).
#pragma once
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/kernels.h"

namespace rl::cuda {

__device__ __forceinline__ float sigmoid_f(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }
__device__ __forceinline__ float silu_f(float x) { return (float)((double)x / (1.0 + exp(-(double)x))); }
// The fast tier's sigmoid and SiLU in fp32 (its activations are 8-bit, its attention's gate fp32):
// the hardware exponential, 2 + 1.17·|x| ulps, ~1e-5 relative at |x| = 80, far under the
// activations' rounding.
__device__ __forceinline__ float sigmoid_fast(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float silu_fast(float x) { return x * sigmoid_fast(x); }
__device__ __forceinline__ float softplus_f(float x) {
  const double d = x;
  return (float)(d > 20.0 ? d : log1p(exp(d)));
}

// Programmatic dependent launch (the decode products, matvec.cu, are launched with it). A kernel
// that a product may follow calls pdl_trigger(): the product's blocks may then become resident and
// stage their tables while this grid finishes. The product calls pdl_wait() before it reads
// anything an earlier kernel wrote: it returns once the preceding grid has completed and its
// memory is visible. Both are no-ops for kernels launched the ordinary way.
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Brings the bytes of [p, p + n) into L2 with one bulk prefetch, the range shrunk to the whole
// 16-byte units inside it (compute capability 9.0; elsewhere nothing). A hint: nothing waits for it.
__device__ __forceinline__ void prefetch_l2_bytes(const void* p, size_t n) {
#if __CUDA_ARCH__ >= 900
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + 15) & ~uintptr_t{15};
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + n) & ~uintptr_t{15};
  if (b > a) {
    const size_t bytes = min((size_t)(b - a), (size_t)0x7FFFFFF0u);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((uint32_t)bytes) : "memory");
  }
#endif
}
// A product's weight rows [row, row + n) of `rows` rows `row_bytes` apart at w, by the block's
// thread 0, before pdl_wait: a product's own weights (not a slot's, whose pointer an earlier
// kernel writes: w null) depend on no earlier kernel, so they stream into L2 while the kernel it
// follows finishes, its blocks being resident by then (launch_dependent).
__device__ __forceinline__ void prefetch_rows_l2(const uint8_t* w, size_t row_bytes, int row, int n, int rows) {
  if (threadIdx.x == 0 && w && row < rows) prefetch_l2_bytes(w + (size_t)row * row_bytes, (size_t)min(n, rows - row) * row_bytes);
}

// Launches kernel on grid x block as a programmatic dependent of the stream's previous kernel: its
// blocks may start, and run what precedes their pdl_wait(), while that kernel finishes. Before
// sm_90, where pdl_wait is not compiled (a build carrying older PTX, JIT-compiled), an ordinary
// launch.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, const Args&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = device_info().cc_major >= 9 ? 1 : 0;
  RL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The warp sums of N values (N a power of two up to 32) at once: each halving step sends half of
// the values still held to the partner lane and keeps the other half, so the N sums take
// N - 1 + log2(32 / N) shuffles instead of 5 N. Returns the sum of v[p] over the warp, p set per
// lane (lanes 32/N apart hold different p). Every sum is formed in warp_sum_d's tree, pair by pair
// (each addition is own + partner, commutative), so each result is bit for bit warp_sum_d's.
// T: double for the exact tier's kernels, float for the fast tier's (attention_fast.cu).
template <int N, int O = 16, class T>
__device__ __forceinline__ T warp_sum_scatter(const T (&v)[N], int lane, int& p) {
  static_assert(N >= 1 && (N <= 2 * O || N == 1) && (N & (N - 1)) == 0, "N is a power of two up to 32");
  if constexpr (N == 1) {
    T x = v[0];
#pragma unroll
    for (int o = O; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    if constexpr (O == 16) p = 0;
    return x;
  } else {
    constexpr int h = N / 2;
    const bool upper = (lane & O) != 0;
    T half[h];
#pragma unroll
    for (int m = 0; m < h; m++) {
      const T send = upper ? v[m] : v[m + h], keep = upper ? v[m + h] : v[m];
      half[m] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
    int q = 0;
    const T r = warp_sum_scatter<h, O / 2>(half, lane, q);
    p = (upper ? h : 0) + q;
    return r;
  }
}

// NeoX rotation of the pair (x[i], x[i + half]) of a head at position pos (rope.cu explains the
// arithmetic: the angle in fp32 as pos * theta_scale^i, cos/sin correctly rounded, the oracle's
// fused products).
__device__ __forceinline__ void rope_pair(float* xh, int i, int half, float pos, float theta_scale) {
  float theta = pos;
  for (int j = 0; j < i; j++) theta = __fmul_rn(theta, theta_scale);
  const float c = (float)cos((double)theta), s = (float)sin((double)theta);
  const float a = xh[i], b = xh[i + half];
  xh[i] = __fmaf_rn(a, c, -__fmul_rn(b, s));
  xh[i + half] = __fmaf_rn(a, s, __fmul_rn(b, c));
}

// Sum of v over a block of THREADS threads; every thread gets it. Every thread must call it.
template <int THREADS>
__device__ __forceinline__ double block_sum_d(double v) {
  __shared__ double partial[THREADS / 32];
  v = warp_sum_d(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  double s = lane < THREADS / 32 ? partial[lane] : 0.0;
  return warp_sum_d(s);
}

// The prefill products' results of one warp (matmul.cu, matmul_x24.cu), from the mma D fragment:
// row tile i's result for token 8s + 2fq + e of the tile is value(i, s, e), its row row0 + 8i + fg
// (y [tokens][rows]; tokens from tile_t, fewer than cnt; sub-tiles s < active). GU (a SwiGLU pair:
// tile 0 gate, tile 1 up, one row row0 + fg): SiLU(gate) · up with swiglu's arithmetic.
template <bool GU, int RT, int TT, class Value>
__device__ __forceinline__ void store_products(float* y, int rows, int row0, int fg, int fq, int tile_t, int cnt,
                                               int active, Value value) {
#pragma unroll
  for (int s = 0; s < TT; s++) {
    if (s >= active) continue;
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int t = tile_t + 8 * s + 2 * fq + e;
      if (t >= cnt) continue;
      if constexpr (GU) {
        const int r = row0 + fg;
        if (r < rows) y[(size_t)t * rows + r] = __fmul_rn(silu_f((float)value(0, s, e)), (float)value(1, s, e));
      } else {
#pragma unroll
        for (int i = 0; i < RT; i++) {
          const int r = row0 + 8 * i + fg;
          if (r < rows) y[(size_t)t * rows + r] = (float)value(i, s, e);
        }
      }
    }
  }
}

// ---- tensor-core and memory helpers shared by the prefill products ----

// Two stacked 8×8 tiles: D0 += A0·B and D1 += A1·B, A0/A1 8×4 (row-major), B 4×8 (column-major),
// all double, one warp. Fragments (PTX ISA), with g = lane/4, q = lane%4: a0 = A0[g][q],
// a1 = A1[g][q], b = B[q][g], d0 = {D0[g][2q], D0[g][2q+1]}, d1 likewise. On compute capability
// 9.0 this is one mma.m16n8k4 (A = A0 over A1, D = D0 over D1, the same fragments): on the H200
// a 512-token chunk went from 254 ms of kernels with the legacy m8n8k4 pair (measured on another
// machine of the kind) to 205 (docs/perf/cuda.md's fourth session, in git history at 57c9cc0;
// bench_cuda_kernels --filter prefill/matmul/ times these products now); before 9.0 it is two m8n8k4.
// Each D element is the same sum of four exact double products plus the accumulator either way.
__device__ __forceinline__ void dmma_16x8x4(double (&d0)[2], double (&d1)[2], double a0, double a1,
                                            double b) {
#if __CUDA_ARCH__ >= 900
  asm("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%0, %1, %2, %3};"
      : "+d"(d0[0]), "+d"(d0[1]), "+d"(d1[0]), "+d"(d1[1])
      : "d"(a0), "d"(a1), "d"(b));
#else
  asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
      : "+d"(d0[0]), "+d"(d0[1])
      : "d"(a0), "d"(b));
  asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
      : "+d"(d1[0]), "+d"(d1[1])
      : "d"(a1), "d"(b));
#endif
}

// D = A·B for a 16×32 A (a[0]: row g, columns 4q..4q+3; a[1]: row g + 8; a[2], a[3]: the same
// rows, columns 16 + 4q..) and a 32×8 B (b0: rows 4q..4q+3 of column g, b1: rows 16 + 4q..); d0,
// d1: row g, columns 2q, 2q + 1; d2, d3: row g + 8. A u8 (kASigned: s8, the Q6_K values q − 32),
// B s8 (kSigned) or u8.
#define RL_IMMA_16X8X32(TYPES)                                                                          \
  asm("mma.sync.aligned.m16n8k32.row.col.s32." TYPES ".s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, " \
      "{%10, %10, %10, %10};"                                                                            \
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])                                                   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0))
template <bool kSigned, bool kASigned = false>
__device__ __forceinline__ void imma_16x8x32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(kSigned || !kASigned, "s8 x u8 is not used");
#if __CUDA_ARCH__ >= 800
  if constexpr (kASigned)
    RL_IMMA_16X8X32("s8.s8");
  else if constexpr (kSigned)
    RL_IMMA_16X8X32("u8.s8");
  else
    RL_IMMA_16X8X32("u8.u8");
#else
  __trap();  // the launcher refuses devices below compute capability 8.0
#endif
}
#undef RL_IMMA_16X8X32

// Brings the 32-byte sector holding p into L2.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
// Copies of 16, 8 or 4 bytes into shared memory; an invalid one writes zeros (source size 0).
template <int N>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool valid) {
  static_assert(N == 4 || N == 8 || N == 16);
  if constexpr (N == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(smem_addr(dst)), "l"(src), "n"(N),
                 "r"(valid ? N : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::); }
// Waits until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// The Q8 form of four consecutive values a thread holds (value index `at`, a multiple of 4), eight
// consecutive lanes holding one block of 32: quantize_q8's arithmetic (matvec_q8.cu) on the same
// values, so the same bits — int8 per value, (d, d·Σq) per block, d NaN for a block with a value
// that is not finite. Every lane of the warp calls it: a kernel whose rounds give each thread four
// consecutive values (a warp 128) may call it for rows of a multiple of 128 values (q8_fusable).
__device__ __forceinline__ void store_q8_quad(float4 v, int8_t* __restrict__ q, float2* __restrict__ ds, size_t at) {
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  int finite = isfinite(v.x) && isfinite(v.y) && isfinite(v.z) && isfinite(v.w);
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    finite &= __shfl_xor_sync(0xffffffffu, finite, o);
  }
  const float d = finite ? __fdiv_rn(amax, 127.0f) : __int_as_float(0x7fc00000);
  const auto quantise = [&](float x) { return finite && d > 0.0f ? __float2int_rn(__fdiv_rn(x, d)) : 0; };
  const int a = quantise(v.x), b = quantise(v.y), c = quantise(v.z), e = quantise(v.w);
  int sum = a + b + c + e;
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  *reinterpret_cast<char4*>(q + at) = make_char4((signed char)a, (signed char)b, (signed char)c, (signed char)e);
  if (at % 32 == 0) ds[at / 32] = make_float2(d, __fmul_rn(d, (float)sum));
}

inline bool q8_fusable(int width) { return width % 128 == 0; }

// A launcher whose kernel can also write its output's Q8 form: launch(q, ds) launches the kernel,
// giving it q8 and q8_ds where it can write them (q8_fusable) and nulls otherwise, in which case
// quantize_q8 converts the output after it. q8 null: no Q8 form wanted.
template <class Launch>
void launch_with_q8_output(const char* who, const float* out, int rows, int width, int8_t* q8, float2* q8_ds,
                           cudaStream_t stream, Launch&& launch) {
  if (q8 && width % 32 != 0)
    throw_error(std::string(who) + ": a Q8 form of rows of " + std::to_string(width) + " values (a multiple of 32)");
  const bool fused = q8 && q8_fusable(width);
  launch(fused ? q8 : nullptr, fused ? q8_ds : nullptr);
  if (q8 && !fused) quantize_q8(out, rows, width, q8, q8_ds, stream);
}

}  // namespace rl::cuda
