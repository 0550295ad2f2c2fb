// Prefill products of the IQ types (IQ2_XXS, IQ2_XS, IQ1_M) on the 8-bit integer tensor cores.
//
// The activations enter in the X24 form (quantize_x24): per token and per 256 columns (one weight
// super-block) a power of two 2^e above the block's largest magnitude, and every value as the
// 24-bit integer n = round(x · 2^(23-e)) (clamped to [-2^23, 2^23 - 1]), split into three bytes:
// n = L0·2^16 + L1·2^8 + L2, L0 signed, L1 and L2 unsigned. That is fp32's own precision relative to
// the block's largest value (a value 2^-k of it keeps 24 - k bits), so these products read
// activations rounded at 2^(e-24) of their block's largest magnitude, not exact fp32 values — the
// one difference from the fp64 products (matmul.cu); parity is measured end to end against the
// CPU oracle (`redlite parity`).
//
// The weights enter as signed bytes: an IQ2 value is d·m·(±g)/8 with the grid byte g ≤ 43 and
// m = 2·l + 1 its 4-bit sub-scale; an IQ1_M value d·m·(8g ± 1)/8 with g in {-1, 0, 1}. The byte
// (±g or 8g ± 1) goes to mma.m16n8k16 (s8), m per 16 columns multiplies its int32 results (one
// integer multiply-add per result), and the three limbs accumulate separately in int32 over a
// super-block (|sum| < 2^31: 16 · 31 · 16 · 43 · 255 < 2^27). At the super-block's end each result
// is N = A0·2^16 + A1·2^8 + A2 (|N| < 2^42, exact in double) times d/8 · 2^(e-23) (11 significant
// bits times a power of two), exact again, and added to the double sum; only the final sum rounds to
// fp32. So every output is the fp32 rounding of Σ w·x̃ (x̃ the X24 activations), up to double sums.
//
// Tiles as in matmul.cu's expert products: a block is 8 warps × 16 weight rows (a SwiGLU pair: 8
// rows of gate and the same 8 of up) × 16 tokens (two 8-token sub-tiles, those wholly past the
// group's tokens skipped), stepping 32 columns at a time; the A fragment of k16 half h of a step is
// lane (g, q)'s four weights 16h + 4q .. +3 of rows g and g + 8, which is half q % 2 of the 8-value
// chunk 2h + q / 2, so a lane looks up its grid word directly. The limb planes of a super-block's
// eight steps are copied into shared memory at once (cp.async, double-buffered, one barrier a
// super-block instead of one a step) so that lane (g, q) reads its B words conflict-free; the
// weights' raw fields are read two steps ahead, and each row's super-block kPrefetchSupers ahead is
// prefetched into L2. (On the H200 the kernel is not bound by memory — DRAM 6-7 % busy — and not
// by the multiply-adds of m either: a variant without them, six accumulating mma per half instead,
// ran no faster. Nsight Compute, before the super-block staging and the X8 form's 3 blocks an SM:
// issue slots ~60 % busy at 16 warps an SM, the largest stall fixed-latency dependencies: the sixth
// and seventh sessions of docs/perf/cuda.md, in git history at 57c9cc0. bench_cuda_kernels
// --filter x24 times these kernels at the 80B's shapes.)
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"
#include "cuda/quant_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kStep = 32;          // columns per step
constexpr int kSuper = 256;        // columns per super-block (the X24 scale, the weights' d)
constexpr int kStepsPerSuper = kSuper / kStep;
constexpr int kTokens = 16;        // tokens per block: two 8-token sub-tiles
constexpr int kSubTiles = kTokens / 8;
constexpr int kMaxLimbs = 3;  // X24 (the X8 form, the fast tier's, has one)
// How far ahead (in super-blocks) x24_kernel prefetches a row's weights into L2.
constexpr int kPrefetchSupers = 2;
// Blocks an SM of the X8 form (the fast tier's): at 80 registers a thread 3 fit, 24 warps to hide
// the decode's fixed-latency chains (IQ2_XXS / IQ2_XS: no spills; IQ1_M spills 24-32 bytes, not
// timed apart); the X24 form's 128 registers allow 2.
constexpr int kX8BlocksPerSm = 3;

// D = A·B + 0 for a 16×16 s8 A (a0: row g, a1: row g + 8, columns 4q..4q+3) and a 16×8 B (columns
// 4q..4q+3 of token g), s8 or u8; d0, d1: row g, tokens 2q, 2q + 1; d2, d3: row g + 8.
template <bool kSigned>
__device__ __forceinline__ void imma_16x8x16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
#if __CUDA_ARCH__ >= 800
  if constexpr (kSigned)
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(0));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(0));
#else
  __trap();  // the launchers refuse devices below compute capability 8.0
#endif
}

// The weight fields' loads as global loads: the slot pointers come from memory, so the compiler
// cannot tell their space and would issue generic loads (LD.E) for plain dereferences.
__device__ __forceinline__ uint32_t gld_u8(const uint8_t* p) { return __ldca(p); }
__device__ __forceinline__ uint32_t gld_u16(const uint8_t* p) { return __ldca(reinterpret_cast<const unsigned short*>(p)); }
// d/8 of an IQ2 super-block (its first two bytes).
__device__ __forceinline__ float iq2_super_scale(const uint8_t* block) {
  return half_bits_to_f32((uint16_t)gld_u16(block)) * 0.125f;
}

// A lane's weights of one row for one step, for its k16 halves h = 0, 1: the four signed bytes
// a[h] (half fq % 2 of chunk 2h + fq / 2 of the step's 32-column group) and the sub-scale m[h].
// load() issues the global reads (a step ahead), decode(raw, fq, step, grid, masks) forms the bytes
// with the block's codebook and sign masks (SharedTables; each type reads what it needs).
// super_scale(): d/8 of super-block sb (exact in fp32).
struct X24Chunk {
  uint32_t a[2];
  int m[2];
};
// The signed bytes of half hb/4 of grid entry gi under sign code si: the tables' 8-byte entries read
// as words at byte offset index·8 + hb.
__device__ __forceinline__ uint32_t iq2_half(const uint32_t* grid, const uint32_t* masks, uint32_t gi, uint32_t si,
                                             uint32_t hb) {
  const uint32_t g = *reinterpret_cast<const uint32_t*>(reinterpret_cast<const char*>(grid) + ((gi << 3) | hb));
  const uint32_t mk = *reinterpret_cast<const uint32_t*>(reinterpret_cast<const char*>(masks) + ((si << 3) | hb));
  return iq2_s8(g, mk);
}

template <GgmlType T>
struct X24Weights;

template <>
struct X24Weights<GgmlType::IQ2_XS> {
  static constexpr int kBytes = 74;
  struct Raw {
    uint32_t qs[2], sc;  // 32-bit registers: no 16-bit arithmetic in the decode
  };
  __device__ static Raw load(const uint8_t* row, int step, int fq) {
    const uint8_t* b = row + (step >> 3) * kBytes;
    const int ib = step & 7;
    const uint8_t* q = b + 2 + 8 * ib + 2 * (fq >> 1);
    return {{gld_u16(q), gld_u16(q + 4)}, gld_u8(b + 66 + ib)};
  }
  __device__ static X24Chunk decode(const Raw& r, int fq, int, const uint32_t* grid, const uint32_t* masks) {
    X24Chunk c;
#pragma unroll
    for (int h = 0; h < 2; h++) c.a[h] = iq2_half(grid, masks, r.qs[h] & 511u, r.qs[h] >> 9, (fq & 1) << 2);
    c.m[0] = (int)(((r.sc << 1) & 0x1Eu) | 1u);
    c.m[1] = (int)(((r.sc >> 3) & 0x1Eu) | 1u);
    return c;
  }
  __device__ static float super_scale(const uint8_t* row, int sb) { return iq2_super_scale(row + sb * kBytes); }
};

template <>
struct X24Weights<GgmlType::IQ2_XXS> {
  static constexpr int kBytes = 66;
  struct Raw {
    uint32_t aux1, idx[2];
  };
  __device__ static Raw load(const uint8_t* row, int step, int fq) {
    const uint8_t* q = row + (step >> 3) * kBytes + 2 + 8 * (step & 7);
    return {gld_u16(q + 4) | (gld_u16(q + 6) << 16), {gld_u8(q + (fq >> 1)), gld_u8(q + 2 + (fq >> 1))}};
  }
  __device__ static X24Chunk decode(const Raw& r, int fq, int, const uint32_t* grid, const uint32_t* masks) {
    X24Chunk c;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      c.a[h] = iq2_half(grid, masks, r.idx[h], (r.aux1 >> (7 * (2 * h + (fq >> 1)))) & 127u, (fq & 1) << 2);
      c.m[h] = (int)(((r.aux1 >> 27) & 0x1Eu) | 1u);
    }
    return c;
  }
  __device__ static float super_scale(const uint8_t* row, int sb) { return iq2_super_scale(row + sb * kBytes); }
};

// IQ1_M: grid bytes g in {-1, 0, 1} (0xFF, 0, 1) and the chunk's delta ±1/8 give 8g ± 1 per byte:
// u = g + 1 per byte ((g ^ 0x80) - 0x7F, no borrows), then 8u + 121 (delta +1/8) or 8u + 119 (-1/8)
// stays below 256, and ^ 0x80 subtracts 128 per byte: 8g + 1 or 8g - 1.
template <>
struct X24Weights<GgmlType::IQ1_M> {
  static constexpr int kBytes = 56;
  struct Raw {
    uint32_t sw;  // the scale word of the step's group
    uint32_t qs[2], qh[2];
  };
  __device__ static Raw load(const uint8_t* row, int step, int fq) {
    const uint8_t* b = row + (step >> 3) * kBytes;
    const int ib = step & 7;
    return {gld_u16(b + 48 + 2 * (ib >> 1)),
            {gld_u8(b + 4 * ib + (fq >> 1)), gld_u8(b + 4 * ib + 2 + (fq >> 1))},
            {gld_u8(b + 32 + 2 * ib), gld_u8(b + 32 + 2 * ib + 1)}};
  }
  __device__ static X24Chunk decode(const Raw& r, int fq, int step, const uint32_t* grid, const uint32_t*) {
    X24Chunk c;
    const int ib = step & 7, odd = fq >> 1;  // chunk 2h + odd: odd selects the high index bits' nibble
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const uint32_t idx = r.qs[h] | ((odd ? (r.qh[h] << 4) : (r.qh[h] << 8)) & 0x700u);
      const bool minus = r.qh[h] & (odd ? 0x80u : 0x08u);
      const uint32_t g = grid[2 * idx + (fq & 1)];
      const uint32_t u = (g ^ 0x80808080u) - 0x7F7F7F7Fu;
      c.a[h] = ((u << 3) + (minus ? 0x77777777u : 0x79797979u)) ^ 0x80808080u;
      c.m[h] = (int)((((r.sw >> (6 * (ib & 1) + 3 * h)) & 0x7u) << 1) | 1u);
    }
    return c;
  }
  __device__ static float super_scale(const uint8_t* row, int sb) {
    return iq1m_super_scale(load8_a4(row + sb * kBytes + 48)) * 0.125f;
  }
};

template <GgmlType T>
constexpr bool kX24Type = T == GgmlType::IQ2_XXS || T == GgmlType::IQ2_XS || T == GgmlType::IQ1_M;

// x24_kernel's step loop without predicates (the IQ2 types): every lane decodes and fetches its
// rows' weights at every step, a row past the matrix reading row 0's (wrow: its sums are never
// stored, and only they read its bytes, an A row of the mma giving its own D rows) and the last
// two steps of a row fetching its last step again, so that the two steps' weight registers rotate
// without copies and the decoding without branches (the step's sub-scales pinned ahead of the
// sub-tiles' branches too): 230 machine instructions for two steps of the IQ2_XS gate/up pair
// against 300 predicated (scripts/sass_loops.py; Nsight Compute found these kernels bound by their
// instruction issue, docs/PERF.md). IQ1_M's X8 form runs unpredicated at 2 blocks an SM (128
// registers, no spill; at 3 it spilled 56 bytes, predicated 32); its X24 form keeps the predicated
// loop (unpredicated it spilled 24 bytes at 128 registers) (ptxas).
template <GgmlType T, int L>
constexpr bool kX24Unpredicated =
    T == GgmlType::IQ2_XXS || T == GgmlType::IQ2_XS || (T == GgmlType::IQ1_M && L == 1);
// Blocks an SM for the X8 (L = 1) and X24 (L = 3) forms.
template <GgmlType T, int L>
constexpr int kX24BlocksPerSm = L == 1 && T != GgmlType::IQ1_M ? kX8BlocksPerSm : 2;

// One warp per (row, super-block): the block's largest magnitude m gives e with m < 2^e (frexp),
// the scale 2^(e-B) with B = 8L - 1 (NaN when the block holds a NaN or an infinity, so that the
// products carry it), and each value's (B+1)-bit integer n = round(x · 2^(B-e)) in L byte planes,
// the first signed: L = 3 is the X24 form, L = 4 the X32 form (kernels.h), which also writes the
// sum of n over each 32 columns (xsum, exact in double: |sum| < 2^36). L = 1, the X8 form, takes
// the scale m / 127 instead (the whole int8 range, as llama.cpp's q8_1 blocks).
template <int L>
__global__ void quantize_kernel(const float* x, int rows, int cols, uint8_t* xq, double* xscale, double* xsum) {
  static_assert(L == 1 || L == 3 || L == 4);
  constexpr int kBits = 8 * L - 1;
  constexpr double kMax = (double)((1LL << kBits) - 1);
  const int nsb = cols / kSuper;
  const int wid = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (wid >= rows * nsb) return;
  const int row = wid / nsb, sb = wid % nsb;
  const float* p = x + (size_t)row * cols + sb * kSuper + 8 * lane;
  const float4 v0 = *reinterpret_cast<const float4*>(p), v1 = *reinterpret_cast<const float4*>(p + 4);
  const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
  float mx = 0.0f;
  bool finite = true;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    mx = fmaxf(mx, fabsf(v[j]));
    finite = finite && isfinite(v[j]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
  finite = __all_sync(0xFFFFFFFFu, finite);
  int e;
  frexpf(mx, &e);  // mx < 2^e (mx = 0: e = 0)
  // X8: n = round(x · 127 / mx) (mx = 0: every n is 0, the scale any finite value).
  const double x8_scale = mx > 0.0f ? (double)mx / kMax : 1.0;
  if (lane == 0)
    xscale[(size_t)row * nsb + sb] = !finite ? __longlong_as_double(0x7FF8000000000000LL)
                                     : L == 1 ? x8_scale
                                              : ldexp(1.0, e - kBits);
  uint32_t limb[L][2] = {};
  long long sum = 0;  // of the lane's 8 integers (X32, and X8 for the Q4_K products)
#pragma unroll
  for (int j = 0; j < 8; j++) {
    int n = 0;
    if (finite) {
      const double s = L == 1 ? rint((double)v[j] / x8_scale) : rint(ldexp((double)v[j], kBits - e));
      n = (int)fmin(fmax(s, -kMax - 1.0), kMax);
    }
    sum += n;
    const int w = j / 4, sh = 8 * (j % 4);
#pragma unroll
    for (int l = 0; l < L; l++) limb[l][w] |= (uint32_t)((n >> (8 * (L - 1 - l))) & 0xFF) << sh;
  }
  // Columns sb·256 + 8·lane .. +7: step sb·8 + lane/4, bytes 8·(lane%4) of each limb's 32.
  uint8_t* q = xq + (size_t)row * cols * L + (size_t)(sb * kStepsPerSuper + lane / 4) * (L * kStep) + 8 * (lane % 4);
#pragma unroll
  for (int l = 0; l < L; l++) *reinterpret_cast<uint2*>(q + l * kStep) = make_uint2(limb[l][0], limb[l][1]);
  if (xsum) {  // the 32 columns of lanes 4k .. 4k + 3
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
    if (lane % 4 == 0) xsum[(size_t)row * (cols / kStep) + sb * kStepsPerSuper + lane / 4] = (double)sum;
  }
}

// GU (a SwiGLU pair): row tile 0 of each warp is rows of the gate matrix, row tile 1 the same rows
// of the up matrix; the lane writes SiLU(gate) · up as swiglu does. Otherwise row tiles 0 and 1 are
// rows g and g + 8 of the warp's 16.
// L limbs: 3, the X24 form; 1, the X8 form.
template <GgmlType T, bool GU, int L>
__global__ void __launch_bounds__(kThreads, kX24BlocksPerSm<T, L>) x24_kernel(
    const uint8_t* w, const uint8_t* const* slot_ptrs, size_t w_offset, const uint8_t* w2, size_t w2_offset,
    size_t row_bytes, int rows, int cols, const uint8_t* xq, const double* xscale, const int* row_off,
    const int* row_cnt, int n_tokens, float* y) {
  using W = X24Weights<T>;
  constexpr int kTileRows = kWarps * (GU ? 8 : 16);
  const int g = blockIdx.z;
  const int t0_group = row_off ? row_off[g] : 0;
  const int cnt = row_cnt ? row_cnt[g] : n_tokens;
  const int tile_t = blockIdx.y * kTokens;
  if (tile_t >= cnt) return;
  // Staged limbs, a super-block at a time: [buffer][step][limb][half][token] of 16 bytes (lane
  // (g, q)'s B word of sub-tile s in step j is word q of entry [j][l][h][8s + g]: a warp reads 32
  // consecutive words).
  __shared__ uint4 xs[2][kStepsPerSuper][L * 2 * kTokens];
  constexpr int kStepBytes = L * kStep;  // a token's bytes of one step: [limb][32]
  const SharedTables<T> tab;
  const uint32_t* grid32 = reinterpret_cast<const uint32_t*>(tab.grid);
  const uint32_t* masks32 = reinterpret_cast<const uint32_t*>(tab.masks);
  const int tile_n = min(kTokens, cnt - tile_t);
  const int active = (tile_n + 7) / 8;
  const int r0 = blockIdx.x * kTileRows;
  const int nsb = cols / kSuper, steps = cols / kStep;
  const size_t x_row = (size_t)cols * L;
  const uint8_t* xg = xq + (size_t)(t0_group + tile_t) * x_row;
  const double* sg = xscale + (size_t)(t0_group + tile_t) * nsb;
  float* yg = y + (size_t)t0_group * rows;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int fg = lane >> 2, fq = lane & 3;
  const int warp_r = warp * (GU ? 8 : 16);
  const uint8_t* wrow[2];
  bool w_valid[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int r = r0 + warp_r + (GU ? 0 : 8 * i) + fg;
    w_valid[i] = r < rows;
    const uint8_t* b = GU && i == 1 ? (slot_ptrs ? slot_ptrs[g] + w2_offset : w2)
                                    : (slot_ptrs ? slot_ptrs[g] + w_offset : w);
    wrow[i] = b + (size_t)(w_valid[i] ? r : 0) * row_bytes;
  }

  // Piece p of a super-block (p < kStepsPerSuper · n_pieces; a thread's pieces are tid + k · kThreads):
  // 16 bytes of limb l, half h of token t in step j, p = j · n_pieces + (2l + h) · n + t with
  // n = active·8 tokens; tokens past the tile's are copied as zeros. Where each of the thread's
  // pieces goes (its entry of xs[buf]; -1: none) and comes from (its offset in a super-block's
  // activations; -1: a zero piece).
  constexpr int kPieces = (kStepsPerSuper * L * 2 * kTokens + kThreads - 1) / kThreads;
  const int n_tok = active * 8, n_pieces = n_tok * L * 2;
  int piece_entry[kPieces];
  long long piece_src[kPieces];
#pragma unroll
  for (int k = 0; k < kPieces; k++) {
    const int p = tid + k * kThreads, j = p / n_pieces, lh = p % n_pieces / n_tok, t = p % n_tok;
    piece_entry[k] = p < kStepsPerSuper * n_pieces ? j * (L * 2 * kTokens) + lh * kTokens + t : -1;
    piece_src[k] = t < tile_n ? (long long)((size_t)t * x_row + (size_t)j * kStepBytes + 16 * lh) : -1;
  }
  auto copy_super = [&](int sb, int b) {
    const uint8_t* src = xg + (size_t)sb * kStepsPerSuper * kStepBytes;
#pragma unroll
    for (int k = 0; k < kPieces; k++)
      if (piece_entry[k] >= 0)
        cp_async<16>(&xs[b][0][0] + piece_entry[k], src + (piece_src[k] >= 0 ? piece_src[k] : 0), piece_src[k] >= 0);
    cp_async_commit();
  };
  typename W::Raw raw[2], raw_next[2];  // the weights of the step being decoded and of the next
  auto fetch_weights = [&](typename W::Raw (&r)[2], int step) {
#pragma unroll
    for (int i = 0; i < 2; i++)
      if (kX24Unpredicated<T, L> || w_valid[i]) r[i] = W::load(wrow[i], step, fq);
  };
  // L2 prefetches of the weights of the super-block kPrefetchSupers ahead (each row's block by its
  // 4 lanes: offsets 0, 32, 64 and the last byte cover the block's sectors).
  auto prefetch_weights = [&](int sb) {
#pragma unroll
    for (int i = 0; i < 2; i++)
      if (w_valid[i]) prefetch_l2(wrow[i] + (size_t)sb * W::kBytes + min(32 * fq, W::kBytes - 1));
  };
  for (int sb = 0; sb < kPrefetchSupers && sb < nsb; sb++) prefetch_weights(sb);
  if (nsb > 0) {  // (no columns: the outputs are zeros, and no copy may be left in flight)
    copy_super(0, 0);
    fetch_weights(raw, 0);
    fetch_weights(raw_next, 1);
  }

  int acc[kSubTiles][L][4];
  double out[kSubTiles][4] = {};
  // A super-block's activations are staged at once, with one barrier: the copies of super-block
  // sb + 1 go into the other buffer once every warp has passed super-block sb's barrier, so has
  // read super-block sb - 1's; each thread waits for its own copies before the barrier. The
  // weights are read into registers two steps ahead.
  for (int sb = 0; sb < nsb; sb++) {
    const int buf = sb & 1;
#pragma unroll
    for (int s = 0; s < kSubTiles; s++)
#pragma unroll
      for (int l = 0; l < L; l++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[s][l][e] = 0;
    if (sb + kPrefetchSupers < nsb) prefetch_weights(sb + kPrefetchSupers);
    cp_async_wait<0>();
    __syncthreads();
    if (sb + 1 < nsb) copy_super(sb + 1, buf ^ 1);
    // The X8 form's steps two at a time, so that one step's loads and decoding overlap the other's
    // products (fully unrolled, or unrolled in the X24 form, the registers spill).
#pragma unroll(L == 1 ? 2 : 1)
    for (int j = 0; j < kStepsPerSuper; j++) {
      const int step = sb * kStepsPerSuper + j;
      X24Chunk c[2];
#pragma unroll
      for (int i = 0; i < 2; i++) {
        if (kX24Unpredicated<T, L> || w_valid[i]) {
          c[i] = W::decode(raw[i], fq, step, grid32, masks32);
        } else {
          c[i].a[0] = c[i].a[1] = 0;
          c[i].m[0] = c[i].m[1] = 0;
        }
      }
      // The sub-scales once a step, not again in each sub-tile's branch (where the compiler
      // would sink them).
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) asm volatile("" : "+r"(c[i].m[h]));
#pragma unroll
      for (int i = 0; i < 2; i++) raw[i] = raw_next[i];
      if (kX24Unpredicated<T, L>)
        fetch_weights(raw_next, min(step + 2, steps - 1));
      else if (step + 2 < steps)
        fetch_weights(raw_next, step + 2);
      const uint32_t* xw = reinterpret_cast<const uint32_t*>(xs[buf][j]) + 4 * fg + fq;
#pragma unroll
      for (int s = 0; s < kSubTiles; s++) {
        if (s < active) {
#pragma unroll
          for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int l = 0; l < L; l++) {
              const uint32_t b = xw[4 * ((2 * l + h) * kTokens + 8 * s)];
              int d[4];
              if (l == 0)
                imma_16x8x16<true>(d, c[0].a[h], c[1].a[h], b);
              else
                imma_16x8x16<false>(d, c[0].a[h], c[1].a[h], b);
              acc[s][l][0] += c[0].m[h] * d[0];
              acc[s][l][1] += c[0].m[h] * d[1];
              acc[s][l][2] += c[1].m[h] * d[2];
              acc[s][l][3] += c[1].m[h] * d[3];
            }
          }
        }
      }
    }
    {
      // The super-block's sums: N = A0·2^16 + A1·2^8 + A2 (X8: A0), times d/8 of the row and the
      // token's scale (X24: 2^(e-23), each product exact), into the double sums.
      float dw[2];
#pragma unroll
      for (int i = 0; i < 2; i++) dw[i] = w_valid[i] ? W::super_scale(wrow[i], sb) : 0.0f;
#pragma unroll
      for (int s = 0; s < kSubTiles; s++) {
        if (s >= active) continue;
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int t = 8 * s + 2 * fq + e;
          const double xsc = t < tile_n ? sg[(size_t)t * nsb + sb] : 0.0;
#pragma unroll
          for (int i = 0; i < 2; i++) {
            const int k = 2 * i + e;
            double n = (double)acc[s][0][k];
            if constexpr (L == 3) n = fma(n, 65536.0, fma((double)acc[s][1][k], 256.0, (double)acc[s][2][k]));
            out[s][k] = fma(n, (double)dw[i] * xsc, out[s][k]);
          }
        }
      }
    }
  }
  // Results: row tile i (row warp_r + 8i + fg, or the pair's row) at out[s][2i + e], token 8s + 2fq + e.
  store_products<GU, 2, kSubTiles>(yg, rows, r0 + warp_r, fg, fq, tile_t, cnt, active,
                                   [&](int i, int s, int e) { return out[s][2 * i + e]; });
}

template <bool GU>
void launch_x24(GgmlType t, const uint8_t* w, const uint8_t* const* slot_ptrs, size_t w_offset, const uint8_t* w2,
                size_t w2_offset, size_t row_bytes, int rows, int cols, const uint8_t* xq, const double* xscale,
                const int* row_off, const int* row_cnt, int n_groups, int max_tokens, float* y, cudaStream_t stream,
                XForm form) {
  if (!x24_supported(t)) throw_error(std::string("matmul_x24: weight type ") + type_name(t) + " has no X24 product");
  if (cols % kSuper != 0)
    throw_error("matmul_x24: " + std::to_string(cols) + " columns is not a multiple of " + std::to_string(kSuper));
  if (device_info().cc_major < 8) throw_error("matmul_x24: the 8-bit tensor-core products need compute capability 8.0");
  if (rows == 0 || n_groups == 0 || max_tokens == 0) return;
  constexpr int kTileRows = kWarps * (GU ? 8 : 16);
  const dim3 grid((rows + kTileRows - 1) / kTileRows, (max_tokens + kTokens - 1) / kTokens, n_groups);
  dispatch_type(t, [&]<GgmlType T>() {
    if constexpr (kX24Type<T>)
      (form == XForm::kX8 ? x24_kernel<T, GU, 1> : x24_kernel<T, GU, kMaxLimbs>)<<<grid, kThreads, 0, stream>>>(
          w, slot_ptrs, w_offset, w2, w2_offset, row_bytes, rows, cols, xq, xscale, row_off, row_cnt, max_tokens, y);
  });
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace

RL_QUANT_TABLES_UPLOADER(upload_quant_tables_x24)

bool x24_supported(GgmlType t) {  // kX24Type's list, the one the launchers dispatch on
  bool ok = false;
  dispatch_type(t, [&]<GgmlType T>() { ok = kX24Type<T>; });
  return ok;
}

template <int L>
void quantize(const char* what, const float* x, int rows, int cols, uint8_t* xq, double* xscale, double* xsum,
              cudaStream_t stream) {
  if (cols % kSuper != 0)
    throw_error(std::string(what) + ": " + std::to_string(cols) + " columns is not a multiple of " + std::to_string(kSuper));
  if (rows == 0 || cols == 0) return;
  const long warps = (long)rows * (cols / kSuper);
  quantize_kernel<L><<<(unsigned)((warps * 32 + 255) / 256), 256, 0, stream>>>(x, rows, cols, xq, xscale, xsum);
  RL_CUDA_LAUNCH_CHECK();
}

void quantize_x24(const float* x, int rows, int cols, uint8_t* xq, double* xscale, cudaStream_t stream, XForm form) {
  if (form == XForm::kX8)
    quantize<1>("quantize_x24 (X8)", x, rows, cols, xq, xscale, nullptr, stream);
  else
    quantize<kMaxLimbs>("quantize_x24", x, rows, cols, xq, xscale, nullptr, stream);
}

void quantize_x32(const float* x, int rows, int cols, uint8_t* xq, double* xscale, double* xsum, cudaStream_t stream,
                  XForm form) {
  if (form == XForm::kX8)
    quantize<1>("quantize_x32 (X8)", x, rows, cols, xq, xscale, xsum, stream);
  else
    quantize<4>("quantize_x32", x, rows, cols, xq, xscale, xsum, stream);
}

void matmul_x24(GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const uint8_t* xq,
                const double* xscale, int T, float* y, cudaStream_t stream, XForm form) {
  launch_x24<false>(t, static_cast<const uint8_t*>(w), nullptr, 0, nullptr, 0, row_bytes, rows, cols, xq, xscale,
                    nullptr, nullptr, 1, T, y, stream, form);
}

void matmul_x24_experts(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes, int rows,
                        int cols, const uint8_t* xq, const double* xscale, const int* row_off, const int* row_cnt,
                        int n, int max_cnt, float* y, cudaStream_t stream, XForm form) {
  launch_x24<false>(t, nullptr, slot_ptrs, w_offset, nullptr, 0, row_bytes, rows, cols, xq, xscale, row_off, row_cnt,
                    n, max_cnt, y, stream, form);
}

void matmul_x24_gate_up(GgmlType t, const void* gate, const void* up, size_t row_bytes, int rows, int cols,
                        const uint8_t* xq, const double* xscale, int T, float* act, cudaStream_t stream,
                        XForm form) {
  launch_x24<true>(t, static_cast<const uint8_t*>(gate), nullptr, 0, static_cast<const uint8_t*>(up), 0, row_bytes,
                   rows, cols, xq, xscale, nullptr, nullptr, 1, T, act, stream, form);
}

void matmul_x24_experts_gate_up(GgmlType t, const uint8_t* const* slot_ptrs, size_t gate_offset, size_t up_offset,
                                size_t row_bytes, int rows, int cols, const uint8_t* xq, const double* xscale,
                                const int* row_off, const int* row_cnt, int n, int max_cnt, float* act,
                                cudaStream_t stream, XForm form) {
  launch_x24<true>(t, nullptr, slot_ptrs, gate_offset, nullptr, up_offset, row_bytes, rows, cols, xq, xscale, row_off,
                   row_cnt, n, max_cnt, act, stream, form);
}

}  // namespace rl::cuda
