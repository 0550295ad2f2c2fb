// The fast tier's decode products on 8-bit activations (plan kernel matvec-q8): y = W·x with x in
// the Q8 form (quantize_q8: int8 per value, an fp32 scale and the block sum per 32 values).
//
// matvec.cu's fast kernels read 8 fp32 activations (32 bytes) for every 8 weights and form each
// product with an FMA. Here a lane reads 32 activations in two 16-byte loads, shared by the R rows
// it computes, and forms four products an instruction with __dp4a, summed in int32 over each
// 32-value block (or 16-value sub-block), which then takes the weights' and the activations'
// scales in fp32. A lane walks units of a row (Q8Dot<T>::kValues weights: a whole number of
// activation blocks), lanes of a group taking consecutive units, so a warp's weight loads are
// contiguous; rows narrower than 32 units take groups of 8 or 16 lanes, so that the 512-column down
// products keep every lane busy. Job lists, slot pointers and warp shapes follow matvec.cu.
// The kernels are measured against matvec-f32 (H200, PERF.md: the token 252-255 tok/s against
// 233-234); kQ8Rows and the lane and warp rules of launch_q8_jobs are matvec.cu's, not tuned for
// these kernels (bench_cuda_kernels, "fast" against "fast-q8" cases; kernel_variants.sh).
//
// The weights' integer forms: Q4_K / Q5_K d·sc·q − dmin·m (the min term from the block sums),
// Q6_K d·sc·(q − 32) (signed bytes), Q8_0 d·q, and the IQ types w = s·(u − b) (quant_device.cuh,
// IqChunk), whose bias term takes Σq over each 8 values (one dp4a with ones, shared by the rows).
#include <algorithm>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/expert_jobs.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"
#include "cuda/quant_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kWarps = 8;  // 256 threads per block, as matvec.cu

// ---- the Q8 form --------------------------------------------------------------------------------

// One warp per 32-value block: lane i quantises value i. A block holding a NaN or an infinity gets
// the scale NaN (its q 0), so its products are NaN as the fp32 products would be non-finite.
__global__ void quantize_q8_kernel(const float* __restrict__ x, size_t n_blocks, int8_t* __restrict__ q,
                                   float2* __restrict__ ds) {
  const size_t b = (size_t)blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  pdl_wait();
  pdl_trigger();
  if (b >= n_blocks) return;
  const float v = x[32 * b + lane];
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const bool finite = __all_sync(0xffffffffu, isfinite(v));
  const float d = finite ? __fdiv_rn(amax, 127.0f) : __int_as_float(0x7fc00000);
  const int qi = finite && d > 0.0f ? __float2int_rn(__fdiv_rn(v, d)) : 0;
  int sum = qi;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  q[32 * b + lane] = (int8_t)qi;
  if (lane == 0) ds[b] = make_float2(d, __fmul_rn(d, (float)sum));
}

// ---- loads --------------------------------------------------------------------------------------

// The activations' loads: from global memory through the read-only path, or (S) from the block's
// shared copy (kernels that quantise their fp32 input themselves), where __ldg may not read.
template <bool S, class V>
__device__ __forceinline__ V ld_x(const V* p) {
  if constexpr (S) return *p;
  else return __ldg(p);
}
// 32 activations of block b as eight words (two 16-byte loads).
template <bool S>
__device__ __forceinline__ void load_x32(const int8_t* __restrict__ xq, int b, int (&w)[8]) {
  const int4 a = ld_x<S>(reinterpret_cast<const int4*>(xq) + 2 * b);
  const int4 c = ld_x<S>(reinterpret_cast<const int4*>(xq) + 2 * b + 1);
  w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = c.x, w[5] = c.y, w[6] = c.z, w[7] = c.w;
}
// 16 activations at value offset v (a multiple of 16): one 16-byte load.
template <bool S>
__device__ __forceinline__ void load_x16(const int8_t* __restrict__ xq, int v, int (&w)[4]) {
  const int4 a = ld_x<S>(reinterpret_cast<const int4*>(xq + v));
  w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
}
__device__ __forceinline__ int dot4x4(const uint32_t (&w)[4], const int* x, int acc) {
#pragma unroll
  for (int i = 0; i < 4; i++) acc = __dp4a((int)w[i], x[i], acc);
  return acc;
}

// ---- per type: a unit of weights against its activations ----------------------------------------
// Q8Dot<T>: kValues weights a unit; X, the unit's activations (loaded once for all rows); W, a row's
// unit of weights in the integer form the dot products take (load_w(row, u, grid): loaded
// and decoded once for all columns); dot(w, x): the unit's part of the row's product, in fp32.
template <GgmlType T>
struct Q8Dot;

template <>
struct Q8Dot<GgmlType::Q8_0> {
  static constexpr int kValues = 32;
  struct X {
    int q[8];
    float d;
  };
  template <bool S>
  __device__ static X load_x(const int8_t* xq, const float2* xds, int u) {
    X x;
    load_x32<S>(xq, u, x.q);
    x.d = ld_x<S>(&xds[u].x);
    return x;
  }
  struct W {
    uint32_t q[8];
    float d;
  };
  __device__ static W load_w(const uint8_t* row, int u, const uint64_t*) {
    const uint8_t* b = row + (size_t)u * 34;
    W w;
    load_words_a2<8>(b + 2, w.q);
    w.d = half_bits_to_f32(load_u16(b));
    return w;
  }
  __device__ static float dot(const W& w, const X& x) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) s = __dp4a((int)w.q[i], x.q[i], s);
    return w.d * x.d * (float)s;
  }
};

// Q4_K and Q5_K: unit u is pair p = u % 4 of super-block u / 4, activation blocks 2u (the low
// nibbles of 32 bytes) and 2u + 1 (the high nibbles); Q5_K's fifth bits are bits 2p and 2p + 1 of
// the super-block's 32 qh bytes.
template <GgmlType T>
struct Q8DotK4 {
  static constexpr bool kQ5 = T == GgmlType::Q5_K;
  static constexpr int kValues = 64;
  struct X {
    int q[2][8];
    float2 ds[2];
  };
  template <bool S>
  __device__ static X load_x(const int8_t* xq, const float2* xds, int u) {
    X x;
    load_x32<S>(xq, 2 * u, x.q[0]);
    load_x32<S>(xq, 2 * u + 1, x.q[1]);
    x.ds[0] = ld_x<S>(&xds[2 * u]), x.ds[1] = ld_x<S>(&xds[2 * u + 1]);
    return x;
  }
  struct W {
    uint32_t lo[8], hi[8];  // the two blocks' values, a byte each
    int sc0, m0, sc1, m1;
    float d, dmin;
  };
  __device__ static W load_w(const uint8_t* row, int u, const uint64_t*) {
    const int p = u & 3;
    const uint8_t* b = row + (size_t)(u >> 2) * Dequant<T>::kBytes;
    const uint4 q0 = *reinterpret_cast<const uint4*>(b + (kQ5 ? 48 : 16) + 32 * p);
    const uint4 q1 = *reinterpret_cast<const uint4*>(b + (kQ5 ? 48 : 16) + 32 * p + 16);
    uint4 h0 = {}, h1 = {};
    if constexpr (kQ5) {
      h0 = *reinterpret_cast<const uint4*>(b + 16);
      h1 = *reinterpret_cast<const uint4*>(b + 32);
    }
    W w;
    k4_scale_min_w(2 * p, b + 4, w.sc0, w.m0);
    k4_scale_min_w(2 * p + 1, b + 4, w.sc1, w.m1);
    const uint32_t dm = load_u32(b);
    const uint32_t words[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    const uint32_t hwords[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
    for (int i = 0; i < 8; i++) {
      w.lo[i] = words[i] & 0x0F0F0F0Fu, w.hi[i] = (words[i] >> 4) & 0x0F0F0F0Fu;
      if constexpr (kQ5) {
        w.lo[i] |= ((hwords[i] >> (2 * p)) & 0x01010101u) << 4;
        w.hi[i] |= ((hwords[i] >> (2 * p + 1)) & 0x01010101u) << 4;
      }
    }
    w.d = half_bits_to_f32((uint16_t)(dm & 0xFFFF)), w.dmin = half_bits_to_f32((uint16_t)(dm >> 16));
    return w;
  }
  __device__ static float dot(const W& w, const X& x) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      s0 = __dp4a((int)w.lo[i], x.q[0][i], s0);
      s1 = __dp4a((int)w.hi[i], x.q[1][i], s1);
    }
    const float scaled = (float)w.sc0 * x.ds[0].x * (float)s0 + (float)w.sc1 * x.ds[1].x * (float)s1;
    const float mins = (float)w.m0 * x.ds[0].y + (float)w.m1 * x.ds[1].y;
    return fmaf(w.d, scaled, -w.dmin * mins);
  }
};
template <>
struct Q8Dot<GgmlType::Q4_K> : Q8DotK4<GgmlType::Q4_K> {};
template <>
struct Q8Dot<GgmlType::Q5_K> : Q8DotK4<GgmlType::Q5_K> {};

// Q6_K: unit u covers, in half n = (u / 2) % 2 of super-block u / 4, the values 128n + 32k + 16h + j
// (h = u % 2, k < 4, j < 16): 16 of each of the four activation blocks 4n + k, each one sub-block of
// the scales (8n + h + 2k). The 6-bit values minus 32 are signed bytes.
template <>
struct Q8Dot<GgmlType::Q6_K> {
  static constexpr int kValues = 64;
  struct X {
    int q[4][4];
    float d[4];
  };
  template <bool S>
  __device__ static X load_x(const int8_t* xq, const float2* xds, int u) {
    X x;
    const int sb = u >> 2, n = (u >> 1) & 1, h = u & 1;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      load_x16<S>(xq, 256 * sb + 128 * n + 32 * k + 16 * h, x.q[k]);
      x.d[k] = ld_x<S>(&xds[8 * sb + 4 * n + k].x);
    }
    return x;
  }
  struct W {
    uint32_t q[4][4];  // the values minus 32 of the four sub-blocks, signed bytes
    float sc[4];
    float d;
  };
  __device__ static W load_w(const uint8_t* row, int u, const uint64_t*) {
    const int n = (u >> 1) & 1, h = u & 1;
    const uint8_t* b = row + (size_t)(u >> 2) * 210;
    uint32_t ql[2][4], qh[4];
    load_words_a2<4>(b + 64 * n + 16 * h, ql[0]);
    load_words_a2<4>(b + 64 * n + 32 + 16 * h, ql[1]);
    load_words_a2<4>(b + 128 + 32 * n + 16 * h, qh);
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * n + h;
    W w;
#pragma unroll
    for (int k = 0; k < 4; k++) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const uint32_t lo = (k >= 2 ? ql[k & 1][i] >> 4 : ql[k & 1][i]) & 0x0F0F0F0Fu;
        w.q[k][i] = __vsub4(lo | (((qh[i] >> (2 * k)) & 0x03030303u) << 4), 0x20202020u);
      }
      w.sc[k] = (float)sc[2 * k];
    }
    w.d = half_bits_to_f32(load_u16(b + 208));
    return w;
  }
  __device__ static float dot(const W& w, const X& x) {
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) acc = fmaf(w.sc[k] * x.d[k], (float)dot4x4(w.q[k], x.q[k], 0), acc);
    return w.d * acc;
  }
};

// The IQ types in their integer form: unit u is activation block u, chunks 4u .. 4u + 3 of
// Dequant<T>::decode; a chunk adds s · (Σ u_j q_j − b · Σ q_j) (exact in fp32: |Σ| < 2^17). The
// four chunks' Dequant<T>::Raw fields come from one load a field of the unit (IqUnit<T>::load), not
// one a field of each chunk.
template <GgmlType T>
struct IqUnit;
template <>
struct IqUnit<GgmlType::IQ2_XXS> {  // 8 bytes a group: four grid indices, then signs and scale
  using Raw = Dequant<GgmlType::IQ2_XXS>::Raw;
  __device__ static void load(const uint8_t* row, int u, Raw (&raw)[4]) {
    const uint8_t* b = row + (size_t)(u >> 3) * 66;
    uint32_t w[2];
    load_words_a2<2>(b + 2 + 8 * (u & 7), w);
    const uint16_t d = load_u16(b);
#pragma unroll
    for (int c = 0; c < 4; c++) raw[c] = {w[1], d, (uint8_t)(w[0] >> (8 * c))};
  }
};
template <>
struct IqUnit<GgmlType::IQ2_XS> {  // four 16-bit codes a group, a byte of two scales
  using Raw = Dequant<GgmlType::IQ2_XS>::Raw;
  __device__ static void load(const uint8_t* row, int u, Raw (&raw)[4]) {
    const uint8_t* b = row + (size_t)(u >> 3) * 74;
    uint32_t w[2];
    load_words_a2<2>(b + 2 + 8 * (u & 7), w);
    const uint16_t d = load_u16(b);
    const uint8_t sc = b[66 + (u & 7)];
#pragma unroll
    for (int c = 0; c < 4; c++) raw[c] = {d, (uint16_t)(w[c >> 1] >> (16 * (c & 1))), sc};
  }
};
template <>
struct IqUnit<GgmlType::IQ1_M> {  // four index bytes, two high-bit bytes, the block's scale words
  using Raw = Dequant<GgmlType::IQ1_M>::Raw;
  __device__ static void load(const uint8_t* row, int u, Raw (&raw)[4]) {
    const uint8_t* b = row + (size_t)(u >> 3) * 56;  // 56-byte blocks: 8-byte aligned
    const int ib = u & 7;
    const uint2 sc = load8_a4(b + 48);
    const uint32_t qs = load_u32(b + 4 * ib);
    const uint32_t qh = load_u16(b + 32 + 2 * ib);
#pragma unroll
    for (int c = 0; c < 4; c++) raw[c] = {sc, (uint8_t)(qh >> (8 * (c >> 1))), (uint8_t)(qs >> (8 * c))};
  }
};

// The IQ2 types take their chunks as signed bytes (no bias, so no activation sums): the same floats,
// since s · (Σ u_j q_j − 43 · Σ q_j) formed in fp32 was already exact (integers below 2^24).
template <GgmlType T>
struct Q8DotIq {
  static constexpr int kValues = 32;
  static constexpr bool kSigned = kSignMasks<T>;  // the IQ2 types
  struct X {
    int q[8];
    int sum[4];  // Σ q over each 8 values (not kSigned)
    float d;
  };
  template <bool S>
  __device__ static X load_x(const int8_t* xq, const float2* xds, int u) {
    X x;
    load_x32<S>(xq, u, x.q);
    if constexpr (!kSigned) {
#pragma unroll
      for (int c = 0; c < 4; c++) x.sum[c] = __dp4a(x.q[2 * c], 0x01010101, __dp4a(x.q[2 * c + 1], 0x01010101, 0));
    }
    x.d = ld_x<S>(&xds[u].x);
    return x;
  }
  struct W {
    IqChunk k[4];
  };
  __device__ static W load_w(const uint8_t* row, int u, const uint64_t* grid) {
    using Q = Dequant<T>;
    typename Q::Raw raw[4];
    IqUnit<T>::load(row, u, raw);
    W w;
#pragma unroll
    for (int c = 0; c < 4; c++) {
      if constexpr (kSigned)
        w.k[c] = Q::template decode<true>(raw[c], 4 * u + c, grid);
      else
        w.k[c] = Q::decode(raw[c], 4 * u + c, grid);
    }
    return w;
  }
  __device__ static float dot(const W& w, const X& x) {
    float acc = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; c++) {
      const IqChunk& k = w.k[c];
      const int s = __dp4a((int)k.u.x, x.q[2 * c], __dp4a((int)k.u.y, x.q[2 * c + 1], 0));
      if constexpr (kSigned)
        acc = fmaf(k.s, (float)s, acc);
      else
        acc = fmaf(k.s, fmaf(-k.b, (float)x.sum[c], (float)s), acc);
    }
    return acc * x.d;
  }
};
template <>
struct Q8Dot<GgmlType::IQ2_XXS> : Q8DotIq<GgmlType::IQ2_XXS> {};
template <>
struct Q8Dot<GgmlType::IQ2_XS> : Q8DotIq<GgmlType::IQ2_XS> {};
template <>
struct Q8Dot<GgmlType::IQ1_M> : Q8DotIq<GgmlType::IQ1_M> {};

template <class F>
bool dispatch_q8(GgmlType t, F&& f) {
  switch (t) {
#define RL_Q8_DISPATCH(T) \
  case GgmlType::T: f.template operator()<GgmlType::T>(); return true;
    RL_Q8_DISPATCH(Q8_0) RL_Q8_DISPATCH(Q4_K) RL_Q8_DISPATCH(Q5_K) RL_Q8_DISPATCH(Q6_K)
    RL_Q8_DISPATCH(IQ2_XXS) RL_Q8_DISPATCH(IQ2_XS) RL_Q8_DISPATCH(IQ1_M)
#undef RL_Q8_DISPATCH
    default: return false;
  }
}

// As matvec.cu's kStageCodebook (its measurement): IQ1_M's 16 KiB codebook is read through L1.
template <GgmlType T>
constexpr bool kStageQ8Codebook = GridOf<T>::kEntries * sizeof(uint64_t) < 16 * 1024;

// ---- kernels ------------------------------------------------------------------------------------

// Where a lane works: row group lane / G of its warp (G lanes, 32 / G groups a warp; G < 32 only
// with W = 1) takes R rows from `row`; the lane is `sub` of its group, in warp `ws` of the rows' W.
template <int W, int R>
struct LaneSlot {
  int warp, lane, row, ws, sub;
  // G is 8, 16 or 32 (launch_q8_columns): its divisions as shifts, not the integer division a
  // run-time divisor costs every warp.
  __device__ LaneSlot(int G) {
    const int lg = __ffs(G) - 1;
    warp = threadIdx.x / 32, lane = threadIdx.x % 32, ws = warp % W, sub = lane & (G - 1);
    row = ((blockIdx.x * (blockDim.x / 32 / W) + warp / W) * (32 >> lg) + (lane >> lg)) * R;
  }
  // The block's rows: from block_row(G), block_rows(G) of them.
  __device__ static int block_rows(int G) { return kWarps / W * (32 / G) * R; }
  __device__ static int block_row(int G) { return blockIdx.x * block_rows(G); }
  // Sums v over the row's G·W lanes; true on the one lane that holds the result. Every thread of
  // the block must call it.
  __device__ bool reduce(float& v, bool active, int G) {
    for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (W > 1) {
      __shared__ float red[kWarps];
      __syncthreads();  // the previous call's reads are done
      if (lane == 0) red[warp] = v;
      __syncthreads();
      if (lane == 0 && ws == 0) {
        float s = red[warp];
#pragma unroll
        for (int i = 1; i < W; i++) s += red[warp + i];
        v = s;
      }
    }
    return active && ws == 0 && sub == 0;
  }
};

// This lane's part of R rows' products on N columns: units u0, u0 + step, ...; with one column,
// two units' loads in flight. A row's unit of weights is loaded and decoded once for the N
// columns (left to the compiler, the decoding was repeated for every column: the PTX of the
// Q4_K kernel on 4 columns had the nibble masks once per column), then the columns' activations
// are read a column at a time; one column keeps one unit of activations and a row's weights at
// a time. A column's sums are those of a one-column launch, in the same order.
// S: the activations are the block's shared copy (kF32Input kernels).
template <GgmlType T, int R, int N, bool S = false>
__device__ __forceinline__ void lane_dots_q8(const uint8_t* const (&wr)[R], const int8_t* xq, const float2* xds,
                                             int cols, int u0, int step, int n_units,
                                             const SharedTables<T, kStageQ8Codebook<T>, false>& tab, float (&acc)[N][R]) {
  using D = Q8Dot<T>;
  auto x_of = [&](int c, int u) {
    return D::template load_x<S>(xq + (size_t)c * cols, xds + (size_t)c * (cols / 32), u);
  };
#pragma unroll(N == 1 ? 2 : 1)
  for (int u = u0; u < n_units; u += step) {
    if constexpr (N == 1) {  // the one-token decode: one activation unit, a row decoded at a time
      const typename D::X x = x_of(0, u);
#pragma unroll
      for (int r = 0; r < R; r++) acc[0][r] += D::dot(D::load_w(wr[r], u, tab.grid), x);
    } else {
      typename D::W w[R];
#pragma unroll
      for (int r = 0; r < R; r++) w[r] = D::load_w(wr[r], u, tab.grid);
#pragma unroll
      for (int c = 0; c < N; c++) {
        const typename D::X x = x_of(c, u);
#pragma unroll
        for (int r = 0; r < R; r++) acc[c][r] += D::dot(w[r], x);
      }
    }
  }
}

__device__ __forceinline__ float*& output_of(MatvecJob& j) { return j.y; }
__device__ __forceinline__ float*& output_of(GateUpJob& j) { return j.act; }

// A launch's jobs, job y for blockIdx.y: the listed ones, or (per_input > 0) the jobs of routed
// experts' products derived from job[0] as expert_matvec_jobs / expert_gate_up_jobs make them —
// job y reads slot y and the Q8 input row y / per_input, and writes its output y · rows after
// job[0]'s — so that a batched step's 160 (token, selection) pairs are one launch, not four.
template <class Job>
struct Q8JobList {
  Job job[kMaxMatvecJobs];
  int per_input = 0;
  // Job y of a derived list (per_input > 0; the kernels' kDerived instantiations, so that the
  // listed ones keep reading their job in place).
  __device__ Job derived(int y, int cols) const {
    Job j = job[0];
    const size_t row = (size_t)(y / per_input);
    j.slot = y;
    if (j.xq) j.xq += row * cols, j.xds += row * (cols / 32);
    if (j.x) j.x += row * cols;
    output_of(j) += (size_t)y * j.rows;
    return j;
  }
};
// A kernel parameter (with the width and the lane count): within the 4 KiB kernels take.
static_assert(sizeof(Q8JobList<GateUpJob>) + 16 <= 4096 && sizeof(Q8JobList<MatvecJob>) + 16 <= 4096);

// Rows a lane group computes (matvec; SwiGLU pairs: one pair): their weight loads are in flight
// together and share the unit's activations. matvec.cu's shapes, measured there for its fast
// kernels (kMatvecRows: the IQ types' down products faster with 4 rows than 2), taken here
// without a variant measured for these kernels.
template <GgmlType T>
constexpr int kQ8Rows = kIntegerForm<T> ? 4 : 2;
// With N columns a lane group's rows are fewer (rows × columns held near kQ8Rows): four rows on
// every column count measured slower, the registers of 4·N sums and N columns' activations
// costing more than the activation loads they share (H200, 2026-12-01, PERF.md "matvec-q8 token
// columns": ssm_in Q4_K at 2 / 4 / 8 / 16 columns 13.6 / 22.9 / 40.3 / 78.8 µs this way, 14.5 /
// 29.0 / 49.1 / 93.6 with four rows).
template <GgmlType T, int N>
constexpr int kQ8RowsN = kQ8Rows<T> / N > 1 ? kQ8Rows<T> / N : 1;

// The job of this block: listed, or derived from job[0] (kDerived).
template <bool kDerived, class Job>
__device__ __forceinline__ decltype(auto) job_of(const Q8JobList<Job>& jobs, int cols) {
  if constexpr (kDerived) return jobs.derived(blockIdx.y, cols);
  else return (const Job&)jobs.job[blockIdx.y];
}

// kF32Input: the job's input is x, N columns of fp32 (q8_f32_input_fits(cols, N)); each block
// first writes its Q8 form into shared memory and the lanes read it there: no quantize_q8 launch
// before the product. A warp converts 128 values a round, four blocks of 32 on 8 lanes each
// (store_q8_quad: quantize_q8's arithmetic, so the same bits), its rounds' loads unrolled so that
// they overlap. Its weights' first rows are asked into L2 meanwhile.
template <GgmlType T, int W, int N, bool kDerived = false, bool kF32Input = false>
__global__ void __launch_bounds__(32 * kWarps) matvec_q8_kernel(const Q8JobList<MatvecJob> jobs, int cols, int G) {
  constexpr int R = kQ8RowsN<T, N>;
  const MatvecJob& jb = job_of<kDerived>(jobs, cols);
  LaneSlot<W, R> s(G);
  prefetch_rows_l2(jb.w ? jb.w + jb.w_offset : nullptr, jb.row_bytes, s.block_row(G), s.block_rows(G), jb.rows);
  const SharedTables<T, kStageQ8Codebook<T>, false> tab;
  pdl_wait();  // inputs and slot pointers come from the previous kernel
  pdl_trigger();
  const bool active = s.row < jb.rows;
  const int8_t* xq = jb.xq;
  const float2* xds = jb.xds;
  if constexpr (kF32Input) {
    __shared__ __align__(16) int8_t xs_q[kQ8F32InputValues];
    __shared__ float2 xs_ds[kQ8F32InputValues / 32];
    if (!jb.w) prefetch_rows_l2(jb.slot_ptrs[jb.slot] + jb.w_offset, jb.row_bytes, s.block_row(G), s.block_rows(G), jb.rows);
    const int n_quads = N * cols / 128;  // the N columns are consecutive rows of cols values
#pragma unroll 4
    for (int r = s.warp; r < n_quads; r += blockDim.x / 32) {
      const size_t at = (size_t)128 * r + 4 * s.lane;
      store_q8_quad(*reinterpret_cast<const float4*>(jb.x + at), xs_q, xs_ds, at);
    }
    __syncthreads();
    xq = xs_q, xds = xs_ds;
  }
  float acc[N][R] = {};
  if (active) {
    const uint8_t* base = (jb.w ? jb.w : jb.slot_ptrs[jb.slot]) + jb.w_offset;
    const uint8_t* wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = base + (size_t)min(s.row + r, jb.rows - 1) * jb.row_bytes;
    lane_dots_q8<T, R, N, kF32Input>(wr, xq, xds, cols, G * s.ws + s.sub, G * W, cols / Q8Dot<T>::kValues, tab, acc);
  }
  const size_t ys = jb.y_stride ? jb.y_stride : jb.rows;
#pragma unroll
  for (int c = 0; c < N; c++)
#pragma unroll
    for (int r = 0; r < R; r++)
      if (s.reduce(acc[c][r], active, G) && s.row + r < jb.rows) jb.y[c * ys + s.row + r] = acc[c][r];
}

template <GgmlType T, int W, int N, bool kDerived = false>
__global__ void __launch_bounds__(32 * kWarps) gate_up_q8_kernel(const Q8JobList<GateUpJob> jobs, int cols, int G) {
  const GateUpJob& jb = job_of<kDerived>(jobs, cols);
  LaneSlot<W, 1> s(G);
  prefetch_rows_l2(jb.gate, jb.row_bytes_gate, s.block_row(G), s.block_rows(G), jb.rows);
  prefetch_rows_l2(jb.up, jb.row_bytes_up, s.block_row(G), s.block_rows(G), jb.rows);
  const SharedTables<T, kStageQ8Codebook<T>, false> tab;
  pdl_wait();
  pdl_trigger();
  const bool active = s.row < jb.rows;
  float acc[N][2] = {};
  if (active) {
    const uint8_t* base = jb.slot_ptrs ? jb.slot_ptrs[jb.slot] : nullptr;
    const size_t row = (size_t)s.row;
    const uint8_t* wr[2] = {(jb.gate ? jb.gate : base + jb.gate_offset) + row * jb.row_bytes_gate,
                            (jb.up ? jb.up : base + jb.up_offset) + row * jb.row_bytes_up};
    lane_dots_q8<T, 2, N>(wr, jb.xq, jb.xds, cols, G * s.ws + s.sub, G * W, cols / Q8Dot<T>::kValues, tab, acc);
  }
  const size_t as = jb.rows;
#pragma unroll
  for (int c = 0; c < N; c++) {
    const bool own_g = s.reduce(acc[c][0], active, G);
    const bool own_u = s.reduce(acc[c][1], active, G);
    if (own_g && own_u) jb.act[c * as + s.row] = __fmul_rn(silu_fast(acc[c][0]), acc[c][1]);
  }
}

// ---- launchers ----------------------------------------------------------------------------------

template <GgmlType T, int W, int N, bool kDerived = false>
auto q8_kernel_of(const MatvecJob*) { return matvec_q8_kernel<T, W, N, kDerived>; }
template <GgmlType T, int W, int N, bool kDerived = false>
auto q8_kernel_of(const GateUpJob*) { return gate_up_q8_kernel<T, W, N, kDerived>; }
// A job on fp32 input (x set, xq null: matvec products only, kF32Input).
bool reads_f32(const MatvecJob& j) { return !j.xq && j.x; }
bool reads_f32(const GateUpJob&) { return false; }
template <GgmlType T, int N>
constexpr int q8_rows_of(const MatvecJob*) { return kQ8RowsN<T, N>; }
template <GgmlType T, int N>
constexpr int q8_rows_of(const GateUpJob*) { return 1; }

// The jobs' column c0 onwards: inputs and outputs moved on by c0 columns.
MatvecJob from_column(MatvecJob j, int c0, int cols) {
  if (j.xq) j.xq += (size_t)c0 * cols, j.xds += (size_t)c0 * (cols / 32);
  if (j.x) j.x += (size_t)c0 * cols;
  j.y += (size_t)c0 * (j.y_stride ? j.y_stride : j.rows);
  return j;
}
GateUpJob from_column(GateUpJob j, int c0, int cols) {
  j.xq += (size_t)c0 * cols, j.xds += (size_t)c0 * (cols / 32);
  j.act += (size_t)c0 * j.rows;
  return j;
}

bool aligned16(const MatvecJob& j) {
  return (reinterpret_cast<uintptr_t>(j.w) | j.w_offset | j.row_bytes) % 16 == 0;
}
bool aligned16(const GateUpJob& j) {
  return (reinterpret_cast<uintptr_t>(j.gate) | reinterpret_cast<uintptr_t>(j.up) | j.gate_offset | j.up_offset |
          j.row_bytes_gate | j.row_bytes_up) % 16 == 0;
}
template <class Job>
bool inputs_aligned(const Job& j) {
  return j.xq && j.xds && reinterpret_cast<uintptr_t>(j.xq) % 16 == 0;
}

// One launch of m ≤ kMaxMatvecJobs jobs on N columns; per_input > 0: of m jobs derived from
// jobs[0] (Q8JobList::derived), m up to 65,535.
template <int N, class Job>
void launch_q8_columns(GgmlType t, int cols, const Job* jobs, int m, int max_rows, int total_rows, cudaStream_t stream,
                       int per_input = 0) {
  const bool ok = dispatch_q8(t, [&]<GgmlType T>() {
    constexpr const Job* kind = nullptr;
    constexpr int R = q8_rows_of<T, N>(kind);
    const int n_units = cols / Q8Dot<T>::kValues;
    // Lanes a row: as many as it has units (8 to 32); then, with one column, warps a row as
    // matvec.cu's warps_per_row, while each lane keeps two units or more (several columns give
    // a lane enough work).
    int G = 8;
    while (G < 32 && n_units > G) G *= 2;
    // (Derived jobs, per_input: one lane group a row; the pairs' rows fill the GPU. fp32 input:
    // one warp a row at most, as its widths take anyway.)
    const bool f32_input = reads_f32(jobs[0]);
    int W = 1;
    while (N == 1 && !per_input && !f32_input && G == 32 && W < 4 && total_rows / R * W < 4096 &&
           n_units >= 2 * 32 * 2 * W)
      W *= 2;
    // Warps a block: kWarps, or fewer (down to W, at least 2) while the grid would leave SMs idle
    // (a shared expert's 512 rows on 8 columns: 64 blocks of 8 warps, 256 of 2). A row's lanes and
    // their sums are the same whatever the block size.
    int warps = kWarps;
    auto blocks = [&](int w) { return (max_rows + w / W * (32 / G) * R - 1) / (w / W * (32 / G) * R) * m; };
    while (warps / 2 >= std::max(W, 2) && blocks(warps) < device_info().sm_count) warps /= 2;
    const int rows_per_block = warps / W * (32 / G) * R;
    const dim3 grid((unsigned)((max_rows + rows_per_block - 1) / rows_per_block), (unsigned)m), block(32 * warps);
    Q8JobList<Job> list{};
    std::copy(jobs, jobs + (per_input ? 1 : m), list.job);
    list.per_input = per_input;
    if constexpr (std::is_same_v<Job, MatvecJob>) {
      if (f32_input) {
        if (N == 1 && per_input)
          launch_dependent(matvec_q8_kernel<T, 1, 1, true, true>, grid, block, stream, list, cols, G);
        else
          launch_dependent(matvec_q8_kernel<T, 1, N, false, true>, grid, block, stream, list, cols, G);
        return;
      }
    }
    if (N == 1 && per_input) {
      launch_dependent(q8_kernel_of<T, 1, 1, true>(kind), grid, block, stream, list, cols, G);
    } else if constexpr (N == 1) {
      auto kernel = W == 1 ? q8_kernel_of<T, 1, 1>(kind) : W == 2 ? q8_kernel_of<T, 2, 1>(kind) : q8_kernel_of<T, 4, 1>(kind);
      launch_dependent(kernel, grid, block, stream, list, cols, G);
    } else {
      launch_dependent(q8_kernel_of<T, 1, N>(kind), grid, block, stream, list, cols, G);
    }
  });
  if (!ok) throw_error(std::string("matvec_q8: weight type ") + type_name(t) + " has no Q8 product");
  RL_CUDA_LAUNCH_CHECK();
}

// per_input > 0 (the routed experts' launchers only): the jobs are those Q8JobList::derived makes
// of the first (expert_matvec_jobs / expert_gate_up_jobs with input row e / per_input), and more
// than a list's worth are one launch.
template <class Job>
void launch_q8_jobs(GgmlType t, int cols, const Job* jobs, int n, cudaStream_t stream, int columns,
                    int per_input = 0) {
  if (cols % 32 != 0 || (q8_supported(t) && cols % quant_type(t).block_size != 0))
    throw_error("matvec_q8: " + std::to_string(cols) + " columns is not a whole number of " + type_name(t) +
                " blocks");
  if (columns < 1 || columns > kMaxQ8Columns)
    throw_error("matvec_q8: " + std::to_string(columns) + " token columns, want 1 to " +
                std::to_string(kMaxQ8Columns));
  // Every job of a call reads its input one way: its Q8 form, or fp32 that fits the blocks' copy.
  const bool f32_input = n > 0 && reads_f32(jobs[0]);
  if (f32_input && !q8_f32_input_fits(cols, columns))
    throw_error("matvec_q8: an fp32 input of " + std::to_string(columns) + " token columns of " + std::to_string(cols) +
                " values (a multiple of 128, at most " + std::to_string(kQ8F32InputCols) + " a column and " +
                std::to_string(kQ8F32InputValues) + " in all; others need quantize_q8)");
  auto check = [&](const Job& jb) {
    if (reads_f32(jb) != f32_input) throw_error("matvec_q8: jobs of one call read both fp32 and Q8 inputs");
    if (f32_input) {
      if (reinterpret_cast<uintptr_t>(jb.x) % 16 != 0) throw_error("matvec_q8: a job's fp32 input is not 16-byte aligned");
    } else if (!inputs_aligned(jb)) {
      throw_error("matvec_q8: a job's Q8 input is missing or not 16-byte aligned");
    }
    if ((t == GgmlType::Q4_K || t == GgmlType::Q5_K) && !aligned16(jb))
      throw_error(std::string("matvec_q8: ") + type_name(t) + " weights must be 16-byte aligned");
  };
  if (per_input > 0 && columns == 1 && n > kMaxMatvecJobs && n <= 65535) {
    check(jobs[0]);
    if (jobs[0].rows > 0) launch_q8_columns<1>(t, cols, jobs, n, jobs[0].rows, n * jobs[0].rows, stream, per_input);
    return;
  }
  for (int j0 = 0; j0 < n; j0 += kMaxMatvecJobs) {
    const int m = std::min(n - j0, kMaxMatvecJobs);
    int max_rows = 0, total_rows = 0;
    for (int j = 0; j < m; j++) {
      const Job& jb = jobs[j0 + j];
      max_rows = std::max(max_rows, jb.rows), total_rows += jb.rows;
      check(jb);
    }
    if (max_rows == 0) continue;
    // The columns in launches of 8, 4, 2 and 1 (each reads the matrices once).
    Job part[kMaxMatvecJobs];
    for (int c0 = 0; c0 < columns;) {
      const int left = columns - c0, N = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
      for (int j = 0; j < m; j++) part[j] = from_column(jobs[j0 + j], c0, cols);
      switch (N) {
        case 8: launch_q8_columns<8>(t, cols, part, m, max_rows, total_rows, stream); break;
        case 4: launch_q8_columns<4>(t, cols, part, m, max_rows, total_rows, stream); break;
        case 2: launch_q8_columns<2>(t, cols, part, m, max_rows, total_rows, stream); break;
        default: launch_q8_columns<1>(t, cols, part, m, max_rows, total_rows, stream);
      }
      c0 += N;
    }
  }
}

}  // namespace

RL_QUANT_TABLES_UPLOADER(upload_quant_tables_matvec_q8)

namespace {
struct Q8Probe {
  template <GgmlType>
  void operator()() const {}
};
}  // namespace

bool q8_supported(GgmlType t) { return dispatch_q8(t, Q8Probe{}); }

void quantize_q8(const float* x, int rows, int cols, int8_t* q, float2* ds, cudaStream_t stream) {
  if (cols % 32 != 0) throw_error("quantize_q8: " + std::to_string(cols) + " columns is not a multiple of 32");
  const size_t n_blocks = (size_t)rows * cols / 32;
  if (n_blocks == 0) return;
  launch_dependent(quantize_q8_kernel, dim3((unsigned)((n_blocks + kWarps - 1) / kWarps)), dim3(32 * kWarps), stream,
                   x, n_blocks, q, ds);
  RL_CUDA_LAUNCH_CHECK();
}

void matvec_q8_jobs(GgmlType t, int cols, const MatvecJob* jobs, int n, cudaStream_t stream, int columns) {
  launch_q8_jobs(t, cols, jobs, n, stream, columns);
}

void matvec_q8_gate_up(GgmlType t, int cols, const GateUpJob* jobs, int n, cudaStream_t stream, int columns) {
  launch_q8_jobs(t, cols, jobs, n, stream, columns);
}

namespace {
// The routed experts' products (slot ptrs), expert e on input row e / experts_per_row (row 0 for
// all when 0): of the rows' Q8 form (xq, xds), or, with x, of fp32 rows that each block quantises.
void expert_products_q8(const char* who, GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset,
                        size_t row_bytes, int rows, int cols, const int8_t* xq, const float2* xds, const float* x,
                        int experts_per_row, float* y, int n, cudaStream_t stream) {
  if (experts_per_row < 0) throw_error(std::string(who) + ": " + std::to_string(experts_per_row) + " experts an input row");
  std::vector<MatvecJob> jobs = expert_matvec_jobs(slot_ptrs, w_offset, row_bytes, rows, y, n);
  for (int e = 0; e < n; e++) {
    const size_t row = experts_per_row ? e / experts_per_row : 0;
    if (x)
      jobs[e].x = x + row * cols;
    else
      jobs[e].xq = xq + row * cols, jobs[e].xds = xds + row * (cols / 32);
  }
  launch_q8_jobs(t, cols, jobs.data(), n, stream, 1, experts_per_row);
}
}  // namespace

void matvec_q8_experts(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes, int rows,
                       int cols, const int8_t* xq, const float2* xds, int experts_per_row, float* y, int n,
                       cudaStream_t stream) {
  expert_products_q8("matvec_q8_experts", t, slot_ptrs, w_offset, row_bytes, rows, cols, xq, xds, nullptr,
                     experts_per_row, y, n, stream);
}

void matvec_q8_experts_f32_input(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes,
                                 int rows, int cols, const float* x, int experts_per_row, float* y, int n,
                                 cudaStream_t stream) {
  if (n > 0 && !x) throw_error("matvec_q8_experts_f32_input: no input");
  expert_products_q8("matvec_q8_experts_f32_input", t, slot_ptrs, w_offset, row_bytes, rows, cols, nullptr, nullptr, x,
                     experts_per_row, y, n, stream);
}

void matvec_q8_experts_gate_up(GgmlType t_gate, GgmlType t_up, const uint8_t* const* slot_ptrs, size_t up_offset,
                               size_t row_bytes_gate, size_t row_bytes_up, int rows, int cols, const int8_t* xq,
                               const float2* xds, float* act, float* scratch, int n, cudaStream_t stream,
                               int experts_per_row) {
  if (experts_per_row < 0)
    throw_error("matvec_q8_experts_gate_up: " + std::to_string(experts_per_row) + " experts an input row");
  if (t_gate != t_up) {  // one kernel per type, then SwiGLU
    matvec_q8_experts(t_gate, slot_ptrs, 0, row_bytes_gate, rows, cols, xq, xds, experts_per_row, act, n, stream);
    matvec_q8_experts(t_up, slot_ptrs, up_offset, row_bytes_up, rows, cols, xq, xds, experts_per_row, scratch, n,
                      stream);
    swiglu(act, scratch, act, (size_t)n * rows, stream);
    return;
  }
  std::vector<GateUpJob> jobs = expert_gate_up_jobs(slot_ptrs, up_offset, row_bytes_gate, row_bytes_up, rows, act, n);
  for (size_t e = 0; e < jobs.size(); e++) {
    const size_t row = experts_per_row ? e / (size_t)experts_per_row : 0;
    jobs[e].xq = xq + row * cols, jobs[e].xds = xds + row * (cols / 32);
  }
  launch_q8_jobs(t_gate, cols, jobs.data(), n, stream, 1, experts_per_row);
}

}  // namespace rl::cuda
