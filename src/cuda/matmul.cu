// Prefill products: Y = X·Wᵀ for a batch of tokens, weights of any supported type.
//
// Classic shared-memory tiling: a block computes a tile of kTileRows weight rows × BT tokens,
// stepping through the columns kTileK at a time. Each step dequantises the weight tile once into
// shared memory (fp32), so a weight byte is read once per BT tokens; each thread then accumulates
// 4 rows × BT/16 tokens in registers. BT = 64 for dense matrices; 16 for experts, which see about
// T·k/n_expert tokens each (≈10 for a 512-token chunk of the 80B model), so a 64-token tile would
// be mostly empty.
// Accumulation is in double, as in matvec.cu and the oracle (see there for why).
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/quant_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kTileRows = 64;  // 16 thread rows × 4 rows each
constexpr int kTileK = 32;     // 4 chunks of 8 per row: one chunk per thread per step

template <GgmlType T, int BT>
__global__ void __launch_bounds__(kThreads) matmul_kernel(
    const uint8_t* w, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes, int rows,
    int cols, const float* x, const int* row_off, const int* row_cnt, int n_tokens, float* y) {
  constexpr int TN = BT / 16;  // tokens per thread
  __shared__ float ws[kTileK][kTileRows + 4];
  __shared__ float xs[kTileK][BT + 4];

  const int g = blockIdx.z;
  const int t0_group = row_off ? row_off[g] : 0;
  const int cnt = row_cnt ? row_cnt[g] : n_tokens;
  const int tile_t = blockIdx.y * BT;
  if (tile_t >= cnt) return;
  const int r0 = blockIdx.x * kTileRows;
  const uint8_t* base = slot_ptrs ? slot_ptrs[g] + w_offset : w;
  const float* xg = x + (size_t)t0_group * cols;
  float* yg = y + (size_t)t0_group * rows;

  const int tid = threadIdx.x;
  const int ty = tid / 16, tx = tid % 16;  // ty: rows 4ty..4ty+3, tx: tokens tx, tx+16, ...
  double acc[4][TN] = {};

  // Weight loading: thread tid dequantises chunk (tid % 4) of tile row (tid / 4).
  const int lr = tid / 4, lc = tid % 4;
  const bool w_valid = r0 + lr < rows;
  const uint8_t* wrow = base + (size_t)(r0 + (w_valid ? lr : 0)) * row_bytes;

  for (int k0 = 0; k0 < cols; k0 += kTileK) {
    float v[8];
    if (w_valid) {
      Dequant<T>::chunk8(wrow, k0 / 8 + lc, v);
    } else {
#pragma unroll
      for (int j = 0; j < 8; j++) v[j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) ws[lc * 8 + j][lr] = v[j];
    // Activations: BT × 32 floats, in float4 pieces.
    for (int i = tid; i < BT * kTileK / 4; i += kThreads) {
      const int t = i / (kTileK / 4), part = i % (kTileK / 4);
      float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
      if (tile_t + t < cnt) a = *reinterpret_cast<const float4*>(xg + (size_t)(tile_t + t) * cols + k0 + 4 * part);
      xs[4 * part + 0][t] = a.x;
      xs[4 * part + 1][t] = a.y;
      xs[4 * part + 2][t] = a.z;
      xs[4 * part + 3][t] = a.w;
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < kTileK; k++) {
      const float4 wv = *reinterpret_cast<const float4*>(&ws[k][4 * ty]);
      float xv[TN];
#pragma unroll
      for (int j = 0; j < TN; j++) xv[j] = xs[k][tx + 16 * j];
#pragma unroll
      for (int j = 0; j < TN; j++) {
        const double xd = xv[j];
        acc[0][j] = fma((double)wv.x, xd, acc[0][j]);
        acc[1][j] = fma((double)wv.y, xd, acc[1][j]);
        acc[2][j] = fma((double)wv.z, xd, acc[2][j]);
        acc[3][j] = fma((double)wv.w, xd, acc[3][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < TN; j++) {
    const int t = tile_t + tx + 16 * j;
    if (t >= cnt) continue;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int r = r0 + 4 * ty + i;
      if (r < rows) yg[(size_t)t * rows + r] = (float)acc[i][j];
    }
  }
}

template <int BT>
void launch(GgmlType t, const void* w, const uint8_t* const* slot_ptrs, size_t w_offset,
            size_t row_bytes, int rows, int cols, const float* x, const int* row_off,
            const int* row_cnt, int n_groups, int max_tokens, float* y, cudaStream_t stream) {
  if (cols % kTileK != 0) throw_error("matmul: " + std::to_string(cols) + " columns is not a multiple of " + std::to_string(kTileK));
  if (rows == 0 || n_groups == 0 || max_tokens == 0) return;
  const dim3 grid((rows + kTileRows - 1) / kTileRows, (max_tokens + BT - 1) / BT, n_groups);
  const bool ok = dispatch_type(t, [&]<GgmlType T>() {
    matmul_kernel<T, BT><<<grid, kThreads, 0, stream>>>(static_cast<const uint8_t*>(w), slot_ptrs,
                                                          w_offset, row_bytes, rows, cols, x,
                                                          row_off, row_cnt, max_tokens, y);
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

}  // namespace

RL_QUANT_TABLES_UPLOADER(upload_quant_tables_matmul)

void matmul(GgmlType t, const void* w, size_t row_bytes, int rows, int cols, const float* x, int T,
            float* y, cudaStream_t stream) {
  launch<64>(t, w, nullptr, 0, row_bytes, rows, cols, x, nullptr, nullptr, 1, T, y, stream);
}

void matmul_experts(GgmlType t, const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes,
                    int rows, int cols, const float* x, const int* row_off, const int* row_cnt,
                    int n, int max_cnt, float* y, cudaStream_t stream) {
  launch<16>(t, nullptr, slot_ptrs, w_offset, row_bytes, rows, cols, x, row_off, row_cnt, n,
             max_cnt, y, stream);
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
