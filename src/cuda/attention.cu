// Gated causal attention with GQA over an fp32 KV cache, for one token (decode) or a chunk
// (prefill). One block per (query token, head) streams the keys in tiles of kWarps: each warp scores
// one key, then every thread folds the tile into its output dim with an online softmax (running
// max and sum), so no score buffer of context length is needed. Scores, softmax and the weighted
// sum are in double, as in the oracle (cpu/forward.cpp attention_layer).
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;  // >= head dim: thread d owns output dim d
constexpr int kMaxHeadDim = 256;

__global__ void store_kv_kernel(const float* k, const float* v, float* kc, float* vc, int width,
                                int pos0, const int32_t* pos_dev) {
  if (pos_dev) pos0 = pos_dev[0];
  const int t = blockIdx.y;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
    kc[(size_t)(pos0 + t) * width + i] = k[(size_t)t * width + i];
    vc[(size_t)(pos0 + t) * width + i] = v[(size_t)t * width + i];
  }
}

__global__ void __launch_bounds__(kThreads) gated_attention_kernel(
    const float* q, const float* gate, const float* kc, const float* vc, float* out, int n_head,
    int n_kv, int hd, int pos0, const int32_t* pos_dev, double scale) {
  if (pos_dev) pos0 = pos_dev[0];
  const int h = blockIdx.x, t = blockIdx.y;
  const int kvh = h / (n_head / n_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ float qs[kMaxHeadDim];
  __shared__ double scores[kWarps];
  const float* qh = q + ((size_t)t * n_head + h) * hd;
  for (int i = threadIdx.x; i < hd; i += kThreads) qs[i] = qh[i];
  __syncthreads();

  const int n_keys = pos0 + t + 1;
  const size_t kv_row = (size_t)n_kv * hd;
  double m = -INFINITY, l = 0.0, acc = 0.0;
  for (int j0 = 0; j0 < n_keys; j0 += kWarps) {
    const int j = j0 + warp;
    if (j < n_keys) {
      const float* kj = kc + (size_t)j * kv_row + (size_t)kvh * hd;
      double s = 0.0;
      for (int i = lane; i < hd; i += 32) s = fma((double)qs[i], (double)kj[i], s);
      s = warp_sum_d(s);
      if (lane == 0) scores[warp] = s * scale;
    }
    __syncthreads();
    const int n = min(kWarps, n_keys - j0);
    double tile_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; w++)
      if (w < n) tile_max = fmax(tile_max, scores[w]);
    const double m_new = fmax(m, tile_max);
    const double correction = exp(m - m_new);
    l *= correction;
    acc *= correction;
    const int d = threadIdx.x;
    // The tile's exponentials and value loads first (independent, so they overlap), then the
    // sums in key order as before.
    double p[kWarps];
    float vv[kWarps];
#pragma unroll
    for (int w = 0; w < kWarps; w++) {
      p[w] = w < n ? exp(scores[w] - m_new) : 0.0;
      vv[w] = w < n && d < hd ? vc[(size_t)(j0 + w) * kv_row + (size_t)kvh * hd + d] : 0.0f;
    }
#pragma unroll
    for (int w = 0; w < kWarps; w++) {
      if (w < n) {
        l += p[w];
        if (d < hd) acc = fma(p[w], (double)vv[w], acc);
      }
    }
    m = m_new;
    __syncthreads();
  }
  const int d = threadIdx.x;
  if (d < hd) {
    const size_t o = ((size_t)t * n_head + h) * hd + d;
    out[o] = __fmul_rn((float)(acc / l), sigmoid_f(gate[o]));
  }
}

}  // namespace

void store_kv(const float* k, const float* v, float* k_cache, float* v_cache, int T, int n_kv,
              int hd, int pos0, cudaStream_t stream, const int32_t* pos_dev) {
  if (T == 0) return;
  const int width = n_kv * hd;
  store_kv_kernel<<<dim3((width + 255) / 256, T), 256, 0, stream>>>(k, v, k_cache, v_cache, width, pos0,
                                                                    pos_dev);
  RL_CUDA_LAUNCH_CHECK();
}

void gated_attention(const float* q, const float* gate, const float* k_cache, const float* v_cache,
                     float* out, int T, int n_head, int n_kv, int hd, int pos0, float scale,
                     cudaStream_t stream, const int32_t* pos_dev) {
  if (hd > kMaxHeadDim) throw_error("attention: head dim " + std::to_string(hd) + " > 256");
  if (n_kv <= 0 || n_head % n_kv != 0)
    throw_error("attention: " + std::to_string(n_head) + " heads do not group over " +
                std::to_string(n_kv) + " KV heads");
  if (T == 0) return;
  gated_attention_kernel<<<dim3(n_head, T), kThreads, 0, stream>>>(q, gate, k_cache, v_cache, out,
                                                                  n_head, n_kv, hd, pos0, pos_dev,
                                                                  (double)scale);
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
