// Gated DeltaNet in the fast tier (DESIGN.md §5a): the causal conv + SiLU, the gates and the
// recurrence (DESIGN.md §1) in fp32 arithmetic. Same arguments and layouts as deltanet.cu's exact
// launchers, so a forward pass swaps one for the other.
//
// Why a sequential kernel and not the chunkwise-parallel (WY) form on tensor cores: the WY form
// needs a triangular inverse per chunk whose conditioning depends on beta and the decays, and fp32
// accuracy from tensor cores only through split TF32 products; it could not be made right and
// validated in the time this was written without a GPU, while the sequential form's error has the
// simple bound below. The sequential form is latency-bound per token (a few dozen FMAs, one
// butterfly of log2 L shuffles, a handful of scalar steps), no longer by double arithmetic: fp32
// shuffles and FMAs, no conversions, and one reduction round per token instead of two. The shape
// (lanes a row, rows a lane) is selectable so that it can be picked by measurement.
//
// Recurrence (fast_recurrence_kernel). A block holds RB rows of one value head's state in
// registers for the whole call, L lanes per row (each lane E = DK / L values, as float4 at
// 4·pos + 4·L·m so that the lanes of a row read k and q from shared memory without bank conflicts),
// R rows per lane. Per token, every lane computes its parts of both U·k and U·q from the state
// before the update, one butterfly over the row's L lanes sums them, and then
//     S̃ = decay·S,  sk = S̃·k,  d = (v − sk)·beta,  S = S̃ + d·kᵀ,  o = S·q = S̃·q + d·(k·q),
// with k·q computed once per token when the block stages it. The state is held as S = c·U with a
// running decay c (lazy decay): a step adds (d / c)·k to U, one FMA per value instead of a
// multiply and an FMA; when c leaves [2^-64, 2^64] the step folds it into U (U = c·U + d·k) and
// restarts c at 1, so U stays far inside fp32's range. c is the same in every lane of a block
// (one head), so that branch is uniform. The block stages kStepGroup tokens' k, q (normalised here
// with `norm`), v rows, beta and exp(g) in shared memory, and fetches the next group into
// registers while it steps through the current one.
//
// Error (the tests' bounds derive from this). With |k| = 1, 0 <= beta <= 1 and 0 < decay <= 1 the
// step's linear part S ↦ decay·S·(I − beta·k·kᵀ) does not expand any row's 2-norm, so an error
// made at one step is carried, never amplified, by the later steps: a row's state error after T
// tokens is at most the sum of the steps' local errors. A step's local error is a few dozen fp32
// roundings of |S_row| + |v_row| (dot products of depth <= 8 + 2 + log2 L, the decay's exp and
// products, the update's FMA), and the row norms stay bounded: |S_row(t)|² <= |S_row(0)|² + Σ v².
#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/deltanet_conv.cuh"
#include "cuda/kernels.h"
#include "cuda/math_device.cuh"

namespace rl::cuda {

namespace {

// ---- conv + SiLU and gates, fp32 (deltanet_conv.cuh's ConvFast) ------------------------------------

constexpr int kFastConvThreads = 128;

// Decode and short chunks, one launch: the first conv_blocks blocks run the conv, the rest the
// gates (token-major over T * nv).
// With `states` (a batched decode step, deltanet_conv_gates_fast_rows): blockIdx.y is the row, a
// token (T = 1) of the session whose conv state is states[row], its inputs and outputs row `row` of
// x, out (rows of C), ba (2 nv), beta and g (nv).
__global__ void conv_gates_short_kernel(const float* x, size_t x_stride, float* out, float* state, const float* w,
                                        int T, int C, int K, const float* ba, const float* dt_bias,
                                        const float* ssm_a, float* beta, float* g, int nk, int nv, int conv_blocks,
                                        float* const* states) {
  pdl_trigger();  // the recurrence's blocks may become resident meanwhile (they wait for this grid)
  pdl_wait();  // launched as a programmatic dependent: its inputs are the previous kernel's output
  if (states) {
    const size_t row = blockIdx.y;
    state = states[row];
    x += row * x_stride;
    out += row * C;
    ba += row * 2 * nv;
    beta += row * nv;
    g += row * nv;
  }
  if ((int)blockIdx.x < conv_blocks) {
    conv1d_silu_channel<ConvFast>(x, x_stride, out, state, w, T, C, K, blockIdx.x * kFastConvThreads + threadIdx.x);
    return;
  }
  const int i = (blockIdx.x - conv_blocks) * kFastConvThreads + threadIdx.x;
  if (i < T * nv) deltanet_gate<ConvFast>(ba, dt_bias, ssm_a, beta, g, nk, nv, i / nv, i % nv);
}

// Long chunks: one thread per (channel, token); blocks past conv_blocks compute token blockIdx.y's
// gates. conv_state_advance moves the state on afterwards.
__global__ void conv_gates_tokens_kernel(const float* __restrict__ x, size_t x_stride, float* __restrict__ out,
                                         const float* __restrict__ state, const float* __restrict__ w, int C, int K,
                                         const float* __restrict__ ba, const float* __restrict__ dt_bias,
                                         const float* __restrict__ ssm_a, float* __restrict__ beta,
                                         float* __restrict__ g, int nk, int nv, int conv_blocks) {
  const int t = blockIdx.y;
  if ((int)blockIdx.x >= conv_blocks) {
    const int j = (blockIdx.x - conv_blocks) * kFastConvThreads + threadIdx.x;
    if (j < nv) deltanet_gate<ConvFast>(ba, dt_bias, ssm_a, beta, g, nk, nv, t, j);
    return;
  }
  const int c = blockIdx.x * kFastConvThreads + threadIdx.x;
  if (c < C) out[(size_t)t * C + c] = conv1d_silu_token<ConvFast>(x, x_stride, state, w, t, C, K, c);
}

// ---- recurrence, fp32 ----------------------------------------------------------------------------

constexpr int kFastWarps = 4;       // warps per block, all on rows of one value head
constexpr int kFastStepGroup = 16;  // tokens a block stages at a time
// The running decay c is folded into the state when it leaves this range: U = S / c then stays
// within 2^64 of the state, far from fp32's limits, and d / c cannot overflow.
constexpr float kDecayFoldBelow = 0x1p-64f, kDecayFoldAbove = 0x1p64f;

__device__ __forceinline__ float warp_sum_f(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

__device__ __forceinline__ float4 fma4(float s, float4 k, float4 u) {
  return make_float4(fmaf(s, k.x, u.x), fmaf(s, k.y, u.y), fmaf(s, k.z, u.z), fmaf(s, k.w, u.w));
}

__device__ __forceinline__ float4 scale4(float4 u, float s) { return make_float4(u.x * s, u.y * s, u.z * s, u.w * s); }

template <int DK, int L, int R, bool NORM>
__global__ void __launch_bounds__(32 * kFastWarps)
    fast_recurrence_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                           size_t stride, const float* __restrict__ beta, const float* __restrict__ g, float* S,
                           float* __restrict__ out, int T, int nk, int nv, int dv, float q_scale, float eps,
                           float* const* states) {
  constexpr int E = DK / L;                    // a row's values per lane
  constexpr int M = E / 4;                     // as float4
  constexpr int GROUPS = 32 / L;               // row groups of a warp
  constexpr int RB = kFastWarps * GROUPS * R;  // rows of a block
  constexpr int G = kFastStepGroup;
  constexpr int THREADS = 32 * kFastWarps;
  constexpr int PS = DK / 32;               // staging: a vector's values per lane
  constexpr int TPW = G / kFastWarps;       // staging: tokens per warp
  constexpr int VPT = (G * RB + THREADS - 1) / THREADS;  // staging: v values per thread
  constexpr int kChains = M >= 8 ? 4 : 2;                // partial sums of a dot product
  static_assert(E % 4 == 0 && 32 % L == 0 && G % kFastWarps == 0, "kernel shape");

  __shared__ __align__(16) float ks[G][DK];
  __shared__ __align__(16) float qs[G][DK];
  __shared__ float vs[G][RB];
  __shared__ float4 scal[G];  // exp(g), beta, k·q

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, pos = lane % L;
  const int blocks_per_head = dv / RB;
  const int j = blockIdx.x / blocks_per_head, row0 = (int)(blockIdx.x % blocks_per_head) * RB;
  const int kh = j / (nv / nk);
  const int my_row = warp * GROUPS * R + (lane / L) * R;  // the first of this lane's R rows, in the block

  // Everything this kernel reads, the state included, waits for the previous kernel: in the decode
  // step of the H200's test the early state read (before this wait) returned stale inputs.
  pdl_wait();
  // A batched decode step (deltanet_recurrence_fast_rows): blockIdx.y is the row, one token (T = 1)
  // of the session whose state is states[row]; its q, k, v, beta, g and out are that row's.
  if (states) {
    const size_t row = blockIdx.y;
    S = states[row];
    q += row * stride;
    k += row * stride;
    v += row * stride;
    beta += row * nv;
    g += row * nv;
    out += row * (size_t)nv * dv;
  }
  float4 U[R][M];
  float* Sr = S + ((size_t)j * dv + row0 + my_row) * DK + 4 * pos;
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < M; m++) U[r][m] = *reinterpret_cast<const float4*>(Sr + (size_t)r * DK + 4 * L * m);
  float c = 1.0f;

  // The next group's inputs, fetched into registers while the current group steps: warp w stages
  // tokens w, w + kFastWarps, ... of a group (lane l: values l, l + 32, ... of k and q, so that
  // loads and shared stores are both contiguous across the warp).
  float kr[TPW][PS], qr[TPW][PS], br[TPW], gr[TPW], vr[VPT];
  const size_t koff = (size_t)kh * DK + lane, voff = (size_t)j * dv + row0;
  auto fetch = [&](int t0) {
#pragma unroll
    for (int i = 0; i < TPW; i++) {
      const int t = t0 + warp + i * kFastWarps;
      const bool in = t < T;
#pragma unroll
      for (int e = 0; e < PS; e++) {
        kr[i][e] = in ? k[(size_t)t * stride + koff + 32 * e] : 0.f;
        qr[i][e] = in ? q[(size_t)t * stride + koff + 32 * e] : 0.f;
      }
      br[i] = in ? beta[(size_t)t * nv + j] : 0.f;
      gr[i] = in ? g[(size_t)t * nv + j] : 0.f;
    }
#pragma unroll
    for (int e = 0; e < VPT; e++) {
      const int idx = threadIdx.x + e * THREADS, t = t0 + idx / RB;
      vr[e] = idx < G * RB && t < T ? v[(size_t)t * stride + voff + idx % RB] : 0.f;
    }
  };
  // Into shared memory, normalising k and q first with `norm` (fp32: sum of squares, rsqrt).
  auto stage = [&]() {
#pragma unroll
    for (int i = 0; i < TPW; i++) {
      const int ti = warp + i * kFastWarps;
      if constexpr (NORM) {
        float ssk = 0.f, ssq = 0.f;
#pragma unroll
        for (int e = 0; e < PS; e++) ssk = fmaf(kr[i][e], kr[i][e], ssk), ssq = fmaf(qr[i][e], qr[i][e], ssq);
        const float ik = rsqrtf(warp_sum_f(ssk) + eps), iq = rsqrtf(warp_sum_f(ssq) + eps) * q_scale;
#pragma unroll
        for (int e = 0; e < PS; e++) kr[i][e] *= ik, qr[i][e] *= iq;
      }
      float kq = 0.f;
#pragma unroll
      for (int e = 0; e < PS; e++) {
        kq = fmaf(kr[i][e], qr[i][e], kq);
        ks[ti][lane + 32 * e] = kr[i][e];
        qs[ti][lane + 32 * e] = qr[i][e];
      }
      kq = warp_sum_f(kq);
      if (lane == 0) scal[ti] = make_float4(expf(gr[i]), br[i], kq, 0.f);
    }
#pragma unroll
    for (int e = 0; e < VPT; e++) {
      const int idx = threadIdx.x + e * THREADS;
      if (idx < G * RB) vs[idx / RB][idx % RB] = vr[e];
    }
  };
  auto load_kq = [&](int i, float4 (&kc)[M], float4 (&qc)[M]) {
#pragma unroll
    for (int m = 0; m < M; m++) {
      kc[m] = *reinterpret_cast<const float4*>(&ks[i][4 * pos + 4 * L * m]);
      qc[m] = *reinterpret_cast<const float4*>(&qs[i][4 * pos + 4 * L * m]);
    }
  };

  float* orow = out + voff + my_row;
  // Token i of the group from k, q in kc, qc; loads token i + 1's into kn, qn while the sums travel.
  auto step = [&](int t0, int i, int n, const float4(&kc)[M], const float4(&qc)[M], float4(&kn)[M],
                  float4(&qn)[M]) {
    const float4 sc = scal[i];
    float pk[R], pq[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      float a[kChains] = {}, b[kChains] = {};  // independent chains for latency
#pragma unroll
      for (int m = 0; m < M; m++)
        a[m % kChains] = dot4(U[r][m], kc[m], a[m % kChains]), b[m % kChains] = dot4(U[r][m], qc[m], b[m % kChains]);
      if constexpr (kChains == 4) a[0] += a[2], a[1] += a[3], b[0] += b[2], b[1] += b[3];
      pk[r] = a[0] + a[1];
      pq[r] = b[0] + b[1];
    }
    load_kq(i + 1 < n ? i + 1 : i, kn, qn);
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1)
#pragma unroll
      for (int r = 0; r < R; r++) {
        pk[r] += __shfl_xor_sync(0xffffffffu, pk[r], o);
        pq[r] += __shfl_xor_sync(0xffffffffu, pq[r], o);
      }
    const float cn = c * sc.x;  // the running decay after this token's
    const bool fold = !(cn >= kDecayFoldBelow && cn <= kDecayFoldAbove);
    const float beta_u = fold ? sc.y : __fdividef(sc.y, cn);  // beta / c, off the dependent chain
    float o[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      const float err = fmaf(-cn, pk[r], vs[i][my_row + r]);  // v - S̃·k
      const float d = err * sc.y;
      o[r] = fmaf(d, sc.z, cn * pq[r]);
      const float du = err * beta_u;  // d / c: U's update
      if (fold) {
#pragma unroll
        for (int m = 0; m < M; m++) U[r][m] = fma4(d, kc[m], scale4(U[r][m], cn));
      } else {
#pragma unroll
        for (int m = 0; m < M; m++) U[r][m] = fma4(du, kc[m], U[r][m]);
      }
    }
    c = fold ? 1.0f : cn;
    if (pos < R) {
      float mine = o[0];
#pragma unroll
      for (int r = 1; r < R; r++)
        if (pos == r) mine = o[r];
      orow[(size_t)(t0 + i) * nv * dv + pos] = mine;
    }
  };

  fetch(0);
  for (int t0 = 0; t0 < T; t0 += G) {
    const int n = min(G, T - t0);
    __syncthreads();  // the previous group is no longer read
    stage();
    __syncthreads();
    if (t0 + G < T) fetch(t0 + G);
    // Two steps an iteration, the k and q registers alternating (no copies between steps).
    float4 ka[M], qa[M], kb[M], qb[M];
    load_kq(0, ka, qa);
    for (int i = 0; i < n; i += 2) {
      step(t0, i, n, ka, qa, kb, qb);
      if (i + 1 < n) step(t0, i + 1, n, kb, qb, ka, qa);
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int m = 0; m < M; m++) *reinterpret_cast<float4*>(Sr + (size_t)r * DK + 4 * L * m) = scale4(U[r][m], c);
}

void check_conv_gates(int K, int nk, int nv) {
  if (K < 2 || K > kMaxConvKernel)
    throw_error("deltanet: conv kernel " + std::to_string(K) + " outside [2, 8]");
  if (nk <= 0 || nv % nk != 0)
    throw_error("deltanet: " + std::to_string(nv) + " value heads do not group over " + std::to_string(nk) +
                " key heads");
}

}  // namespace

void deltanet_conv_gates_fast(const float* x, size_t x_stride, float* out, float* state, const float* w, int T,
                              int C, int K, const float* ba, const float* dt_bias, const float* ssm_a, float* beta,
                              float* g, int nk, int nv, cudaStream_t stream) {
  check_conv_gates(K, nk, nv);
  if (T == 0) return;
  const int conv_blocks = (C + kFastConvThreads - 1) / kFastConvThreads;
  if (T <= 8) {  // decode and short chunks: one pass over the tokens per channel, one launch
    const int gate_blocks = (T * nv + kFastConvThreads - 1) / kFastConvThreads;
    launch_dependent(conv_gates_short_kernel, dim3(conv_blocks + gate_blocks), dim3(kFastConvThreads), stream, x,
                     x_stride, out, state, w, T, C, K, ba, dt_bias, ssm_a, beta, g, nk, nv, conv_blocks,
                     static_cast<float* const*>(nullptr));
    RL_CUDA_LAUNCH_CHECK();
    return;
  }
  const int gate_blocks = (nv + kFastConvThreads - 1) / kFastConvThreads;
  conv_gates_tokens_kernel<<<dim3(conv_blocks + gate_blocks, T), kFastConvThreads, 0, stream>>>(
      x, x_stride, out, state, w, C, K, ba, dt_bias, ssm_a, beta, g, nk, nv, conv_blocks);
  RL_CUDA_LAUNCH_CHECK();
  conv_state_advance(x, x_stride, state, T, C, K, stream);
}

int deltanet_fast_rows_per_block(int lanes_per_row, int rows_per_lane) {
  return kFastWarps * (32 / lanes_per_row) * rows_per_lane;
}

void deltanet_conv_gates_fast_rows(const float* x, size_t x_stride, float* out, float* const* states, const float* w,
                                   int B, int C, int K, const float* ba, const float* dt_bias, const float* ssm_a,
                                   float* beta, float* g, int nk, int nv, cudaStream_t stream) {
  check_conv_gates(K, nk, nv);
  if (B == 0) return;
  if (B > 65535) throw_error("deltanet: " + std::to_string(B) + " rows in one launch (at most 65,535)");
  if (!states) throw_error("deltanet: a batched step's conv needs its table of states");
  if (x_stride < (size_t)C)
    throw_error("deltanet: input rows of " + std::to_string(x_stride) + " values for " + std::to_string(C) + " channels");
  const int conv_blocks = (C + kFastConvThreads - 1) / kFastConvThreads;
  const int gate_blocks = (nv + kFastConvThreads - 1) / kFastConvThreads;
  launch_dependent(conv_gates_short_kernel, dim3(conv_blocks + gate_blocks, B), dim3(kFastConvThreads), stream, x,
                   x_stride, out, static_cast<float*>(nullptr), w, 1, C, K, ba, dt_bias, ssm_a, beta, g, nk, nv,
                   conv_blocks, states);
  RL_CUDA_LAUNCH_CHECK();
}

namespace {

// The recurrence's launch: T tokens of one session (states null, the state S), or one token each
// of B sessions (states[row], blockIdx.y the row).
void launch_recurrence(const float* q, const float* k, const float* v, size_t qkv_stride, const float* beta,
                       const float* g, float* S, float* const* states, float* out, int T, int B, int nk, int nv,
                       int dk, int dv, cudaStream_t stream, const L2Norm* norm, int lanes_per_row, int rows_per_lane) {
  if (dk != 64 && dk != 128) throw_error("deltanet: key head dim " + std::to_string(dk) + " (supported: 64, 128)");
  if (norm && dk != 128)
    throw_error("deltanet: the fused L2 norm needs key heads of 128 (got " + std::to_string(dk) + ")");
  if (nk <= 0 || nv % nk != 0)
    throw_error("deltanet: " + std::to_string(nv) + " value heads do not group over " + std::to_string(nk) +
                " key heads");
  if (lanes_per_row == 0) lanes_per_row = 8;
  if (rows_per_lane == 0) rows_per_lane = 1;
  const bool shape_known = ((lanes_per_row == 8 || lanes_per_row == 16) && (rows_per_lane == 1 || rows_per_lane == 2)) ||
                           (lanes_per_row == 4 && rows_per_lane == 1);
  if (!shape_known)
    throw_error("deltanet: fast recurrence shape " + std::to_string(lanes_per_row) + " lanes a row, " +
                std::to_string(rows_per_lane) + " rows a lane (supported: 8 or 16 with 1 or 2, 4 with 1)");
  const int rows_per_block = deltanet_fast_rows_per_block(lanes_per_row, rows_per_lane);
  if (dv % rows_per_block != 0)
    throw_error("deltanet: value head dim " + std::to_string(dv) + " is not a multiple of " +
                std::to_string(rows_per_block));
  if (!states && reinterpret_cast<uintptr_t>(S) % 16 != 0)
    throw_error("deltanet: the state must be 16-byte aligned (its rows are read as float4)");
  const unsigned blocks = (unsigned)(nv * dv / rows_per_block);
  const float q_scale = norm ? norm->q_scale : 1.0f, eps = norm ? norm->eps : 0.0f;
  // A programmatic dependent (math_device.cuh): the blocks load their state rows while the
  // previous kernel (the conv, which triggers at its start) still runs, so that kernel must not
  // write S. The recurrence does not trigger its dependents early: a second call on the same state
  // right after it reads S only once this grid's blocks have all exited.
  auto launch = [&](auto kernel) {
    launch_dependent(kernel, dim3(blocks, B), dim3(32 * kFastWarps), stream, q, k, v, qkv_stride, beta, g, S, out, T,
                     nk, nv, dv, q_scale, eps, states);
  };
  auto pick = [&]<int L, int R>() {
    if (dk == 64)
      launch(fast_recurrence_kernel<64, L, R, false>);
    else if (norm)
      launch(fast_recurrence_kernel<128, L, R, true>);
    else
      launch(fast_recurrence_kernel<128, L, R, false>);
  };
  if (lanes_per_row == 4)
    pick.template operator()<4, 1>();
  else if (lanes_per_row == 8)
    rows_per_lane == 2 ? pick.template operator()<8, 2>() : pick.template operator()<8, 1>();
  else
    rows_per_lane == 2 ? pick.template operator()<16, 2>() : pick.template operator()<16, 1>();
  RL_CUDA_LAUNCH_CHECK();
}

}  // namespace

void deltanet_recurrence_fast(const float* q, const float* k, const float* v, size_t qkv_stride, const float* beta,
                              const float* g, float* S, float* out, int T, int nk, int nv, int dk, int dv,
                              cudaStream_t stream, const L2Norm* norm, int lanes_per_row, int rows_per_lane) {
  if (T == 0) return;
  launch_recurrence(q, k, v, qkv_stride, beta, g, S, nullptr, out, T, 1, nk, nv, dk, dv, stream, norm, lanes_per_row,
                    rows_per_lane);
}

void deltanet_recurrence_fast_rows(const float* q, const float* k, const float* v, size_t qkv_stride,
                                   const float* beta, const float* g, float* const* states, float* out, int B, int nk,
                                   int nv, int dk, int dv, cudaStream_t stream, const L2Norm* norm) {
  if (B == 0) return;
  if (B > 65535) throw_error("deltanet: " + std::to_string(B) + " rows in one launch (at most 65,535)");
  if (!states) throw_error("deltanet: a batched step's recurrence needs its table of states");
  launch_recurrence(q, k, v, qkv_stride, beta, g, nullptr, states, out, 1, B, nk, nv, dk, dv, stream, norm, 0, 0);
}

}  // namespace rl::cuda
