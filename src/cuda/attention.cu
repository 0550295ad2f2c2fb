// Gated causal attention with GQA over an fp32 KV cache, for one token (decode) or a chunk
// (prefill). One block per head and QT query tokens (1 for decode, 4 for a chunk) streams the keys
// in steps of kTile = 32: each warp scores four keys for every query, warp i takes query i's step
// maximum and 32 exponentials (once per key, not once per thread), then every thread folds the
// step into its output dim with an online softmax
// (running max and sum), so no score buffer of context length is needed. Scores, softmax and the
// weighted sum are in double, as in the oracle (cpu/forward.cpp attention_layer).
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

// attention_prep: one warp per (head, token). Query heads (blockIdx.x < n_head): split the query
// from attn_q's output, RMSNorm it with q_norm, rotate; key/value heads: RMSNorm and rotate the key
// into the cache row pos_dev[0] + t, copy the value. The norm forms its sum of squares as rms_norm's
// warp-per-row kernel does (float4 groups, lane-strided) and rope_pair is rope_neox's arithmetic,
// so the result equals the six separate kernels bit for bit.
__device__ __forceinline__ void warp_rms_norm_row(const float* src, const float* __restrict__ w, float* dst, int hd,
                                                  float eps, int lane) {
  double ss = 0.0;
  for (int i = 4 * lane; i < hd; i += 128) {
    const float4 a = *reinterpret_cast<const float4*>(src + i);
    double s4 = (double)a.x * a.x;
    s4 = fma((double)a.y, (double)a.y, s4);
    s4 = fma((double)a.z, (double)a.z, s4);
    ss += fma((double)a.w, (double)a.w, s4);
  }
  ss = warp_sum_d(ss);
  const double scale = 1.0 / sqrt(ss / (double)hd + (double)eps);
  for (int i = 4 * lane; i < hd; i += 128) {
    const float4 a = *reinterpret_cast<const float4*>(src + i);
    const float4 b = *reinterpret_cast<const float4*>(w + i);
    *reinterpret_cast<float4*>(dst + i) = make_float4((float)(a.x * scale * b.x), (float)(a.y * scale * b.y),
                                                      (float)(a.z * scale * b.z), (float)(a.w * scale * b.w));
  }
}

__global__ void __launch_bounds__(32) attention_prep_kernel(
    const float* __restrict__ qg, const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ q,
    float* __restrict__ gate, const float* __restrict__ q_norm, const float* __restrict__ k_norm, float* kc, float* vc,
    int n_head, int n_kv, int hd, float eps, int n_rot, float theta_scale, const int32_t* __restrict__ pos_dev) {
  const int hh = blockIdx.x, t = blockIdx.y, lane = threadIdx.x, half = n_rot / 2;
  const float pos = (float)pos_dev[t];
  float* dst;
  if (hh < n_head) {
    const float* src = qg + ((size_t)t * n_head + hh) * 2 * hd;
    dst = q + ((size_t)t * n_head + hh) * hd;
    float* g = gate + ((size_t)t * n_head + hh) * hd;
    for (int i = lane; i < hd; i += 32) g[i] = src[hd + i];
    warp_rms_norm_row(src, q_norm, dst, hd, eps, lane);
  } else {
    const int j = hh - n_head;
    const size_t row = (size_t)(pos_dev[0] + t) * n_kv * hd + (size_t)j * hd;
    dst = kc + row;
    const float* vs = v + ((size_t)t * n_kv + j) * hd;
    for (int i = lane; i < hd; i += 32) vc[row + i] = vs[i];
    warp_rms_norm_row(k + ((size_t)t * n_kv + j) * hd, k_norm, dst, hd, eps, lane);
  }
  __syncwarp();  // the rotation pairs values other lanes wrote
  for (int i = lane; i < half; i += 32) rope_pair(dst, i, half, pos, theta_scale);
}

constexpr int kKeysPerWarp = 4;
constexpr int kTile = kWarps * kKeysPerWarp;  // keys per step
constexpr int kPrefillQueries = 4;            // query tokens per block for T > 1

// QT consecutive query tokens of one head per block (prefill: 4; decode: 1). Every key and value
// is read and converted once per block for all QT queries; each query keeps its own running max,
// sum and output, and sees only its own keys: for query i, keys past its position are left out of
// the step (a step wholly past it multiplies by exp(0) = 1 and adds nothing), so each query's
// arithmetic is exactly what a block of its own would do.
template <int QT>
__global__ void __launch_bounds__(kThreads) gated_attention_kernel(
    const float* q, const float* gate, const float* kc, const float* vc, float* out, int T, int n_head,
    int n_kv, int hd, int pos0, const int32_t* pos_dev, double scale) {
  pdl_trigger();  // the output projection follows
  if (pos_dev) pos0 = pos_dev[0];
  const int h = blockIdx.x, t0 = blockIdx.y * QT, nq = min(QT, T - t0);
  const int kvh = h / (n_head / n_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ double qs[QT][kMaxHeadDim];
  __shared__ double scores[QT][kTile];
  __shared__ double probs[QT][kTile];
  __shared__ double step[QT][2];  // each query's new running max and the correction exp(m - m_new)
  for (int i = threadIdx.x; i < QT * hd; i += kThreads) {
    const int qi = i / hd, c = i % hd;
    qs[qi][c] = qi < nq ? (double)q[((size_t)(t0 + qi) * n_head + h) * hd + c] : 0.0;
  }
  __syncthreads();

  int n_keys[QT];  // query i sees keys 0 .. pos0 + t0 + i
#pragma unroll
  for (int i = 0; i < QT; i++) n_keys[i] = pos0 + t0 + min(i, nq - 1) + 1;
  const int n_all = n_keys[QT - 1];
  const size_t kv_row = (size_t)n_kv * hd;
  const int d = threadIdx.x;
  double m[QT], l[QT], acc[QT];
#pragma unroll
  for (int i = 0; i < QT; i++) m[i] = -INFINITY, l[i] = 0.0, acc[i] = 0.0;
  for (int j0 = 0; j0 < n_all; j0 += kTile) {
    // Scores: warp w takes keys j0 + 4w .. j0 + 4w + 3, the four dot products side by side, for
    // every query.
    double s[kKeysPerWarp * QT] = {};  // key kk, query i at kk·QT + i
#pragma unroll
    for (int kk = 0; kk < kKeysPerWarp; kk++) {
      const int j = min(j0 + warp * kKeysPerWarp + kk, n_all - 1);
      const float* kj = kc + (size_t)j * kv_row + (size_t)kvh * hd;
      for (int c = lane; c < hd; c += 32) {
        const double kd = kj[c];
#pragma unroll
        for (int i = 0; i < QT; i++) s[kk * QT + i] = fma(qs[i][c], kd, s[kk * QT + i]);
      }
    }
    {
      int p;
      const double v = warp_sum_scatter(s, lane, p);
      if (lane % (32 / (kKeysPerWarp * QT)) == 0) scores[p % QT][warp * kKeysPerWarp + p / QT] = v * scale;
    }
    __syncthreads();
    // Warp i (< QT): query i's step maximum, then each of its keys' exponential once (lane: key
    // j0 + lane).
    if (warp < QT) {
      const int i = warp;
      double mi = m[0];  // m[i] and n_keys[i] without indexing registers by a run-time value
      int nk = n_keys[0];
#pragma unroll
      for (int k = 1; k < QT; k++)
        if (i == k) mi = m[k], nk = n_keys[k];
      const int n = min(kTile, nk - j0);
      double tmax = lane < n ? scores[i][lane] : -INFINITY;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) tmax = fmax(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      const double m_new = fmax(mi, tmax);
      probs[i][lane] = lane < n ? exp(scores[i][lane] - m_new) : 0.0;
      if (lane == 0) step[i][0] = m_new, step[i][1] = exp(mi - m_new);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < QT; i++) {
      const double correction = step[i][1];
      m[i] = step[i][0];
      l[i] *= correction;
      acc[i] *= correction;
    }
    const int n_step = min(kTile, n_all - j0);
    float vv[kTile];
#pragma unroll
    for (int w = 0; w < kTile; w++)
      vv[w] = w < n_step && d < hd ? vc[(size_t)(j0 + w) * kv_row + (size_t)kvh * hd + d] : 0.0f;
    // The sums in key order. A key past query i's last (or past the step's end) has probs 0 and,
    // past the step's end, v 0, so adding p and p·v = ±0 leaves l and acc as they were (at most
    // the sign of a zero acc changes) and no branch per key and query is needed. The keys past
    // query i but in the block's range are later tokens' values: were one of them Inf or NaN,
    // 0·v would carry it into query i's output, which its own decode call would not see.
#pragma unroll
    for (int w = 0; w < kTile; w++) {
      const double vd = vv[w];
#pragma unroll
      for (int i = 0; i < QT; i++) {
        l[i] += probs[i][w];
        acc[i] = fma(probs[i][w], vd, acc[i]);
      }
    }
  }
  if (d < hd) {
#pragma unroll
    for (int i = 0; i < QT; i++) {
      if (i >= nq) break;
      const size_t o = ((size_t)(t0 + i) * n_head + h) * hd + d;
      out[o] = __fmul_rn((float)(acc[i] / l[i]), sigmoid_f(gate[o]));
    }
  }
}

}  // namespace

void attention_prep(const float* qg, const float* k, const float* v, float* q, float* gate, const float* q_norm,
                    const float* k_norm, float* k_cache, float* v_cache, int T, int n_head, int n_kv, int hd,
                    float eps, int n_rot, float theta_scale, const int32_t* pos_dev, cudaStream_t stream) {
  if (hd % 4 != 0 || n_rot > hd || n_rot % 2 != 0)
    throw_error("attention_prep: head dim " + std::to_string(hd) + " / rotary dims " + std::to_string(n_rot));
  if (T == 0) return;
  attention_prep_kernel<<<dim3(n_head + n_kv, T), 32, 0, stream>>>(qg, k, v, q, gate, q_norm, k_norm, k_cache,
                                                                   v_cache, n_head, n_kv, hd, eps, n_rot,
                                                                   theta_scale, pos_dev);
  RL_CUDA_LAUNCH_CHECK();
}

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
  if (T == 1)
    gated_attention_kernel<1><<<dim3(n_head, 1), kThreads, 0, stream>>>(q, gate, k_cache, v_cache, out, T, n_head,
                                                                       n_kv, hd, pos0, pos_dev, (double)scale);
  else
    gated_attention_kernel<kPrefillQueries><<<dim3(n_head, (T + kPrefillQueries - 1) / kPrefillQueries), kThreads, 0,
                                              stream>>>(q, gate, k_cache, v_cache, out, T, n_head, n_kv, hd, pos0,
                                                        pos_dev, (double)scale);
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
