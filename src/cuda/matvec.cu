// Decode products: y = W·x for one token, on weights of any supported ggml type.
//
// A launch runs a list of jobs (MatvecJob: one matrix, its input and output) of one weight type
// and one width, blockIdx.y picking the job, so the router and its neighbours, or the ten routed
// experts, are one kernel. Blocks of 8 warps; each row gets W warps (1, 2 or 4, chosen so that a
// small matrix still spreads over the whole GPU), and a warp does two rows, walking its share of
// them one 256-value super-block at a time: lane i dequantises 8 values of each row
// (quant_device.cuh) and multiplies them with x read as two float4 and converted to double once
// for both rows, so a warp's loads of a super-block are contiguous. The W warps' partial sums meet
// in shared memory.
//
// Products and sums are in double, as the oracle's dot (cpu/ops.h): an fp32 product is exact in
// double, so the result rounded to fp32 does not depend on the summation order except in the
// rarest ties, and the GPU reproduces the oracle's values bit for bit almost everywhere. That is
// what keeps the router's top-k identical when two experts' logits nearly tie.
//
// The IQ types (the routed and shared experts) take their integer form instead (quant_device.cuh:
// w_j = s * (u_j - b) exactly, u_j a byte): a chunk adds s * (Σ u_j x_j - b Σ x_j). Every product
// is still exact in double; the sums round differently (Σ x_j, b Σ x_j and their difference, which
// cancel in part), by up to ~3e-14 of the chunk's magnitude instead of ~1e-15 by a bound worked out
// on paper (not measured) — far below an fp32 rounding step, and the tests hold every product to the
// fp32 rounding of the exact sum. The byte u_j becomes the double u_j * 2^-1074 by placing it in the low
// word of a zero double (one byte permute, no conversion instruction), and x is scaled by 2^512 so
// that the products u_j x_j 2^-562 are far above the subnormal range and keep all their bits;
// their sum is scaled back by 2^562, an exact power of two. These warps take 4 rows (2 SwiGLU
// pairs), so each converted x serves four products.
//
// The fast tier (Sums::kFast) runs the same kernels, jobs and warp shapes with fp32 sums and no
// conversion to double: a 32-value unit of Q4_K/Q5_K forms Σ q·x and Σ x over each 16-value
// sub-block and adds d·sc·Σqx − dmin·m·Σx; the integer form adds s·(Σ u·x − b·Σx) per chunk; the
// other types multiply chunk8's values. Per weight that is a byte permute, an add (the byte as a
// float) and an FMA instead of a conversion and a double FMA.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/expert_jobs.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"
#include "cuda/quant_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kWarps = 8;  // 256 threads per block

// One launch's jobs, passed by value as the kernel's parameter.
template <class Job>
struct JobList {
  Job job[kMaxMatvecJobs];
};
// A kernel parameter (with the width and the lane count): within the 4 KiB kernels take.
static_assert(sizeof(JobList<GateUpJob>) + 16 <= 4096 && sizeof(JobList<MatvecJob>) + 16 <= 4096);
using Jobs = JobList<MatvecJob>;
using GateUpJobs = JobList<GateUpJob>;

// This lane's part of R rows' dot products with x: chunks c0, c0 + step, ... (double sums). x is
// converted to double once per chunk for all R rows (the fp32 -> fp64 conversion is the slow
// instruction here), the weights through chunk8.
//
// Q4_K and Q5_K go 32 values at a time instead (kquant_unit): 16 bytes of 4-bit values hold 16
// values of sub-block 2p (low nibbles) and 16 of sub-block 2p+1 (high nibbles), so one 16-byte load
// and one decode of the two (scale, min) pairs serve 32 weights. The values are those of chunk8,
// computed by the same expression.
template <GgmlType T, int R>
__device__ __forceinline__ void kquant_unit(const uint8_t* const (&wr)[R], const float* __restrict__ x, int u,
                                            double (&acc)[R]) {
  constexpr bool kQ5 = T == GgmlType::Q5_K;
  const int sb = u >> 3, p = (u & 7) >> 1, h = u & 1;
  float dd[R][2], mm[R][2];
  uint4 q[R], qh[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const uint8_t* b = wr[r] + (size_t)sb * Dequant<T>::kBytes;
    int sc0, m0, sc1, m1;
    k4_scale_min_w(2 * p, b + 4, sc0, m0);
    k4_scale_min_w(2 * p + 1, b + 4, sc1, m1);
    const uint32_t dm = load_u32(b);
    const float d = half_bits_to_f32((uint16_t)(dm & 0xFFFF)), dmin = half_bits_to_f32((uint16_t)(dm >> 16));
    dd[r][0] = d * (float)sc0, mm[r][0] = dmin * (float)m0;
    dd[r][1] = d * (float)sc1, mm[r][1] = dmin * (float)m1;
    q[r] = *reinterpret_cast<const uint4*>(b + (kQ5 ? 48 : 16) + 32 * p + 16 * h);
    if (kQ5) qh[r] = *reinterpret_cast<const uint4*>(b + 16 + 16 * h);
  }
  const float* xs = x + sb * 256 + 64 * p + 16 * h;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    double xd[16];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(xs + 32 * half + 4 * i));
      xd[4 * i] = a.x, xd[4 * i + 1] = a.y, xd[4 * i + 2] = a.z, xd[4 * i + 3] = a.w;
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      const uint32_t words[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
      const uint32_t hwords[4] = {qh[r].x, qh[r].y, qh[r].z, qh[r].w};
#pragma unroll
      for (int k = 0; k < 4; k++) {
        // Four 4-bit (Q5: 5-bit) values as bytes, each placed by one byte permute in the mantissa
        // of 2^23 (0x4B000000): the float 2^23 + q, exact, as small_uint_to_float forms it.
        uint32_t vals = (half ? words[k] >> 4 : words[k]) & 0x0F0F0F0Fu;
        if (kQ5) vals |= ((hwords[k] >> (2 * p + half)) & 0x01010101u) << 4;
#pragma unroll
        for (int b = 0; b < 4; b++) {
          const float f = __int_as_float((int)__byte_perm(vals, 0x4B000000u, 0x7440 | b)) - 8388608.0f;
          const float v = dd[r][half] * f - mm[r][half];
          acc[r] = fma((double)v, xd[4 * k + b], acc[r]);
        }
      }
    }
  }
}

// How many rows a warp computes (the integer form: quant_device.cuh). bench_cuda_kernels on the
// H200 (docs/PERF.md, "decode product tuning"): the routed experts' gate/up of ten IQ2_XS experts
// takes 13.5 us with two pairs a warp and 12.0 us with one (IQ2_XXS 14.2 / 11.7, the shared
// expert's 3.7 / 3.4; IQ1_M equal), while their down products are faster with four rows a warp
// than with two (IQ2_XS 7.2 / 9.2 us).
template <GgmlType T>
constexpr int kMatvecRows = kIntegerForm<T> ? 4 : 2;
template <GgmlType T>
constexpr int kGateUpPairs = 1;

// Whether a block stages its type's codebook in shared memory or reads it through L1. Measured on
// the H200 (bench_cuda_kernels, docs/PERF.md "decode product tuning"): the 16 KiB codebook of
// IQ1_S / IQ1_M is better left in global memory (ten IQ1_M experts' gate/up 15.5 -> 14.6 us), the
// 4 KiB one of IQ2_XS better staged (13.5 vs 14.0 us).
template <GgmlType T>
constexpr bool kStageCodebook = GridOf<T>::kEntries * sizeof(uint64_t) < 16 * 1024;

// This lane's part of R rows' dot products in the integer form (exact products, double sums; see
// the top of the file): chunks c0, c0 + step, ... Each
// step's weight bytes and x are loaded one step ahead, so the loads of the next chunk are in flight
// while this one is summed.
template <GgmlType T, int R>
__device__ __forceinline__ void iq_lane_dot(const uint8_t* const (&wr)[R], const float* __restrict__ x, int c0,
                                            int step, int n_chunks, const uint64_t* grid, double (&acc)[R]) {
  using Q = Dequant<T>;
  if (c0 >= n_chunks) return;
  typename Q::Raw raw[R];
#pragma unroll
  for (int r = 0; r < R; r++) raw[r] = Q::load(wr[r], c0);
  float4 xa = __ldg(reinterpret_cast<const float4*>(x + 8 * c0));
  float4 xb = __ldg(reinterpret_cast<const float4*>(x + 8 * c0 + 4));
  for (int c = c0; c < n_chunks; c += step) {
    const int cn = c + step < n_chunks ? c + step : c;
    typename Q::Raw next[R];
#pragma unroll
    for (int r = 0; r < R; r++) next[r] = Q::load(wr[r], cn);
    const float4 na = __ldg(reinterpret_cast<const float4*>(x + 8 * cn));
    const float4 nb = __ldg(reinterpret_cast<const float4*>(x + 8 * cn + 4));
    const float xf[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
    double xs[8], sum_x = 0.0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const double v = xf[j];
      sum_x += v;
      xs[j] = v * 0x1p512;
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      const IqChunk k = Q::decode(raw[r], c, grid);
      double s = 0.0;
#pragma unroll
      for (int j = 0; j < 4; j++) s = fma(__hiloint2double(0, (int)__byte_perm(k.u.x, 0, 0x4440 | j)), xs[j], s);
#pragma unroll
      for (int j = 0; j < 4; j++) s = fma(__hiloint2double(0, (int)__byte_perm(k.u.y, 0, 0x4440 | j)), xs[4 + j], s);
      acc[r] = fma((double)k.s, fma(s, 0x1p562, -(double)k.b * sum_x), acc[r]);
      raw[r] = next[r];
    }
    xa = na, xb = nb;
  }
}

template <GgmlType T, int R>
__device__ __forceinline__ void lane_dot(const uint8_t* const (&wr)[R], const float* __restrict__ x, int c0, int step,
                                         int n_chunks, double (&acc)[R]) {
  if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    // Units of 32 values (4 chunks); lane and warp offsets map to units as they do to chunks.
    for (int u = c0; u < n_chunks / 4; u += step) kquant_unit<T, R>(wr, x, u, acc);
  } else {
#pragma unroll 2
    for (int c = c0; c < n_chunks; c += step) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(x + 8 * c));
      const float4 b = __ldg(reinterpret_cast<const float4*>(x + 8 * c + 4));
      const double xd[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int r = 0; r < R; r++) {
        float v[8];
        Dequant<T>::chunk8(wr[r], c, v);
#pragma unroll
        for (int j = 0; j < 8; j++) acc[r] = fma((double)v[j], xd[j], acc[r]);
      }
    }
  }
}


// ---- fast tier: the same walks with fp32 sums --------------------------------------------------

// A 4-bit (Q5: 5-bit) value placed in a byte of `vals`, as a float: one byte permute into the
// mantissa of 2^23, minus 2^23 (exact).
__device__ __forceinline__ float byte_as_float(uint32_t vals, int b) {
  return __int_as_float((int)__byte_perm(vals, 0x4B000000u, 0x7440 | b)) - 8388608.0f;
}

template <GgmlType T, int R>
__device__ __forceinline__ void kquant_unit_f32(const uint8_t* const (&wr)[R], const float* __restrict__ x, int u,
                                                float (&acc)[R]) {
  constexpr bool kQ5 = T == GgmlType::Q5_K;
  const int sb = u >> 3, p = (u & 7) >> 1, h = u & 1;
  float dd[R][2], mm[R][2];
  uint4 q[R], qh[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const uint8_t* b = wr[r] + (size_t)sb * Dequant<T>::kBytes;
    int sc0, m0, sc1, m1;
    k4_scale_min_w(2 * p, b + 4, sc0, m0);
    k4_scale_min_w(2 * p + 1, b + 4, sc1, m1);
    const uint32_t dm = load_u32(b);
    const float d = half_bits_to_f32((uint16_t)(dm & 0xFFFF)), dmin = half_bits_to_f32((uint16_t)(dm >> 16));
    dd[r][0] = d * (float)sc0, mm[r][0] = dmin * (float)m0;
    dd[r][1] = d * (float)sc1, mm[r][1] = dmin * (float)m1;
    q[r] = *reinterpret_cast<const uint4*>(b + (kQ5 ? 48 : 16) + 32 * p + 16 * h);
    if (kQ5) qh[r] = *reinterpret_cast<const uint4*>(b + 16 + 16 * h);
  }
  const float* xs = x + sb * 256 + 64 * p + 16 * h;
#pragma unroll
  for (int half = 0; half < 2; half++) {
    float xf[16], sx = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(xs + 32 * half + 4 * i));
      xf[4 * i] = a.x, xf[4 * i + 1] = a.y, xf[4 * i + 2] = a.z, xf[4 * i + 3] = a.w;
      sx += (a.x + a.y) + (a.z + a.w);
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      const uint32_t words[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
      const uint32_t hwords[4] = {qh[r].x, qh[r].y, qh[r].z, qh[r].w};
      float sq = 0.f;
#pragma unroll
      for (int k = 0; k < 4; k++) {
        uint32_t vals = (half ? words[k] >> 4 : words[k]) & 0x0F0F0F0Fu;
        if (kQ5) vals |= ((hwords[k] >> (2 * p + half)) & 0x01010101u) << 4;
#pragma unroll
        for (int b = 0; b < 4; b++) sq = fmaf(byte_as_float(vals, b), xf[4 * k + b], sq);
      }
      acc[r] = fmaf(dd[r][half], sq, fmaf(-mm[r][half], sx, acc[r]));
    }
  }
}

// The integer form in fp32: s · (Σ u·x − b·Σx) per chunk, loads one step ahead as iq_lane_dot.
template <GgmlType T, int R>
__device__ __forceinline__ void iq_lane_dot_f32(const uint8_t* const (&wr)[R], const float* __restrict__ x, int c0,
                                                int step, int n_chunks, const uint64_t* grid, float (&acc)[R]) {
  using Q = Dequant<T>;
  if (c0 >= n_chunks) return;
  typename Q::Raw raw[R];
#pragma unroll
  for (int r = 0; r < R; r++) raw[r] = Q::load(wr[r], c0);
  float4 xa = __ldg(reinterpret_cast<const float4*>(x + 8 * c0));
  float4 xb = __ldg(reinterpret_cast<const float4*>(x + 8 * c0 + 4));
  for (int c = c0; c < n_chunks; c += step) {
    const int cn = c + step < n_chunks ? c + step : c;
    typename Q::Raw next[R];
#pragma unroll
    for (int r = 0; r < R; r++) next[r] = Q::load(wr[r], cn);
    const float4 na = __ldg(reinterpret_cast<const float4*>(x + 8 * cn));
    const float4 nb = __ldg(reinterpret_cast<const float4*>(x + 8 * cn + 4));
    const float xf[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
    const float sum_x = ((xa.x + xa.y) + (xa.z + xa.w)) + ((xb.x + xb.y) + (xb.z + xb.w));
#pragma unroll
    for (int r = 0; r < R; r++) {
      const IqChunk k = Q::decode(raw[r], c, grid);
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < 4; j++) s = fmaf(byte_as_float(k.u.x, j), xf[j], s);
#pragma unroll
      for (int j = 0; j < 4; j++) s = fmaf(byte_as_float(k.u.y, j), xf[4 + j], s);
      acc[r] = fmaf(k.s, fmaf(-k.b, sum_x, s), acc[r]);
      raw[r] = next[r];
    }
    xa = na, xb = nb;
  }
}

template <GgmlType T, int R>
__device__ __forceinline__ void lane_dot_f32(const uint8_t* const (&wr)[R], const float* __restrict__ x, int c0,
                                             int step, int n_chunks, float (&acc)[R]) {
  if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    for (int u = c0; u < n_chunks / 4; u += step) kquant_unit_f32<T, R>(wr, x, u, acc);
  } else {
#pragma unroll 2
    for (int c = c0; c < n_chunks; c += step) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(x + 8 * c));
      const float4 b = __ldg(reinterpret_cast<const float4*>(x + 8 * c + 4));
      const float xf[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int r = 0; r < R; r++) {
        float v[8];
        Dequant<T>::chunk8(wr[r], c, v);
#pragma unroll
        for (int j = 0; j < 8; j++) acc[r] = fmaf(v[j], xf[j], acc[r]);
      }
    }
  }
}

// This lane's part of R rows' dot products, in the type's form.
template <GgmlType T, int R>
__device__ __forceinline__ void row_dots(const uint8_t* const (&wr)[R], const float* __restrict__ x, int c0, int step,
                                         int n_chunks, const SharedTables<T, kStageCodebook<T>, false>& tab, double (&acc)[R]) {
  if constexpr (kIntegerForm<T>)
    iq_lane_dot<T, R>(wr, x, c0, step, n_chunks, tab.grid, acc);
  else
    lane_dot<T, R>(wr, x, c0, step, n_chunks, acc);
}
template <GgmlType T, int R>
__device__ __forceinline__ void row_dots(const uint8_t* const (&wr)[R], const float* __restrict__ x, int c0, int step,
                                         int n_chunks, const SharedTables<T, kStageCodebook<T>, false>& tab, float (&acc)[R]) {
  if constexpr (kIntegerForm<T>)
    iq_lane_dot_f32<T, R>(wr, x, c0, step, n_chunks, tab.grid, acc);
  else
    lane_dot_f32<T, R>(wr, x, c0, step, n_chunks, acc);
}

// The sums' type of a tier: double for the exact tier, float for the fast.
template <bool kFast>
using SumOf = std::conditional_t<kFast, float, double>;
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) { return warp_sum_d(v); }

// Where this warp works: rows `row` .. row + R - 1 of its job, warp `ws` of the rows' W.
template <int W, int R>
struct RowSlot {
  int warp, lane, row, ws;
  __device__ RowSlot() {
    warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    row = (blockIdx.x * (kWarps / W) + warp / W) * R, ws = warp % W;
  }
  static constexpr int kBlockRows = kWarps / W * R;  // the block's rows, from block_row()
  __device__ static int block_row() { return blockIdx.x * kBlockRows; }
  // Sums the W warp sums of value i (shared memory); true on the one lane that holds the result.
  // Every thread of the block must call it.
  template <class V>
  __device__ bool reduce(V& v, bool active) {
    if (W == 1) return active && lane == 0;
    __shared__ V red[kWarps];
    __syncthreads();  // the previous call's reads are done
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (!active || ws != 0 || lane != 0) return false;
    V s = red[warp];
#pragma unroll
    for (int i = 1; i < W; i++) s += red[warp + i];
    v = s;
    return true;
  }
};

__device__ __forceinline__ const uint8_t* job_weights(const uint8_t* w, const uint8_t* const* slot_ptrs, int slot,
                                                      size_t offset) {
  return (w ? w : slot_ptrs[slot]) + offset;
}

template <GgmlType T, int W, bool kFast>
__global__ void __launch_bounds__(32 * kWarps) matvec_kernel(const Jobs jobs, int cols) {
  constexpr int R = kMatvecRows<T>;
  const MatvecJob& jb = jobs.job[blockIdx.y];
  RowSlot<W, R> s;
  prefetch_rows_l2(jb.w ? jb.w + jb.w_offset : nullptr, jb.row_bytes, s.block_row(), s.kBlockRows, jb.rows);
  const SharedTables<T, kStageCodebook<T>, false> tab;
  pdl_wait();  // inputs and slot pointers come from the previous kernel
  // The next kernel's blocks may take SMs as this one's finish and stage their tables (they still
  // wait for this grid to complete): 0.2-1 us less a product (bench_cuda_kernels, PERF.md).
  pdl_trigger();
  const bool active = s.row < jb.rows;
  SumOf<kFast> acc[R] = {};
  if (active) {
    const uint8_t* base = job_weights(jb.w, jb.slot_ptrs, jb.slot, jb.w_offset);
    const uint8_t* wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = base + (size_t)min(s.row + r, jb.rows - 1) * jb.row_bytes;
    row_dots<T, R>(wr, jb.x, 32 * s.ws + s.lane, 32 * W, cols / 8, tab, acc);
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
  }
#pragma unroll
  for (int r = 0; r < R; r++)
    if (s.reduce(acc[r], active) && s.row + r < jb.rows) jb.y[s.row + r] = (float)acc[r];
}

// act[r] = SiLU(W_gate[r]·x) * (W_up[r]·x): one warp (group) computes both rows of P pairs, so their
// loads are in flight together and x is converted once for all, and writes the SwiGLU product
// rounded as the oracle rounds it (gate and up rounded to fp32 first).
template <GgmlType T, int W, bool kFast>
__global__ void __launch_bounds__(32 * kWarps) gate_up_kernel(const GateUpJobs jobs, int cols) {
  constexpr int P = kGateUpPairs<T>;
  const GateUpJob& jb = jobs.job[blockIdx.y];
  RowSlot<W, P> s;
  prefetch_rows_l2(jb.gate, jb.row_bytes_gate, s.block_row(), s.kBlockRows, jb.rows);
  prefetch_rows_l2(jb.up, jb.row_bytes_up, s.block_row(), s.kBlockRows, jb.rows);
  const SharedTables<T, kStageCodebook<T>, false> tab;
  pdl_wait();
  pdl_trigger();  // as matvec_kernel
  const bool active = s.row < jb.rows;
  SumOf<kFast> acc[2 * P] = {};
  if (active) {
    const uint8_t* base = jb.slot_ptrs ? jb.slot_ptrs[jb.slot] : nullptr;
    const uint8_t* gate = jb.gate ? jb.gate : base + jb.gate_offset;
    const uint8_t* up = jb.up ? jb.up : base + jb.up_offset;
    const uint8_t* wr[2 * P];
#pragma unroll
    for (int p = 0; p < P; p++) {
      const size_t row = (size_t)min(s.row + p, jb.rows - 1);
      wr[2 * p] = gate + row * jb.row_bytes_gate;
      wr[2 * p + 1] = up + row * jb.row_bytes_up;
    }
    row_dots<T, 2 * P>(wr, jb.x, 32 * s.ws + s.lane, 32 * W, cols / 8, tab, acc);
#pragma unroll
    for (int i = 0; i < 2 * P; i++) acc[i] = warp_sum(acc[i]);
  }
#pragma unroll
  for (int p = 0; p < P; p++) {
    const bool own_g = s.reduce(acc[2 * p], active);
    const bool own_u = s.reduce(acc[2 * p + 1], active);
    if (own_g && own_u && s.row + p < jb.rows)
      jb.act[s.row + p] = __fmul_rn(silu_f((float)acc[2 * p]), (float)acc[2 * p + 1]);
  }
}

void check_cols(int cols) {
  if (cols % 32 != 0) throw_error("matvec: " + std::to_string(cols) + " columns is not a multiple of 32");
}

// Warps per row: enough warps in flight for small matrices, each lane still with >= 2 chunks.
int warps_per_row(int total_warps, int cols) {
  int w = 1;
  while (w < 4 && total_warps * w < 4096 && cols / 8 >= 64 * 2 * w) w *= 2;
  return w;
}

// Where a job's rows start (the direct pointer, or the slot offset: slots are 256-byte aligned) and
// how far apart they are, for the alignment check.
const void* job_base(const MatvecJob& j) { return j.w ? j.w : reinterpret_cast<const void*>(j.w_offset); }
const void* job_base(const GateUpJob& j) {
  return reinterpret_cast<const void*>(j.gate ? reinterpret_cast<uintptr_t>(j.gate) | reinterpret_cast<uintptr_t>(j.up)
                                              : j.gate_offset | j.up_offset);
}
size_t row_bytes_of(const MatvecJob& j) { return j.row_bytes; }
size_t row_bytes_of(const GateUpJob& j) { return j.row_bytes_gate | j.row_bytes_up; }

// Products are launched as programmatic dependents (math_device.cuh, launch_dependent): their
// blocks may start, and stage their tables, while the previous kernel finishes.
template <class Args>
void launch_product(void (*kernel)(Args, int), dim3 grid, const Args& jobs, int cols, cudaStream_t stream) {
  launch_dependent(kernel, grid, dim3(32 * kWarps), stream, jobs, cols);
}
// The kernel of a job kind for type T and W warps per row, and the rows (pairs) a warp takes.
template <GgmlType T, int W, bool kFast>
auto kernel_of(const MatvecJob*) { return matvec_kernel<T, W, kFast>; }
template <GgmlType T, int W, bool kFast>
auto kernel_of(const GateUpJob*) { return gate_up_kernel<T, W, kFast>; }
template <GgmlType T>
constexpr int rows_per_warp(const MatvecJob*) { return kMatvecRows<T>; }
template <GgmlType T>
constexpr int rows_per_warp(const GateUpJob*) { return kGateUpPairs<T>; }

// Launches a job list (at most kMaxMatvecJobs jobs a launch), W chosen from the total rows.
template <class Job>
void launch_jobs(GgmlType t, int cols, const Job* jobs, int n, cudaStream_t stream, Sums sums) {
  check_cols(cols);
  for (int j0 = 0; j0 < n; j0 += kMaxMatvecJobs) {
    const int m = std::min(n - j0, kMaxMatvecJobs);
    int max_rows = 0, total_rows = 0;
    for (int j = 0; j < m; j++) max_rows = std::max(max_rows, jobs[j0 + j].rows), total_rows += jobs[j0 + j].rows;
    if (max_rows == 0) continue;
    if (t == GgmlType::Q4_K || t == GgmlType::Q5_K)  // 16-byte loads of the 4-bit values (kquant_unit)
      for (int j = 0; j < m; j++) {
        const Job& jb = jobs[j0 + j];
        if (reinterpret_cast<uintptr_t>(job_base(jb)) % 16 != 0 || row_bytes_of(jb) % 16 != 0)
          throw_error(std::string("matvec: ") + type_name(t) + " weights must be 16-byte aligned");
      }
    const bool ok = dispatch_type(t, [&]<GgmlType T>() {
      constexpr const Job* kind = nullptr;
      constexpr int R = rows_per_warp<T>(kind);
      const int W = warps_per_row(total_rows / R, cols);
      const int rows_per_block = kWarps / W * R;
      const dim3 grid((unsigned)((max_rows + rows_per_block - 1) / rows_per_block), (unsigned)m);
      JobList<Job> list{};
      std::copy(jobs + j0, jobs + j0 + m, list.job);
      auto pick = [&]<bool kFast>() {
        return W == 1 ? kernel_of<T, 1, kFast>(kind) : W == 2 ? kernel_of<T, 2, kFast>(kind) : kernel_of<T, 4, kFast>(kind);
      };
      launch_product(sums == Sums::kFast ? pick.template operator()<true>() : pick.template operator()<false>(), grid,
                     list, cols, stream);
    });
    if (!ok) throw_error(std::string("matvec: weight type ") + type_name(t) + " is not supported by the CUDA backend");
    RL_CUDA_LAUNCH_CHECK();
  }
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

void matvec_jobs(GgmlType t, int cols, const MatvecJob* jobs, int n, cudaStream_t stream, Sums sums) {
  launch_jobs(t, cols, jobs, n, stream, sums);
}

void matvec_gate_up(GgmlType t, int cols, const GateUpJob* jobs, int n, cudaStream_t stream, Sums sums) {
  launch_jobs(t, cols, jobs, n, stream, sums);
}

void matvec(GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const float* x,
            float* y, cudaStream_t stream, Sums sums) {
  MatvecJob j{};
  j.w = static_cast<const uint8_t*>(w);
  j.row_bytes = row_bytes;
  j.rows = rows;
  j.x = x;
  j.y = y;
  matvec_jobs(t, cols, &j, 1, stream, sums);
}

void matvec_experts(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes,
                    int rows, int cols, const float* x, size_t x_stride, float* y, int n,
                    cudaStream_t stream, Sums sums) {
  check_cols(cols);
  std::vector<MatvecJob> jobs = expert_matvec_jobs(slot_ptrs, w_offset, row_bytes, rows, y, n);
  for (int e = 0; e < n; e++) jobs[e].x = x + (size_t)e * x_stride;
  matvec_jobs(t, cols, jobs.data(), n, stream, sums);
}

void matvec_experts_gate_up(GgmlType t_gate, GgmlType t_up, const uint8_t* const* slot_ptrs, size_t up_offset,
                            size_t row_bytes_gate, size_t row_bytes_up, int rows, int cols, const float* x,
                            float* act, float* u, int n, cudaStream_t stream, Sums sums) {
  if (t_gate != t_up) {  // one kernel per type, then SwiGLU
    matvec_experts(t_gate, slot_ptrs, 0, row_bytes_gate, rows, cols, x, 0, act, n, stream, sums);
    matvec_experts(t_up, slot_ptrs, up_offset, row_bytes_up, rows, cols, x, 0, u, n, stream, sums);
    swiglu(act, u, act, (size_t)n * rows, stream);
    return;
  }
  std::vector<GateUpJob> jobs = expert_gate_up_jobs(slot_ptrs, up_offset, row_bytes_gate, row_bytes_up, rows, act, n);
  for (GateUpJob& j : jobs) j.x = x;
  matvec_gate_up(t_gate, cols, jobs.data(), n, stream, sums);
}

}  // namespace rl::cuda
