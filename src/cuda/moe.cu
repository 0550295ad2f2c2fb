// Mixture-of-experts glue: router softmax, SwiGLU, and the weighted combine of routed and shared
// experts. The expert products themselves are matvec_experts / matmul_experts on slot pointers.
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"

namespace rl::cuda {

namespace {

constexpr int kSoftmaxThreads = 256;

__global__ void softmax_kernel(const float* logits, float* probs, int n) {
  const float* x = logits + (size_t)blockIdx.x * n;
  float* y = probs + (size_t)blockIdx.x * n;
  __shared__ float red[kSoftmaxThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kSoftmaxThreads) m = fmaxf(m, x[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < kSoftmaxThreads / 32; w++) m = fmaxf(m, red[w]);
  __syncthreads();
  float s = 0.f;
  for (int i = threadIdx.x; i < n; i += kSoftmaxThreads) s += expf(x[i] - m);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) red[warp] = s;
  __syncthreads();
  s = 0.f;
  for (int w = 0; w < kSoftmaxThreads / 32; w++) s += red[w];
  for (int i = threadIdx.x; i < n; i += kSoftmaxThreads) y[i] = expf(x[i] - m) / s;
}

__global__ void swiglu_kernel(const float* gate, const float* up, float* act, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  act[i] = __fmul_rn(silu_f(gate[i]), up[i]);
}

__global__ void combine_kernel(float* x, const float* y, const int32_t* assign, const float* weights,
                               int k, const float* shared, const float* shared_gate, int width) {
  const int t = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= width) return;
  // The oracle: routed sum in double, then (float)routed + shared * sigmoid(gate), which its
  // compiler fuses into one fma; the residual add is a separate fp32 add.
  double routed = 0.0;
  for (int j = 0; j < k; j++)
    routed = fma((double)weights[(size_t)t * k + j], (double)y[(size_t)assign[(size_t)t * k + j] * width + c], routed);
  const float sg = sigmoid_f(shared_gate[t]);
  const float mix = __fmaf_rn(shared[(size_t)t * width + c], sg, (float)routed);
  x[(size_t)t * width + c] = __fadd_rn(x[(size_t)t * width + c], mix);
}

__global__ void gather_kernel(const float* src, const int32_t* idx, float* dst, int width) {
  const int i = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < width) dst[(size_t)i * width + c] = src[(size_t)idx[i] * width + c];
}

constexpr int kRouteThreads = 256;
constexpr int kMaxRouteK = 64;

// One block per token. Dynamic shared memory: exp values [E] (double) then probabilities [E].
__global__ void __launch_bounds__(kRouteThreads) route_kernel(
    const float* logits, int E, int K, float scale, const uint64_t* residency, const uint8_t* fallback,
    int32_t* ids, float* weights, const uint8_t** slot_ptrs, int32_t* miss_count) {
  extern __shared__ double route_smem[];
  double* ex = route_smem;                           // [E]
  float* prob = reinterpret_cast<float*>(ex + E);    // [E]
  __shared__ float warp_p[kRouteThreads / 32];
  __shared__ int warp_i[kRouteThreads / 32];
  __shared__ float sel_p[kMaxRouteK];
  __shared__ int sel_i[kMaxRouteK];
  __shared__ double total;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, n_warps = blockDim.x / 32;

  // Max logit (fp32, exact in any order).
  float m = -INFINITY;
  for (int e = tid; e < E; e += blockDim.x) m = fmaxf(m, logits[e]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) warp_p[warp] = m;
  __syncthreads();
  m = warp_p[0];
  for (int w = 1; w < n_warps; w++) m = fmaxf(m, warp_p[w]);
  const double max_l = m;
  for (int e = tid; e < E; e += blockDim.x) ex[e] = exp((double)logits[e] - max_l);
  __syncthreads();
  // The oracle sums in expert order; a sequential double sum keeps its rounding.
  if (tid == 0) {
    double s = 0.0;
    for (int e = 0; e < E; e++) s += ex[e];
    total = s;
  }
  __syncthreads();
  for (int e = tid; e < E; e += blockDim.x) prob[e] = (float)(ex[e] / total);
  __syncthreads();

  // K rounds of arg-max over (probability desc, index asc): the order of the oracle's
  // partial_sort. A chosen expert is marked -1 (probabilities are >= 0).
  for (int k = 0; k < K; k++) {
    float bp = -2.0f;
    int bi = 0x7fffffff;
    for (int e = tid; e < E; e += blockDim.x) {
      const float p = prob[e];
      if (p > bp || (p == bp && e < bi)) bp = p, bi = e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float op = __shfl_xor_sync(0xffffffffu, bp, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (op > bp || (op == bp && oi < bi)) bp = op, bi = oi;
    }
    if (lane == 0) warp_p[warp] = bp, warp_i[warp] = bi;
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < n_warps; w++)
        if (warp_p[w] > bp || (warp_p[w] == bp && warp_i[w] < bi)) bp = warp_p[w], bi = warp_i[w];
      sel_p[k] = bp;
      sel_i[k] = bi;
      prob[bi] = -1.0f;
    }
    __syncthreads();
  }

  if (tid == 0) {
    double selected = 0.0;
    for (int k = 0; k < K; k++) selected += sel_p[k];
    int misses = 0;
    for (int k = 0; k < K; k++) {
      double wk = sel_p[k] / selected;
      if (scale != 0.0f) wk *= scale;
      ids[k] = sel_i[k];
      weights[k] = (float)wk;
      const uint64_t addr = residency[sel_i[k]];
      if (addr == 0) misses++;
      slot_ptrs[k] = addr ? reinterpret_cast<const uint8_t*>(addr) : fallback;
    }
    *miss_count = misses;
  }
}

}  // namespace

void route_topk(const float* logits, int n_expert, int k, float scale, const uint64_t* residency_row,
                const uint8_t* fallback, int32_t* ids, float* weights, const uint8_t** slot_ptrs,
                int32_t* miss_count, cudaStream_t stream) {
  if (k < 1 || k > kMaxRouteK || k > n_expert)
    throw_error("route_topk: " + std::to_string(k) + " experts per token out of 1.." +
                std::to_string(kMaxRouteK) + " (n_expert " + std::to_string(n_expert) + ")");
  const size_t smem = (size_t)n_expert * (sizeof(double) + sizeof(float));
  if (smem > 48 * 1024) throw_error("route_topk: " + std::to_string(n_expert) + " experts exceed shared memory");
  route_kernel<<<1, kRouteThreads, smem, stream>>>(logits, n_expert, k, scale, residency_row, fallback, ids,
                                                   weights, slot_ptrs, miss_count);
  RL_CUDA_LAUNCH_CHECK();
}

void softmax_rows(const float* logits, float* probs, int T, int n, cudaStream_t stream) {
  if (T == 0) return;
  softmax_kernel<<<T, kSoftmaxThreads, 0, stream>>>(logits, probs, n);
  RL_CUDA_LAUNCH_CHECK();
}

void swiglu(const float* gate, const float* up, float* act, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(gate, up, act, n);
  RL_CUDA_LAUNCH_CHECK();
}

void moe_combine(float* x, const float* y, const int32_t* assign, const float* weights, int k,
                 const float* shared, const float* shared_gate, int T, int width,
                 cudaStream_t stream) {
  if (T == 0) return;
  combine_kernel<<<dim3((width + 255) / 256, T), 256, 0, stream>>>(x, y, assign, weights, k, shared,
                                                                   shared_gate, width);
  RL_CUDA_LAUNCH_CHECK();
}

void gather_rows(const float* src, const int32_t* idx, float* dst, int n, int width,
                 cudaStream_t stream) {
  if (n == 0) return;
  gather_kernel<<<dim3((width + 255) / 256, n), 256, 0, stream>>>(src, idx, dst, width);
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
