// Prefill products: Y = X·Wᵀ for a batch of tokens, weights of any supported type.
//
// FP64 tensor cores (DMMA, mma.m16n8k4 f64 on compute capability 9.0, see dmma_16x8x4). The
// arithmetic is the oracle's: an fp32 weight times an fp32 activation is exact in double, the
// products are summed in double (in DMMA's order, which the oracle does not fix), only the sum is
// rounded to fp32. No reduced-precision format is used. (The IQ types enter as w·2^-600 against
// x·2^600: the same exact products, see WeightFetch.)
//
// A block computes RT·64 weight rows × BT tokens (a SwiGLU pair: 64 rows of each matrix),
// stepping through the columns kTileK = 32 at a time. Each of the 8 warps owns RT·8 rows and all
// BT tokens, as RT × BT/8 accumulator tiles of 8×8. The weights never pass through shared memory:
// lane (g, q) = (lane/4, lane%4) dequantises chunk q (columns 8q..8q+7 of the step) of row g of
// each of its row tiles, and those eight values are exactly its A fragments for the step's eight
// k4 mma's once the step's columns are taken in the order j, 8+j, 16+j, 24+j for mma j (a
// permutation of the sum, applied to both operands). The activations are staged once per step in
// shared memory as double (fp32→fp64 conversion is exact but slow, so each element is converted
// once per block), double-buffered so that one barrier per step suffices.
//
// Dense products use 64-, 32- or 16-token tiles (matmul() picks by block count) and, when even
// then the grid leaves SMs idle, split their columns over clusters of 2 or 4 blocks. Experts see
// about T·k/n_expert tokens each (≈10 for a 512-token chunk of the 80B model), so they use
// 16-token tiles (measured on an H200 faster than 32-token ones for such groups); in every tile,
// 8-token sub-tiles that lie wholly past the group's last token are neither staged nor
// multiplied. With tiles of up to 32 tokens the next step's activations (and the IQ types' raw
// weight fields) are read into registers during the current step.
#include <cooperative_groups.h>

#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"
#include "cuda/quant_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kTileK = 32;     // columns per step: 4 chunks of 8, one per lane of a fragment row
// Tiles: tokens per block and 8-row tiles per warp (a block covers 64·row tiles weight rows).
constexpr int kDenseTokens = 64, kMidTokens = 32, kDenseRowTiles = 2;
constexpr int kExpertTokens = 16, kExpertRowTiles = 2;
static_assert(kDenseRowTiles % 2 == 0 && kExpertRowTiles % 2 == 0, "row tiles go in pairs (dmma_16x8x4)");

// The staged activations are [kTileK][BT] doubles, element (k, t) at k·(BT+4) + 2·(k/4) + t. A
// fragment load reads k = 8q + j, t = t0 + g: the pitch BT+4 ≡ 4 (mod 16 doubles) puts j in the
// same bank group for every q, and the skew 2·(k/4) = 4q + 2(j/4) then separates the four q, so
// the 16 lanes of a half-warp hit distinct 8-byte banks; the staging stores (lanes spread over
// tokens and over k in steps of 4) are separated by the same skew.
template <int BT>
__host__ __device__ constexpr int x_index(int k, int t) {
  return k * (BT + 4) + 2 * (k >> 2) + t;
}
// The products read element (8q + j, 8s + g) as a lane's base x_index(8q, g) plus the compile-time
// x_index(j, 8s) (j < 8): true of this layout for every q, j, s, g (asserted in matmul_kernel).
template <int BT>
constexpr bool x_index_splits() {
  for (int q = 0; q < 4; q++)
    for (int j = 0; j < 8; j++)
      for (int s = 0; s < BT / 8; s++)
        for (int g = 0; g < 8; g++)
          if (x_index<BT>(8 * q + j, 8 * s + g) != x_index<BT>(8 * q, g) + x_index<BT>(j, 8 * s)) return false;
  return true;
}
template <int BT>
constexpr int kXTileDoubles = kTileK * (BT + 4) + 2 * (kTileK / 4);

// The IQ types' weights enter the products in their integer form (quant_device.cuh), scaled:
// w_j = s·(u_j − b) is formed as fma(u_j·2^-1074, s·2^474, −b·s·2^-600) = w_j·2^-600 — the byte
// u_j placed in the low word of a double is the subnormal u_j·2^-1074, the product and the sum
// are exact (w_j has at most 24 significant bits), so fma returns w_j·2^-600 exactly — and the
// activations are staged as x·2^600 (exact), so every product w_j·x is the same exact value as
// before. One fma per weight replaces an int→fp32 and an fp32→fp64 conversion (which run at a
// quarter of the fp64 rate; measured, they were not what limits the expert products). Other
// types: chunk8, then to double.
template <GgmlType T>
constexpr double kXScale = kIntegerForm<T> ? 0x1p600 : 1.0;

// A lane's weights of one chunk: fetch() issues the reads, decode() forms a Chunk whose value(j)
// is the A operand of the step's mma j. The integer form keeps its raw fields in registers between
// the two, so a step's reads can be issued a step ahead, and its Chunk is the bytes and the scale,
// each value formed by one fma right before its mma; other types read in decode() (chunk8) and
// hold the eight fp32 values.
template <GgmlType T>
struct WeightFetch {
  struct Chunk {
    float v[8];
    __device__ double value(int j) const { return (double)v[j]; }
  };
  __device__ void fetch(const uint8_t*, int) {}
  template <class Tables>
  __device__ Chunk decode(const uint8_t* row, int c, const Tables&) const {
    Chunk k;
    Dequant<T>::chunk8(row, c, k.v);
    return k;
  }
  __device__ static Chunk zero() { return {}; }
};
template <GgmlType T>
  requires kIntegerForm<T>
struct WeightFetch<T> {
  using Q = Dequant<T>;
  struct Chunk {
    uint2 u;
    double s, nb;  // s·2^474 and −b·s·2^-600
    __device__ double value(int j) const {
      return fma(__hiloint2double(0, (int)__byte_perm(j < 4 ? u.x : u.y, 0, 0x4440 | (j & 3))), s, nb);
    }
  };
  typename Q::Raw raw;
  __device__ void fetch(const uint8_t* row, int c) { raw = Q::load(row, c); }
  template <class Tables>
  __device__ Chunk decode(const uint8_t*, int c, const Tables& tab) const {
    const IqChunk k = Q::decode(raw, c, tab.grid);
    return {k.u, (double)k.s * 0x1p474, -((double)k.b * (double)k.s) * 0x1p-600};
  }
  __device__ static Chunk zero() { return {make_uint2(0, 0), 0.0, 0.0}; }
};

// S > 1 (dense products whose grid would leave SMs idle): the columns are split over a cluster of S
// blocks (blockIdx.x = row block · S + split), each summing its share; block 0 of the cluster then
// adds the others' partial sums in split order through distributed shared memory, one 8-token
// sub-tile at a time through the activation buffers (free by then), so the result does not
// depend on scheduling.
//
// GU (a SwiGLU pair of one type and row size): row tile 0 of each warp is rows of the gate matrix
// (w, or slot + w_offset), row tile 1 the same rows of the up matrix (w2, or slot + w2_offset),
// so a lane holds both sums of each of its outputs and writes y = SiLU(gate) · up, as swiglu does.
template <GgmlType T, int BT, int RT, int S, bool GU>
__global__ void __launch_bounds__(kThreads, BT <= kExpertTokens ? 4 : 2) matmul_kernel(
    const uint8_t* w, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes, int rows,
    int cols, const float* x, const int* row_off, const int* row_cnt, int n_tokens, float* y,
    const uint8_t* w2, size_t w2_offset) {
  static_assert(!GU || RT == 2, "a gate/up pair is the warp's two row tiles");
  static_assert(x_index_splits<BT>(), "the B-fragment address splits per lane (see the mma loop)");
  constexpr int kTileRows = kWarps * (GU ? 1 : RT) * 8;
  constexpr int TT = BT / 8;  // 8-token sub-tiles
  __shared__ double xs[2][kXTileDoubles<BT>];

  const int g = blockIdx.z;
  const int t0_group = row_off ? row_off[g] : 0;
  const int cnt = row_cnt ? row_cnt[g] : n_tokens;
  const int tile_t = blockIdx.y * BT;
  if (tile_t >= cnt) return;  // the whole token tile is past this group's end
  // The codebook in shared memory when it fits beside the activation tiles (IQ1_M's 16 KiB does
  // not beside 64-token tiles).
  constexpr bool kStageTables = sizeof xs + GridOf<T>::kEntries * 8 + 1024 <= 48 * 1024;
  const SharedTables<T, kStageTables, false> tab;
  // Tokens of this tile that exist; sub-tiles j < active hold at least one of them (block-uniform).
  const int tile_n = min(BT, cnt - tile_t);
  const int active = (tile_n + 7) / 8;
  const int split = (int)blockIdx.x % S;
  const int r0 = (int)blockIdx.x / S * kTileRows;
  // This block's columns: whole steps of kTileK, ceil(steps / S) a split; the last splits may be
  // shorter or empty (an empty one adds zeros and still takes part in every cluster barrier).
  const int steps = cols / kTileK, per = (steps + S - 1) / S;
  const int k_begin = min(steps, split * per) * kTileK, k_end = min(steps, (split + 1) * per) * kTileK;
  const uint8_t* base = slot_ptrs ? slot_ptrs[g] + w_offset : w;
  const float* xg = x + (size_t)(t0_group + tile_t) * cols;
  float* yg = y + (size_t)t0_group * rows;

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int fg = lane >> 2, fq = lane & 3;  // fragment coordinates (see dmma_16x8x4)
  const int warp_r = warp * ((GU ? 1 : RT) * 8);  // first tile row of this warp
  double acc[RT][TT][2] = {};

  // Row tile i of this warp: lane reads chunk fq of row warp_r + 8i + fg (zeros past `rows`).
  const uint8_t* wrow[RT];
  bool w_valid[RT];
#pragma unroll
  for (int i = 0; i < RT; i++) {
    const int r = r0 + warp_r + (GU ? 0 : 8 * i) + fg;
    w_valid[i] = r < rows;
    const uint8_t* b = GU && i == 1 ? (slot_ptrs ? slot_ptrs[g] + w2_offset : w2) : base;
    wrow[i] = b + (size_t)(w_valid[i] ? r : 0) * row_bytes;
  }

  // A step's global reads (activations, and the integer form's weight fields) are issued together,
  // and with tiles of up to 32 tokens a step ahead, before the previous step's products, so their
  // latency overlaps those (64-token tiles have no registers to spare for that: their accumulators
  // take 64).
  constexpr bool kAhead = BT <= kMidTokens;
  constexpr int kXItems = (BT * (kTileK / 4) + kThreads - 1) / kThreads;  // float4 pieces per thread
  const int n_items = active * 8 * (kTileK / 4);
  float4 xr[kAhead ? kXItems : 1];
  WeightFetch<T> wf[RT];
  // Piece i of the step at column k0: 4 activations of token i / 8 (zeros past the tile's tokens,
  // or when the piece is not `wanted`).
  auto load_x = [&](int i, int k0, bool wanted) {
    const int t = i / (kTileK / 4), part = i % (kTileK / 4);
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < tile_n && wanted) a = *reinterpret_cast<const float4*>(xg + (size_t)t * cols + k0 + 4 * part);
    return a;
  };
  auto fetch_weights = [&](int k0) {
#pragma unroll
    for (int i = 0; i < RT; i++)
      if (w_valid[i]) wf[i].fetch(wrow[i], k0 / 8 + fq);
  };
  auto fetch = [&](int k0) {  // kAhead: the step's activations into registers, and its weights
#pragma unroll
    for (int u = 0; u < kXItems; u++) xr[u] = load_x(tid + u * kThreads, k0, tid + u * kThreads < n_items);
    fetch_weights(k0);
  };
  if (kAhead && k_begin < k_end) fetch(k_begin);
  int buf = 0;
  for (int k0 = k_begin; k0 < k_end; k0 += kTileK, buf ^= 1) {
    // Activations of the active sub-tiles: active·8 × 32 floats in float4 pieces, 8 per token;
    // tokens past the end (inside the last partial sub-tile) are zero.
    double* xb = xs[buf];
    auto stage = [&](int i, float4 a) {
      const int t = i / (kTileK / 4), part = i % (kTileK / 4);
      xb[x_index<BT>(4 * part + 0, t)] = (double)a.x * kXScale<T>;
      xb[x_index<BT>(4 * part + 1, t)] = (double)a.y * kXScale<T>;
      xb[x_index<BT>(4 * part + 2, t)] = (double)a.z * kXScale<T>;
      xb[x_index<BT>(4 * part + 3, t)] = (double)a.w * kXScale<T>;
    };
    if constexpr (kAhead) {
#pragma unroll
      for (int u = 0; u < kXItems; u++)
        if (tid + u * kThreads < n_items) stage(tid + u * kThreads, xr[u]);
    } else {
      fetch_weights(k0);
      for (int i = tid; i < n_items; i += kThreads) stage(i, load_x(i, k0, true));
    }
    typename WeightFetch<T>::Chunk v[RT];
#pragma unroll
    for (int i = 0; i < RT; i++) v[i] = w_valid[i] ? wf[i].decode(wrow[i], k0 / 8 + fq, tab) : WeightFetch<T>::zero();
    if (kAhead && k0 + kTileK < k_end) fetch(k0 + kTileK);
    __syncthreads();
    // mma j covers the step's columns j, 8+j, 16+j, 24+j: lane (g, q) supplies column 8q + j.
    // x_index(8q + j, 8s + g) = x_index(8q, g) + x_index(j, 8s) for j < 8 (x_index_splits): one
    // base a lane, the rest compile-time offsets (the compiler had rebuilt the whole address in
    // every sub-tile branch under the 64-register cap).
    const double* xl = xb + x_index<BT>(8 * fq, fg);
#pragma unroll
    for (int j = 0; j < 8; j++) {
      double a[RT];
#pragma unroll
      for (int i = 0; i < RT; i++) a[i] = v[i].value(j);
#pragma unroll
      for (int s = 0; s < TT; s++) {
        if (s < active) {
          const double b = xl[x_index<BT>(j, 8 * s)];
#pragma unroll
          for (int i = 0; i < RT; i += 2) dmma_16x8x4(acc[i][s], acc[i + 1][s], a[i], a[i + 1], b);
        }
      }
    }
  }
  if constexpr (S > 1) {
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    double* part = &xs[0][0];  // RT·2 doubles per thread: 8 KiB, within xs for every BT
    static_assert(sizeof xs >= kThreads * RT * 2 * sizeof(double), "the partial sums fit in xs");
#pragma unroll
    for (int s = 0; s < TT; s++) {
      if (s >= active) continue;  // block-uniform, and the same in every block of the cluster
      cluster.sync();  // xs is no longer read (products, or the previous sub-tile's sums)
      if (split != 0) {
#pragma unroll
        for (int i = 0; i < RT; i++)
#pragma unroll
          for (int e = 0; e < 2; e++) part[(i * 2 + e) * kThreads + tid] = acc[i][s][e];
      }
      cluster.sync();
      if (split == 0) {
        for (int r = 1; r < S; r++) {
          const double* remote = cluster.map_shared_rank(part, r);
#pragma unroll
          for (int i = 0; i < RT; i++)
#pragma unroll
            for (int e = 0; e < 2; e++) acc[i][s][e] += remote[(i * 2 + e) * kThreads + tid];
        }
      }
    }
    cluster.sync();  // no block leaves while block 0 may still read its shared memory
    if (split != 0) return;
  }
  // D fragment: row warp_r + 8i + fg, tokens 8s + 2fq + {0, 1}.
  store_products<GU, RT, TT>(yg, rows, r0 + warp_r, fg, fq, tile_t, cnt, active,
                             [&](int i, int s, int e) { return acc[i][s][e]; });
}

template <int BT, int RT, int S = 1, bool GU = false>
void launch(GgmlType t, const void* w, const uint8_t* const* slot_ptrs, size_t w_offset,
            size_t row_bytes, int rows, int cols, const float* x, const int* row_off,
            const int* row_cnt, int n_groups, int max_tokens, float* y, cudaStream_t stream,
            const void* w2 = nullptr, size_t w2_offset = 0) {
  if (cols % kTileK != 0) throw_error("matmul: " + std::to_string(cols) + " columns is not a multiple of " + std::to_string(kTileK));
  if (rows == 0 || n_groups == 0 || max_tokens == 0) return;
  static_assert(!GU || S == 1, "SwiGLU pairs have no column-split launch");
  constexpr int kTileRows = kWarps * (GU ? 1 : RT) * 8;
  const uint8_t* wb2 = static_cast<const uint8_t*>(w2);
  const dim3 grid((rows + kTileRows - 1) / kTileRows * S, (max_tokens + BT - 1) / BT, n_groups);
  const bool ok = dispatch_type(t, [&]<GgmlType T>() {
    const uint8_t* wb = static_cast<const uint8_t*>(w);
    if constexpr (S == 1) {
      matmul_kernel<T, BT, RT, 1, GU><<<grid, kThreads, 0, stream>>>(wb, slot_ptrs, w_offset, row_bytes, rows, cols,
                                                                       x, row_off, row_cnt, max_tokens, y, wb2,
                                                                       w2_offset);
    } else {
      // Clusters of S blocks along x (the splits of one row block). Split blocks never return
      // early: they are only launched for dense products (row_off null), whose tiles all hold tokens.
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = grid;
      cfg.blockDim = dim3(kThreads);
      cfg.stream = stream;
      cudaLaunchAttribute attr;
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = S;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      RL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, matmul_kernel<T, BT, RT, S, false>, wb, slot_ptrs, w_offset, row_bytes,
                                       rows, cols, x, row_off, row_cnt, max_tokens, y, wb2, w2_offset));
    }
  });
  if (!ok) throw_error(std::string("matmul: weight type ") + type_name(t) + " is not supported by the CUDA backend");
  RL_CUDA_LAUNCH_CHECK();
}

template <GgmlType T>
__global__ void get_rows_kernel(const uint8_t* w, size_t row_bytes, int cols, const int32_t* ids,
                                float* out) {
  const int t = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols / 8) return;
  float v[8];
  Dequant<T>::chunk8(w + (size_t)ids[t] * row_bytes, c, v);
#pragma unroll
  for (int j = 0; j < 8; j++) out[(size_t)t * cols + 8 * c + j] = v[j];
}

// A dense product with S column splits (1, 2 or 4).
template <int BT, int RT>
void launch_dense(int S, GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const float* x, int T,
                  float* y, cudaStream_t stream) {
  if (S == 4)
    launch<BT, RT, 4>(t, w, nullptr, 0, row_bytes, rows, cols, x, nullptr, nullptr, 1, T, y, stream);
  else if (S == 2)
    launch<BT, RT, 2>(t, w, nullptr, 0, row_bytes, rows, cols, x, nullptr, nullptr, 1, T, y, stream);
  else
    launch<BT, RT, 1>(t, w, nullptr, 0, row_bytes, rows, cols, x, nullptr, nullptr, 1, T, y, stream);
}

}  // namespace

RL_QUANT_TABLES_UPLOADER(upload_quant_tables_matmul)

void matmul(GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const float* x, int T,
            float* y, cudaStream_t stream, int token_tile, int k_splits) {
  if (token_tile != 0 && token_tile != kExpertTokens && token_tile != kMidTokens && token_tile != kDenseTokens)
    throw_error("matmul: token tile " + std::to_string(token_tile) + " (expected 16, 32 or 64)");
  if (k_splits != 0 && k_splits != 1 && k_splits != 2 && k_splits != 4)
    throw_error("matmul: " + std::to_string(k_splits) + " column splits (expected 1, 2 or 4)");
  const int sms = device_info().sm_count;
  const bool clusters = device_info().cc_major >= 9;
  // The largest token tile that gives at least half a block per SM: 64 tokens, else 32, else 16
  // (small matrices — router, shared expert — and short chunks). Smaller tiles dequantise each
  // weight for fewer tokens; too few blocks leave SMs idle. (On the H200, 2048-row products of a
  // 512-token chunk, 128 blocks, took as long with 64-token tiles as with 32, and 4096-row ones,
  // 256 blocks, 27 % less with 64; bench_cuda_kernels --filter 'prefill/matmul/ssm_(z|out)' times
  // both at each tile.) Fewer blocks than SMs left: the columns are split over
  // clusters of 2 or 4 blocks (compute capability 9.0), at most one split per two steps.
  const long row_blocks = (rows + kWarps * kDenseRowTiles * 8 - 1) / (kWarps * kDenseRowTiles * 8);
  auto blocks = [&](int bt) { return row_blocks * ((T + bt - 1) / bt); };
  if (token_tile == 0) token_tile = 2 * blocks(kDenseTokens) >= sms ? kDenseTokens
                                    : 2 * blocks(kMidTokens) >= sms   ? kMidTokens
                                                                      : kExpertTokens;
  const int steps = cols / kTileK;
  if (k_splits == 0) {
    const long b = blocks(token_tile);
    k_splits = !clusters || b >= sms ? 1 : 2 * b >= sms ? 2 : 4;
    while (k_splits > 1 && 2 * k_splits > steps) k_splits /= 2;
  }
  if (k_splits > 1 && !clusters) throw_error("matmul: column splits need compute capability 9.0");
  if (token_tile == kDenseTokens)
    launch_dense<kDenseTokens, kDenseRowTiles>(k_splits, t, w, row_bytes, rows, cols, x, T, y, stream);
  else if (token_tile == kMidTokens)
    launch_dense<kMidTokens, kDenseRowTiles>(k_splits, t, w, row_bytes, rows, cols, x, T, y, stream);
  else
    launch_dense<kExpertTokens, kExpertRowTiles>(k_splits, t, w, row_bytes, rows, cols, x, T, y, stream);
}

void matmul_experts(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes,
                    int rows, int cols, const float* x, const int* row_off, const int* row_cnt,
                    int n, int max_cnt, float* y, cudaStream_t stream) {
  launch<kExpertTokens, kExpertRowTiles>(t, nullptr, slot_ptrs, w_offset, row_bytes, rows, cols, x,
                                         row_off, row_cnt, n, max_cnt, y, stream);
}

void matmul_gate_up(GgmlType t, const void* gate, const void* up, size_t row_bytes, int rows, int cols,
                    const float* x, int T, float* act, cudaStream_t stream) {
  launch<kExpertTokens, kExpertRowTiles, 1, true>(t, gate, nullptr, 0, row_bytes, rows, cols, x, nullptr, nullptr,
                                                  1, T, act, stream, up, 0);
}

void matmul_experts_gate_up(GgmlType t, const uint8_t* const* slot_ptrs, size_t gate_offset, size_t up_offset,
                            size_t row_bytes, int rows, int cols, const float* x, const int* row_off,
                            const int* row_cnt, int n, int max_cnt, float* act, cudaStream_t stream) {
  launch<kExpertTokens, kExpertRowTiles, 1, true>(t, nullptr, slot_ptrs, gate_offset, row_bytes, rows, cols, x,
                                                  row_off, row_cnt, n, max_cnt, act, stream, nullptr, up_offset);
}

void get_rows(GgmlType t, const void* w, size_t row_bytes, int cols, const int32_t* ids, int T,
              float* out, cudaStream_t stream) {
  if (cols % 8 != 0) throw_error("get_rows: " + std::to_string(cols) + " columns is not a multiple of 8");
  if (T == 0) return;
  const dim3 grid((cols / 8 + 127) / 128, T);
  const bool ok = dispatch_type(t, [&]<GgmlType T_>() {
    get_rows_kernel<T_><<<grid, 128, 0, stream>>>(static_cast<const uint8_t*>(w), row_bytes, cols,
                                                  ids, out);
  });
  if (!ok) throw_error(std::string("get_rows: type ") + type_name(t) + " is not supported by the CUDA backend");
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
