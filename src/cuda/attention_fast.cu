// Gated causal attention with GQA for the fast numeric tier (DESIGN.md §5a). The function is
// attention.cu's gated_attention: query token t at position pos = pos0 + t sees cache rows
// 0 .. pos, out = softmax(q·kᵀ·scale)·v · sigmoid(gate), query head h on KV head h / (n_head / n_kv).
// The arithmetic is fp32, with fp16 tensor-core operands in the prefill. The caches are of any
// --kv-type: the kernels are templates on the cache element, reading it through
// kv_cache_device.cuh's accessor and converting as they load.
//
// Prefill (T > 1): flash attention on tensor cores. A block takes kPrefillRows query rows of one KV
// head, a row being a (token, query head) pair of the heads that share the KV head, so one staging
// of a key tile serves all of them (the 80B's 8 heads a KV head: 8 tokens × 8 heads a block). It
// walks the keys in tiles of kPrefillKeys: K and V rounded to fp16 into shared memory,
// S = Q·Kᵀ by mma.m16n8k16 (fp16 operands, fp32 accumulation), the online softmax in fp32 on S's
// registers (running maximum and sum per row, exp2 with scale·log2(e) folded in), P rounded to
// fp16 in the registers that already form mma's A fragment, O += P·V with V's B fragments by
// ldmatrix.trans. Only tiles that reach past a warp's first row are masked; a warp whose rows all
// end before a tile skips its arithmetic. A chunk of few row tiles given the split buffers also
// splits its key tiles over blocks, each writing partial results that the decode step's combine
// kernel folds, so that a few tokens at depth still fill the GPU.
//
// Decode (T = 1): flash-decoding on tensor cores, attention_fast_decode.cu.
//
// Accuracy (the tests' bounds are argued from this; the decode rounds the same operands). Prefill:
// q, k, v and p are rounded to fp16 (unit roundoff u = 2^-11, an error of RMS ~u/√3 each). A
// score's error then has an RMS of ~u·√(2/3)·σ (σ the scores' spread), which is also the output's
// relative error (the output is a p-weighted mean whose weights move by that much), plus ~u/√3
// from each of p and v: ~1e-3 relative RMS for scores of spread 2. fp16's range (65,504) covers these inputs: q and k are
// RMS-normed, v is a projection of a normed state, p ≤ 1.
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "cuda/attention_fast.cuh"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"

namespace rl::cuda {
namespace fast_attention {
namespace {

// ---- prefill ----------------------------------------------------------------------------------

constexpr int kPrefillWarps = 4;                  // warps a block; each owns 16 query rows (one mma M)
constexpr int kPrefillThreads = 32 * kPrefillWarps;
constexpr int kPrefillRows = 16 * kPrefillWarps;  // (token, head) rows a block: one K/V staging serves them
constexpr int kPrefillKeys = 64;                  // keys a tile: S is 64 fp32 registers' worth a row pair
constexpr int kSmemPad = 8;   // halves after each shared row (16 bytes): fragment loads hit 32 banks
// Bytes of each tile a thread loads at once while staging (4 rows of fp32, 8 of f16): the loads in
// flight, within the registers the hd-256 kernel leaves (it holds a 16×256 fp32 output a warp).
constexpr int kStageBytes = 64;
// A chunk whose row tiles give fewer blocks than this many a multiprocessor has its keys split
// over blocks until they do (within the split buffers): two blocks of 101 KB shared memory fit a
// multiprocessor, so one's loads overlap the other's arithmetic, and a short chunk at depth
// (speculative verification, a prompt's last chunk) does not leave most of them idle.
constexpr int kPrefillSplitBlocksPerSm = 2;

// Shared memory of a block for head dims up to TIER: Q [kPrefillRows][kRow], then K and V
// [kPrefillKeys][kRow], fp16, rows kRow halves apart.
template <int TIER>
struct PrefillTile {
  static constexpr int kRow = TIER + kSmemPad;
  static constexpr size_t kBytes = (size_t)(kPrefillRows + 2 * kPrefillKeys) * kRow * sizeof(__half);
};

// Four 8×8 fp16 tiles, transposed: lanes 8i .. 8i + 7 give the row addresses of tile i; lane l
// receives {tile[2(l%4)][l/4], tile[2(l%4)+1][l/4]} of each, which for rows = keys and columns =
// dims is mma's B fragment of V.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __half* row) {
  const uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// Stages rows into shared fp16 rows of PrefillTile<TIER>::kRow halves, NS tiles at once (K and V
// together, so twice the loads are in flight): tile k's row r gets the first hd values at
// row_ptr(k, r) for r < n_valid, zeros for the rest (a padding key then adds 0·0, a padding query
// scores 0). Columns from hd to TIER are never read. A thread keeps one column of four values and
// takes every kRowStep-th row. row_ptr gives a row as its element type addresses it (KvRow).
template <int TIER, int ROWS, int NS, class Src, class RowPtr>
__device__ __forceinline__ void stage_tiles(__half* const (&dst)[NS], RowPtr row_ptr, int n_valid, int hd, int tid) {
  using Q = KvQuad<Src>;
  constexpr int kQuads = TIER / 4, kRowStep = kPrefillThreads / kQuads, kPer = ROWS / kRowStep;
  constexpr int kStageBatch = kStageBytes / (int)sizeof(typename Q::Raw);
  static_assert(kPrefillThreads % kQuads == 0 && kPer % kStageBatch == 0, "whole rows and batches a thread");
  const int c = tid % kQuads, r_first = tid / kQuads;
  if (4 * c >= hd) return;
#pragma unroll
  for (int b = 0; b < kPer; b += kStageBatch) {
    typename Q::Raw r[NS][kStageBatch];
#pragma unroll
    for (int k = 0; k < NS; k++)
#pragma unroll
      for (int u = 0; u < kStageBatch; u++) {
        const int row = r_first + (b + u) * kRowStep;
        r[k][u] = row < n_valid ? Q::load(row_ptr(k, row), 4 * c) : Q::zero();
      }
#pragma unroll
    for (int k = 0; k < NS; k++)
#pragma unroll
      for (int u = 0; u < kStageBatch; u++) {
        const int row = r_first + (b + u) * kRowStep;
        *reinterpret_cast<uint2*>(dst[k] + row * PrefillTile<TIER>::kRow + 4 * c) = Q::to_half(r[k][u]);
      }
  }
}

int prefill_row_tiles(int T, int group) { return (T * group + kPrefillRows - 1) / kPrefillRows; }

// Block (row tile, KV head): rows R = r0 .. r0 + 63 of the KV head's T·G (token, head) pairs,
// R = t·G + i for query head kvh·G + i of token t. Later tokens (more keys) are scheduled first.
// With n_splits > 1 (blockIdx.z = split) the block takes the split's share of the chunk's key
// tiles and writes each row's unnormalised output, maximum and sum as a partial of (token, head)
// t·n_head + h, which the decode combine kernel folds.
template <int TIER, class E>
__global__ void __launch_bounds__(kPrefillThreads) attention_prefill_fast_kernel(
    const float* __restrict__ q, const float* __restrict__ gate, KvPlane<E> kc, KvPlane<E> vc, float* __restrict__ out, int T, int n_head, int n_kv, int hd, int pos0,
    const int32_t* __restrict__ pos_dev, float scale_log2, int n_splits, float* __restrict__ part_acc,
    float* __restrict__ part_ml) {
  using Tile = PrefillTile<TIER>;
  constexpr int kRow = Tile::kRow, kKeyTiles = kPrefillKeys / 8, kDimTiles = TIER / 8;
  pdl_trigger();  // the output projection follows
  if (pos_dev) pos0 = pos_dev[0];
  extern __shared__ __align__(16) unsigned char prefill_smem[];
  __half* sQ = reinterpret_cast<__half*>(prefill_smem);
  __half* sK = sQ + kPrefillRows * kRow;
  __half* sV = sK + kPrefillKeys * kRow;

  const int G = n_head / n_kv, kvh = blockIdx.y, rows_total = T * G;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * kPrefillRows;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, fg = lane / 4, fq = lane % 4;
  const size_t kv_row = (size_t)n_kv * hd;
  const int kv_off = kvh * hd;
  // The last key a block row sees (a padding row repeats the last real one).
  auto last_key = [&](int r) { return pos0 + min(r0 + r, rows_total - 1) / G; };
  const int wr = warp * 16;
  const int lim[2] = {last_key(wr + fg), last_key(wr + fg + 8)};
  const int warp_first = last_key(wr), warp_last = last_key(wr + 15);
  const int n_keys = last_key(kPrefillRows - 1) + 1;
  // This split's key tiles: an equal share of the chunk's (a share past n_keys leaves m = -inf).
  const int chunk_tiles = (pos0 + T + kPrefillKeys - 1) / kPrefillKeys, z = blockIdx.z;
  const int key_begin = (int)((long long)z * chunk_tiles / n_splits) * kPrefillKeys;
  const int key_end = min(n_keys, (int)((long long)(z + 1) * chunk_tiles / n_splits) * kPrefillKeys);

  __half* const q_tile[1] = {sQ};
  stage_tiles<TIER, kPrefillRows, 1, float>(
      q_tile,
      [&](int, int r) {
        const int R = r0 + r;
        return q + ((size_t)(R / G) * n_head + kvh * G + R % G) * hd;
      },
      min(kPrefillRows, rows_total - r0), hd, tid);
  __half* const kv_tiles[2] = {sK, sV};

  float o[kDimTiles][4];
#pragma unroll
  for (int n = 0; n < kDimTiles; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // running maximum (log2 units), partial sum

  for (int j0 = key_begin; j0 < key_end; j0 += kPrefillKeys) {
    __syncthreads();  // the previous tile is read
    const int valid = min(kPrefillKeys, n_keys - j0);
    stage_tiles<TIER, kPrefillKeys, 2, E>(
        kv_tiles, [&](int k, int r) { return (k == 0 ? kc : vc).row(j0 + r, kv_row, kv_off); }, valid, hd, tid);
    __syncthreads();
    if (j0 > warp_last) continue;  // every row of this warp ends before the tile

    // S = Q·Kᵀ for the warp's 16 rows and the tile's 64 keys.
    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 1
    for (int kk = 0; kk < TIER / 16; kk++) {
      if (16 * kk >= hd) break;
      const __half* qa = sQ + (wr + fg) * kRow + 16 * kk + 2 * fq;
      const uint32_t a[4] = {*reinterpret_cast<const uint32_t*>(qa), *reinterpret_cast<const uint32_t*>(qa + 8 * kRow),
                             *reinterpret_cast<const uint32_t*>(qa + 8),
                             *reinterpret_cast<const uint32_t*>(qa + 8 * kRow + 8)};
#pragma unroll
      for (int n = 0; n < kKeyTiles; n++) {
        const __half* kb = sK + (8 * n + fg) * kRow + 16 * kk + 2 * fq;
        mma_f16(s[n], a, *reinterpret_cast<const uint32_t*>(kb), *reinterpret_cast<const uint32_t*>(kb + 8));
      }
    }

    // Online softmax in log2 units; element e of s[n] is row fg + 8(e/2), key j0 + 8n + 2fq + e%2.
    const bool masked = j0 + kPrefillKeys - 1 > warp_first;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kKeyTiles; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float v = s[n][e] * scale_log2;
        if (masked && j0 + 8 * n + 2 * fq + (e & 1) > lim[e >> 1]) v = -INFINITY;
        s[n][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    float alpha[2], base[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i]);
      base[i] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: every p is 0
      alpha[i] = exp2f(m[i] - base[i]);
      m[i] = m_new;
      l[i] *= alpha[i];
    }
#pragma unroll
    for (int n = 0; n < kKeyTiles; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float p = exp2f(s[n][e] - base[e >> 1]);
        s[n][e] = p;
        l[e >> 1] += p;
      }
#pragma unroll
    for (int n = 0; n < kDimTiles; n++) {
      o[n][0] *= alpha[0], o[n][1] *= alpha[0];
      o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    }

    // O += P·V: S's tiles 2kk and 2kk + 1 are the A fragment of keys 16kk .. 16kk + 15.
    const int mi = lane / 8;
#pragma unroll
    for (int kk = 0; kk < kPrefillKeys / 16; kk++) {
      const uint32_t a[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]), pack_half2(s[2 * kk][2], s[2 * kk][3]),
                             pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const __half* vrow = sV + (16 * kk + (mi & 1) * 8 + lane % 8) * kRow + (mi >> 1) * 8;
#pragma unroll
      for (int np = 0; np < TIER / 16; np++) {
        if (16 * np >= hd) break;
        uint32_t b[4];
        ldmatrix_x4_trans(b, vrow + 16 * np);
        mma_f16(o[2 * np], a, b[0], b[1]);
        mma_f16(o[2 * np + 1], a, b[2], b[3]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; i++) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int R = r0 + wr + fg + 8 * i;
    if (R >= rows_total) continue;
    const size_t vh = (size_t)(R / G) * n_head + kvh * G + R % G, row = vh * hd;
    if (n_splits > 1) {
      const size_t part = vh * n_splits + z;
#pragma unroll
      for (int n = 0; n < kDimTiles; n++) {
        if (8 * n >= hd) break;
        *reinterpret_cast<float2*>(part_acc + part * hd + 8 * n + 2 * fq) = make_float2(o[n][2 * i], o[n][2 * i + 1]);
      }
      if (fq == 0) part_ml[2 * part] = m[i], part_ml[2 * part + 1] = l[i];
      continue;
    }
    const float inv = 1.0f / l[i];
#pragma unroll
    for (int n = 0; n < kDimTiles; n++) {
      if (8 * n >= hd) break;
      const size_t at = row + 8 * n + 2 * fq;
      const float2 gt = *reinterpret_cast<const float2*>(gate + at);
      *reinterpret_cast<float2*>(out + at) = make_float2(o[n][2 * i] * inv * sigmoid_fast(gt.x),
                                                         o[n][2 * i + 1] * inv * sigmoid_fast(gt.y));
    }
  }
}

template <int TIER, class E>
void launch_prefill(const float* q, const float* gate, KvPlane<E> kc, KvPlane<E> vc, float* out, int T,
                    int n_head, int n_kv, int hd, int pos0, const int32_t* pos_dev, float scale_log2,
                    int n_splits, const AttentionSplitsF* sp, cudaStream_t stream) {
  constexpr size_t kBytes = PrefillTile<TIER>::kBytes;
  // Above 48 KiB of dynamic shared memory a kernel must opt in, once per process.
  static const bool opted_in = [] {
    RL_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_fast_kernel<TIER, E>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kBytes));
    return true;
  }();
  (void)opted_in;
  attention_prefill_fast_kernel<TIER, E>
      <<<dim3(prefill_row_tiles(T, n_head / n_kv), n_kv, n_splits), kPrefillThreads, kBytes, stream>>>(
          q, gate, kc, vc, out, T, n_head, n_kv, hd, pos0, pos_dev, scale_log2, n_splits, sp ? sp->acc : nullptr,
          sp ? sp->ml : nullptr);
  RL_CUDA_LAUNCH_CHECK();
}

void check_split_buffers(const AttentionSplitsF& sp, int n_head, int hd) {
  if (sp.max_splits > kFastDecodeMaxSplits || sp.n_head < n_head || sp.hd < hd)
    throw_error("attention (fast): the split buffers hold " + std::to_string(sp.n_head) + " heads of " +
                std::to_string(sp.hd) + " dims, the step has " + std::to_string(n_head) + " of " + std::to_string(hd));
}

// Independent of the position, so a chunk gives the same bits with it on the host or the device
// (splits past a shallow chunk's keys are empty and exit after writing an empty partial).
int chunk_key_splits(int T, int n_head, int n_kv, const AttentionSplitsF* sp) {
  if (!sp || !sp->acc || !sp->ml || T < 2) return 1;
  const int blocks = prefill_row_tiles(T, n_head / n_kv) * n_kv;
  const int want = (kPrefillSplitBlocksPerSm * device_info().sm_count + blocks - 1) / blocks;
  const int n = std::min({want, kFastSplitPartials / T, kFastDecodeMaxSplits});  // the combine weighs ≤ 128
  return std::max(n, 1);
}

// The head shapes and cache types the fast kernels take (every entry point checks them).
void check_shape(int n_head, int n_kv, int hd, KvType kv_type) {
  if (hd < 16 || hd > kMaxHeadDimF || hd % 16 != 0)
    throw_error("attention (fast): head dim " + std::to_string(hd) + " is not a multiple of 16 from 16 to 256");
  if (n_kv <= 0 || n_head <= 0 || n_head % n_kv != 0)
    throw_error("attention (fast): " + std::to_string(n_head) + " query heads do not group over " +
                std::to_string(n_kv) + " KV heads");
  if (kv_type == KvType::kQ8_0 && hd % kKvQ8Block != 0)
    throw_error("attention (fast): a q8_0 cache needs a head dim that is a multiple of 32, not " +
                std::to_string(hd));
}

template <class E>
void gated_attention_fast_impl(const float* q, const float* gate, KvPlane<E> k_cache, KvPlane<E> v_cache,
                               float* out, int T, int n_head, int n_kv, int hd, int pos0, float scale,
                               cudaStream_t stream, const int32_t* pos_dev, const AttentionSplitsF* splits) {
  if (T < 0) throw_error("attention (fast): " + std::to_string(T) + " query tokens");
  if (!pos_dev && pos0 < 0) throw_error("attention (fast): position " + std::to_string(pos0) + " is negative");
  if (T == 0) return;
  const float scale_log2 = scale * kLog2e;
  if (T == 1) {
    if (!splits || !splits->acc || !splits->ml || splits->max_splits <= 0)
      throw_error("attention (fast): a decode step needs the split buffers (AttentionSplitsF)");
    check_split_buffers(*splits, n_head, hd);
    decode_step(q, gate, k_cache, v_cache, out, n_head, n_kv, hd, pos0, pos_dev, scale_log2, *splits, stream);
    return;
  }
  if (splits && splits->acc) check_split_buffers(*splits, n_head, hd);
  const int n_splits = chunk_key_splits(T, n_head, n_kv, splits);
  if (hd <= 64)
    launch_prefill<64>(q, gate, k_cache, v_cache, out, T, n_head, n_kv, hd, pos0, pos_dev, scale_log2, n_splits,
                       splits, stream);
  else if (hd <= 128)
    launch_prefill<128>(q, gate, k_cache, v_cache, out, T, n_head, n_kv, hd, pos0, pos_dev, scale_log2, n_splits,
                        splits, stream);
  else
    launch_prefill<256>(q, gate, k_cache, v_cache, out, T, n_head, n_kv, hd, pos0, pos_dev, scale_log2, n_splits,
                        splits, stream);
  if (n_splits > 1) fold_chunk_splits(*splits, gate, out, T * n_head, hd, n_splits, stream);
}

}  // namespace
}  // namespace fast_attention

int fast_chunk_key_splits(int T, int n_head, int n_kv, const AttentionSplitsF* splits) {
  return fast_attention::chunk_key_splits(T, n_head, n_kv, splits);
}

size_t AttentionSplitsF::bytes(int, int n_head, int hd) {
  return (size_t)kFastSplitPartials * n_head * (hd + 2) * sizeof(float);
}

AttentionSplitsF AttentionSplitsF::within(void* storage, int n_ctx, int n_head, int hd) {
  AttentionSplitsF s;
  s.max_splits = fast_attention::max_decode_splits(n_ctx);
  s.n_head = n_head;
  s.hd = hd;
  s.acc = static_cast<float*>(storage);
  s.ml = s.acc + (size_t)kFastSplitPartials * n_head * hd;
  return s;
}

void gated_attention_fast(const float* q, const float* gate, const KvCacheRef& cache, float* out, int T, int n_head,
                          int n_kv, int hd, int pos0, float scale, cudaStream_t stream, const int32_t* pos_dev,
                          const AttentionSplitsF* splits) {
  fast_attention::check_shape(n_head, n_kv, hd, cache.type);
  with_kv_element(cache.type, [&](auto element) {
    using E = decltype(element);
    const size_t width = (size_t)n_kv * hd;
    fast_attention::gated_attention_fast_impl(q, gate, KvPlane<E>::of(cache.k, cache.n_ctx, width),
                                              KvPlane<E>::of(cache.v, cache.n_ctx, width), out, T, n_head, n_kv, hd,
                                              pos0, scale, stream, pos_dev, splits);
  });
}
void gated_attention_fast_rows(const float* q, const float* gate, const AttentionRow* rows, KvType kv_type,
                               int max_splits, float* out, int B, int n_head, int n_kv, int hd, float scale,
                               const int32_t* pos_dev, cudaStream_t stream) {
  fast_attention::check_shape(n_head, n_kv, hd, kv_type);
  if (B == 0) return;
  if (!rows || !pos_dev) throw_error("attention (fast): a batched step needs its rows and positions on the device");
  if (max_splits < 1 || max_splits > kFastDecodeMaxSplits || B > 65535)
    throw_error("attention (fast): a batched step of " + std::to_string(B) + " rows with " +
                std::to_string(max_splits) + " splits (1 to " + std::to_string(kFastDecodeMaxSplits) + ")");
  with_kv_element(kv_type, [&](auto element) {
    using E = decltype(element);
    fast_attention::decode_rows<E>(q, gate, rows, max_splits, out, B, n_head, n_kv, hd, pos_dev, scale * fast_attention::kLog2e,
                                   stream);
  });
}

void gated_attention_fast(const float* q, const float* gate, const float* k_cache, const float* v_cache, float* out,
                          int T, int n_head, int n_kv, int hd, int pos0, float scale, cudaStream_t stream,
                          const int32_t* pos_dev, const AttentionSplitsF* splits) {
  gated_attention_fast(q, gate, KvCacheRef{const_cast<float*>(k_cache), const_cast<float*>(v_cache), KvType::kF32, 0},
                       out, T, n_head, n_kv, hd, pos0, scale, stream, pos_dev, splits);
}

}  // namespace rl::cuda
