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
#include <algorithm>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"
#include "cuda/quant_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kWarps = 8;  // 256 threads per block

struct Jobs {
  MatvecJob job[kMaxMatvecJobs];
};
struct GateUpJobs {
  GateUpJob job[kMaxMatvecJobs];
};

// This lane's part of R rows' dot products with x: chunks c0, c0 + step, ... (double sums). x is
// converted to double once per chunk for all R rows (the fp32 -> fp64 conversion is the slow
// instruction here), the weights through dequant8d.
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
      for (int i = 0; i < 16; i++) {
        const int byte = (int)((words[i / 4] >> (8 * (i % 4))) & 0xFF);
        int nib = half ? byte >> 4 : byte & 0xF;
        if (kQ5) nib += ((int)(hwords[i / 4] >> (8 * (i % 4) + 2 * p + half)) & 1) << 4;
        const float v = dd[r][half] * small_uint_to_float(nib) - mm[r][half];
        acc[r] = fma((double)v, xd[i], acc[r]);
      }
    }
  }
}

template <GgmlType T, int R>
__device__ __forceinline__ void lane_dot(const uint8_t* const (&wr)[R], const float* __restrict__ x, int c0, int step,
                                         int n_chunks, const uint64_t* grid, double (&acc)[R]) {
  if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    // Units of 32 values (4 chunks); lane and warp offsets map to units as they do to chunks.
    for (int u = c0; u < n_chunks / 4; u += step) kquant_unit<T, R>(wr, x, u, acc);
    return;
  }
#pragma unroll 2
  for (int c = c0; c < n_chunks; c += step) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(x + 8 * c));
    const float4 b = __ldg(reinterpret_cast<const float4*>(x + 8 * c + 4));
    const double xd[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int r = 0; r < R; r++) {
      double v[8];
      dequant8d<T>(wr[r], c, v, grid);
#pragma unroll
      for (int j = 0; j < 8; j++) acc[r] = fma(v[j], xd[j], acc[r]);
    }
  }
}

// The type's codebook copied to shared memory (IQ types), for all the block's lookups.
template <GgmlType T>
struct SharedGrid {
  static constexpr int kN = GridOf<T>::kEntries;
  const uint64_t* ptr = nullptr;
  __device__ SharedGrid() {
    if constexpr (kN > 0) {
      __shared__ uint64_t grid[kN];
      for (int i = threadIdx.x; i < kN; i += blockDim.x) grid[i] = GridOf<T>::table()[i];
      __syncthreads();
      ptr = grid;
    }
  }
};

// Where this warp works: rows `row` .. row + kRowsPerWarp - 1 of its job, warp `ws` of the rows' W.
constexpr int kRowsPerWarp = 2;
template <int W, int R>
struct RowSlot {
  int warp, lane, row, ws;
  __device__ RowSlot() {
    warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    row = (blockIdx.x * (kWarps / W) + warp / W) * R, ws = warp % W;
  }
  // Sums the W warp sums of value i (shared memory); true on the one lane that holds the result.
  // Every thread of the block must call it.
  __device__ bool reduce(double& v, bool active) {
    if (W == 1) return active && lane == 0;
    __shared__ double red[kWarps];
    __syncthreads();  // the previous call's reads are done
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (!active || ws != 0 || lane != 0) return false;
    double s = red[warp];
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

template <GgmlType T, int W>
__global__ void __launch_bounds__(32 * kWarps) matvec_kernel(const Jobs jobs, int cols) {
  constexpr int R = kRowsPerWarp;
  const MatvecJob& jb = jobs.job[blockIdx.y];
  RowSlot<W, R> s;
  const SharedGrid<T> grid;
  const bool active = s.row < jb.rows;
  double acc[R] = {};
  if (active) {
    const uint8_t* base = job_weights(jb.w, jb.slot_ptrs, jb.slot, jb.w_offset);
    const uint8_t* wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = base + (size_t)min(s.row + r, jb.rows - 1) * jb.row_bytes;
    lane_dot<T, R>(wr, jb.x, 32 * s.ws + s.lane, 32 * W, cols / 8, grid.ptr, acc);
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = warp_sum_d(acc[r]);
  }
#pragma unroll
  for (int r = 0; r < R; r++)
    if (s.reduce(acc[r], active) && s.row + r < jb.rows) jb.y[s.row + r] = (float)acc[r];
}

// act[r] = SiLU(W_gate[r]·x) * (W_up[r]·x): one warp (group) computes both rows, so their loads are
// in flight together and x is converted once for both, and writes the SwiGLU product rounded as
// the oracle rounds it (gate and up rounded to fp32 first).
template <GgmlType T, int W>
__global__ void __launch_bounds__(32 * kWarps) gate_up_kernel(const GateUpJobs jobs, int cols) {
  const GateUpJob& jb = jobs.job[blockIdx.y];
  RowSlot<W, 1> s;
  const SharedGrid<T> grid;
  const bool active = s.row < jb.rows;
  double acc[2] = {};
  if (active) {
    const uint8_t* base = jb.slot_ptrs ? jb.slot_ptrs[jb.slot] : nullptr;
    const uint8_t* wr[2] = {(jb.gate ? jb.gate : base + jb.gate_offset) + (size_t)s.row * jb.row_bytes_gate,
                            (jb.up ? jb.up : base + jb.up_offset) + (size_t)s.row * jb.row_bytes_up};
    lane_dot<T, 2>(wr, jb.x, 32 * s.ws + s.lane, 32 * W, cols / 8, grid.ptr, acc);
    acc[0] = warp_sum_d(acc[0]);
    acc[1] = warp_sum_d(acc[1]);
  }
  const bool own_g = s.reduce(acc[0], active);
  const bool own_u = s.reduce(acc[1], active);
  if (own_g && own_u) jb.act[s.row] = __fmul_rn(silu_f((float)acc[0]), (float)acc[1]);
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

template <class Job, class Launch>
void launch_jobs(GgmlType t, int cols, const Job* jobs, int n, int rows_per_warp, cudaStream_t stream,
                 Launch&& launch) {
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
    const int W = warps_per_row(total_rows / rows_per_warp, cols);
    const int rows_per_block = kWarps / W * rows_per_warp;
    const dim3 grid((unsigned)((max_rows + rows_per_block - 1) / rows_per_block), (unsigned)m);
    const bool ok = dispatch_type(t, [&]<GgmlType T>() { launch.template operator()<T>(W, grid, jobs + j0, m); });
    if (!ok) throw_error(std::string("matvec: weight type ") + type_name(t) + " is not supported by the CUDA backend");
    RL_CUDA_LAUNCH_CHECK();
  }
}

template <GgmlType T, int W>
void launch_matvec(dim3 grid, const Jobs& j, int cols, cudaStream_t stream) {
  matvec_kernel<T, W><<<grid, 32 * kWarps, 0, stream>>>(j, cols);
}
template <GgmlType T, int W>
void launch_gate_up(dim3 grid, const GateUpJobs& j, int cols, cudaStream_t stream) {
  gate_up_kernel<T, W><<<grid, 32 * kWarps, 0, stream>>>(j, cols);
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

void matvec_jobs(GgmlType t, int cols, const MatvecJob* jobs, int n, cudaStream_t stream) {
  launch_jobs(t, cols, jobs, n, kRowsPerWarp, stream, [&]<GgmlType T>(int W, dim3 grid, const MatvecJob* js, int m) {
    Jobs j{};
    std::copy(js, js + m, j.job);
    if (W == 1) launch_matvec<T, 1>(grid, j, cols, stream);
    else if (W == 2) launch_matvec<T, 2>(grid, j, cols, stream);
    else launch_matvec<T, 4>(grid, j, cols, stream);
  });
}

void matvec_gate_up(GgmlType t, int cols, const GateUpJob* jobs, int n, cudaStream_t stream) {
  launch_jobs(t, cols, jobs, n, 1, stream, [&]<GgmlType T>(int W, dim3 grid, const GateUpJob* js, int m) {
    GateUpJobs j{};
    std::copy(js, js + m, j.job);
    if (W == 1) launch_gate_up<T, 1>(grid, j, cols, stream);
    else if (W == 2) launch_gate_up<T, 2>(grid, j, cols, stream);
    else launch_gate_up<T, 4>(grid, j, cols, stream);
  });
}

void matvec(GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const float* x,
            float* y, cudaStream_t stream) {
  MatvecJob j{};
  j.w = static_cast<const uint8_t*>(w);
  j.row_bytes = row_bytes;
  j.rows = rows;
  j.x = x;
  j.y = y;
  matvec_jobs(t, cols, &j, 1, stream);
}

void matvec_experts(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes,
                    int rows, int cols, const float* x, size_t x_stride, float* y, int n,
                    cudaStream_t stream) {
  check_cols(cols);
  std::vector<MatvecJob> jobs(n);
  for (int e = 0; e < n; e++) {
    MatvecJob& j = jobs[e];
    j.slot_ptrs = slot_ptrs;
    j.slot = e;
    j.w_offset = w_offset;
    j.row_bytes = row_bytes;
    j.rows = rows;
    j.x = x + (size_t)e * x_stride;
    j.y = y + (size_t)e * rows;
  }
  matvec_jobs(t, cols, jobs.data(), n, stream);
}

void matvec_experts_gate_up(GgmlType t_gate, GgmlType t_up, const uint8_t* const* slot_ptrs, size_t up_offset,
                            size_t row_bytes_gate, size_t row_bytes_up, int rows, int cols, const float* x,
                            float* act, float* u, int n, cudaStream_t stream) {
  if (t_gate != t_up) {  // one kernel per type, then SwiGLU
    matvec_experts(t_gate, slot_ptrs, 0, row_bytes_gate, rows, cols, x, 0, act, n, stream);
    matvec_experts(t_up, slot_ptrs, up_offset, row_bytes_up, rows, cols, x, 0, u, n, stream);
    swiglu(act, u, act, (size_t)n * rows, stream);
    return;
  }
  std::vector<GateUpJob> jobs(n);
  for (int e = 0; e < n; e++) {
    GateUpJob& j = jobs[e];
    j.slot_ptrs = slot_ptrs;
    j.slot = e;
    j.up_offset = up_offset;
    j.row_bytes_gate = row_bytes_gate;
    j.row_bytes_up = row_bytes_up;
    j.rows = rows;
    j.x = x;
    j.act = act + (size_t)e * rows;
  }
  matvec_gate_up(t_gate, cols, jobs.data(), n, stream);
}

}  // namespace rl::cuda
