// Norms, RoPE, attention, DeltaNet and MoE glue kernels against plain CPU references written from
// the math (DESIGN.md §1, fixtures README "Computation"), each at more than one shape.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/error.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"

namespace rl {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;

class CudaLayerKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::device_available())
      GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped (run it on the GPU host)";
  }
};

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x * sigmoid(x); }

void expect_all_near(const std::vector<float>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); i++)
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i]))) << what << " [" << i << "]";
}

TEST_F(CudaLayerKernels, RmsNormAndGatedNorm) {
  for (int width : {64, 256, 2048}) {
    const int rows = 7;
    auto x = random_floats((size_t)rows * width, 1, 2.0f);
    auto w = random_floats(width, 2);
    auto z = random_floats((size_t)rows * width, 3);
    auto dx = to_device(x), dw = to_device(w), dz = to_device(z);
    cuda::DeviceBuffer dout(x.size() * 4);
    std::vector<double> ref(x.size()), gref(x.size());
    for (int r = 0; r < rows; r++) {
      double ss = 0;
      for (int i = 0; i < width; i++) ss += (double)x[r * width + i] * x[r * width + i];
      const double s = 1.0 / std::sqrt(ss / width + 1e-6);
      for (int i = 0; i < width; i++) {
        ref[r * width + i] = x[r * width + i] * s * w[i];
        gref[r * width + i] = ref[r * width + i] * silu(z[r * width + i]);
      }
    }
    cuda::rms_norm(dx.f(), dw.f(), dout.f(), rows, width, 1e-6f, nullptr);
    expect_all_near(to_host<float>(dout, x.size()), ref, 1e-5, "rms_norm");
    cuda::gated_rms_norm(dx.f(), dz.f(), dw.f(), dout.f(), rows, width, 1e-6f, nullptr);
    expect_all_near(to_host<float>(dout, x.size()), gref, 1e-5, "gated_rms_norm");
  }
}

TEST_F(CudaLayerKernels, L2NormPerHeadWithStride) {
  for (int width : {64, 128}) {
    const int T = 3, heads = 2, stride = 5 * width;  // heads sit at the start of a wider row
    auto x = random_floats((size_t)T * stride, 4);
    auto dx = to_device(x);
    cuda::l2_norm(dx.f(), T, heads, width, stride, 1e-6f, 0.25f, nullptr);
    std::vector<double> ref(x.begin(), x.end());
    for (int t = 0; t < T; t++)
      for (int h = 0; h < heads; h++) {
        double ss = 0;
        for (int i = 0; i < width; i++) ss += std::pow(x[t * stride + h * width + i], 2);
        for (int i = 0; i < width; i++)
          ref[t * stride + h * width + i] = x[t * stride + h * width + i] / std::sqrt(ss + 1e-6) * 0.25;
      }
    expect_all_near(to_host<float>(dx, x.size()), ref, 1e-5, "l2_norm");
  }
}

TEST_F(CudaLayerKernels, PartialNeoxRope) {
  struct Case {
    int heads, hd, n_rot;
  };
  for (Case cs : {Case{4, 64, 16}, Case{16, 256, 64}}) {
    const int T = 3;
    const std::vector<int32_t> pos = {0, 5, 1099};
    auto x = random_floats((size_t)T * cs.heads * cs.hd, 5);
    auto dx = to_device(x);
    auto dp = to_device(pos);
    const float theta_scale = std::pow(1e7f, -2.0f / (float)cs.n_rot);
    cuda::rope_neox(dx.f(), T, cs.heads, cs.hd, (size_t)cs.heads * cs.hd, cs.n_rot, theta_scale, dp.get<int32_t>(), nullptr);
    std::vector<double> ref(x.begin(), x.end());
    for (int t = 0; t < T; t++)
      for (int h = 0; h < cs.heads; h++) {
        const size_t b = ((size_t)t * cs.heads + h) * cs.hd;
        for (int i = 0; i < cs.n_rot / 2; i++) {
          const double theta = pos[t] * std::pow(1e7, -2.0 * i / cs.n_rot);
          const double a = x[b + i], c = x[b + i + cs.n_rot / 2];
          ref[b + i] = a * std::cos(theta) - c * std::sin(theta);
          ref[b + i + cs.n_rot / 2] = a * std::sin(theta) + c * std::cos(theta);
        }
      }
    // fp32 angles at position 1099 are good to ~1e-4 rad.
    expect_all_near(to_host<float>(dx, x.size()), ref, 5e-4, "rope");
  }
}

// Causal GQA attention with a sigmoid output gate, written out in double (the oracle's two-pass
// softmax): out [T][n_head][hd] for queries at positions pos0 .. pos0 + T - 1.
std::vector<double> attention_reference(const std::vector<float>& q, const std::vector<float>& g,
                                        const std::vector<float>& kc, const std::vector<float>& vc, int T,
                                        int n_head, int n_kv, int hd, int pos0, double scale) {
  const int kv = n_kv * hd;
  std::vector<double> ref(q.size());
  for (int t = 0; t < T; t++)
    for (int h = 0; h < n_head; h++) {
      const int kh = h / (n_head / n_kv), nk = pos0 + t + 1;
      const float* qh = q.data() + ((size_t)t * n_head + h) * hd;
      std::vector<double> p(nk), acc(hd, 0.0);
      double mx = -1e300, sum = 0;
      for (int j = 0; j < nk; j++) {
        double sc = 0;
        const float* kj = kc.data() + (size_t)j * kv + kh * hd;
        for (int i = 0; i < hd; i++) sc += (double)qh[i] * kj[i];
        p[j] = sc * scale;
        mx = std::max(mx, p[j]);
      }
      for (double& v : p) sum += (v = std::exp(v - mx));
      for (int j = 0; j < nk; j++) {
        const float* vj = vc.data() + (size_t)j * kv + kh * hd;
        for (int i = 0; i < hd; i++) acc[i] += p[j] * vj[i];
      }
      for (int i = 0; i < hd; i++) {
        const size_t o = ((size_t)t * n_head + h) * hd + i;
        ref[o] = acc[i] / sum * sigmoid(g[o]);
      }
    }
  return ref;
}

struct AttentionCase {
  int n_head, n_kv, hd, pos0, T;
};

// Runs one case (keys already in the caches up to pos0, the T new ones stored by store_kv) and
// checks it against the reference; for a chunk, also that each token's decode step gives its
// output bit for bit.
void check_attention(const AttentionCase& cs, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << cs.n_head << "/" << cs.n_kv << " heads, hd " << cs.hd << ", pos0 "
                                    << cs.pos0 << ", T " << cs.T);
  const int n_keys = cs.pos0 + cs.T, n_ctx = std::max(64, n_keys), kv = cs.n_kv * cs.hd;
  // Keys of unit scale give scores of a few units: the softmax is neither flat nor one-hot.
  auto kc = random_floats((size_t)n_ctx * kv, seed), vc = random_floats((size_t)n_ctx * kv, seed + 1);
  auto knew = random_floats((size_t)cs.T * kv, seed + 2), vnew = random_floats((size_t)cs.T * kv, seed + 3);
  auto q = random_floats((size_t)cs.T * cs.n_head * cs.hd, seed + 4, 2.0f), g = random_floats(q.size(), seed + 5);
  auto dkc = to_device(kc), dvc = to_device(vc), dk = to_device(knew), dv = to_device(vnew);
  auto dq = to_device(q), dg = to_device(g);
  cuda::DeviceBuffer dout(q.size() * 4);
  cuda::DeviceBuffer split_storage(cuda::AttentionSplits::bytes(n_ctx, cs.n_head, cs.hd));
  const auto splits = cuda::AttentionSplits::within(split_storage.get(), n_ctx, cs.n_head, cs.hd);
  const float scale = 1.0f / std::sqrt((float)cs.hd);
  cuda::store_kv(dk.f(), dv.f(), dkc.f(), dvc.f(), cs.T, cs.n_kv, cs.hd, cs.pos0, nullptr);
  cuda::gated_attention(dq.f(), dg.f(), dkc.f(), dvc.f(), dout.f(), cs.T, cs.n_head, cs.n_kv, cs.hd, cs.pos0,
                        scale, nullptr, nullptr, &splits);
  std::copy(knew.begin(), knew.end(), kc.begin() + (size_t)cs.pos0 * kv);
  std::copy(vnew.begin(), vnew.end(), vc.begin() + (size_t)cs.pos0 * kv);
  const auto ref = attention_reference(q, g, kc, vc, cs.T, cs.n_head, cs.n_kv, cs.hd, cs.pos0, scale);
  const auto got = to_host<float>(dout, q.size());
  // Sums in double, one rounding to fp32 and the fp32 gate product: a few ulp of fp32.
  expect_all_near(got, ref, 1e-6, "attention");
  // A chunk's queries give bit for bit what one decode step per token gives (the splits' arithmetic
  // is shared), and the decode step reads its position from device memory as a graph does.
  const size_t row = (size_t)cs.n_head * cs.hd;
  cuda::DeviceBuffer dout1(row * 4), dpos(sizeof(int32_t));
  for (int t = 0; t < cs.T && cs.T > 1; t++) {
    const int32_t pos = cs.pos0 + t;
    RL_CUDA_CHECK(cudaMemcpy(dpos.get(), &pos, sizeof pos, cudaMemcpyHostToDevice));
    cuda::gated_attention(dq.f() + t * row, dg.f() + t * row, dkc.f(), dvc.f(), dout1.f(), 1, cs.n_head, cs.n_kv,
                          cs.hd, 0, scale, nullptr, dpos.get<int32_t>(), &splits);
    const auto one = to_host<float>(dout1, row);
    for (size_t i = 0; i < row; i++) ASSERT_EQ(one[i], got[t * row + i]) << "token " << t << " value " << i;
  }
}

// Chunks at the start and straddling split boundaries (kSplitKeys = 256), including query tiles of
// four whose queries end in different splits; the last case's decode steps take the many-split
// grouping (8 heads a block), the others one head a block.
TEST_F(CudaLayerKernels, GatedAttentionPrefillChunks) {
  for (AttentionCase cs : {AttentionCase{4, 2, 64, 0, 9}, AttentionCase{16, 2, 256, 30, 5},
                           AttentionCase{8, 2, 128, 61, 7}, AttentionCase{4, 2, 64, 250, 13},
                           AttentionCase{16, 2, 256, 509, 7}, AttentionCase{8, 2, 128, 1020, 70},
                           AttentionCase{16, 2, 256, 4000, 9}})
    check_attention(cs, 6);
}

// Decode steps at depths 1, 31, 32, 33, 4,095 and 70,001 (many splits, a partial last one) for the
// fixtures' 4/2 heads and the 80B's 16/2 (and 8/2) at their head dims.
TEST_F(CudaLayerKernels, GatedAttentionDecodeAtDepth) {
  for (int depth : {1, 31, 32, 33, 255, 256, 257, 4095})
    for (AttentionCase cs : {AttentionCase{4, 2, 64, depth - 1, 1}, AttentionCase{8, 2, 128, depth - 1, 1},
                             AttentionCase{16, 2, 256, depth - 1, 1}})
      check_attention(cs, 20 + depth);
  check_attention({16, 2, 256, 70000, 1}, 90);
  check_attention({4, 2, 64, 70000, 2}, 91);  // a two-token chunk there too
}

// A group of 3 query heads per KV head (no power of two): one head per decode block.
TEST_F(CudaLayerKernels, GatedAttentionOddGroup) { check_attention({6, 2, 64, 300, 3}, 95); }

// The decode step's fused L2 norm: recurrence with `norm` on raw q/k equals l2_norm, then the
// plain recurrence, bit for bit (outputs and state), over several single-token steps.
TEST_F(CudaLayerKernels, RecurrenceWithFusedL2NormEqualsL2NormThenRecurrence) {
  const int nk = 2, nv = 4, d = 128, key_dim = nk * d, conv_dim = 2 * key_dim + nv * d, steps = 3;
  const cuda::L2Norm norm{1e-6f, (float)(1.0 / std::sqrt((double)d))};
  auto s0 = random_floats((size_t)nv * d * d, 40, 0.1f);
  cuda::DeviceBuffer S1(s0.size() * 4), S2(s0.size() * 4);
  RL_CUDA_CHECK(cudaMemcpy(S1.get(), s0.data(), s0.size() * 4, cudaMemcpyHostToDevice));
  RL_CUDA_CHECK(cudaMemcpy(S2.get(), s0.data(), s0.size() * 4, cudaMemcpyHostToDevice));
  for (int step = 0; step < steps; step++) {
    auto qkv = random_floats(conv_dim, 41 + step, 2.0f);
    auto beta = random_floats(nv, 50 + step, 1.0f), g = random_floats(nv, 60 + step, 0.5f);
    for (float& b : beta) b = std::fabs(b);
    for (float& x : g) x = -std::fabs(x);
    auto d1 = to_device(qkv), d2 = to_device(qkv), db = to_device(beta), dg = to_device(g);
    cuda::DeviceBuffer o1(nv * d * 4), o2(nv * d * 4);
    cuda::l2_norm(d1.f(), 1, 2 * nk, d, conv_dim, norm.eps, norm.q_scale, nullptr, nk);
    cuda::deltanet_recurrence(d1.f(), d1.f() + key_dim, d1.f() + 2 * key_dim, conv_dim, db.f(), dg.f(), S1.f(), o1.f(),
                              1, nk, nv, d, d, nullptr);
    cuda::deltanet_recurrence(d2.f(), d2.f() + key_dim, d2.f() + 2 * key_dim, conv_dim, db.f(), dg.f(), S2.f(), o2.f(),
                              1, nk, nv, d, d, nullptr, &norm);
    EXPECT_EQ(to_host<float>(o1, nv * d), to_host<float>(o2, nv * d)) << "out, step " << step;
    EXPECT_EQ(to_host<float>(S1, s0.size()), to_host<float>(S2, s0.size())) << "state, step " << step;
    EXPECT_NE(to_host<float>(o1, nv * d), std::vector<float>(nv * d, 0.0f)) << "the step produced output";
  }
  // The fused form is for key heads of 128 values only.
  cuda::DeviceBuffer dummy(4096 * 4);
  EXPECT_THROW(cuda::deltanet_recurrence(dummy.f(), dummy.f(), dummy.f(), 64, dummy.f(), dummy.f(), dummy.f(),
                                         dummy.f(), 1, 1, 1, 64, 64, nullptr, &norm),
               Error);
}

// The bit patterns of fp32 values (an exact comparison: -0 and +0, NaN payloads differ).
std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// Two state rows a warp (their sums exchanged together) give bit for bit what one row a warp
// gives: outputs and state, key heads of 64 and 128, one token and several staging groups, with
// and without the fused L2 norm.
TEST_F(CudaLayerKernels, RecurrenceTwoRowsPerWarpEqualOneRowPerWarp) {
  const int nk = 2, nv = 4;
  for (int d : {64, 128})
    for (int T : {1, 37})
      for (bool fused : {false, true}) {
        if (fused && d != 128) continue;
        SCOPED_TRACE("d=" + std::to_string(d) + " T=" + std::to_string(T) + (fused ? " fused norm" : ""));
        const int key_dim = nk * d, conv_dim = 2 * key_dim + nv * d;
        const cuda::L2Norm norm{1e-6f, (float)(1.0 / std::sqrt((double)d))};
        auto s0 = random_floats((size_t)nv * d * d, 70 + d + T, 0.1f);
        auto qkv = random_floats((size_t)T * conv_dim, 71 + d + T, fused ? 2.0f : 0.2f);
        auto beta = random_floats((size_t)T * nv, 72, 1.0f), g = random_floats((size_t)T * nv, 73, 0.5f);
        for (float& b : beta) b = std::fabs(b);
        for (float& x : g) x = -std::fabs(x);
        auto dq = to_device(qkv), db = to_device(beta), dg = to_device(g);
        std::vector<uint32_t> outs[2], states[2];  // bit patterns: -0 and +0 differ
        for (int rows : {1, 2}) {
          auto dS = to_device(s0);
          cuda::DeviceBuffer dout((size_t)T * nv * d * 4);
          // NaN everywhere first, so that an output a kernel leaves unwritten cannot pass as the
          // previous kernel's value left in reused memory.
          RL_CUDA_CHECK(cudaMemset(dout.get(), 0xFF, (size_t)T * nv * d * 4));
          cuda::deltanet_recurrence(dq.f(), dq.f() + key_dim, dq.f() + 2 * key_dim, conv_dim, db.f(), dg.f(), dS.f(),
                                    dout.f(), T, nk, nv, d, d, nullptr, fused ? &norm : nullptr, rows);
          outs[rows - 1] = bits(to_host<float>(dout, (size_t)T * nv * d));
          states[rows - 1] = bits(to_host<float>(dS, s0.size()));
        }
        EXPECT_EQ(outs[0], outs[1]) << "outputs";
        EXPECT_EQ(states[0], states[1]) << "state";
        EXPECT_NE(states[0], bits(s0)) << "the steps changed the state";
        for (uint32_t b : outs[0]) ASSERT_NE(b, 0xFFFFFFFFu) << "an output left unwritten";
      }
  cuda::DeviceBuffer dummy(4096 * 4);
  EXPECT_THROW(cuda::deltanet_recurrence(dummy.f(), dummy.f(), dummy.f(), 64, dummy.f(), dummy.f(), dummy.f(),
                                         dummy.f(), 1, 1, 1, 64, 64, nullptr, nullptr, 3),
               Error);
  // Two rows a warp need value heads of a multiple of 16 rows (8 warps a block, one head).
  EXPECT_THROW(cuda::deltanet_recurrence(dummy.f(), dummy.f(), dummy.f(), 64, dummy.f(), dummy.f(), dummy.f(),
                                         dummy.f(), 1, 1, 1, 8, 8, nullptr, nullptr, 2),
               Error);
}

// Conv + gates + recurrence, run as two calls (the state carries over) against one CPU pass.
TEST_F(CudaLayerKernels, DeltaNetConvGatesAndRecurrence) {
  struct Case {
    int nk, nv, d, T1, T2;
  };
  // 37 and 20 tokens: several of the recurrence's 16-token staging groups, the last one partial.
  for (Case cs : {Case{2, 4, 64, 5, 1}, Case{2, 4, 128, 1, 9}, Case{2, 4, 128, 12, 2}, Case{2, 4, 64, 2, 2},
                  Case{2, 4, 128, 37, 20}, Case{2, 4, 64, 20, 37}}) {
    SCOPED_TRACE(cs.d);
    const int K = 4, key_dim = cs.nk * cs.d, conv_dim = 2 * key_dim + cs.nv * cs.d, T = cs.T1 + cs.T2;
    const int r = cs.nv / cs.nk;
    auto x = random_floats((size_t)T * conv_dim, 12);
    auto w = random_floats((size_t)conv_dim * K, 13, 0.3f);
    auto ba = random_floats((size_t)T * 2 * cs.nv, 14);
    auto dt = random_floats(cs.nv, 15);
    std::vector<float> a(cs.nv);
    for (int j = 0; j < cs.nv; j++) a[j] = -0.1f * (j + 1);

    // CPU reference.
    std::vector<double> conv((size_t)T * conv_dim), beta((size_t)T * cs.nv), g((size_t)T * cs.nv);
    for (int t = 0; t < T; t++)
      for (int c = 0; c < conv_dim; c++) {
        double s = 0;
        for (int j = 0; j < K; j++) {
          const int src = t - (K - 1) + j;
          if (src >= 0) s += (double)w[c * K + j] * x[(size_t)src * conv_dim + c];
        }
        conv[(size_t)t * conv_dim + c] = silu(s);
      }
    for (int t = 0; t < T; t++)
      for (int j = 0; j < cs.nv; j++) {
        const int kh = j / r, i = j % r;
        beta[t * cs.nv + j] = sigmoid(ba[t * 2 * cs.nv + kh * 2 * r + i]);
        g[t * cs.nv + j] = std::log1p(std::exp((double)ba[t * 2 * cs.nv + kh * 2 * r + r + i] + dt[j])) * a[j];
      }
    std::vector<double> qk = conv;
    for (int t = 0; t < T; t++)
      for (int h = 0; h < 2 * cs.nk; h++) {
        double ss = 0;
        for (int i = 0; i < cs.d; i++) ss += std::pow(qk[(size_t)t * conv_dim + h * cs.d + i], 2);
        const double sc = (h < cs.nk ? 1.0 / std::sqrt((double)cs.d) : 1.0) / std::sqrt(ss + 1e-6);
        for (int i = 0; i < cs.d; i++) qk[(size_t)t * conv_dim + h * cs.d + i] *= sc;
      }
    std::vector<double> S((size_t)cs.nv * cs.d * cs.d, 0.0), out((size_t)T * cs.nv * cs.d);
    for (int t = 0; t < T; t++)
      for (int j = 0; j < cs.nv; j++) {
        const double* q = &qk[(size_t)t * conv_dim + (j / r) * cs.d];
        const double* k = &qk[(size_t)t * conv_dim + key_dim + (j / r) * cs.d];
        const double* v = &qk[(size_t)t * conv_dim + 2 * key_dim + j * cs.d];
        double* Sj = &S[(size_t)j * cs.d * cs.d];
        for (size_t i = 0; i < (size_t)cs.d * cs.d; i++) Sj[i] *= std::exp(g[t * cs.nv + j]);
        for (int i = 0; i < cs.d; i++) {
          double sk = 0;
          for (int c = 0; c < cs.d; c++) sk += Sj[i * cs.d + c] * k[c];
          const double dd = (v[i] - sk) * beta[t * cs.nv + j];
          for (int c = 0; c < cs.d; c++) Sj[i * cs.d + c] += dd * k[c];
          double o = 0;
          for (int c = 0; c < cs.d; c++) o += Sj[i * cs.d + c] * q[c];
          out[((size_t)t * cs.nv + j) * cs.d + i] = o;
        }
      }

    // GPU, in two calls.
    auto dx = to_device(x), dw = to_device(w), dba = to_device(ba), ddt = to_device(dt), da = to_device(a);
    cuda::DeviceBuffer dstate((size_t)(K - 1) * conv_dim * 4), dS(S.size() * 4), dconv(x.size() * 4);
    cuda::DeviceBuffer dbeta((size_t)T * cs.nv * 4), dg((size_t)T * cs.nv * 4), dout(out.size() * 4);
    RL_CUDA_CHECK(cudaMemset(dstate.get(), 0, dstate.bytes()));
    RL_CUDA_CHECK(cudaMemset(dS.get(), 0, dS.bytes()));
    int t0 = 0;
    for (int Tc : {cs.T1, cs.T2}) {
      float* c0 = dconv.f() + (size_t)t0 * conv_dim;
      if (Tc % 2) {  // the backend's combined launch
        cuda::deltanet_conv_gates(dx.f() + (size_t)t0 * conv_dim, conv_dim, c0, dstate.f(), dw.f(), Tc, conv_dim, K,
                                  dba.f() + (size_t)t0 * 2 * cs.nv, ddt.f(), da.f(), dbeta.f() + t0 * cs.nv,
                                  dg.f() + t0 * cs.nv, cs.nk, cs.nv, nullptr);
      } else {
        cuda::deltanet_gates(dba.f() + (size_t)t0 * 2 * cs.nv, ddt.f(), da.f(), dbeta.f() + t0 * cs.nv,
                             dg.f() + t0 * cs.nv, Tc, cs.nk, cs.nv, nullptr);
        cuda::conv1d_silu(dx.f() + (size_t)t0 * conv_dim, conv_dim, c0, dstate.f(), dw.f(), Tc, conv_dim, K, nullptr);
      }
      if (Tc % 2) {  // the backend's one launch over q and k heads
        cuda::l2_norm(c0, Tc, 2 * cs.nk, cs.d, conv_dim, 1e-6f, 1.0f / std::sqrt((float)cs.d), nullptr, cs.nk);
      } else {
        cuda::l2_norm(c0, Tc, cs.nk, cs.d, conv_dim, 1e-6f, 1.0f / std::sqrt((float)cs.d), nullptr);
        cuda::l2_norm(c0 + key_dim, Tc, cs.nk, cs.d, conv_dim, 1e-6f, 1.0f, nullptr);
      }
      cuda::deltanet_recurrence(c0, c0 + key_dim, c0 + 2 * key_dim, conv_dim, dbeta.f() + t0 * cs.nv,
                                dg.f() + t0 * cs.nv, dS.f(), dout.f() + (size_t)t0 * cs.nv * cs.d, Tc, cs.nk,
                                cs.nv, cs.d, cs.d, nullptr);
      t0 += Tc;
    }
    expect_all_near(to_host<float>(dbeta, beta.size()), beta, 1e-5, "beta");
    expect_all_near(to_host<float>(dg, g.size()), g, 1e-5, "g");
    expect_all_near(to_host<float>(dconv, conv.size()), qk, 1e-5, "conv+l2");
    expect_all_near(to_host<float>(dout, out.size()), out, 1e-4, "recurrence out");
    expect_all_near(to_host<float>(dS, S.size()), S, 1e-4, "state");
  }
}

TEST_F(CudaLayerKernels, RouterSoftmaxSwigluCombineGather) {
  for (int E : {64, 512}) {
    const int T = 3, K = 10, width = 256;
    auto logits = random_floats((size_t)T * E, 16, 3.0f);
    auto dl = to_device(logits);
    cuda::DeviceBuffer dp(logits.size() * 4);
    cuda::softmax_rows(dl.f(), dp.f(), T, E, nullptr);
    std::vector<double> ref(logits.size());
    for (int t = 0; t < T; t++) {
      double mx = *std::max_element(logits.begin() + t * E, logits.begin() + (t + 1) * E), s = 0;
      for (int e = 0; e < E; e++) s += std::exp(logits[t * E + e] - mx);
      for (int e = 0; e < E; e++) ref[t * E + e] = std::exp(logits[t * E + e] - mx) / s;
    }
    expect_all_near(to_host<float>(dp, ref.size()), ref, 1e-5, "softmax");

    auto gate = random_floats((size_t)T * K * width, 17), up = random_floats(gate.size(), 18);
    auto dgt = to_device(gate), dup = to_device(up);
    cuda::DeviceBuffer dact(gate.size() * 4);
    cuda::swiglu(dgt.f(), dup.f(), dact.f(), gate.size(), nullptr);
    std::vector<double> act(gate.size());
    for (size_t i = 0; i < gate.size(); i++) act[i] = silu(gate[i]) * up[i];
    expect_all_near(to_host<float>(dact, act.size()), act, 1e-5, "swiglu");

    // y rows assigned out of order; x += sum_k w y[assign] + sigmoid(sg) * shared.
    auto y = random_floats((size_t)T * K * width, 19), shared = random_floats((size_t)T * width, 20);
    auto x = random_floats((size_t)T * width, 21), wts = random_floats((size_t)T * K, 22), sg = random_floats(T, 23);
    std::vector<int32_t> assign(T * K);
    for (int i = 0; i < T * K; i++) assign[i] = (i * 7) % (T * K);
    auto dx = to_device(x), dy = to_device(y), dsh = to_device(shared), dw = to_device(wts), dsg = to_device(sg);
    auto da = to_device(assign);
    cuda::moe_combine(dx.f(), dy.f(), da.get<int32_t>(), dw.f(), K, dsh.f(), dsg.f(), T, width, nullptr);
    std::vector<double> xr(x.begin(), x.end());
    for (int t = 0; t < T; t++)
      for (int c = 0; c < width; c++) {
        double m = 0;
        for (int k = 0; k < K; k++) m += (double)wts[t * K + k] * y[(size_t)assign[t * K + k] * width + c];
        xr[t * width + c] += m + sigmoid(sg[t]) * shared[t * width + c];
      }
    expect_all_near(to_host<float>(dx, xr.size()), xr, 1e-5, "combine");

    std::vector<int32_t> idx = {2, 0, 2, 1};
    cuda::DeviceBuffer dgath(idx.size() * width * 4);
    auto di = to_device(idx);
    cuda::gather_rows(dsh.f(), di.get<int32_t>(), dgath.f(), (int)idx.size(), width, nullptr);
    auto gth = to_host<float>(dgath, idx.size() * width);
    for (size_t i = 0; i < idx.size(); i++)
      for (int c = 0; c < width; c++) ASSERT_EQ(gth[i * width + c], shared[(size_t)idx[i] * width + c]);
  }
}

TEST_F(CudaLayerKernels, SplitQueryAndGate) {
  const int T = 2, nh = 3, hd = 64;
  auto qg = random_floats((size_t)T * nh * 2 * hd, 24);
  auto dqg = to_device(qg);
  cuda::DeviceBuffer dq((size_t)T * nh * hd * 4), dg((size_t)T * nh * hd * 4);
  cuda::split_q_gate(dqg.f(), dq.f(), dg.f(), T, nh, hd, nullptr);
  auto q = to_host<float>(dq, (size_t)T * nh * hd), g = to_host<float>(dg, (size_t)T * nh * hd);
  for (int t = 0; t < T; t++)
    for (int h = 0; h < nh; h++)
      for (int i = 0; i < hd; i++) {
        ASSERT_EQ(q[(t * nh + h) * hd + i], qg[(t * nh + h) * 2 * hd + i]);
        ASSERT_EQ(g[(t * nh + h) * hd + i], qg[(t * nh + h) * 2 * hd + hd + i]);
      }
}

}  // namespace
}  // namespace rl
