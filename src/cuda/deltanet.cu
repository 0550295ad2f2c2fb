// Gated DeltaNet: the causal depthwise conv, the gates, and the recurrence (DESIGN.md §1).
//
// The recurrence runs one warp per R rows of the state S [nv][dv][dk] (recurrence_kernel; R = 2,
// or 1 where dv is not a multiple of 16), tokens in order exactly as the oracle processes them.
// The arithmetic is the oracle's (cpu/forward.cpp deltanet_layer): sums and the state update in
// double, the state stored as fp32 after each step; the dot products' double sums are formed as a
// warp tree instead of left to right, which moves a rounded fp32 result only in the rarest ties.
#include "cuda/cuda_check.h"
#include "cuda/deltanet_conv.cuh"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"

namespace rl::cuda {

namespace {

// The conv and the gates in the oracle's arithmetic (deltanet_conv.cuh).
__global__ void conv1d_silu_tokens_kernel(const float* __restrict__ x, size_t x_stride, float* __restrict__ out,
                                          const float* __restrict__ state, const float* __restrict__ w, int T, int C,
                                          int K) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
  if (c >= C) return;
  out[(size_t)t * C + c] = conv1d_silu_token<ConvExact>(x, x_stride, state, w, t, C, K, c);
}

// state[i] = input at time T-(K-1)+i: ascending i reads old entries before they are replaced.
__global__ void conv_state_kernel(const float* __restrict__ x, size_t x_stride, float* state, int T, int C, int K) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int i = 0; i < K - 1; i++)
    state[(size_t)i * C + c] = i + T < K - 1 ? state[(size_t)(i + T) * C + c] : x[(size_t)(T - (K - 1) + i) * x_stride + c];
}

__global__ void conv1d_silu_kernel(const float* x, size_t x_stride, float* out, float* state, const float* w, int T,
                                   int C, int K) {
  conv1d_silu_channel<ConvExact>(x, x_stride, out, state, w, T, C, K, blockIdx.x * blockDim.x + threadIdx.x);
}

__global__ void gates_kernel(const float* ba, const float* dt_bias, const float* ssm_a, float* beta, float* g, int T,
                             int nk, int nv) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < T * nv) deltanet_gate<ConvExact>(ba, dt_bias, ssm_a, beta, g, nk, nv, i / nv, i % nv);
}

// Both in one launch (short chunks): the first conv_blocks blocks run the conv, the rest the gates.
__global__ void conv_gates_kernel(const float* x, size_t x_stride, float* out, float* state, const float* w, int T,
                                  int C, int K, const float* ba, const float* dt_bias, const float* ssm_a, float* beta,
                                  float* g, int nk, int nv, int conv_blocks) {
  if ((int)blockIdx.x < conv_blocks) {
    conv1d_silu_channel<ConvExact>(x, x_stride, out, state, w, T, C, K, blockIdx.x * blockDim.x + threadIdx.x);
    return;
  }
  const int i = (blockIdx.x - conv_blocks) * blockDim.x + threadIdx.x;
  if (i < T * nv) deltanet_gate<ConvExact>(ba, dt_bias, ssm_a, beta, g, nk, nv, i / nv, i % nv);
}

constexpr int kRecurrenceWarps = 8;  // warps per block (all on rows of one value head)
constexpr int kStepGroup = 16;       // tokens whose k and q a block stages at a time

// One warp per R rows of S (value head j, rows `row` .. row + R - 1): lane l keeps the DK/32
// consecutive state values of each row starting at l*DK/32 in registers for the whole chunk, so
// the state is read and written once per call with coalesced accesses, and the dv*nv/R warps of a
// layer run in parallel. Each token is a dependent step: decay, s·k (double, warp sum), the delta,
// the update and s·q (double, warp sum).
//
// The state values are fp32 values (the oracle stores the state as fp32 after each step) held in
// double registers: each update rounds to fp32 and back, and the products take them as they are.
// The block's warps share a head, so k and q are converted to double once per block, kStepGroup
// tokens at a time, into shared memory (warp w stages tokens w, w + 8, ...), instead of once per
// warp (fp32<->fp64 conversions run at a quarter of the fp64 rate): 25.9 -> 22.6 ms per 512-token
// chunk of the 80B model on the H200. The state's two roundings per value and step remain.
//
// R = 2: a warp's two rows share the loads of k and q, and their sums of a step travel together
// (warp_sum_scatter: 5 exchanges for two sums instead of 10, then one to give every lane the other
// row's s·k); each sum is bit for bit warp_sum_d's, so R = 1 and R = 2 give identical results. The
// per-token chain is bound by the latency of the exchanges and shared-memory loads: R = 2 took the
// 512-token chunk's recurrence from 22.6 to 16.9 ms on the H200 (prefill 2481 -> 2565 tok/s;
// decode, where it runs too, 191.9 -> 193.1 tok/s in the same call; bench_cuda_kernels --filter
// recurrence times one layer's call of each, 36 layers a chunk). Four rows a warp measured no
// faster (two calls) and was removed.
//
// NORM (decode, DK = 128): q and k arrive as the conv wrote them and the staging warp
// L2-normalises them (q then scaled by q_scale) with l2_norm_kernel's arithmetic on the same
// partition (lane l: values 4l..4l+3, a warp tree of double sums): bit for bit what l2_norm followed
// by the plain recurrence gives, one launch fewer per layer. The normalised values are not stored.
__device__ __forceinline__ void l2_normalise4(float (&x)[4], float eps, float scale) {
  double ss = (double)x[0] * x[0];
  ss = fma((double)x[1], (double)x[1], ss);
  ss = fma((double)x[2], (double)x[2], ss);
  ss = fma((double)x[3], (double)x[3], ss);
  ss = warp_sum_d(ss);
  const double inv = 1.0 / sqrt(ss + (double)eps);
#pragma unroll
  for (int i = 0; i < 4; i++) x[i] = __fmul_rn((float)(x[i] * inv), scale);
}

// The R row sums of v over the warp: every lane gets both (R = 1 or 2).
template <int R>
__device__ __forceinline__ void row_sums(double (&v)[R], int lane) {
  if constexpr (R == 1) {
    v[0] = warp_sum_d(v[0]);
  } else {
    int p = 0;
    const double mine = warp_sum_scatter<2>(v, lane, p);  // row p's sum
    const double other = __shfl_xor_sync(0xffffffffu, mine, 16);  // lanes 16 apart hold the other row
    v[0] = p == 0 ? mine : other;
    v[1] = p == 0 ? other : mine;
  }
}

template <int DK, bool NORM, int R>
__global__ void __launch_bounds__(32 * kRecurrenceWarps)
    recurrence_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                      size_t stride, const float* __restrict__ beta, const float* __restrict__ g, float* S,
                      float* __restrict__ out, int T, int nk, int nv, int dv, float q_scale, float eps) {
  constexpr int P = DK / 32;
  static_assert(!NORM || P == 4, "the fused L2 norm takes four values per lane");
  static_assert(R == 1 || R == 2, "one or two rows a warp");
  __shared__ double ks[kStepGroup][DK], qs[kStepGroup][DK];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gr = (blockIdx.x * kRecurrenceWarps + warp) * R;  // first row (of nv * dv: the grid is exact)
  const int j = gr / dv, row = gr % dv;
  const int kh = j / (nv / nk);
  double s[R][P];
  float* Sr = S + (size_t)gr * DK + lane * P;
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int i = 0; i < P; i++) s[r][i] = Sr[r * DK + i];
  const size_t koff = (size_t)kh * DK + lane * P, voff = (size_t)j * dv + row;
  for (int t0 = 0; t0 < T; t0 += kStepGroup) {
    const int n = min(kStepGroup, T - t0);
    __syncthreads();  // the previous group's k and q are no longer read
    for (int i = warp; i < n; i += kRecurrenceWarps) {
      float kk[P], qq[P];
#pragma unroll
      for (int e = 0; e < P; e++)
        kk[e] = k[(size_t)(t0 + i) * stride + koff + e], qq[e] = q[(size_t)(t0 + i) * stride + koff + e];
      if constexpr (NORM) {
        l2_normalise4(kk, eps, 1.0f);
        l2_normalise4(qq, eps, q_scale);
      }
#pragma unroll
      for (int e = 0; e < P; e++) ks[i][lane * P + e] = kk[e], qs[i][lane * P + e] = qq[e];
    }
    // Lane l fetches token t0+l's decay exp(g), beta and v up front, and the steps take them by
    // shuffle, so the exponential and the scalar loads leave the dependent chain.
    const int tl = t0 + lane;
    double dec_l = 0.0, b_l = 0.0;
    float v_l[R] = {};
    if (lane < n) {
      dec_l = exp((double)g[(size_t)tl * nv + j]);
      b_l = beta[(size_t)tl * nv + j];
#pragma unroll
      for (int r = 0; r < R; r++) v_l[r] = v[(size_t)tl * stride + voff + r];
    }
    __syncthreads();
    for (int i = 0; i < n; i++) {
      const double decay = __shfl_sync(0xffffffffu, dec_l, i);
      const double bt = __shfl_sync(0xffffffffu, b_l, i);
      double kd[P], qd[P];
#pragma unroll
      for (int e = 0; e < P; e++) kd[e] = ks[i][lane * P + e], qd[e] = qs[i][lane * P + e];
      double sk[R] = {};
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int e = 0; e < P; e++) {
          s[r][e] = (double)(float)(s[r][e] * decay);
          sk[r] = fma(s[r][e], kd[e], sk[r]);
        }
      row_sums<R>(sk, lane);
      double o[R] = {};
#pragma unroll
      for (int r = 0; r < R; r++) {
        const float vt = __shfl_sync(0xffffffffu, v_l[r], i);
        const double d = ((double)vt - sk[r]) * bt;
#pragma unroll
        for (int e = 0; e < P; e++) {
          s[r][e] = (double)(float)fma(d, kd[e], s[r][e]);
          o[r] = fma(s[r][e], qd[e], o[r]);
        }
      }
      float* ot = out + (size_t)(t0 + i) * nv * dv + voff;
      int p = 0;
      const double sum = warp_sum_scatter<R>(o, lane, p);  // row p's; lanes 32 / R apart hold the others
      if ((lane & (32 / R - 1)) == 0) ot[p] = (float)sum;
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int i = 0; i < P; i++) Sr[r * DK + i] = (float)s[r][i];
}

}  // namespace

void conv1d_silu(const float* x, size_t x_stride, float* out, float* state, const float* w, int T,
                 int C, int K, cudaStream_t stream) {
  if (K < 2 || K > kMaxConvKernel)
    throw_error("deltanet: conv kernel " + std::to_string(K) + " outside [2, 8]");
  if (T == 0) return;
  if (T <= 8) {  // decode and short chunks: one pass over the tokens per channel
    conv1d_silu_kernel<<<(C + 127) / 128, 128, 0, stream>>>(x, x_stride, out, state, w, T, C, K);
    RL_CUDA_LAUNCH_CHECK();
    return;
  }
  conv1d_silu_tokens_kernel<<<dim3((C + 127) / 128, T), 128, 0, stream>>>(x, x_stride, out, state, w, T, C, K);
  RL_CUDA_LAUNCH_CHECK();
  conv_state_advance(x, x_stride, state, T, C, K, stream);
}

void conv_state_advance(const float* x, size_t x_stride, float* state, int T, int C, int K, cudaStream_t stream) {
  conv_state_kernel<<<(C + 127) / 128, 128, 0, stream>>>(x, x_stride, state, T, C, K);
  RL_CUDA_LAUNCH_CHECK();
}

void deltanet_conv_gates(const float* x, size_t x_stride, float* out, float* state, const float* w, int T, int C,
                         int K, const float* ba, const float* dt_bias, const float* ssm_a, float* beta, float* g,
                         int nk, int nv, cudaStream_t stream) {
  if (T > 8 || K < 2 || K > kMaxConvKernel) {
    deltanet_gates(ba, dt_bias, ssm_a, beta, g, T, nk, nv, stream);
    conv1d_silu(x, x_stride, out, state, w, T, C, K, stream);
    return;
  }
  if (T == 0) return;
  const int conv_blocks = (C + 127) / 128, gate_blocks = (T * nv + 127) / 128;
  conv_gates_kernel<<<conv_blocks + gate_blocks, 128, 0, stream>>>(x, x_stride, out, state, w, T, C, K, ba, dt_bias,
                                                                   ssm_a, beta, g, nk, nv, conv_blocks);
  RL_CUDA_LAUNCH_CHECK();
}

void deltanet_gates(const float* ba, const float* dt_bias, const float* ssm_a, float* beta,
                    float* g, int T, int nk, int nv, cudaStream_t stream) {
  if (T == 0) return;
  gates_kernel<<<(T * nv + 127) / 128, 128, 0, stream>>>(ba, dt_bias, ssm_a, beta, g, T, nk, nv);
  RL_CUDA_LAUNCH_CHECK();
}

void deltanet_recurrence(const float* q, const float* k, const float* v, size_t qkv_stride,
                         const float* beta, const float* g, float* S, float* out, int T, int nk,
                         int nv, int dk, int dv, cudaStream_t stream, const L2Norm* norm, int rows_per_warp) {
  if (T == 0) return;
  if (rows_per_warp == 0) rows_per_warp = dv % (2 * kRecurrenceWarps) == 0 ? 2 : 1;
  if (rows_per_warp != 1 && rows_per_warp != 2)
    throw_error("deltanet: " + std::to_string(rows_per_warp) + " rows a warp (expected 1 or 2)");
  const int rows_per_block = kRecurrenceWarps * rows_per_warp;
  if (dv % rows_per_block != 0)
    throw_error("deltanet: value head dim " + std::to_string(dv) + " is not a multiple of " +
                std::to_string(rows_per_block));
  const unsigned blocks = (unsigned)(nv * dv / rows_per_block);
  const float q_scale = norm ? norm->q_scale : 1.0f, eps = norm ? norm->eps : 0.0f;
  auto launch = [&](auto kernel) {
    kernel<<<blocks, 32 * kRecurrenceWarps, 0, stream>>>(q, k, v, qkv_stride, beta, g, S, out, T, nk, nv, dv, q_scale,
                                                         eps);
  };
  if (norm && dk != 128) throw_error("deltanet: the fused L2 norm needs key heads of 128 (got " + std::to_string(dk) + ")");
  auto pick = [&]<int R>() {
    switch (dk) {
      case 64: launch(recurrence_kernel<64, false, R>); break;
      case 128: norm ? launch(recurrence_kernel<128, true, R>) : launch(recurrence_kernel<128, false, R>); break;
      default:
        throw_error("deltanet: key head dim " + std::to_string(dk) + " (supported: 64, 128)");
    }
  };
  if (rows_per_warp == 2)
    pick.template operator()<2>();
  else
    pick.template operator()<1>();
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace rl::cuda
