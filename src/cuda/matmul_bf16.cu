// Fast-tier prefill products: Y = X·Wᵀ for a batch of tokens on bf16 tensor cores, weights of
// every type the backend runs (dispatch_type).
//
// Arithmetic: each weight is dequantised on the GPU to the oracle's fp32 value (Dequant<T>::chunk8)
// and rounded to bf16, each activation is rounded fp32 → bf16 (both round to nearest even), and
// the products are summed by bf16 MMA (WMMA m16n16k16) with fp32 accumulation. NaN and infinity
// pass through both conversions and the sums, so a NaN input gives NaN outputs as in the oracle.
// Accuracy: a bf16 rounding has relative error at most 2^-8 (≈ 1.7e-3 rms for values spread over a
// binade), so a product w̃·x̃ is off by ≈ 2.4e-3 rms relative and, for sums of independent terms
// of random sign, the normalised squared error Σ(y − ref)²/Σref² is that squared, ≈ 6e-6 (≤ 1e-5);
// fp32 accumulation over K ≤ 10^4 terms adds ~K·2^-48 ≈ 1e-10. The fast tier's bar is 5e-4
// (DESIGN.md §5a), ~50× above.
//
// Shape: a block computes kTileRows = 128 output rows × BN tokens (a SwiGLU pair: 128 rows of
// each matrix), stepping through the columns kTileK = 32 at a time. Each step, the block's
// 256 threads dequantise its weight tile (two or four 8-value chunks each) into a bf16 tile in
// shared memory and convert the step's activations into another; then each of the 8 warps
// multiplies its 16 rows by the block's tokens, one 16×16 accumulator per 16 tokens. A weight is
// thus dequantised once per block and reused over all its tokens: for experts, one block holds a
// whole group (≈10 tokens for a 512-token chunk of the 80B model, ≤ 64), so each expert's tile is
// dequantised once per group; 16-token fragments that lie wholly past the group's last token are
// neither staged nor multiplied. The tiles are double-buffered and a step's global reads (and its
// dequantisation, into registers) are issued before the previous step's products, so that their
// latency overlaps those, with one barrier per step; each row's weight bytes are prefetched into
// L2 a few steps ahead (chunk8 reads only the bytes a chunk needs, which differ per type, so
// there is no type-independent bulk copy to issue instead).
//
// Dense products use 64-token tiles when those give every SM a block and 16-token tiles
// otherwise (small matrices and short chunks: more blocks, each weight dequantised for fewer
// tokens). SwiGLU pairs hold two accumulators per output, so their tiles are 32 tokens or 16 (48
// would fit the 48 KiB of static shared memory but not the 128 registers two blocks an SM leave:
// it spilled). An expert group of more tokens than a tile takes several blocks, each dequantising
// the tile; at ≈10 tokens a group those are few.
//
// Split over the columns: a dense product whose 64-token grid leaves most of the GPU idle (the
// F32 routers, 2048 → 512, and shared gates, 2048 → 1, ssm_ba, 2048 → 64, of a 512-token pass: 8
// to 32 blocks each walking all 2 048 columns) is cut into S slices of whole 256 columns, grid.z
// the slice: each block writes its partial sums to slice s of a scratch [S][T][rows], and
// split_sum_kernel adds the slices in the order s = 0 .. S-1 (fp32), so the result does not depend
// on the blocks' timing. S fills two blocks an SM where the columns and the caller's scratch allow.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"
#include "cuda/quant_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kFrag = 16;                   // WMMA m16n16k16: rows, tokens and columns of a fragment
constexpr int kTileRows = kWarps * kFrag;   // output rows per block: 16 per warp
constexpr int kTileK = 32;                  // columns per step: two k16 MMAs, four 8-value chunks a row
// Staged rows are kTileK + 8 bf16 (80 bytes) apart: the 8 rows of a 16-byte-per-row fragment load
// then fall in 8 distinct groups of 4 banks, and every fragment starts 32-byte aligned (WMMA's rule:
// a multiple of 16 rows, 0 or 16 columns in).
constexpr int kPitch = kTileK + 8;
// Token tiles: dense products 64 (or 16 for small grids), expert groups 64; SwiGLU pairs 32 / 16.
constexpr int kWideTokens = 64, kPairTokens = 32, kNarrowTokens = 16;
constexpr int kSliceCols = 256;  // split products: columns come in slices of whole 256 (every type's block divides it)
constexpr int kChunksPerRow = kTileK / 8;   // chunk8 calls per staged row and step
constexpr int kXPieces = kTileK / 4;        // float4 reads per staged token and step
// How far ahead (in steps) each staged row's weight bytes are prefetched into L2, so that the
// dequantising loads, which a warp waits on, mostly hit L2 rather than DRAM.
constexpr int kPrefetchSteps = 4;

template <int BN, bool GU>
constexpr size_t kStagingBytes = 2 * (size_t)((GU ? 2 : 1) * kTileRows + BN) * kPitch * 2;
static_assert(kStagingBytes<kWideTokens, false> <= 48 * 1024 && kStagingBytes<kPairTokens, true> <= 48 * 1024,
              "the double-buffered tiles fit the static shared memory");
static_assert(kWarps * kFrag * kFrag * 4 <= kTileRows * kPitch * 2,
              "the epilogue's per-warp 16×16 fp32 tiles fit in one weight buffer");

// Two fp32 values as a bf16 pair, the first in the low half (the lower address).
__device__ __forceinline__ uint32_t bf16x2(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Y [cnt][rows] (at y + group offset) = X · Wᵀ for this block's 128 rows and BN tokens. Dense
// products: one group (row_off, row_cnt null; n_tokens tokens), weights at w (and w2, the up matrix
// of a SwiGLU pair). Experts: group blockIdx.z's rows of X and Y start at row_off[g], count
// row_cnt[g], weights at slot_ptrs[g] + w_offset (up: + w2_offset).
//
// GU: each warp's 16 rows are taken from both matrices (weight tile rows 0..127 gate, 128..255 up),
// and it writes SiLU(gate) · up with swiglu's arithmetic.
//
// slice_cols < cols (dense products on the 64-token tile; the other instances carry no slicing
// code): block z computes the columns [z · slice_cols, min(cols, (z + 1) · slice_cols)) into
// y + z · slice_stride; slice_cols is a multiple of 256.
template <GgmlType T, int BN, bool GU>
__global__ void __launch_bounds__(kThreads, 2) matmul_bf16_kernel(
    const uint8_t* w, const uint8_t* w2, const uint8_t* const* slot_ptrs, size_t w_offset, size_t w2_offset,
    size_t row_bytes, int rows, int cols, const float* x, const int* row_off, const int* row_cnt, int n_tokens,
    float* y, int slice_cols, size_t slice_stride) {
#if __CUDA_ARCH__ >= 800
  using namespace nvcuda;
  constexpr int kMats = GU ? 2 : 1;
  constexpr int kWRows = kMats * kTileRows;                        // staged weight rows
  constexpr int kWChunks = kWRows * kChunksPerRow / kThreads;      // chunk8 calls per thread and step
  constexpr int kNF = BN / kFrag;                                  // token fragments
  static_assert(kWRows * kChunksPerRow % kThreads == 0 && BN % kFrag == 0, "whole chunks and fragments");
  __shared__ __align__(128) uint16_t ws[2][kWRows * kPitch];  // bf16 weights [row][k]
  __shared__ __align__(128) uint16_t xs[2][BN * kPitch];      // bf16 activations [token][k]

  const bool sliced = !GU && BN == kWideTokens && slice_cols < cols;
  const int g = sliced ? 0 : blockIdx.z;
  const int k_begin = sliced ? blockIdx.z * slice_cols : 0;
  const int k_end = sliced ? min(cols, k_begin + slice_cols) : cols;
  if (sliced) y += blockIdx.z * slice_stride;
  const int cnt = row_cnt ? row_cnt[g] : n_tokens;
  const int tile_t = blockIdx.y * BN;
  if (tile_t >= cnt) return;  // the whole token tile is past this group's end (block-uniform)
  const int t_first = (row_off ? row_off[g] : 0) + tile_t;  // the tile's first row of X and Y
  const int tile_n = min(BN, cnt - tile_t);
  const int active = (tile_n + kFrag - 1) / kFrag;  // fragments holding at least one token
  const int r0 = blockIdx.x * kTileRows;
  const uint8_t* mats[2] = {slot_ptrs ? slot_ptrs[g] + w_offset : w,
                            GU ? (slot_ptrs ? slot_ptrs[g] + w2_offset : w2) : nullptr};
  const float* xt = x + (size_t)t_first * cols;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  // This thread's chunks of each step: chunk i = tid + u·kThreads is chunk i % 4 of staged row
  // i / 4 (so the 4 lanes of a row read one block); null rows (past `rows`) stage zeros.
  const uint8_t* wrow[kWChunks];
  int wchunk[kWChunks];
#pragma unroll
  for (int u = 0; u < kWChunks; u++) {
    const int i = tid + u * kThreads, srow = i / kChunksPerRow;
    const int r = r0 + srow % kTileRows;
    wchunk[u] = i % kChunksPerRow;
    wrow[u] = r < rows ? (srow < kTileRows ? mats[0] : mats[1]) + (size_t)r * row_bytes : nullptr;
  }
  // L2 prefetch of every staged row's bytes for columns [kc, kc + kSpan), kc a multiple of kSpan:
  // one quant block, or one step of a float type (at most 3 cache lines, one per chunk lane, the
  // fourth lane the last byte's line).
  constexpr int kSpan = Dequant<T>::kValues > kTileK ? Dequant<T>::kValues : kTileK;
  auto prefetch = [&](int kc) {
    const size_t begin = (size_t)(kc / Dequant<T>::kValues) * Dequant<T>::kBytes;
    const size_t end = (size_t)((kc + kSpan) / Dequant<T>::kValues) * Dequant<T>::kBytes;
#pragma unroll
    for (int u = 0; u < kWChunks; u++)
      if (wrow[u]) {
        const size_t at = begin + 128 * (size_t)wchunk[u];
        prefetch_l2(wrow[u] + (at < end ? at : end - 1));
      }
  };
  static_assert(Dequant<T>::kBytes * (kSpan / Dequant<T>::kValues) <= 3 * 128 + 1,
                "a span lies in the 4 lines the chunk lanes prefetch");
  // A step's tiles pass through registers: read() issues the global reads and dequantises (the
  // weights as bf16 pairs, the activations as fp32), write() stores them into a staging buffer.
  // Tokens past the tile's end (inside the last active fragment) are zeros, so no product reads
  // unset memory.
  constexpr int kXItems = (BN * kXPieces + kThreads - 1) / kThreads;  // float4 reads per thread
  const int n_pieces = active * kFrag * kXPieces;
  uint4 wreg[kWChunks];
  float4 xreg[kXItems];
  auto read = [&](int k0) {
#pragma unroll
    for (int u = 0; u < kWChunks; u++) {
      wreg[u] = make_uint4(0, 0, 0, 0);
      if (wrow[u]) {
        float v[8];
        Dequant<T>::chunk8(wrow[u], k0 / 8 + wchunk[u], v);
        wreg[u] = make_uint4(bf16x2(v[0], v[1]), bf16x2(v[2], v[3]), bf16x2(v[4], v[5]), bf16x2(v[6], v[7]));
      }
    }
#pragma unroll
    for (int u = 0; u < kXItems; u++) {
      const int i = tid + u * kThreads, t = i / kXPieces, part = i % kXPieces;
      xreg[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (i < n_pieces && t < tile_n)
        xreg[u] = __ldg(reinterpret_cast<const float4*>(xt + (size_t)t * cols + k0 + 4 * part));
    }
  };
  auto write = [&](int buf) {
#pragma unroll
    for (int u = 0; u < kWChunks; u++) {
      const int i = tid + u * kThreads;
      *reinterpret_cast<uint4*>(&ws[buf][(i / kChunksPerRow) * kPitch + 8 * wchunk[u]]) = wreg[u];
    }
#pragma unroll
    for (int u = 0; u < kXItems; u++) {
      const int i = tid + u * kThreads, t = i / kXPieces, part = i % kXPieces;
      if (i < n_pieces)
        *reinterpret_cast<uint2*>(&xs[buf][t * kPitch + 4 * part]) =
            make_uint2(bf16x2(xreg[u].x, xreg[u].y), bf16x2(xreg[u].z, xreg[u].w));
    }
  };

  wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float> acc[kMats][kNF];
#pragma unroll
  for (int m = 0; m < kMats; m++)
#pragma unroll
    for (int f = 0; f < kNF; f++) wmma::fill_fragment(acc[m][f], 0.0f);

  for (int kc = k_begin; kc < k_begin + kPrefetchSteps * kTileK && kc < k_end; kc += kSpan) prefetch(kc);
  read(k_begin);
  write(0);
  // Step s's products read buffer s % 2 after the barrier that opens step s; before them, the reads
  // of step s + 1 are issued (their latency overlaps the products), and after them that step is
  // written to the other buffer, which every warp finished reading (step s − 1) before the barrier.
  // One barrier per step.
  int buf = 0;
  for (int k0 = k_begin; k0 < k_end; k0 += kTileK, buf ^= 1) {
    __syncthreads();
    const bool more = k0 + kTileK < k_end;
    const int kc = k0 + kPrefetchSteps * kTileK;
    if (kc < k_end && kc % kSpan == 0) prefetch(kc);
    if (more) read(k0 + kTileK);
    const __nv_bfloat16* wb = reinterpret_cast<const __nv_bfloat16*>(ws[buf]);
    const __nv_bfloat16* xb = reinterpret_cast<const __nv_bfloat16*>(xs[buf]);
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += kFrag) {
      wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, __nv_bfloat16, wmma::row_major> a[kMats];
#pragma unroll
      for (int m = 0; m < kMats; m++)
        wmma::load_matrix_sync(a[m], wb + (m * kTileRows + warp * kFrag) * kPitch + kk, kPitch);
#pragma unroll
      for (int f = 0; f < kNF; f++) {
        if (f < active) {
          // B (k × token, column-major) is the staged [token][k] tile as it lies.
          wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, __nv_bfloat16, wmma::col_major> b;
          wmma::load_matrix_sync(b, xb + f * kFrag * kPitch + kk, kPitch);
#pragma unroll
          for (int m = 0; m < kMats; m++) wmma::mma_sync(acc[m][f], a[m], b, acc[m][f]);
        }
      }
    }
    if (more) write(buf ^ 1);
  }

  // Each warp writes its 16 rows × active·16 tokens through a 16×16 fp32 tile of its own (in the
  // weight buffers, free once every warp is past its last products), with bounds on rows and tokens.
  __syncthreads();
  float* tile = reinterpret_cast<float*>(ws[0]) + warp * kFrag * kFrag;
  float* yt = y + (size_t)t_first * rows;
  const int row0 = r0 + warp * kFrag;
#pragma unroll
  for (int f = 0; f < kNF; f++) {
    if (f >= active) continue;
    if constexpr (GU) {
      // Gate and up accumulators of one shape hold the same elements at the same indices.
#pragma unroll
      for (int e = 0; e < acc[0][f].num_elements; e++)
        acc[0][f].x[e] = __fmul_rn(silu_f(acc[0][f].x[e]), acc[1][f].x[e]);
    }
    wmma::store_matrix_sync(tile, acc[0][f], kFrag, wmma::mem_col_major);  // tile[token·16 + row]
    __syncwarp();
    for (int e = lane; e < kFrag * kFrag; e += 32) {
      const int t = f * kFrag + e / kFrag, r = row0 + e % kFrag;
      if (t < tile_n && r < rows) yt[(size_t)t * rows + r] = tile[e];
    }
    __syncwarp();
  }
#else
  __trap();  // the launchers refuse devices below compute capability 8.0
#endif
}

// y[i] = Σ_s part[s · n + i] for s = 0 .. S-1 in that order (fp32): four values a thread where n
// is a multiple of 4 and y and part are 16-byte aligned (kVec), else one.
template <bool kVec>
__global__ void split_sum_kernel(const float* part, int S, size_t n, float* y) {
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if constexpr (kVec) {
    const size_t i = 4 * idx;
    if (i >= n) return;
    float4 a = *reinterpret_cast<const float4*>(part + i);
    for (int s = 1; s < S; s++) {
      const float4 b = *reinterpret_cast<const float4*>(part + (size_t)s * n + i);
      a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
    }
    *reinterpret_cast<float4*>(y + i) = a;
  } else {
    if (idx >= n) return;
    float a = part[idx];
    for (int s = 1; s < S; s++) a += part[(size_t)s * n + idx];
    y[idx] = a;
  }
}

// The launchers' checks, before any CUDA call; each names the launcher and what is wrong.
struct Product {
  const char* who;
  GgmlType t;
  size_t row_bytes;
  int rows, cols;
};
void check_product(const Product& p, const float* x, const float* y) {
  const std::string who = p.who;
  if (!weight_type_supported(p.t))
    throw_error(who + ": weight type " + type_name(p.t) + " is not supported by the CUDA backend");
  const QuantType& q = quant_type(p.t);
  if (p.rows < 0 || p.cols <= 0)
    throw_error(who + ": " + std::to_string(p.rows) + " rows × " + std::to_string(p.cols) + " columns");
  if (p.cols % kTileK != 0 || p.cols % q.block_size != 0)
    throw_error(who + ": " + std::to_string(p.cols) + " columns is not a multiple of " +
                std::to_string(kTileK) + " and of " + type_name(p.t) + "'s block of " + std::to_string(q.block_size));
  if (p.row_bytes < row_size(p.t, p.cols) || p.row_bytes % q.type_size != 0)
    throw_error(who + ": rows " + std::to_string(p.row_bytes) + " bytes apart (a " + type_name(p.t) + " row of " +
                std::to_string(p.cols) + " values is " + std::to_string(row_size(p.t, p.cols)) +
                " bytes; rows must start at whole blocks)");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0) throw_error(who + ": activations not 16-byte aligned (float4 reads)");
}
// The weights' address a block's loads need: as aligned as the block size allows (4, 2 or 1 bytes,
// quant_device.cuh).
void check_weights(const Product& p, const void* w, const char* what) {
  const size_t align = (size_t)alignment_of((int)quant_type(p.t).type_size);
  if (reinterpret_cast<uintptr_t>(w) % align != 0)
    throw_error(std::string(p.who) + ": " + what + " weights not " + std::to_string(align) + "-byte aligned for " +
                type_name(p.t));
}
void check_offset(const Product& p, size_t offset, const char* what) {
  const size_t align = (size_t)alignment_of((int)quant_type(p.t).type_size);
  if (offset % align != 0)
    throw_error(std::string(p.who) + ": " + what + " offset " + std::to_string(offset) + " is not a multiple of " +
                std::to_string(align) + " (" + type_name(p.t) + " blocks' alignment)");
}
void check_groups(const Product& p, const uint8_t* const* slot_ptrs, const int* row_off, const int* row_cnt, int n,
                  int max_cnt) {
  if (n < 0 || max_cnt < 0)
    throw_error(std::string(p.who) + ": " + std::to_string(n) + " groups of at most " + std::to_string(max_cnt) +
                " rows");
  if (!slot_ptrs || !row_off || !row_cnt)
    throw_error(std::string(p.who) + ": slot pointers, row offsets and counts are required");
}
void check_device(const Product& p) {
  if (device_info().cc_major < 8)
    throw_error(std::string(p.who) + ": bf16 tensor cores need compute capability 8.0 or newer");
}

// slices > 1 (a dense product, n_groups 1): the columns in that many slices of slice_cols, the
// partial sums in `part` ([slices][max_tokens][rows]), then added into y.
template <int BN, bool GU>
void launch(const Product& p, const void* w, const void* w2, const uint8_t* const* slot_ptrs, size_t w_offset,
            size_t w2_offset, const float* x, const int* row_off, const int* row_cnt, int n_groups, int max_tokens,
            float* y, cudaStream_t stream, int slices = 1, int slice_cols = 0, float* part = nullptr) {
  if (p.rows == 0 || n_groups == 0 || max_tokens == 0) return;
  if (!x || !y || (!slot_ptrs && (!w || (GU && !w2))))
    throw_error(std::string(p.who) + ": a null activation, output or weight pointer");
  check_device(p);
  const bool sliced = slices > 1;
  const dim3 grid((p.rows + kTileRows - 1) / kTileRows, (max_tokens + BN - 1) / BN, sliced ? slices : n_groups);
  if (grid.y > 65535 || grid.z > 65535)
    throw_error(std::string(p.who) + ": " + std::to_string(max_tokens) + " tokens in " + std::to_string(n_groups) +
                " groups exceed the grid");
  const size_t n = (size_t)max_tokens * p.rows;
  dispatch_type(p.t, [&]<GgmlType T>() {
    matmul_bf16_kernel<T, BN, GU><<<grid, kThreads, 0, stream>>>(
        static_cast<const uint8_t*>(w), static_cast<const uint8_t*>(w2), slot_ptrs, w_offset, w2_offset, p.row_bytes,
        p.rows, p.cols, x, row_off, row_cnt, max_tokens, sliced ? part : y, sliced ? slice_cols : p.cols, n);
  });
  RL_CUDA_LAUNCH_CHECK();
  if (sliced) {
    constexpr int kSumThreads = 256;
    const bool vec =
        n % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 && reinterpret_cast<uintptr_t>(part) % 16 == 0;
    const size_t items = vec ? n / 4 : n;
    const unsigned blocks = (unsigned)((items + kSumThreads - 1) / kSumThreads);
    if (vec)
      split_sum_kernel<true><<<blocks, kSumThreads, 0, stream>>>(part, slices, n, y);
    else
      split_sum_kernel<false><<<blocks, kSumThreads, 0, stream>>>(part, slices, n, y);
    RL_CUDA_LAUNCH_CHECK();
  }
}

// The columns of each slice when `cols` are cut into at most `slices`: whole 256-column slices, as
// even as they go (the last holds the rest).
int slice_width(int cols, int slices) {
  const int units = (cols + kSliceCols - 1) / kSliceCols;
  return (units + slices - 1) / slices * kSliceCols;
}
int slice_count(int cols, int width) { return (cols + width - 1) / width; }

// The dense token tile: `wide` when its grid gives every SM a block, else 16; a forced tile must be
// one of the two.
int dense_tile(const Product& p, int T, int wide, int forced) {
  if (forced != 0 && forced != wide && forced != kNarrowTokens)
    throw_error(std::string(p.who) + ": token tile " + std::to_string(forced) + " (expected " +
                std::to_string(kNarrowTokens) + " or " + std::to_string(wide) + ")");
  if (T < 0) throw_error(std::string(p.who) + ": " + std::to_string(T) + " tokens");
  if (forced != 0) return forced;
  if (p.rows == 0 || T == 0) return wide;
  const long blocks = (long)((p.rows + kTileRows - 1) / kTileRows) * ((T + wide - 1) / wide);
  return blocks >= device_info().sm_count ? wide : kNarrowTokens;
}

}  // namespace

RL_QUANT_TABLES_UPLOADER(upload_quant_tables_bf16)

int matmul_bf16_slices(int rows, int cols, int T, size_t scratch_floats) {
  if (rows <= 0 || T <= 0 || cols < 2 * kSliceCols) return 1;
  const long tiles = (long)((rows + kTileRows - 1) / kTileRows) * ((T + kWideTokens - 1) / kWideTokens);
  const long target = 2L * device_info().sm_count;  // two blocks an SM (__launch_bounds__)
  if (tiles >= target) return 1;
  const long by_grid = (target + tiles - 1) / tiles, by_cols = cols / kSliceCols;
  const long by_scratch = (long)(scratch_floats / ((size_t)T * rows));
  const int s = (int)std::min({by_grid, by_cols, by_scratch});
  return s < 2 ? 1 : slice_count(cols, slice_width(cols, s));
}

void matmul_bf16(GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const float* x, int T, float* y,
                 cudaStream_t stream, int token_tile, float* scratch, size_t scratch_floats, int slices) {
  const Product p{"matmul_bf16", t, row_bytes, rows, cols};
  check_product(p, x, y);
  check_weights(p, w, "the");
  if (slices < 0 || (slices > 1 && slices > cols / kSliceCols))
    throw_error("matmul_bf16: " + std::to_string(slices) + " slices of " + std::to_string(cols) +
                " columns (each at least " + std::to_string(kSliceCols) + ")");
  // Picked only where the caller leaves the tile to the kernel (the split takes the 64-token one).
  const bool tile_free = token_tile == 0 || token_tile == kWideTokens;
  if (slices == 0) slices = scratch && tile_free ? matmul_bf16_slices(rows, cols, T, scratch_floats) : 1;
  if (slices > 1 && T > 0 && rows > 0) {
    const int width = slice_width(cols, slices);
    slices = slice_count(cols, width);
    if (!scratch || scratch_floats < (size_t)slices * T * rows)
      throw_error("matmul_bf16: " + std::to_string(slices) + " slices of " + std::to_string(T) + " × " +
                  std::to_string(rows) + " partial sums, the scratch holds " +
                  std::to_string(scratch ? scratch_floats : 0) + " floats");
    if (token_tile != 0 && token_tile != kWideTokens)
      throw_error("matmul_bf16: split products take the " + std::to_string(kWideTokens) + "-token tile, not " +
                  std::to_string(token_tile));
    launch<kWideTokens, false>(p, w, nullptr, nullptr, 0, 0, x, nullptr, nullptr, 1, T, y, stream, slices, width,
                               scratch);
    return;
  }
  if (dense_tile(p, T, kWideTokens, token_tile) == kWideTokens)
    launch<kWideTokens, false>(p, w, nullptr, nullptr, 0, 0, x, nullptr, nullptr, 1, T, y, stream);
  else
    launch<kNarrowTokens, false>(p, w, nullptr, nullptr, 0, 0, x, nullptr, nullptr, 1, T, y, stream);
}

void matmul_bf16_experts(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes, int rows,
                         int cols, const float* x, const int* row_off, const int* row_cnt, int n, int max_cnt,
                         float* y, cudaStream_t stream) {
  const Product p{"matmul_bf16_experts", t, row_bytes, rows, cols};
  check_product(p, x, y);
  check_offset(p, w_offset, "weight");
  check_groups(p, slot_ptrs, row_off, row_cnt, n, max_cnt);
  launch<kWideTokens, false>(p, nullptr, nullptr, slot_ptrs, w_offset, 0, x, row_off, row_cnt, n, max_cnt, y, stream);
}

void matmul_bf16_gate_up(GgmlType t, const void* gate, const void* up, size_t row_bytes, int rows, int cols,
                         const float* x, int T, float* act, cudaStream_t stream, int token_tile) {
  const Product p{"matmul_bf16_gate_up", t, row_bytes, rows, cols};
  check_product(p, x, act);
  check_weights(p, gate, "gate");
  check_weights(p, up, "up");
  if (dense_tile(p, T, kPairTokens, token_tile) == kPairTokens)
    launch<kPairTokens, true>(p, gate, up, nullptr, 0, 0, x, nullptr, nullptr, 1, T, act, stream);
  else
    launch<kNarrowTokens, true>(p, gate, up, nullptr, 0, 0, x, nullptr, nullptr, 1, T, act, stream);
}

void matmul_bf16_experts_gate_up(GgmlType t, const uint8_t* const* slot_ptrs, size_t gate_offset, size_t up_offset,
                                 size_t row_bytes, int rows, int cols, const float* x, const int* row_off,
                                 const int* row_cnt, int n, int max_cnt, float* act, cudaStream_t stream) {
  const Product p{"matmul_bf16_experts_gate_up", t, row_bytes, rows, cols};
  check_product(p, x, act);
  check_offset(p, gate_offset, "gate");
  check_offset(p, up_offset, "up");
  check_groups(p, slot_ptrs, row_off, row_cnt, n, max_cnt);
  launch<kPairTokens, true>(p, nullptr, nullptr, slot_ptrs, gate_offset, up_offset, x, row_off, row_cnt, n, max_cnt,
                            act, stream);
}

}  // namespace rl::cuda
