// The fast tier's Q4_K / Q5_K / Q6_K products of a few tokens (2 to kMaxQ8Columns: a batched decode step,
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
//
// Q6_K (mma_q6k_kernel): the weights are signed (q − 32) and take one scale per 16 values, so its
// lanes load the values in their natural k order (q6k_fragments.h) and each activation block takes
// two products, one with the second 16 columns of A zeroed and one with the first, each scaled by
// its sub-block's scale: y += d · dₓ · (sc₀ · C₀ + sc₁ · C₁), matvec-q8's Q6_K form (d · Σ sc_j ·
// dₓ · Σ q·qₓ) in another order of fp32 additions. Its rows are 2-byte aligned (210-byte blocks):
// its words are read by load_word_a2 (quant_device.cuh), as matvec-q8's Q6_K.
#include <algorithm>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/job_lists.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"
#include "cuda/q6k_fragments.h"
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

// The warps' partial sums of a block's 16 rows × n_tokens (acc: lane (g, q)'s rows g, g + 8 of
// tokens 2q, 2q + 1 of each 8-token tile), added in warp order by warp 0, which writes them.
__device__ __forceinline__ void store_tile(const float (&acc)[2][4], const MatvecJob& jb, int r0, int n_tokens) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
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

// A block's view of a job for lane (g, q): the weight rows g and g + 8 of its 16 (clamped to the
// last row), the lane's B column (token 8t + g of each 8-token tile t) and the Q8 scales of its two
// output tokens (8t + 2q, + 1), clamped to the last token; `tiles` 8-token tiles (1 or 2).
struct LaneTiles {
  const uint8_t* row[2];
  const int8_t* xb[2];
  const float2* xs[2][2];
  int tiles;
  __device__ LaneTiles(const MatvecJob& jb, int r0, int cols, int n_tokens, int g, int q) {
#pragma unroll
    for (int r = 0; r < 2; r++) row[r] = jb.w + (size_t)min(r0 + g + 8 * r, jb.rows - 1) * jb.row_bytes;
    tiles = (n_tokens + 7) / 8;
    const int blocks32 = cols / 32;
#pragma unroll
    for (int t = 0; t < 2; t++) {
      xb[t] = jb.xq + (size_t)min(8 * t + g, n_tokens - 1) * cols;
#pragma unroll
      for (int i = 0; i < 2; i++) xs[t][i] = jb.xds + (size_t)min(8 * t + 2 * q + i, n_tokens - 1) * blocks32;
    }
  }
};

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
  const LaneTiles lt(jb, r0, cols, n_tokens, g, q);
  float acc[2][4] = {};
  const int n_super = cols / 256;
  for (int sb = warp; sb < n_super; sb += kWarps) {
    const uint8_t* ba = lt.row[0] + (size_t)sb * kBytes;
    const uint8_t* bb = lt.row[1] + (size_t)sb * kBytes;
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
          if (t < lt.tiles) {
            const uint2 x = __ldg(reinterpret_cast<const uint2*>(lt.xb[t] + 32 * blk + 8 * q));
            int c[4];
            imma_16x8x32<true>(c, a, x.x, x.y);
            const float2 s0 = __ldg(lt.xs[t][0] + blk), s1 = __ldg(lt.xs[t][1] + blk);
            acc[t][0] += fmaf(dsa * s0.x, (float)c[0], -dma * s0.y);
            acc[t][1] += fmaf(dsa * s1.x, (float)c[1], -dma * s1.y);
            acc[t][2] += fmaf(dsb * s0.x, (float)c[2], -dmb * s0.y);
            acc[t][3] += fmaf(dsb * s1.x, (float)c[3], -dmb * s1.y);
          }
        }
      }
    }
  }
  store_tile(acc, jb, r0, n_tokens);
}

__global__ void __launch_bounds__(32 * kWarps) mma_q6k_kernel(const MmaJobs jobs, int cols, int n_tokens) {
  const MatvecJob& jb = jobs.job[blockIdx.y];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int r0 = blockIdx.x * kTileRows;
  pdl_wait();  // the Q8 input comes from the previous kernel
  pdl_trigger();
  if (r0 >= jb.rows) return;  // the whole block
  const LaneTiles lt(jb, r0, cols, n_tokens, g, q);
  float acc[2][4] = {};
  const int n_super = cols / 256;
  for (int sb = warp; sb < n_super; sb += kWarps) {
    const uint8_t* b[2] = {lt.row[0] + (size_t)sb * kQ6kBytes, lt.row[1] + (size_t)sb * kQ6kBytes};
    float d[2];
#pragma unroll
    for (int r = 0; r < 2; r++) d[r] = half_bits_to_f32(load_u16(b[r] + kQ6kD));
#pragma unroll
    for (int n = 0; n < 2; n++) {
      Q6kHalfWords w[2];
#pragma unroll
      for (int r = 0; r < 2; r++) {
#pragma unroll
        for (int i = 0; i < 4; i++) w[r].ql[i] = load_word_a2(b[r] + q6k_ql_offset(n, i, q));
#pragma unroll
        for (int i = 0; i < 2; i++) w[r].qh[i] = load_word_a2(b[r] + q6k_qh_offset(n, i, q));
      }
#pragma unroll
      for (int gb = 0; gb < 4; gb++) {
        const Q6kFragment fa = q6k_fragment(w[0], gb), fb = q6k_fragment(w[1], gb);
        const uint32_t a0[4] = {fa.lo, fb.lo, 0u, 0u}, a1[4] = {0u, 0u, fa.hi, fb.hi};
        const int8_t* sc0 = reinterpret_cast<const int8_t*>(b[0] + q6k_scale_offset(n, gb));
        const int8_t* sc1 = reinterpret_cast<const int8_t*>(b[1] + q6k_scale_offset(n, gb));
        const float sa0 = (float)sc0[0], sa1 = (float)sc0[1], sb0 = (float)sc1[0], sb1 = (float)sc1[1];
        const int blk = sb * 8 + 4 * n + gb;
#pragma unroll
        for (int t = 0; t < 2; t++) {
          if (t < lt.tiles) {
            const uint32_t x0 = __ldg(reinterpret_cast<const uint32_t*>(lt.xb[t] + 32 * blk + 4 * q));
            const uint32_t x1 = __ldg(reinterpret_cast<const uint32_t*>(lt.xb[t] + 32 * blk + 16 + 4 * q));
            int c0[4], c1[4];
            imma_16x8x32<true, true>(c0, a0, x0, x1);
            imma_16x8x32<true, true>(c1, a1, x0, x1);
            const float dx0 = __ldg(&lt.xs[t][0][blk].x), dx1 = __ldg(&lt.xs[t][1][blk].x);
            acc[t][0] += d[0] * dx0 * fmaf(sa0, (float)c0[0], sa1 * (float)c1[0]);
            acc[t][1] += d[0] * dx1 * fmaf(sa0, (float)c0[1], sa1 * (float)c1[1]);
            acc[t][2] += d[1] * dx0 * fmaf(sb0, (float)c0[2], sb1 * (float)c1[2]);
            acc[t][3] += d[1] * dx1 * fmaf(sb0, (float)c0[3], sb1 * (float)c1[3]);
          }
        }
      }
    }
  }
  store_tile(acc, jb, r0, n_tokens);
}

}  // namespace

bool mma_q8_supported(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K; }

bool mma_q8_weights_fit(GgmlType t, const void* w, size_t row_bytes, int cols) {
  // Q4_K / Q5_K: 16-byte loads of a block's header and 8-byte ones of its values; Q6_K: words
  // read two at a time at 2-byte aligned addresses.
  const size_t align = t == GgmlType::Q6_K ? 2 : 16;
  return mma_q8_supported(t) && cols % 256 == 0 && (reinterpret_cast<uintptr_t>(w) | row_bytes) % align == 0;
}

void matmul_q8_jobs(GgmlType t, int cols, const MatvecJob* jobs, int n, cudaStream_t stream, int columns) {
  if (!mma_q8_supported(t)) throw_error(std::string("matmul_q8: weight type ") + type_name(t) + " has no mma-q8 product");
  if (device_info().cc_major < 8) throw_error("matmul_q8: the int8 tensor-core products need compute capability 8.0");
  if (cols % 256 != 0) throw_error("matmul_q8: " + std::to_string(cols) + " columns is not a whole number of blocks");
  if (columns < 1 || columns > kMaxQ8Columns)
    throw_error("matmul_q8: " + std::to_string(columns) + " token columns, want 1 to " + std::to_string(kMaxQ8Columns));
  auto check = [&](const MatvecJob& jb) {
    if (!jb.w || !mma_q8_weights_fit(t, jb.w, jb.row_bytes, cols))
      throw_error(std::string("matmul_q8: the ") + type_name(t) + " weights must be direct and " +
                  (t == GgmlType::Q6_K ? "2" : "16") + "-byte aligned");
    if (!jb.xq || !jb.xds || reinterpret_cast<uintptr_t>(jb.xq) % 16 != 0)
      throw_error("matmul_q8: a job's Q8 input is missing or not 16-byte aligned");
  };
  for_each_job_list<MmaJobs>(jobs, n, check, [&](const MmaJobs& list, int m, int max_rows) {
    const dim3 grid((unsigned)((max_rows + kTileRows - 1) / kTileRows), (unsigned)m);
    if (t == GgmlType::Q6_K)
      launch_dependent(mma_q6k_kernel, grid, dim3(32 * kWarps), stream, list, cols, columns);
    else if (t == GgmlType::Q5_K)
      launch_dependent(mma_q8_kernel<true>, grid, dim3(32 * kWarps), stream, list, cols, columns);
    else
      launch_dependent(mma_q8_kernel<false>, grid, dim3(32 * kWarps), stream, list, cols, columns);
    RL_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace rl::cuda
