// The fast tier's Gated DeltaNet kernels (src/cuda/deltanet_fast.cu) against references in double
// written from DESIGN.md §1, at the 80B's head shape (16 key heads, 32 value heads of 128) and the
// fixtures' (2, 4 of 64), over chunk sequences of 1, 7, 64 and 512 tokens that carry the state.
//
// The bounds come from the fp32 error analysis, not from a run (u = 2^-24, fp32's unit roundoff):
// - recurrence: the step's linear part S_row ↦ decay·S_row·(I − beta·k·kᵀ) does not expand a row's
//   2-norm (|k| = 1, 0 < beta, decay <= 1), so a row's state error is at most the sum of the steps'
//   local errors. A step's local error is at most kStepRoundings·u·(|S_row| + |v_row|): the exp
//   of the decay (2 ulp) and the running decay's product and fold (6u), d from a dot product of
//   summation depth <= 24 (the kernels' is at most 8 + 2 + log2 L <= 14) and two roundings (27u), the
//   update's FMA and the reciprocal of the running decay (5u), and inputs one rounding off the
//   reference's (2u): 40. An output adds its own dot product, d's error times k·q, k·q's rounding
//   and the last FMA (66u: 70) to the state error carried in, times |q|. With the fused L2 norm the
//   kernel's k and q are up to 11u off the reference's (sum of squares, rsqrt, products), which
//   moves a step by 2·|δk|·(|S| + |v|) and an output by about 31u more: 60 and 100.
// - conv + SiLU: K products summed in fp32 (K·u of Σ|w·x|, times SiLU's slope <= 1.1), SiLU itself
//   within 6u (exp, add, divide); gates: sigmoid within 6u, softplus(a + dt) within u·|a + dt| + 8u
//   of itself, times |ssm_a|, plus the product's rounding.
// Every bound is checked at twice the analysis (the margin).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"

namespace rl {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;

constexpr double kU = 0x1p-24;  // fp32 unit roundoff
constexpr double kMargin = 2.0;

class CudaDeltaNetFast : public ::testing::Test {
 protected:
  void SetUp() override { RL_REQUIRE_GPU(); }
};

struct Heads {
  int nk, nv, d;
  int key_dim() const { return nk * d; }
  int stride() const { return 2 * nk * d + nv * d; }  // a token's row: q heads, k heads, v heads
  size_t state_size() const { return (size_t)nv * d * d; }
  std::string name() const { return std::to_string(nk) + "/" + std::to_string(nv) + " heads of " + std::to_string(d); }
};
constexpr Heads k80B{16, 32, 128}, kFixture{2, 4, 64};

struct Constants {
  double step, output;
};
constexpr Constants kPlain{40, 70}, kFusedNorm{60, 100};

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

// A sequence of tokens' recurrence inputs: qkv [T][stride] (q, k normalised and q scaled unless
// `raw`), beta and g [T][nv]. The decays mix values near 1, exactly 1 (g = 0) and ones that underflow
// fp32 (g = -120), and the running decay passes 2^-64 within a 512-token chunk.
struct Tokens {
  std::vector<float> qkv, beta, g;
};
Tokens make_tokens(const Heads& h, int T, uint32_t seed, bool raw) {
  Tokens tk;
  tk.qkv = random_floats((size_t)T * h.stride(), seed, raw ? 2.0f : 1.0f);
  if (!raw)
    for (int t = 0; t < T; t++)
      for (int head = 0; head < 2 * h.nk; head++) {
        float* x = tk.qkv.data() + (size_t)t * h.stride() + (size_t)head * h.d;
        double ss = 0;
        for (int i = 0; i < h.d; i++) ss += (double)x[i] * x[i];
        const double sc = (head < h.nk ? 1.0 / std::sqrt((double)h.d) : 1.0) / std::sqrt(ss);
        for (int i = 0; i < h.d; i++) x[i] = (float)(x[i] * sc);
      }
  tk.beta = random_floats((size_t)T * h.nv, seed + 1, 2.0f);
  for (float& b : tk.beta) b = (float)sigmoid(b);
  tk.g = random_floats((size_t)T * h.nv, seed + 2, 0.3f);
  for (size_t i = 0; i < tk.g.size(); i++) {
    const size_t t = i / h.nv;
    tk.g[i] = t % 97 == 50 ? -120.0f : t % 31 == 3 ? 0.0f : -std::fabs(tk.g[i]);
  }
  return tk;
}

// The recurrence in double with, per state row, the bound on the fp32 kernels' accumulated error.
struct Reference {
  Heads h;
  Constants k;
  bool normalise;             // the inputs are raw: normalise q and k here (in double)
  std::vector<double> S;      // [nv][dv][dk]
  std::vector<double> err;    // [nv][dv]: the row's state error bound so far (before the margin)

  Reference(const Heads& heads, Constants c, bool norm, const std::vector<float>& s0)
      : h(heads), k(c), normalise(norm), S(s0.begin(), s0.end()), err((size_t)heads.nv * heads.d, 0.0) {}

  // One chunk; out and out_bound [T][nv][dv].
  void run(const Tokens& tk, int T, std::vector<double>& out, std::vector<double>& out_bound) {
    const int d = h.d, r = h.nv / h.nk;
    out.assign((size_t)T * h.nv * d, 0.0);
    out_bound.assign(out.size(), 0.0);
    std::vector<double> q(d), kk(d);
    for (int t = 0; t < T; t++)
      for (int j = 0; j < h.nv; j++) {
        const float* row = tk.qkv.data() + (size_t)t * h.stride();
        const float* qf = row + (j / r) * d;
        const float* kf = row + h.key_dim() + (j / r) * d;
        const float* vf = row + 2 * h.key_dim() + (size_t)j * d;
        double sq = 0, sk = 0;
        for (int i = 0; i < d; i++) q[i] = qf[i], kk[i] = kf[i], sq += q[i] * q[i], sk += kk[i] * kk[i];
        if (normalise) {
          const double qs = 1.0 / std::sqrt(sq + 1e-6) / std::sqrt((double)d), ks = 1.0 / std::sqrt(sk + 1e-6);
          for (int i = 0; i < d; i++) q[i] *= qs, kk[i] *= ks;
          sq *= qs * qs;
        }
        const double qnorm = std::sqrt(sq), decay = std::exp((double)tk.g[(size_t)t * h.nv + j]);
        const double b = tk.beta[(size_t)t * h.nv + j];
        for (int i = 0; i < d; i++) {
          double* s = S.data() + ((size_t)j * d + i) * d;
          double ss = 0, dot_k = 0;
          for (int c = 0; c < d; c++) ss += s[c] * s[c], dot_k += s[c] * kk[c];
          const double mag = std::sqrt(ss) + std::fabs((double)vf[i]);
          double& e = err[(size_t)j * d + i];
          const size_t o = ((size_t)t * h.nv + j) * d + i;
          out_bound[o] = kMargin * qnorm * (e + k.output * kU * mag);
          e += k.step * kU * mag;
          const double delta = ((double)vf[i] - decay * dot_k) * b;
          double dot_q = 0;
          for (int c = 0; c < d; c++) {
            s[c] = decay * s[c] + delta * kk[c];
            dot_q += s[c] * q[c];
          }
          out[o] = dot_q;
        }
      }
  }
};

// Element-wise |got - want| <= bound (NaN fails); reports the first miss and the count.
void expect_within(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  size_t misses = 0, first = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (!(std::fabs(got[i] - want[i]) <= bound[i]) && misses++ == 0) first = i;
  EXPECT_EQ(misses, 0u) << what << ": first at [" << first << "]: got " << got[first] << ", reference "
                        << want[first] << ", bound " << bound[first];
}

// The state rows' 2-norm errors within twice the reference's bound.
void expect_state_within(const std::vector<float>& got, const Reference& ref, const std::string& what) {
  const int d = ref.h.d;
  ASSERT_EQ(got.size(), ref.S.size());
  size_t misses = 0;
  for (size_t row = 0; row < ref.err.size(); row++) {
    double e2 = 0;
    for (int c = 0; c < d; c++) e2 += std::pow(got[row * d + c] - ref.S[row * d + c], 2);
    if (!(std::sqrt(e2) <= kMargin * ref.err[row]) && misses++ == 0)
      ADD_FAILURE() << what << ": state row " << row << " off by " << std::sqrt(e2) << ", bound "
                    << kMargin * ref.err[row];
  }
  EXPECT_EQ(misses, 0u) << what << ": state rows out of bound";
}

// The per-kernel bar: normalised mean squared error <= 5e-4.
void expect_nmse(const std::vector<float>& got, const std::vector<double>& want, const std::string& what) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) num += std::pow(got[i] - want[i], 2), den += want[i] * want[i];
  EXPECT_LE(num / den, 5e-4) << what;
}

struct Shape {
  int lanes, rows;
};
constexpr Shape kShapes[] = {{8, 1}, {8, 2}, {16, 1}, {16, 2}, {4, 1}};
constexpr int kChunks[] = {1, 7, 64, 512};

float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  RL_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

// Per layer call of a 512-token chunk at the 80B shape, each kernel shape and the exact kernel
// (printed for the choice of the default shape; the accuracy tests carry the assertions).
void print_timings(const Heads& h, const Tokens& tk, const std::vector<float>& s0) {
  // Two states in turn: a launch reads its state before it waits for the previous kernel.
  auto dq = to_device(tk.qkv), db = to_device(tk.beta), dg = to_device(tk.g);
  cuda::DeviceBuffer states[2] = {to_device(s0), to_device(s0)};
  cuda::DeviceBuffer dout((size_t)512 * h.nv * h.d * 4);
  int turn = 0;
  cudaEvent_t a, b;
  RL_CUDA_CHECK(cudaEventCreate(&a));
  RL_CUDA_CHECK(cudaEventCreate(&b));
  const float* q = dq.f();
  auto mean_ms = [&](auto call) {
    call(states[turn++ % 2].f());  // warm-up
    RL_CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < 10; i++) call(states[turn++ % 2].f());
    RL_CUDA_CHECK(cudaEventRecord(b));
    RL_CUDA_CHECK(cudaEventSynchronize(b));
    return elapsed_ms(a, b) / 10;
  };
  for (Shape s : kShapes)
    std::printf("deltanet_recurrence_fast %d lanes a row, %d rows a lane: %.3f ms per 512-token layer call\n",
                s.lanes, s.rows, mean_ms([&](float* S) {
                  cuda::deltanet_recurrence_fast(q, q + h.key_dim(), q + 2 * h.key_dim(), h.stride(), db.f(), dg.f(),
                                                 S, dout.f(), 512, h.nk, h.nv, h.d, h.d, nullptr, nullptr,
                                                 s.lanes, s.rows);
                }));
  std::printf("deltanet_recurrence (exact): %.3f ms per 512-token layer call\n", mean_ms([&](float* S) {
                cuda::deltanet_recurrence(q, q + h.key_dim(), q + 2 * h.key_dim(), h.stride(), db.f(), dg.f(), S,
                                          dout.f(), 512, h.nk, h.nv, h.d, h.d, nullptr);
              }));
  RL_CUDA_CHECK(cudaEventDestroy(a));
  RL_CUDA_CHECK(cudaEventDestroy(b));
}

// Every kernel shape over the chunks 1, 7, 64, 512 in sequence from a nonzero state: each chunk's
// outputs and the final state within the bound, outputs never left unwritten (NaN-filled first).
TEST_F(CudaDeltaNetFast, RecurrenceChunksAgainstDoubleReference) {
  for (const Heads& h : {kFixture, k80B}) {
    SCOPED_TRACE(h.name());
    int total = 0;
    for (int T : kChunks) total += T;
    const Tokens tk = make_tokens(h, total, 100 + h.d, false);
    const auto s0 = random_floats(h.state_size(), 101 + h.d, 0.3f);
    Reference ref(h, kPlain, false, s0);
    std::vector<std::vector<double>> want, bound;
    {
      int t0 = 0;
      for (int T : kChunks) {
        Tokens chunk{{tk.qkv.begin() + (size_t)t0 * h.stride(), tk.qkv.begin() + (size_t)(t0 + T) * h.stride()},
                     {tk.beta.begin() + (size_t)t0 * h.nv, tk.beta.begin() + (size_t)(t0 + T) * h.nv},
                     {tk.g.begin() + (size_t)t0 * h.nv, tk.g.begin() + (size_t)(t0 + T) * h.nv}};
        want.emplace_back();
        bound.emplace_back();
        ref.run(chunk, T, want.back(), bound.back());
        t0 += T;
      }
    }
    auto dq = to_device(tk.qkv), db = to_device(tk.beta), dg = to_device(tk.g);
    for (Shape s : kShapes) {
      SCOPED_TRACE(std::to_string(s.lanes) + " lanes a row, " + std::to_string(s.rows) + " rows a lane");
      auto dS = to_device(s0);
      int t0 = 0, chunk = 0;
      for (int T : kChunks) {
        cuda::DeviceBuffer dout((size_t)T * h.nv * h.d * 4);
        RL_CUDA_CHECK(cudaMemset(dout.get(), 0xFF, dout.bytes()));
        const float* q = dq.f() + (size_t)t0 * h.stride();
        cuda::deltanet_recurrence_fast(q, q + h.key_dim(), q + 2 * h.key_dim(), h.stride(), db.f() + t0 * h.nv,
                                       dg.f() + t0 * h.nv, dS.f(), dout.f(), T, h.nk, h.nv, h.d, h.d, nullptr,
                                       nullptr, s.lanes, s.rows);
        const auto got = to_host<float>(dout, (size_t)T * h.nv * h.d);
        expect_within(got, want[chunk], bound[chunk], "outputs of the " + std::to_string(T) + "-token chunk");
        expect_nmse(got, want[chunk], "outputs of the " + std::to_string(T) + "-token chunk");
        t0 += T, chunk++;
      }
      expect_state_within(to_host<float>(dS, s0.size()), ref, "final state");
    }
    if (h.d == 128) {
      const Tokens chunk{{tk.qkv.end() - (size_t)512 * h.stride(), tk.qkv.end()},
                         {tk.beta.end() - (size_t)512 * h.nv, tk.beta.end()},
                         {tk.g.end() - (size_t)512 * h.nv, tk.g.end()}};
      print_timings(h, chunk, s0);
    }
  }
}

// Decode steps and chunks of 7 and 40 tokens (three staging groups, the norm applied to each) on
// raw q and k: the fused L2 norm and l2_norm followed by the plain fast recurrence both within
// their bounds of the reference, so within the sum of the two bounds of each other.
TEST_F(CudaDeltaNetFast, FusedNormEqualsL2NormThenRecurrence) {
  for (const Heads& h : {Heads{2, 4, 128}, k80B}) {
    SCOPED_TRACE(h.name());
    const cuda::L2Norm norm{1e-6f, (float)(1.0 / std::sqrt((double)h.d))};
    const auto s0 = random_floats(h.state_size(), 200, 0.3f);
    Reference ref_fused(h, kFusedNorm, true, s0), ref_plain(h, kPlain, true, s0);
    auto dS_fused = to_device(s0), dS_plain = to_device(s0);
    int step = 0;
    for (int T : {1, 1, 1, 7, 40, 1}) {
      SCOPED_TRACE("step " + std::to_string(step) + ", " + std::to_string(T) + " tokens");
      const Tokens tk = make_tokens(h, T, 210 + step++, true);
      std::vector<double> want, bound_fused, bound_plain;
      ref_fused.run(tk, T, want, bound_fused);
      ref_plain.run(tk, T, want, bound_plain);
      auto d_fused = to_device(tk.qkv), d_plain = to_device(tk.qkv), db = to_device(tk.beta), dg = to_device(tk.g);
      const size_t n_out = (size_t)T * h.nv * h.d;
      cuda::DeviceBuffer o_fused(n_out * 4), o_plain(n_out * 4);
      RL_CUDA_CHECK(cudaMemset(o_fused.get(), 0xFF, o_fused.bytes()));
      RL_CUDA_CHECK(cudaMemset(o_plain.get(), 0xFF, o_plain.bytes()));
      cuda::l2_norm(d_plain.f(), T, 2 * h.nk, h.d, h.stride(), norm.eps, norm.q_scale, nullptr, h.nk);
      const float* qp = d_plain.f();
      const float* qf = d_fused.f();
      cuda::deltanet_recurrence_fast(qp, qp + h.key_dim(), qp + 2 * h.key_dim(), h.stride(), db.f(), dg.f(),
                                     dS_plain.f(), o_plain.f(), T, h.nk, h.nv, h.d, h.d, nullptr);
      cuda::deltanet_recurrence_fast(qf, qf + h.key_dim(), qf + 2 * h.key_dim(), h.stride(), db.f(), dg.f(),
                                     dS_fused.f(), o_fused.f(), T, h.nk, h.nv, h.d, h.d, nullptr, &norm);
      const auto got_fused = to_host<float>(o_fused, n_out), got_plain = to_host<float>(o_plain, n_out);
      expect_within(got_fused, want, bound_fused, "fused norm");
      expect_within(got_plain, want, bound_plain, "l2_norm, then the recurrence");
      std::vector<double> plain_d(got_plain.begin(), got_plain.end()), both(n_out);
      for (size_t i = 0; i < n_out; i++) both[i] = bound_fused[i] + bound_plain[i];
      expect_within(got_fused, plain_d, both, "fused against unfused");
      // The fused norm did not change the inputs it read.
      EXPECT_EQ(to_host<float>(d_fused, tk.qkv.size()), tk.qkv) << "raw q/k/v";
    }
    expect_state_within(to_host<float>(dS_fused, s0.size()), ref_fused, "state (fused norm)");
    expect_state_within(to_host<float>(dS_plain, s0.size()), ref_plain, "state (l2_norm first)");
  }
}

// The decode step as a forward pass enqueues it, several tokens without a host synchronisation:
// conv + gates, then the recurrence with the fused norm on the conv's output (launched as a
// programmatic dependent: it must wait for the conv before reading, and the conv's outputs start
// as NaN). Checked against the reference run on the conv outputs and gates read back afterwards.
TEST_F(CudaDeltaNetFast, DecodeStepsConvThenFusedRecurrence) {
  const Heads h = k80B;
  const int K = 4, C = h.stride(), steps = 6;
  const cuda::L2Norm norm{1e-6f, (float)(1.0 / std::sqrt((double)h.d))};
  auto x = random_floats((size_t)steps * C, 400, 2.0f), w = random_floats((size_t)C * K, 401, 0.5f);
  auto ba = random_floats((size_t)steps * 2 * h.nv, 402, 2.0f), dt = random_floats(h.nv, 403), a = random_floats(h.nv, 404);
  for (float& v : a) v = -std::exp(v);
  const auto s0 = random_floats(h.state_size(), 405, 0.3f);
  auto dx = to_device(x), dw = to_device(w), dba = to_device(ba), ddt = to_device(dt), da = to_device(a);
  auto dS = to_device(s0);
  cuda::DeviceBuffer dconv_state((size_t)(K - 1) * C * 4), dconv((size_t)steps * C * 4);
  cuda::DeviceBuffer dbeta((size_t)steps * h.nv * 4), dg((size_t)steps * h.nv * 4), dout((size_t)steps * h.nv * h.d * 4);
  RL_CUDA_CHECK(cudaMemset(dconv_state.get(), 0, dconv_state.bytes()));
  RL_CUDA_CHECK(cudaMemset(dconv.get(), 0xFF, dconv.bytes()));
  RL_CUDA_CHECK(cudaMemset(dout.get(), 0xFF, dout.bytes()));
  RL_CUDA_CHECK(cudaDeviceSynchronize());
  for (int s = 0; s < steps; s++) {
    float* conv = dconv.f() + (size_t)s * C;
    cuda::deltanet_conv_gates_fast(dx.f() + (size_t)s * C, C, conv, dconv_state.f(), dw.f(), 1, C, K,
                                   dba.f() + (size_t)s * 2 * h.nv, ddt.f(), da.f(), dbeta.f() + s * h.nv,
                                   dg.f() + s * h.nv, h.nk, h.nv, nullptr);
    cuda::deltanet_recurrence_fast(conv, conv + h.key_dim(), conv + 2 * h.key_dim(), C, dbeta.f() + s * h.nv,
                                   dg.f() + s * h.nv, dS.f(), dout.f() + (size_t)s * h.nv * h.d, 1, h.nk, h.nv, h.d,
                                   h.d, nullptr, &norm);
  }
  const Tokens tk{to_host<float>(dconv, (size_t)steps * C), to_host<float>(dbeta, (size_t)steps * h.nv),
                  to_host<float>(dg, (size_t)steps * h.nv)};
  Reference ref(h, kFusedNorm, true, s0);
  std::vector<double> want, bound;
  ref.run(tk, steps, want, bound);
  expect_within(to_host<float>(dout, want.size()), want, bound, "decode outputs");
  expect_state_within(to_host<float>(dS, s0.size()), ref, "state after the decode steps");

  // A layer's decode step, conv + gates then the fused recurrence, fast against exact (printed).
  cudaEvent_t ev[2];
  for (cudaEvent_t& e : ev) RL_CUDA_CHECK(cudaEventCreate(&e));
  float* conv = dconv.f();
  for (bool fast : {true, false}) {
    auto layer_step = [&] {
      auto conv_gates = fast ? cuda::deltanet_conv_gates_fast : cuda::deltanet_conv_gates;
      conv_gates(dx.f(), C, conv, dconv_state.f(), dw.f(), 1, C, K, dba.f(), ddt.f(), da.f(), dbeta.f(), dg.f(), h.nk,
                 h.nv, nullptr);
      if (fast)
        cuda::deltanet_recurrence_fast(conv, conv + h.key_dim(), conv + 2 * h.key_dim(), C, dbeta.f(), dg.f(), dS.f(),
                                       dout.f(), 1, h.nk, h.nv, h.d, h.d, nullptr, &norm);
      else
        cuda::deltanet_recurrence(conv, conv + h.key_dim(), conv + 2 * h.key_dim(), C, dbeta.f(), dg.f(), dS.f(),
                                  dout.f(), 1, h.nk, h.nv, h.d, h.d, nullptr, &norm);
    };
    layer_step();
    RL_CUDA_CHECK(cudaEventRecord(ev[0]));
    for (int i = 0; i < 100; i++) layer_step();
    RL_CUDA_CHECK(cudaEventRecord(ev[1]));
    RL_CUDA_CHECK(cudaEventSynchronize(ev[1]));
    std::printf("decode step of a DeltaNet layer (conv + gates, recurrence with the norm), %s: %.2f us\n",
                fast ? "fast" : "exact", elapsed_ms(ev[0], ev[1]) * 10.0f);
  }
  for (cudaEvent_t& e : ev) RL_CUDA_CHECK(cudaEventDestroy(e));
}

// Conv + SiLU and the gates over the chunks 1, 7, 64, 512 (the one-launch and the two-launch
// paths) from a nonzero conv state, input rows wider than the channels: outputs within the bound,
// the state exactly the last K-1 inputs after every chunk.
TEST_F(CudaDeltaNetFast, ConvGatesChunksAgainstDoubleReference) {
  for (const Heads& h : {kFixture, k80B}) {
    SCOPED_TRACE(h.name());
    const int K = 4, C = h.stride(), x_stride = C + 16, r = h.nv / h.nk;
    int total = 0;
    for (int T : kChunks) total += T;
    auto x = random_floats((size_t)total * x_stride, 300);
    auto w = random_floats((size_t)C * K, 301, 0.3f);
    auto state0 = random_floats((size_t)(K - 1) * C, 302);
    auto ba = random_floats((size_t)total * 2 * h.nv, 303, 2.0f);
    auto dt = random_floats(h.nv, 304);
    auto a = random_floats(h.nv, 305);
    for (float& v : a) v = -std::exp(v);
    auto dx = to_device(x), dw = to_device(w), dstate = to_device(state0), dba = to_device(ba), ddt = to_device(dt);
    auto da = to_device(a);
    std::vector<float> state = state0;  // the reference's: the previous K-1 inputs, oldest first
    int t0 = 0;
    for (int T : kChunks) {
      SCOPED_TRACE(std::to_string(T) + " tokens");
      cuda::DeviceBuffer dout((size_t)T * C * 4), dbeta((size_t)T * h.nv * 4), dg((size_t)T * h.nv * 4);
      RL_CUDA_CHECK(cudaMemset(dout.get(), 0xFF, dout.bytes()));
      cuda::deltanet_conv_gates_fast(dx.f() + (size_t)t0 * x_stride, x_stride, dout.f(), dstate.f(), dw.f(), T, C, K,
                                     dba.f() + (size_t)t0 * 2 * h.nv, ddt.f(), da.f(), dbeta.f(), dg.f(), h.nk, h.nv,
                                     nullptr);
      std::vector<double> want((size_t)T * C), bound(want.size());
      for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
          double s = 0, mag = 0;
          for (int i = 0; i < K; i++) {
            const int tau = t - (K - 1) + i;
            const float in = tau < 0 ? state[(size_t)(K - 1 + tau) * C + c] : x[(size_t)(t0 + tau) * x_stride + c];
            s += (double)w[(size_t)c * K + i] * in;
            mag += std::fabs((double)w[(size_t)c * K + i] * in);
          }
          const double y = s * sigmoid(s);
          want[(size_t)t * C + c] = y;
          bound[(size_t)t * C + c] = kMargin * (1.1 * K * kU * mag + 6 * kU * std::fabs(y));
        }
      std::vector<double> beta((size_t)T * h.nv), g(beta.size()), beta_bound(beta.size()), g_bound(beta.size());
      for (int t = 0; t < T; t++)
        for (int j = 0; j < h.nv; j++) {
          const float* row = ba.data() + (size_t)(t0 + t) * 2 * h.nv + (size_t)(j / r) * 2 * r;
          const size_t i = (size_t)t * h.nv + j;
          const double x_sp = (double)row[r + j % r] + dt[j], sp = softplus(x_sp);
          beta[i] = sigmoid(row[j % r]);
          beta_bound[i] = kMargin * 6 * kU * beta[i];
          g[i] = sp * a[j];
          g_bound[i] = kMargin * ((kU * std::fabs(x_sp) + 8 * kU * sp) * std::fabs(a[j]) + kU * std::fabs(g[i]));
        }
      expect_within(to_host<float>(dout, want.size()), want, bound, "conv + SiLU");
      expect_within(to_host<float>(dbeta, beta.size()), beta, beta_bound, "beta");
      expect_within(to_host<float>(dg, g.size()), g, g_bound, "g");
      for (int i = 0; i < K - 1; i++)
        for (int c = 0; c < C; c++) {
          const int tau = T - (K - 1) + i;
          const float next = tau < 0 ? state[(size_t)(i + T) * C + c] : x[(size_t)(t0 + tau) * x_stride + c];
          state[(size_t)i * C + c] = next;  // ascending i reads the entries it replaces first
        }
      EXPECT_EQ(to_host<float>(dstate, state.size()), state) << "conv state";
      t0 += T;
    }
  }
}

// A batched decode step's rows (deltanet_conv_gates_fast_rows, deltanet_recurrence_fast_rows): B
// sessions' states in one launch each against each row's own one-token calls on copies of the same
// states, over three steps that carry them: outputs, gates and both states equal bit for bit (the
// same arithmetic per row; a row reading another's state or inputs differs everywhere). At the
// 80B's heads with the fused norm and the fixtures' without.
TEST_F(CudaDeltaNetFast, RowsOfSessionsEqualEachSessionsOwnStep) {
  for (const Heads& h : {k80B, kFixture}) {
    SCOPED_TRACE(h.name());
    const int B = 5, K = 4, C = h.stride(), x_stride = C + 8, steps = 3, kd = h.key_dim();
    const cuda::L2Norm norm{1e-6f, (float)(1.0 / std::sqrt((double)h.d))};
    const cuda::L2Norm* fused = h.d == 128 ? &norm : nullptr;
    const float qk_scale = fused ? 2.0f : 0.05f;  // unnormalised q, k small enough to keep the state bounded
    auto w = random_floats((size_t)C * K, 700, 0.5f), dt = random_floats(h.nv, 701), a = random_floats(h.nv, 702);
    for (float& v : a) v = -std::exp(v);
    auto dw = to_device(w), ddt = to_device(dt), da = to_device(a);
    // Each row's states twice: for its own calls (own) and for the batched launches (rows).
    std::vector<cuda::DeviceBuffer> conv_own, conv_rows, ssm_own, ssm_rows;
    for (int r = 0; r < B; r++) {
      const auto cs = random_floats((size_t)(K - 1) * C, 710 + r, 1.0f), ss = random_floats(h.state_size(), 720 + r, 0.3f);
      conv_own.push_back(to_device(cs));
      conv_rows.push_back(to_device(cs));
      ssm_own.push_back(to_device(ss));
      ssm_rows.push_back(to_device(ss));
    }
    std::vector<float*> table;
    for (auto& b : conv_rows) table.push_back(b.f());
    for (auto& b : ssm_rows) table.push_back(b.f());
    auto dtable = to_device(table);
    float* const* conv_table = dtable.get<float*>();
    float* const* ssm_table = conv_table + B;
    const size_t out_row = (size_t)h.nv * h.d;
    cuda::DeviceBuffer conv_a((size_t)B * C * 4), conv_b((size_t)B * C * 4), beta_a((size_t)B * h.nv * 4),
        beta_b((size_t)B * h.nv * 4), g_a((size_t)B * h.nv * 4), g_b((size_t)B * h.nv * 4),
        out_a((size_t)B * out_row * 4), out_b((size_t)B * out_row * 4);
    for (int s = 0; s < steps; s++) {
      auto x = random_floats((size_t)B * x_stride, 730 + s, 1.0f);
      for (int r = 0; r < B; r++)  // q and k of each row at the scale the recurrence takes them
        for (int i = 0; i < 2 * kd; i++) x[(size_t)r * x_stride + i] *= qk_scale;
      auto ba = random_floats((size_t)B * 2 * h.nv, 740 + s, 2.0f);
      auto dx = to_device(x), dba = to_device(ba);
      for (int r = 0; r < B; r++) {
        float* conv = conv_a.f() + (size_t)r * C;
        cuda::deltanet_conv_gates_fast(dx.f() + (size_t)r * x_stride, x_stride, conv, conv_own[r].f(), dw.f(), 1, C,
                                       K, dba.f() + (size_t)r * 2 * h.nv, ddt.f(), da.f(), beta_a.f() + r * h.nv,
                                       g_a.f() + r * h.nv, h.nk, h.nv, nullptr);
        cuda::deltanet_recurrence_fast(conv, conv + kd, conv + 2 * kd, C, beta_a.f() + r * h.nv, g_a.f() + r * h.nv,
                                       ssm_own[r].f(), out_a.f() + r * out_row, 1, h.nk, h.nv, h.d, h.d, nullptr,
                                       fused);
      }
      cuda::deltanet_conv_gates_fast_rows(dx.f(), x_stride, conv_b.f(), conv_table, dw.f(), B, C, K, dba.f(), ddt.f(),
                                          da.f(), beta_b.f(), g_b.f(), h.nk, h.nv, nullptr);
      cuda::deltanet_recurrence_fast_rows(conv_b.f(), conv_b.f() + kd, conv_b.f() + 2 * kd, C, beta_b.f(), g_b.f(),
                                          ssm_table, out_b.f(), B, h.nk, h.nv, h.d, h.d, nullptr, fused);
      SCOPED_TRACE("step " + std::to_string(s));
      EXPECT_EQ(to_host<float>(conv_b, (size_t)B * C), to_host<float>(conv_a, (size_t)B * C)) << "conv outputs";
      EXPECT_EQ(to_host<float>(beta_b, (size_t)B * h.nv), to_host<float>(beta_a, (size_t)B * h.nv)) << "beta";
      EXPECT_EQ(to_host<float>(g_b, (size_t)B * h.nv), to_host<float>(g_a, (size_t)B * h.nv)) << "g";
      const auto oa = to_host<float>(out_a, (size_t)B * out_row), ob = to_host<float>(out_b, (size_t)B * out_row);
      EXPECT_EQ(ob, oa) << "outputs";
      EXPECT_TRUE(std::all_of(oa.begin(), oa.end(), [](float v) { return std::isfinite(v); })) << "outputs not finite";
      for (int r = 0; r < B; r++) {
        EXPECT_EQ(to_host<float>(conv_rows[r], (size_t)(K - 1) * C), to_host<float>(conv_own[r], (size_t)(K - 1) * C))
            << "conv state of row " << r;
        EXPECT_EQ(to_host<float>(ssm_rows[r], h.state_size()), to_host<float>(ssm_own[r], h.state_size()))
            << "state of row " << r;
      }
    }
  }
}

// Arguments the launchers refuse, before anything is launched (no device needed).
TEST(DeltaNetFastArguments, RefusedClearly) {
  float* p = reinterpret_cast<float*>(uintptr_t{256});  // never dereferenced: every call throws first
  auto recurrence = [&](int dk, int dv, const cuda::L2Norm* norm, int lanes, int rows, float* S) {
    cuda::deltanet_recurrence_fast(p, p, p, 64, p, p, S, p, 1, 1, 2, dk, dv, nullptr, norm, lanes, rows);
  };
  const cuda::L2Norm norm{1e-6f, 0.125f};
  EXPECT_THROW(recurrence(96, 64, nullptr, 0, 0, p), Error);      // key head dim
  EXPECT_THROW(recurrence(64, 64, &norm, 0, 0, p), Error);        // fused norm at dk 64
  EXPECT_THROW(recurrence(64, 8, nullptr, 0, 0, p), Error);       // 16 rows a block do not divide dv 8
  EXPECT_THROW(recurrence(64, 64, nullptr, 2, 1, p), Error);      // lanes a row
  EXPECT_THROW(recurrence(64, 64, nullptr, 4, 2, p), Error);      // 4 lanes take one row only
  EXPECT_THROW(recurrence(64, 64, nullptr, 8, 3, p), Error);      // rows a lane
  EXPECT_THROW(recurrence(64, 64, nullptr, 0, 0, p + 1), Error);  // state not 16-byte aligned
  EXPECT_THROW(cuda::deltanet_recurrence_fast(p, p, p, 64, p, p, p, p, 1, 2, 3, 64, 64, nullptr), Error);  // 3 / 2
  EXPECT_THROW(cuda::deltanet_conv_gates_fast(p, 64, p, p, p, 1, 64, 9, p, p, p, p, p, 1, 2, nullptr), Error);
  EXPECT_EQ(cuda::deltanet_fast_rows_per_block(8, 1), 16);
}

}  // namespace
}  // namespace rl
