// Sampler: greedy is argmax, seeds reproduce, the filters never let an excluded token through,
// and temperature reshapes the distribution as softmax(l / T) says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "common/error.h"
#include "generate/sampler.h"

namespace rl {
namespace {

std::vector<float> random_logits(int n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> l(n);
  for (auto& v : l) v = d(g);
  return l;
}

SamplingParams plain(float temperature, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  return p;
}

std::map<int32_t, int> histogram(Sampler& s, const std::vector<float>& logits, int draws) {
  std::map<int32_t, int> h;
  for (int i = 0; i < draws; ++i) h[s.sample(logits)]++;
  return h;
}

TEST(Sampler, GreedyEqualsArgmax) {
  for (int n : {1, 7, 4099, 151936}) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      auto l = random_logits(n, seed);
      // Independent reference: the first position of the maximum.
      int32_t expected = (int32_t)(std::max_element(l.begin(), l.end()) - l.begin());
      Sampler s(plain(0.0f, seed));
      EXPECT_EQ(s.sample(l), expected) << "n=" << n << " seed=" << seed;
    }
  }
  // Ties go to the lower id.
  Sampler s(plain(0.0f));
  EXPECT_EQ(s.sample(std::vector<float>{1, 5, 3, 5}), 1);
}

TEST(Sampler, FixedSeedReproduces) {
  auto l = random_logits(500, 7, 1.0f);
  SamplingParams p = plain(1.0f, 1234);
  Sampler a(p), b(p);
  std::vector<int32_t> sa, sb;
  for (int i = 0; i < 300; ++i) {
    sa.push_back(a.sample(l));
    sb.push_back(b.sample(l));
  }
  EXPECT_EQ(sa, sb);
  Sampler c(plain(1.0f, 1235));
  std::vector<int32_t> sc;
  for (int i = 0; i < 300; ++i) sc.push_back(c.sample(l));
  EXPECT_NE(sa, sc);
  EXPECT_GT(std::set<int32_t>(sa.begin(), sa.end()).size(), 20u);  // it really samples
}

TEST(Sampler, TopKNeverEmitsExcluded) {
  auto l = random_logits(1000, 11, 1.0f);
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  for (int k : {1, 5, 40}) {
    std::set<int32_t> allowed(order.begin(), order.begin() + k);
    SamplingParams p = plain(2.0f, 99);  // hot: without the filter the tail would show up
    p.top_k = k;
    Sampler s(p);
    auto h = histogram(s, l, 20000);
    for (auto [token, count] : h) EXPECT_TRUE(allowed.count(token)) << "k=" << k << " emitted " << token;
    EXPECT_EQ(h.size(), allowed.size()) << "every kept token should appear at T=2";
  }
}

TEST(Sampler, TopPNeverEmitsExcluded) {
  // p = [0.5, 0.25, 0.15, 0.1]: the nucleus for top_p 0.7 is {0, 1} (0.5 < 0.7 <= 0.75).
  std::vector<float> l = {std::log(0.5f), std::log(0.25f), std::log(0.15f), std::log(0.1f)};
  SamplingParams p = plain(1.0f, 5);
  p.top_p = 0.7f;
  Sampler s(p);
  auto h = histogram(s, l, 30000);
  EXPECT_EQ(h.count(2), 0u);
  EXPECT_EQ(h.count(3), 0u);
  // Renormalised: 0.5/0.75 and 0.25/0.75.
  EXPECT_NEAR(h[0] / 30000.0, 2.0 / 3.0, 0.015);
  EXPECT_NEAR(h[1] / 30000.0, 1.0 / 3.0, 0.015);

  // top_p 0.8 also keeps token 2 (0.75 < 0.8 <= 0.9), never token 3.
  p.top_p = 0.8f;
  Sampler s2(p);
  auto h2 = histogram(s2, l, 30000);
  EXPECT_EQ(h2.count(3), 0u);
  EXPECT_GT(h2[2], 0);

  // A wide vocabulary whose nucleus is hundreds of tokens: the same set as an independent full
  // sort + cumulative softmax gives.
  auto wide = random_logits(20000, 21, 1.5f);
  std::vector<int32_t> order(wide.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return wide[a] > wide[b]; });
  double z = 0;
  for (float v : wide) z += std::exp((double)v - wide[order[0]]);
  std::set<int32_t> nucleus;
  double cum = 0;
  for (int32_t t : order) {
    nucleus.insert(t);
    cum += std::exp((double)wide[t] - wide[order[0]]) / z;
    if (cum >= 0.9) break;
  }
  ASSERT_GT(nucleus.size(), 256u) << "the case must exercise the growing sorted prefix";
  p.top_p = 0.9f;
  Sampler s3(p);
  auto cands = s3.candidates(wide);
  EXPECT_EQ(cands.size(), nucleus.size());
  for (int i = 0; i < 300; ++i) {
    int32_t t = s3.sample(wide);
    ASSERT_TRUE(nucleus.count(t)) << "token " << t << " is outside the nucleus";
  }
}

TEST(Sampler, MinPNeverEmitsExcluded) {
  // p = [0.5, 0.3, 0.12, 0.08]; min_p 0.2 keeps p >= 0.1: tokens 0, 1, 2.
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.12f), std::log(0.08f)};
  SamplingParams p = plain(1.0f, 8);
  p.min_p = 0.2f;
  Sampler s(p);
  auto h = histogram(s, l, 30000);
  EXPECT_EQ(h.count(3), 0u);
  EXPECT_NEAR(h[2] / 30000.0, 0.12 / 0.92, 0.012);
  // On a wide random vocabulary: every emitted token passes the threshold.
  auto wide = random_logits(2000, 3, 2.0f);
  p.min_p = 0.05f;
  Sampler s2(p);
  const float top = *std::max_element(wide.begin(), wide.end());
  for (int i = 0; i < 5000; ++i) {
    int32_t t = s2.sample(wide);
    EXPECT_GE(std::exp(wide[t] - top), 0.05f - 1e-6f) << "token " << t;
  }
}

TEST(Sampler, TemperatureBehaves) {
  std::vector<float> l = {0.0f, 1.0f, 2.0f};
  const int draws = 40000;
  double entropy_prev = -1;
  for (float t : {0.5f, 1.0f, 2.0f}) {
    Sampler s(plain(t, 77));
    auto h = histogram(s, l, draws);
    // softmax(l / T), computed here independently.
    double z = 0;
    for (float v : l) z += std::exp(v / t);
    double entropy = 0;
    for (int i = 0; i < 3; ++i) {
      double expected = std::exp(l[i] / t) / z;
      EXPECT_NEAR(h[i] / (double)draws, expected, 0.01) << "T=" << t << " token " << i;
      double f = h[i] / (double)draws;
      if (f > 0) entropy -= f * std::log(f);
    }
    EXPECT_GT(entropy, entropy_prev) << "higher temperature must spread the distribution";
    entropy_prev = entropy;
  }
  // A tiny temperature is argmax in practice.
  Sampler cold(plain(0.01f, 3));
  auto h = histogram(cold, l, 1000);
  EXPECT_EQ(h[2], 1000);
}

TEST(Sampler, Penalties) {
  // logits [2, -2, 1.5]; history [0, 0, 1].
  std::vector<float> l = {2.0f, -2.0f, 1.5f};
  auto pick = [&](SamplingParams p) {
    p.temperature = 0;
    Sampler s(p);
    for (int32_t t : {0, 0, 1}) s.accept(t);
    return s.sample(l);
  };
  SamplingParams p = plain(0);
  EXPECT_EQ(pick(p), 0);
  p.repeat_penalty = 2.0f;  // 2 -> 1 (< 1.5)
  EXPECT_EQ(pick(p), 2);
  p = plain(0);
  p.frequency_penalty = 0.3f;  // 2 - 2*0.3 = 1.4 < 1.5
  EXPECT_EQ(pick(p), 2);
  p.frequency_penalty = 0.2f;  // 1.6 > 1.5
  EXPECT_EQ(pick(p), 0);
  p = plain(0);
  p.presence_penalty = 0.6f;  // 1.4 < 1.5
  EXPECT_EQ(pick(p), 2);
  // The window: only the last token (1) counts, so 0 is not penalised.
  p.repeat_last_n = 1;
  EXPECT_EQ(pick(p), 0);
  // The penalised candidate list shows the exact values: repetition divides positive logits and
  // multiplies negative ones.
  SamplingParams q = plain(1.0f);
  q.repeat_penalty = 2.0f;
  Sampler s(q);
  s.accept(0);
  s.accept(1);
  auto c = s.candidates(l);  // logits become [1, -4, 1.5]
  ASSERT_EQ(c.size(), 3u);
  double z = std::exp(1.0) + std::exp(-4.0) + std::exp(1.5);
  EXPECT_EQ(c[0].first, 2);
  EXPECT_NEAR(c[0].second, std::exp(1.5) / z, 1e-6);
  EXPECT_EQ(c[2].first, 1);
  EXPECT_NEAR(c[2].second, std::exp(-4.0) / z, 1e-6);
}

// The candidates of a top-k chain against the chain written out over a full sort of the row:
// the k first tokens (descending logit, lower id first), softmax of l / T over them in double,
// min-p, the shortest prefix reaching top-p, renormalised. Each sampler serves rows of both sizes
// in turn (its buffers are reused), with penalties and a mask on some.
TEST(Sampler, TopKCandidatesEqualTheChainOverAFullSort) {
  struct Case {
    float t;
    int k;
    float p, min_p, repeat;
    bool mask;
  };
  const Case cases[] = {{0.7f, 20, 0.8f, 0.0f, 1.0f, false}, {1.0f, 50, 1.0f, 0.0f, 1.0f, false},
                        {0.5f, 5, 1.0f, 0.1f, 1.0f, false},  {1.3f, 1000, 0.95f, 0.0f, 1.3f, false},
                        {0.9f, 40, 0.9f, 0.05f, 1.1f, true}};
  for (const Case& cs : cases) {
    SamplingParams sp = plain(cs.t);
    sp.top_k = cs.k, sp.top_p = cs.p, sp.min_p = cs.min_p, sp.repeat_penalty = cs.repeat;
    Sampler s(sp);
    const std::vector<int32_t> history = {3, 17, 3, 4000};
    for (int32_t t : history) s.accept(t);
    for (int n : {151936, 4099, 151936}) {
      std::vector<float> l = random_logits(n, (uint32_t)(n + cs.k));
      const int tie = n / 2;
      l[tie] = l[tie + 1] = 25.0f;  // a tie at the top
      TokenMask mask;
      mask.reset(n);
      for (int i = 0; i < n; i += 3) mask.allow(i);
      mask.allow(tie + 1);
      // The written-out chain.
      std::vector<float> e(l);
      if (cs.mask)
        for (int i = 0; i < n; i++)
          if (!mask.allows(i)) e[i] = -INFINITY;
      if (cs.repeat != 1.0f)
        for (int32_t t : std::set<int32_t>(history.begin(), history.end()))
          e[t] = e[t] > 0 ? e[t] / cs.repeat : e[t] * cs.repeat;
      std::vector<int32_t> ids(n);
      std::iota(ids.begin(), ids.end(), 0);
      std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return e[a] > e[b] || (e[a] == e[b] && a < b); });
      ids.resize(cs.k);
      std::erase_if(ids, [&](int32_t t) { return e[t] == -INFINITY; });
      std::vector<double> w;
      double norm = 0;
      for (int32_t t : ids) norm += w.emplace_back(std::exp((double)(e[t] - e[ids[0]]) * (1.0 / cs.t)));
      std::vector<std::pair<int32_t, double>> kept;
      for (size_t i = 0; i < ids.size(); i++)
        if (!(cs.min_p > 0 && w[i] < cs.min_p)) kept.push_back({ids[i], w[i]});
      if (cs.p < 1.0f) {
        size_t n_keep = 0;
        double cum = 0;
        while (n_keep < kept.size()) {
          cum += kept[n_keep++].second / norm;
          if (cum >= cs.p) break;
        }
        kept.resize(n_keep);
      }
      double mass = 0;
      for (auto& [t, wt] : kept) mass += wt;
      const auto got = s.candidates(l, cs.mask ? &mask : nullptr);
      ASSERT_EQ(got.size(), kept.size()) << "k " << cs.k << " n " << n;
      for (size_t i = 0; i < kept.size(); i++) {
        EXPECT_EQ(got[i].first, kept[i].first) << "k " << cs.k << " n " << n << " rank " << i;
        EXPECT_EQ(got[i].second, (float)(kept[i].second / mass)) << "k " << cs.k << " n " << n << " rank " << i;
      }
      // The tie at the top: the lower id first, unless the mask leaves it out.
      EXPECT_EQ(got[0].first, cs.mask && !mask.allows(tie) ? tie + 1 : tie);
    }
  }
}

TEST(Sampler, RejectsBadParameters) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.min_p = 1.5f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.repeat_penalty = 0.0f;
  EXPECT_THROW(Sampler{p}, Error);
}

}  // namespace
}  // namespace rl
