// The fast tier's F32 products on token columns (matvec_f32_columns): y = W·x for 2 to
// kMaxQ8Columns token columns of a pass (a batched decode step, a short prompt), each matrix read
// once for all of them. These are the MoE routers (512 x 2048 F32 in the 80B) and the shared
// experts' gate scalars, which have no Q8 form: before, matvec-f32 took a job a column and read
// the router 16 times a 16-row step (Nsight Compute, H200, PERF.md: 1.57 ms of the step's 24.3 ms
// of kernels, 32.7 µs a layer).
//
// A block computes kRows rows on all the columns: its warps split the width (lane i of warp w reads
// the rows' float4 weights w·32 + i, + 256, ... and each column's float4 of activations at the same
// offset), summing in fp32 by FMA; each warp's kRows × N sums are reduced across its lanes by a
// transposing butterfly (31 shuffles for 32 sums, each lane left with one), then across the warps
// in shared memory in warp order. The router's 512 rows are 256 blocks of 8 warps. (A first form,
// a warp a row pair walking the whole width, 256 warps for the router, was 0.7 ms slower a 16-row
// step than a job a column on the H200.) Weights and activations
// 16-byte aligned, the width a multiple of 4 (the launcher checks).
#include <algorithm>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/job_lists.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kWarps = 8;  // 256 threads a block, splitting the width
constexpr int kRows = 2;   // rows a block: their weight loads in flight together, sharing each activation load

struct ColumnJobs {
  MatvecJob job[kMaxMatvecJobs];
};
static_assert(sizeof(ColumnJobs) + 16 <= 4096);

// N: the columns the kernel is compiled for (2, 4, 8 or 16); columns ≤ N of them are computed.
template <int N>
__global__ void __launch_bounds__(32 * kWarps) matvec_f32_columns_kernel(const ColumnJobs jobs, int cols, int columns) {
  constexpr int V = N * kRows;  // sums a thread forms: v[c · kRows + r]
  static_assert(V <= 32 && (V & (V - 1)) == 0);
  const MatvecJob& jb = jobs.job[blockIdx.y];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kRows;
  prefetch_rows_l2(jb.w ? jb.w + jb.w_offset : nullptr, jb.row_bytes, row, kRows, jb.rows);
  pdl_wait();  // the input comes from the previous kernel
  pdl_trigger();
  if (row >= jb.rows) return;  // the whole block: row depends on the block only
  const uint8_t* base = (jb.w ? jb.w : jb.slot_ptrs[jb.slot]) + jb.w_offset;
  const float4* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; r++)
    wr[r] = reinterpret_cast<const float4*>(base + (size_t)min(row + r, jb.rows - 1) * jb.row_bytes);
  const float4* x = reinterpret_cast<const float4*>(jb.x);
  const int n4 = cols / 4;
  float v[V] = {};
  for (int k = warp * 32 + lane; k < n4; k += 32 * kWarps) {
    float4 w[kRows];
#pragma unroll
    for (int r = 0; r < kRows; r++) w[r] = __ldg(wr[r] + k);
#pragma unroll
    for (int c = 0; c < N; c++) {
      if (c < columns) {
        const float4 a = __ldg(x + (size_t)c * n4 + k);
#pragma unroll
        for (int r = 0; r < kRows; r++) {
          float& s = v[c * kRows + r];
          s = fmaf(w[r].w, a.w, fmaf(w[r].z, a.z, fmaf(w[r].y, a.y, fmaf(w[r].x, a.x, s))));
        }
      }
    }
  }
  // Across the lanes: at step o the lanes with bit o keep the upper half of their sums and take
  // their partner's, the others the lower half; lane L ends with sum L & (V − 1) over the lanes
  // that differ in the bits below V, and the plain steps add the rest.
#pragma unroll
  for (int o = V / 2; o > 0; o >>= 1) {
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < o; i++) {
      const float send = upper ? v[i] : v[i + o];
      const float keep = upper ? v[i + o] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
  }
#pragma unroll
  for (int o = V; o < 32; o <<= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
  __shared__ float red[kWarps][V];
  if (lane < V) red[warp][lane] = v[0];
  __syncthreads();
  if (threadIdx.x < V) {
    float s = red[0][threadIdx.x];
#pragma unroll
    for (int i = 1; i < kWarps; i++) s += red[i][threadIdx.x];
    const int c = threadIdx.x / kRows, r = threadIdx.x % kRows;
    const size_t ys = jb.y_stride ? jb.y_stride : jb.rows;
    if (c < columns && row + r < jb.rows) jb.y[c * ys + row + r] = s;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool f32_columns_supported(const MatvecJob& j, int cols) {
  return cols % 4 == 0 && j.row_bytes % 16 == 0 && j.w_offset % 16 == 0 && (!j.w || aligned16(j.w)) &&
         aligned16(j.x);
}

void matvec_f32_columns(int cols, const MatvecJob* jobs, int n, int columns, cudaStream_t stream) {
  if (columns < 1 || columns > kMaxQ8Columns)
    throw_error("matvec_f32_columns: " + std::to_string(columns) + " token columns, want 1 to " +
                std::to_string(kMaxQ8Columns));
  auto check = [&](const MatvecJob& jb) {
    if (!f32_columns_supported(jb, cols))
      throw_error("matvec_f32_columns: weights and input must be 16-byte aligned and the width a multiple of 4");
  };
  for_each_job_list<ColumnJobs>(jobs, n, check, [&](const ColumnJobs& list, int m, int max_rows) {
    const dim3 grid((unsigned)((max_rows + kRows - 1) / kRows), (unsigned)m);
    auto kernel = columns <= 2   ? matvec_f32_columns_kernel<2>
                  : columns <= 4 ? matvec_f32_columns_kernel<4>
                  : columns <= 8 ? matvec_f32_columns_kernel<8>
                                 : matvec_f32_columns_kernel<16>;
    launch_dependent(kernel, grid, dim3(32 * kWarps), stream, list, cols, columns);
    RL_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace rl::cuda
