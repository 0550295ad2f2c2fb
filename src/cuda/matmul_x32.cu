// Dense prefill products of Q4_K weights on the 8-bit integer tensor cores, on X32 activations.
//
// The X32 form (quantize_x32, matmul_x24.cu) is X24's with a fourth byte: per token and 256
// columns a power of two 2^e above the block's largest magnitude, each value as the 32-bit integer
// n = round(x · 2^(31-e)) in four byte planes (the first signed). A value of magnitude 2^(e-8) or
// more — at least 2^-7 of the block's largest — is held exactly (fp32 has 24 significant bits), a
// smaller one to 2^(e-32). (Three
// planes, the X24 form, were measured to move the 80B model's router selections against the
// oracle's once these products took them: docs/perf/cuda.md's eighth session, in git history at
// 57c9cc0.)
//
// A Q4_K value is w = d·sc·q − dmin·m: q a 4-bit unsigned integer, sc and m 6-bit integers per 32
// columns (a sub-block), d and dmin fp16 per 256 (a super-block). Against x̂ = n · 2^(e-31) the sum
// over a super-block is
//     Σ w·x̂ = 2^(e-31) · (d · N − dmin · Σ_j m_j · S_j),   N = Σ_j sc_j · Σ_{k in j} q_k · n_k,
// with S_j = Σ_{k in j} n_k (quantize_x32's xsum, |S_j| < 2^36). The q·n sums run on mma.m16n8k32
// (u8 weights against the signed top plane and the three unsigned ones), sc_j multiplies each
// sub-block's int32 results, and the planes accumulate separately over the super-block: |plane sum|
// ≤ 8 · 63 · 32 · 15 · 255 < 2^31. N = A0·2^24 + A1·2^16 + A2·2^8 + A3 is an integer below 2^51,
// exact in double; M = dmin · Σ m_j S_j is formed on the fp64 tensor cores (one m16n8k4 per four
// sub-blocks; each product m_j·dmin·S_j is exact). Each super-block adds fl(d·N − M) times the
// power of two to a double sum and only the final sum rounds to fp32: every output is the fp32
// rounding of Σ w·x̂ with w the exact Q4_K value, up to double roundings. (The oracle forms w in
// fp32, d·sc·q − dmin·m rounded once; the two differ where that subtraction rounds, by at most half
// an fp32 unit of w.)
//
// A block is 8 warps × 16 weight rows × 24 tokens (the X32 form: three 8-token sub-tiles; the X8
// form 32, four; sub-tiles wholly past the tokens are skipped), one sub-block (32 columns) a step.
// Lane (g, q) takes columns 8q .. 8q + 7 of the step for mma column slots 4q .. 4q + 3 (its first
// A and B registers) and 16 + 4q .. 16 + 4q + 3 (its second): the sum does not depend on the order
// of its columns, and then a lane's weights of
// a row are the 8 bytes 8q .. 8q + 7 of the step's 32 quant bytes (low nibbles on even steps, high
// on odd ones, the same bytes for both) and its B registers are 8 consecutive bytes of a token's
// plane. The planes of a step, the sub-block sums and the scales are copied into shared memory with
// cp.async three stages deep (a stage: one step in the X32 form, two in the X8 form, so that the X8
// form's four mma a warp per step wait on half as many barriers); the weights are read into
// registers two steps ahead and prefetched into L2 two super-blocks ahead. Blocks of one row tile
// are adjacent in the grid, so the tokens' blocks of a weight tile run together and read it from
// L2. (The int32 sums of 4 planes × 3 sub-tiles fill the registers that 128 a thread allow at two
// blocks an SM; the double sums live in shared memory.)
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"
#include "cuda/quant_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = kWarps * 16;
// Tokens per block: the X32 form three 8-token sub-tiles (its int32 sums of 4 planes fill the
// registers), the X8 form four (one plane: each weight decoded once for 32 tokens; 78 registers,
// 43.5 KiB of shared memory, the double sums' 32 KiB of it; five would pass the 48 KiB of static
// shared memory).
constexpr int kX8Tokens = 32;
template <int L>
constexpr int kTokens = L == 1 ? kX8Tokens : 24;
template <int L>
constexpr int kSubTiles = kTokens<L> / 8;
constexpr int kStep = 32;    // columns per step: one Q4_K sub-block
constexpr int kSuper = 256;  // columns per super-block
constexpr int kStepsPerSuper = kSuper / kStep;
constexpr int kMaxLimbs = 4;  // X32 (the X8 form, the fast tier's, has one)
constexpr int kStages = 3;
constexpr int kQ4KBytes = 144;
constexpr int kPrefetchSupers = 2;
// Copy pieces of a step: 16 bytes of plane l, half h of token t at piece (l·kTokens<L> + t)·2 + h.
template <int L>
constexpr int kPieces = L * kTokens<L> * 2;
// Steps a stage holds (one barrier each): the X8 form two, the step pair whose quant bytes a lane
// reads at once (its stages fit the 48 KiB of static shared memory); the X32 form one (two would
// not fit).
template <int L>
constexpr int kStageSteps = L == 1 ? 2 : 1;
static_assert(kPieces<kMaxLimbs> + kTokens<kMaxLimbs> <= kThreads && kPieces<1> + kTokens<1> <= kThreads,
              "a step's copies take one thread each");

// The 6-bit scale (kMin false) or min (true) of sub-block j from a Q4_K block's scale words
// s0, s1, s2 (its bytes 4..15), as ggml packs them: j < 4 in the low 6 bits of byte j (scale) and
// j + 4 (min); j ≥ 4 in the nibbles of byte j + 4 with the top bits of byte j − 4 (scale) or j (min).
template <bool kMin>
__device__ __forceinline__ int k4_field(uint32_t s0, uint32_t s1, uint32_t s2, int j) {
  const uint32_t lo = kMin ? s1 : s0;
  if (j < 4) return (int)((lo >> (8 * j)) & 63u);
  const int sh = 8 * (j - 4);
  const uint32_t nib = kMin ? (s2 >> (sh + 4)) & 15u : (s2 >> sh) & 15u;
  return (int)(nib | (((lo >> (sh + 6)) & 3u) << 4));
}

template <int L>
struct Stage {
  uint4 x[kStageSteps<L>][kPieces<L>];  // [step][plane][token][2 halves of 16 bytes]
};

// Y [T][rows] = X̂ · Wᵀ for Q4_K W [rows][cols]: see the top of the file. L planes: 4, the X32 form;
// 1, the X8 form (n an int8, N = A0; the same sub-block sums S_j). The X8 form's registers fit 3
// blocks an SM (78 a thread, no spills), the X32 form's 128 allow 2.
template <int L>
__global__ void __launch_bounds__(kThreads, L == 1 ? 3 : 2)
    x32_q4k_kernel(const uint8_t* w, size_t row_bytes, int rows, int cols, const uint8_t* xq, const double* xscale,
                   const double* xsum, int n_tokens, float* y) {
  constexpr int kPieceCount = kPieces<L>;
  constexpr int kStepBytes = L * kStep;  // a token's bytes of one step: [plane][32]
  constexpr int kTok = kTokens<L>, kSub = kSubTiles<L>;
  __shared__ Stage<L> stages[kStages];
  __shared__ double ssum[2][kStepsPerSuper][kTok];  // sub-block sums by super-block parity
  __shared__ double sxsc[2][kTok];                   // the tokens' scales 2^(e-31), likewise
  __shared__ uint4 sscale[2][kTileRows];             // the rows' d, dmin and scale bytes, likewise
  // The double sums: thread tid's output k (sub-tile k / 4, fragment element k % 4) at [k][tid],
  // in shared memory rather than registers, which the int32 sums fill (they are touched once a
  // super-block).
  __shared__ double sout[kSub * 4][kThreads];

  const int tile_t = blockIdx.x * kTok;
  const int r0 = blockIdx.y * kTileRows;
  const int tile_n = min(kTok, n_tokens - tile_t);
  const int active = (tile_n + 7) / 8;
  const int nsb = cols / kSuper, steps = cols / kStep;
  const size_t x_row = (size_t)cols * L;
  const uint8_t* xg = xq + (size_t)tile_t * x_row;
  const double* sg = xsum + (size_t)tile_t * steps;
  const double* cg = xscale + (size_t)tile_t * nsb;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int fg = lane >> 2, fq = lane & 3;
  const int warp_r = r0 + warp * 16;
  // Rows fg and fg + 8 of the warp's 16 (a row past the end reads row 0 and is not stored).
  const uint8_t* wrow[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int r = warp_r + 8 * i + fg;
    wrow[i] = w + (size_t)(r < rows ? r : 0) * row_bytes;
  }

  // Stage q's copies, steps st = q·S .. q·S + S − 1 (S = kStageSteps, a divisor of a super-block's
  // steps): the planes (threads below kPieces), the sub-block sums (the next kTok threads) and, on a
  // super-block's first step, the tokens' scales (the same threads) and the rows' first 16 bytes of
  // the super-block (threads below kTileRows, row r0 + tid). One group a thread.
  constexpr int S = kStageSteps<L>;
  auto stage = [&](int q) {
    const int st0 = q * S;
    if (st0 < steps) {
      if (st0 % kStepsPerSuper == 0 && tid < kTileRows) {
        const int r = r0 + tid;
        cp_async<16>(&sscale[(st0 / kStepsPerSuper) & 1][tid],
                     w + (size_t)(r < rows ? r : 0) * row_bytes + (size_t)(st0 / kStepsPerSuper) * kQ4KBytes, r < rows);
      }
      if (tid < kPieceCount) {
        const int h = tid & 1, t = (tid >> 1) % kTok, l = tid / (2 * kTok);
        const bool v = t < tile_n;
        const uint8_t* src = xg + (size_t)(v ? t : 0) * x_row + (size_t)st0 * kStepBytes + 32 * l + 16 * h;
#pragma unroll
        for (int u = 0; u < S; u++) cp_async<16>(&stages[q % kStages].x[u][tid], src + u * kStepBytes, v);
      } else if (tid < kPieceCount + kTok) {
        const int t = tid - kPieceCount;
        const bool v = t < tile_n;
        const int par = (st0 / kStepsPerSuper) & 1;
#pragma unroll
        for (int u = 0; u < S; u++)
          cp_async<8>(&ssum[par][(st0 + u) % kStepsPerSuper][t], sg + (size_t)(v ? t : 0) * steps + st0 + u, v);
        if (st0 % kStepsPerSuper == 0)
          cp_async<8>(&sxsc[par][t], cg + (size_t)(v ? t : 0) * nsb + st0 / kStepsPerSuper, v);
      }
    }
    cp_async_commit();
  };
  auto prefetch_weights = [&](int sb) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const uint8_t* b = wrow[i] + (size_t)sb * kQ4KBytes;
      prefetch_l2(b + 32 * fq);
      if (fq < 2) prefetch_l2(b + (fq == 0 ? 128 : kQ4KBytes - 1));
    }
  };
  // A lane's quant bytes of row i for the step pair p (steps 2p, 2p + 1: sub-blocks 2(p%4), +1).
  auto load_quants = [&](int i, int p) {
    return __ldca(reinterpret_cast<const uint2*>(wrow[i] + (size_t)(p / 4) * kQ4KBytes + 16 + 32 * (p % 4) + 8 * fq));
  };

  for (int sb = 0; sb < kPrefetchSupers && sb < nsb; sb++) prefetch_weights(sb);
  stage(0);
  stage(1);
  uint2 qcur[2], qnext[2];
#pragma unroll
  for (int i = 0; i < 2; i++) qnext[i] = load_quants(i, 0);

#pragma unroll
  for (int k = 0; k < kSub * 4; k++) sout[k][tid] = 0.0;
  for (int sb = 0; sb < nsb; sb++) {
    if (sb + kPrefetchSupers < nsb) prefetch_weights(sb + kPrefetchSupers);
    const int par = sb & 1;
    const uint4* scw = &sscale[par][warp * 16 + fg];  // row g's words; row g + 8's at scw[8]
    int acc[kSub][L][4] = {};
#pragma unroll
    for (int j = 0; j < kStepsPerSuper; j++) {
      const int st = sb * kStepsPerSuper + j;
      const int q = st / S;
      if (j % S == 0) {
        cp_async_wait<1>();  // this stage's group (the next one may still be in flight)
        __syncthreads();     // everyone's copies visible; the buffer stage(q + 2) reuses is read
        stage(q + 2);
      }
      if (j % 2 == 0) {
        const int p = st / 2;
#pragma unroll
        for (int i = 0; i < 2; i++) {
          qcur[i] = qnext[i];
          if (p + 1 < steps / 2) qnext[i] = load_quants(i, p + 1);
        }
      }
      const int sh = 4 * (j & 1);
      const uint32_t a[4] = {(qcur[0].x >> sh) & 0x0F0F0F0Fu, (qcur[1].x >> sh) & 0x0F0F0F0Fu,
                             (qcur[0].y >> sh) & 0x0F0F0F0Fu, (qcur[1].y >> sh) & 0x0F0F0F0Fu};
      int sc[2];
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const uint4 v = scw[8 * i];
        sc[i] = k4_field<false>(v.y, v.z, v.w, j);
      }
      const uint2* xb = reinterpret_cast<const uint2*>(stages[q % kStages].x[j % S]);
#pragma unroll
      for (int s = 0; s < kSub; s++) {
        if (s >= active) continue;
#pragma unroll
        for (int l = 0; l < L; l++) {
          // Token 8s + g of plane l: 32 bytes = 4 uint2, the lane's at q.
          const uint2 b = xb[(l * kTok + 8 * s + fg) * 4 + fq];
          int d[4];
          if (l == 0)
            imma_16x8x32<true>(d, a, b.x, b.y);
          else
            imma_16x8x32<false>(d, a, b.x, b.y);
          acc[s][l][0] += sc[0] * d[0];
          acc[s][l][1] += sc[0] * d[1];
          acc[s][l][2] += sc[1] * d[2];
          acc[s][l][3] += sc[1] * d[3];
        }
      }
    }
    // The super-block's contribution (its last stage's barrier made its sums and scales visible).
    double dmin_m[2][2], dd[2];  // [row][k4 half]: m_j · dmin for j = 4·half + q; d per row
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const uint4 v = scw[8 * i];
      const double dmin = (double)half_bits_to_f32((uint16_t)(v.x >> 16));
      dd[i] = (double)half_bits_to_f32((uint16_t)(v.x & 0xFFFF));
#pragma unroll
      for (int hh = 0; hh < 2; hh++) dmin_m[i][hh] = (double)k4_field<true>(v.y, v.z, v.w, 4 * hh + fq) * dmin;
    }
#pragma unroll
    for (int s = 0; s < kSub; s++) {
      if (s >= active) continue;
      double m0[2] = {0.0, 0.0}, m1[2] = {0.0, 0.0};  // M = dmin · Σ m_j S_j, rows g and g + 8
#pragma unroll
      for (int hh = 0; hh < 2; hh++)
        dmma_16x8x4(m0, m1, dmin_m[0][hh], dmin_m[1][hh], ssum[par][4 * hh + fq][8 * s + fg]);
#pragma unroll
      for (int k = 0; k < 4; k++) {
        double n = (double)acc[s][0][k];
        if constexpr (L == 4)
          n = fma(n, 16777216.0, fma((double)acc[s][1][k], 65536.0, fma((double)acc[s][2][k], 256.0, (double)acc[s][3][k])));
        const double m = k < 2 ? m0[k] : m1[k - 2];
        const double v = fma(n, dd[k / 2], -m);
        sout[4 * s + k][tid] = fma(v, sxsc[par][8 * s + 2 * fq + (k & 1)], sout[4 * s + k][tid]);
      }
    }
  }
  cp_async_wait<0>();
  // Row tile i (rows g, g + 8) at element 2i + e of sub-tile s, token 8s + 2q + e.
  store_products<false, 2, kSub>(y, rows, warp_r, fg, fq, tile_t, n_tokens, active,
                                 [&](int i, int s, int e) { return sout[4 * s + 2 * i + e][tid]; });
}

}  // namespace

bool x32_supported(GgmlType t) { return t == GgmlType::Q4_K; }

int x32_blocks(int rows, int T) {
  return ((rows + kTileRows - 1) / kTileRows) * ((T + kTokens<kMaxLimbs> - 1) / kTokens<kMaxLimbs>);
}

void matmul_x32(GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const uint8_t* xq,
                const double* xscale, const double* xsum, int T, float* y, cudaStream_t stream, XForm form) {
  if (!x32_supported(t)) throw_error(std::string("matmul_x32: weight type ") + type_name(t) + " has no X32 product");
  if (cols % kSuper != 0)
    throw_error("matmul_x32: " + std::to_string(cols) + " columns is not a multiple of " + std::to_string(kSuper));
  if (reinterpret_cast<uintptr_t>(w) % 16 != 0 || row_bytes % 16 != 0)
    throw_error("matmul_x32: the weights are not 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(xq) % 16 != 0 || reinterpret_cast<uintptr_t>(xscale) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(xsum) % 8 != 0)
    throw_error("matmul_x32: the activations are not aligned (X32 bytes to 16, scales and sums to 8)");
  if (device_info().cc_major < 9) throw_error("matmul_x32: needs compute capability 9.0 (fp64 m16n8k4)");
  if (rows == 0 || T == 0) return;
  const int tokens = form == XForm::kX8 ? kTokens<1> : kTokens<kMaxLimbs>;
  const dim3 grid((T + tokens - 1) / tokens, (rows + kTileRows - 1) / kTileRows);
  (form == XForm::kX8 ? x32_q4k_kernel<1> : x32_q4k_kernel<kMaxLimbs>)<<<grid, kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(w), row_bytes, rows, cols, xq, xscale, xsum, T, y);
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
