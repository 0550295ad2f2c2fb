// The fast tier's delta-rule step (cpu/deltanet_fast.h) against the oracle's form of it (the
// arithmetic of forward.cpp's exact recurrence: fp32 state, double sums), over 200 tokens from a
// nonzero state, at the 80B's head (dk = dv = 128), the fixtures' (64) and a width with a tail
// (dk 20, dv 24: not a multiple of 8).
//
// Bound: each fp32 dot product of dk terms is off by ~2^-24·√dk relative (≤ 7e-7 at 128) where the
// oracle rounds an exact-ish double sum; both round the state to fp32 every step, and the decay (<
// 1) and the delta rule's (I − β k kᵀ) contraction keep the differences from compounding: the
// outputs and the state stay within 1e-5 relative RMS over the 200 tokens (a dropped decay, a sign
// or a lost tail column is off by far more).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cpu/deltanet_fast.h"

namespace rl::cpu {
namespace {

struct Step {
  std::vector<float> q, k, v;
  float decay, beta;
};

std::vector<Step> steps(int n, int dk, int dv, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<Step> out(n);
  for (Step& s : out) {
    s.q.resize(dk), s.k.resize(dk), s.v.resize(dv);
    double nq = 0, nk = 0;
    for (int i = 0; i < dk; i++) nq += (s.q[i] = nd(rng)) * s.q[i], nk += (s.k[i] = nd(rng)) * s.k[i];
    for (int i = 0; i < dk; i++) s.q[i] /= (float)std::sqrt(nq * dk), s.k[i] /= (float)std::sqrt(nk);  // as l2norm, q/√dk
    for (float& x : s.v) x = nd(rng);
    s.decay = std::exp(-u(rng) * 0.5f);
    s.beta = u(rng);
  }
  return out;
}

// The oracle's step: forward.cpp's exact recurrence for one head and token.
void oracle_step(std::vector<float>& S, const Step& s, int dk, int dv, float* o) {
  const double decay = s.decay, b = s.beta;
  std::vector<double> d(dv);
  auto dot = [&](const float* a, const float* x) {
    double acc = 0;
    for (int c = 0; c < dk; c++) acc += (double)a[c] * x[c];
    return acc;
  };
  for (float& x : S) x = (float)(x * decay);
  for (int i = 0; i < dv; i++) d[i] = ((double)s.v[i] - dot(&S[(size_t)i * dk], s.k.data())) * b;
  for (int i = 0; i < dv; i++)
    for (int c = 0; c < dk; c++) S[(size_t)i * dk + c] = (float)(S[(size_t)i * dk + c] + d[i] * s.k[c]);
  for (int i = 0; i < dv; i++) o[i] = (float)dot(&S[(size_t)i * dk], s.q.data());
}

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, r = 0;
  for (size_t i = 0; i < a.size(); i++) e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
  return std::sqrt(e / r);
}

TEST(CpuFastDeltaRule, MatchesTheOraclesStepOver200Tokens) {
  struct Shape {
    int dk, dv;
  };
  for (Shape sh : {Shape{128, 128}, Shape{64, 64}, Shape{20, 24}}) {
    SCOPED_TRACE(::testing::Message() << "dk " << sh.dk << ", dv " << sh.dv);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 0.3f);
    std::vector<float> S((size_t)sh.dk * sh.dv);
    for (float& x : S) x = nd(rng);
    std::vector<float> S_fast = S, o_ref(sh.dv), o_fast(sh.dv), all_ref, all_fast;
    for (const Step& s : steps(200, sh.dk, sh.dv, 11)) {
      oracle_step(S, s, sh.dk, sh.dv, o_ref.data());
      delta_rule_step_fast(S_fast.data(), s.q.data(), s.k.data(), s.v.data(), s.decay, s.beta, sh.dk, sh.dv,
                           o_fast.data());
      all_ref.insert(all_ref.end(), o_ref.begin(), o_ref.end());
      all_fast.insert(all_fast.end(), o_fast.begin(), o_fast.end());
    }
    EXPECT_LE(rel_rms(all_fast, all_ref), 1e-5) << "outputs";
    EXPECT_LE(rel_rms(S_fast, S), 1e-5) << "state";
    EXPECT_GT(rel_rms(all_ref, std::vector<float>(all_ref.size(), 0.0f)), 0.5) << "the outputs are not all zero";
  }
}

}  // namespace
}  // namespace rl::cpu
