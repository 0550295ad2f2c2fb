// The fast tier's Q4_K / Q5_K products of a few tokens (2 to kMaxQ8Columns: a batched decode step,
// a short prompt) on the int8 tensor cores, against the Q8 form of the activations (plan kernel
// mma-q8). matvec-q8 on token columns forms the same sums with dp4a, and its time grows with the
// columns (the 80B's ssm_in 2048 -> 12288: 9.1 µs on one column, 78.8 on 16; the LM head 80 and
// 972, H200, PERF.md "matvec-q8 token columns"): each column's activations are loaded and dotted
// with every unit of weights. Here one mma.m16n8k32 multiplies 16 rows' 32 weights of a sub-block
// by 8 tokens' 32 activations.
//
// The numeric form is matvec-q8's: per 32-value sub-block j of a row and 32-value Q8 block of a
// token, the int32 sum C = Σ q·qₓ (q the weights' 4- or 5-bit integers, qₓ the int8 activations),
// then in fp32  y += d·sc_j · dₓ · C − dmin·m_j · sₓ  (sₓ = dₓ·Σqₓ, the Q8 form's block sum), so
// the outputs differ from matvec-q8's only in the order of the fp32 additions.
//
// A block is 4 warps on 16 rows: warp w takes the super-blocks w, w + 4, ... of the rows' width
// (one m16 tile of rows, every token tile), and the four partial sums are added in shared memory in
// warp order. Lane (g, q) of a warp loads the 8 weight bytes 8q .. 8q + 7 of a 64-value chunk of
// rows g and g + 8 (low nibbles: sub-block 2p, high: 2p + 1) and the 8 activations 8q .. 8q + 7 of
// token g of the sub-block; it feeds them to the mma's column slots 4q .. 4q + 3 and 16 + 4q ..
// 16 + 4q + 3 (A and B take the same order of k, so the sum is the same; matmul_x32.cu does this
// too). Its results are rows g, g + 8 of tokens 2q, 2q + 1 of each 8-token tile.
#include <algorithm>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"
#include "cuda/quant_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kWarps = 4;  // a block: 16 rows, the width split over its warps
constexpr int kTileRows = 16;

struct MmaJobs {
  MatvecJob job[kMaxMatvecJobs];
};
static_assert(sizeof(MmaJobs) + 16 <= 4096);

// One row's super-block header: d, dmin and the scale words.
struct K4Head {
  float d, dmin;
  uint32_t s[3];
};
__device__ __forceinline__ K4Head k4_head(const uint8_t* b) {
  const uint4 h = *reinterpret_cast<const uint4*>(b);
  return {half_bits_to_f32((uint16_t)(h.x & 0xFFFFu)), half_bits_to_f32((uint16_t)(h.x >> 16)), {h.y, h.z, h.w}};
}

template <bool kQ5>
__global__ void __launch_bounds__(32 * kWarps) mma_q8_kernel(const MmaJobs jobs, int cols, int n_tokens) {
  constexpr int kBytes = kQ5 ? 176 : 144, kQs = kQ5 ? 48 : 16;
  const MatvecJob& jb = jobs.job[blockIdx.y];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int r0 = blockIdx.x * kTileRows;
  prefetch_rows_l2(jb.w, jb.row_bytes, r0, kTileRows, jb.rows);
  pdl_wait();  // the Q8 input comes from the previous kernel
  pdl_trigger();
  if (r0 >= jb.rows) return;  // the whole block
  const uint8_t* row_a = jb.w + (size_t)min(r0 + g, jb.rows - 1) * jb.row_bytes;
  const uint8_t* row_b = jb.w + (size_t)min(r0 + g + 8, jb.rows - 1) * jb.row_bytes;
  const int tiles = (n_tokens + 7) / 8;  // 1 or 2
  const int blocks32 = cols / 32;
  // This lane's B column (token t·8 + g) and its two output tokens (t·8 + 2q, + 1) of each tile.
  const int8_t* xb[2];
  const float2* xs[2][2];
#pragma unroll
  for (int t = 0; t < 2; t++) {
    xb[t] = jb.xq + (size_t)min(8 * t + g, n_tokens - 1) * cols;
#pragma unroll
    for (int i = 0; i < 2; i++) xs[t][i] = jb.xds + (size_t)min(8 * t + 2 * q + i, n_tokens - 1) * blocks32;
  }
  float acc[2][4] = {};
  const int n_super = cols / 256;
  for (int sb = warp; sb < n_super; sb += kWarps) {
    const uint8_t* ba = row_a + (size_t)sb * kBytes;
    const uint8_t* bb = row_b + (size_t)sb * kBytes;
    const K4Head ha = k4_head(ba), hb = k4_head(bb);
    uint2 qha = {}, qhb = {};
    if constexpr (kQ5) {
      qha = *reinterpret_cast<const uint2*>(ba + 16 + 8 * q);
      qhb = *reinterpret_cast<const uint2*>(bb + 16 + 8 * q);
    }
#pragma unroll
    for (int p = 0; p < 4; p++) {
      const uint2 qa = *reinterpret_cast<const uint2*>(ba + kQs + 32 * p + 8 * q);
      const uint2 qb = *reinterpret_cast<const uint2*>(bb + kQs + 32 * p + 8 * q);
#pragma unroll
      for (int hi = 0; hi < 2; hi++) {
        const int j = 2 * p + hi;
        auto nib = [&](uint32_t w, uint32_t h) {
          uint32_t v = (w >> (4 * hi)) & 0x0F0F0F0Fu;
          if constexpr (kQ5) v |= ((h >> j) & 0x01010101u) << 4;
          return v;
        };
        const uint32_t a[4] = {nib(qa.x, qha.x), nib(qb.x, qhb.x), nib(qa.y, qha.y), nib(qb.y, qhb.y)};
        int sca, ma, scb, mb;
        k4_scale_min_w(j, ha.s[0], ha.s[1], ha.s[2], sca, ma);
        k4_scale_min_w(j, hb.s[0], hb.s[1], hb.s[2], scb, mb);
        const float dsa = ha.d * (float)sca, dma = ha.dmin * (float)ma;
        const float dsb = hb.d * (float)scb, dmb = hb.dmin * (float)mb;
        const int blk = sb * 8 + j;
#pragma unroll
        for (int t = 0; t < 2; t++) {
          if (t < tiles) {
            const uint2 x = __ldg(reinterpret_cast<const uint2*>(xb[t] + 32 * blk + 8 * q));
            int c[4];
            imma_16x8x32<true>(c, a, x.x, x.y);
            const float2 s0 = __ldg(xs[t][0] + blk), s1 = __ldg(xs[t][1] + blk);
            acc[t][0] += fmaf(dsa * s0.x, (float)c[0], -dma * s0.y);
            acc[t][1] += fmaf(dsa * s1.x, (float)c[1], -dma * s1.y);
            acc[t][2] += fmaf(dsb * s0.x, (float)c[2], -dmb * s0.y);
            acc[t][3] += fmaf(dsb * s1.x, (float)c[3], -dmb * s1.y);
          }
        }
      }
    }
  }
  // The warps' partial sums, added in warp order by warp 0.
  __shared__ float red[kWarps - 1][2][4][32];
  if (warp > 0)
#pragma unroll
    for (int t = 0; t < 2; t++)
#pragma unroll
      for (int i = 0; i < 4; i++) red[warp - 1][t][i][lane] = acc[t][i];
  __syncthreads();
  if (warp != 0) return;
  const size_t ys = jb.y_stride ? jb.y_stride : jb.rows;
#pragma unroll
  for (int t = 0; t < 2; t++) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float s = acc[t][i];
#pragma unroll
      for (int w = 0; w < kWarps - 1; w++) s += red[w][t][i][lane];
      const int tok = 8 * t + 2 * q + (i & 1), row = r0 + g + (i >= 2 ? 8 : 0);
      if (tok < n_tokens && row < jb.rows) jb.y[(size_t)tok * ys + row] = s;
    }
  }
}

}  // namespace

bool mma_q8_supported(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q5_K; }

void matmul_q8_jobs(GgmlType t, int cols, const MatvecJob* jobs, int n, cudaStream_t stream, int columns) {
  if (!mma_q8_supported(t)) throw_error(std::string("matmul_q8: weight type ") + type_name(t) + " has no mma-q8 product");
  if (device_info().cc_major < 8) throw_error("matmul_q8: the int8 tensor-core products need compute capability 8.0");
  if (cols % 256 != 0) throw_error("matmul_q8: " + std::to_string(cols) + " columns is not a whole number of blocks");
  if (columns < 1 || columns > kMaxQ8Columns)
    throw_error("matmul_q8: " + std::to_string(columns) + " token columns, want 1 to " + std::to_string(kMaxQ8Columns));
  for (int j0 = 0; j0 < n; j0 += kMaxMatvecJobs) {
    const int m = std::min(n - j0, kMaxMatvecJobs);
    MmaJobs list{};
    int max_rows = 0;
    for (int j = 0; j < m; j++) {
      const MatvecJob& jb = jobs[j0 + j];
      if (!jb.w || (reinterpret_cast<uintptr_t>(jb.w) | jb.row_bytes) % 16 != 0)
        throw_error("matmul_q8: the weights must be direct and 16-byte aligned");
      if (!jb.xq || !jb.xds || reinterpret_cast<uintptr_t>(jb.xq) % 16 != 0)
        throw_error("matmul_q8: a job's Q8 input is missing or not 16-byte aligned");
      list.job[j] = jb;
      max_rows = std::max(max_rows, jb.rows);
    }
    if (max_rows == 0) continue;
    const dim3 grid((unsigned)((max_rows + kTileRows - 1) / kTileRows), (unsigned)m);
    if (t == GgmlType::Q5_K)
      launch_dependent(mma_q8_kernel<true>, grid, dim3(32 * kWarps), stream, list, cols, columns);
    else
      launch_dependent(mma_q8_kernel<false>, grid, dim3(32 * kWarps), stream, list, cols, columns);
    RL_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace rl::cuda
