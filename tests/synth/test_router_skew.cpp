// Router skew: the capped Zipf targets, the gains that realise them, and the LRU hit rates a cache
// of experts sees with the synthesized routers (numbers printed for docs/synth.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <numeric>

#include "synth/random_blocks.h"
#include "synth/router_skew.h"
#include "synth/routing_study.h"
#include "synth/synth.h"

namespace rl::synth {
namespace {

TEST(RouterSkew, TargetsAreACappedZipfLawSummingToK) {
  const auto p = zipf_selection_targets(512, 10, 1.0, 0.4);
  EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 10.0, 1e-9);
  for (double v : p) EXPECT_LE(v, 0.4 + 1e-12);
  // Below the cap the law is exactly c / rank^S.
  EXPECT_NEAR(p[99] / p[199], 200.0 / 100.0, 1e-9);
  const auto flat = zipf_selection_targets(64, 4, 0.0, 0.4);
  for (double v : flat) EXPECT_NEAR(v, 4.0 / 64, 1e-12);
}

TEST(RouterSkew, GainsRealiseTheTargetPopularity) {
  for (double s : {0.5, 1.0}) {
    const int n = 128, k = 8;
    const auto gains = router_gains(n, k, s, 42);
    const auto target = zipf_selection_targets(n, k, s, kMaxSelectionProbability);
    // Independent Monte Carlo (another seed) of top-k over gain * N(0, 1) logits.
    Rng rng(99);
    std::vector<int> hits(n, 0);
    const int samples = 40000;
    std::vector<std::pair<float, int>> z(n);
    for (int t = 0; t < samples; t++) {
      for (int e = 0; e < n; e++) z[e] = {gains[e] * rng.normal(), e};
      std::partial_sort(z.begin(), z.begin() + k, z.end(), [](auto& a, auto& b) { return a.first > b.first; });
      for (int j = 0; j < k; j++) hits[z[j].second]++;
    }
    for (int r : {0, 1, 4, 16, 64, 127}) {
      const double f = (double)hits[r] / samples;
      EXPECT_NEAR(f, target[r], 0.15 * target[r] + 0.003) << "skew " << s << " rank " << r;
    }
  }
}

TEST(RouterSkew, ZeroSkewLeavesRoutersUntouched) {
  Options o;
  o.preset = "tiny";
  const Plan p = make_plan(o);
  for (const auto& t : p.tensors) {
    EXPECT_TRUE(t.init.row_gains.empty()) << t.name;
    EXPECT_FALSE(t.init.adjust_row) << t.name;  // no topic heads either: S = 0 files are unchanged
  }
  EXPECT_TRUE(p.expert_rank.empty());
  EXPECT_EQ(topic_heads(p.dims, 0.0).n_key_heads, 0);
}

// The topic heads of a skewed plan, read back from the generated values: the first key head's q
// and k channels have taps (0, 0, 0, qk_tap), its value heads the pinned decay, and the other
// heads keep the plain draws of the S = 0 plan.
TEST(RouterSkew, TopicHeadsPinTheirConvTapsAndDecay) {
  Options plain;
  plain.preset = "tiny";
  Options skewed = plain;
  skewed.router_skew = 1.0;
  const Plan p0 = make_plan(plain), p1 = make_plan(skewed);
  const TopicHeads th = topic_heads(p1.dims, 1.0);
  ASSERT_EQ(th.n_key_heads, 1);
  auto values = [](const Plan& p, const std::string& name) {
    for (size_t i = 0; i < p.tensors.size(); i++)
      if (p.tensors[i].name == name) {
        const TensorPlan& t = p.tensors[i];
        EXPECT_EQ(t.type, GgmlType::F32) << name;
        std::vector<float> v((size_t)(t.ne[0] * t.n_rows()));
        fill_tensor_rows(p, i, reinterpret_cast<uint8_t*>(v.data()), 0, t.n_rows());
        return v;
      }
    ADD_FAILURE() << "no tensor " << name;
    return std::vector<float>{};
  };
  const int K = p1.dims.conv_kernel, hd = p1.dims.ssm_head_dim, kd = p1.dims.key_dim();
  const auto c0 = values(p0, "blk.0.ssm_conv1d.weight"), c1 = values(p1, "blk.0.ssm_conv1d.weight");
  for (int ch : {0, hd - 1, kd, kd + hd - 1})
    for (int j = 0; j < K; j++) EXPECT_EQ(c1[(size_t)ch * K + j], j == K - 1 ? th.qk_tap : 0.0f) << ch << " " << j;
  for (int ch : {hd, kd - 1, kd + hd, 2 * kd})  // other key heads and the values keep their draws
    for (int j = 0; j < K; j++) EXPECT_EQ(c1[(size_t)ch * K + j], c0[(size_t)ch * K + j]);
  const auto a0 = values(p0, "blk.0.ssm_a"), a1 = values(p1, "blk.0.ssm_a");
  const int vpk = p1.dims.ssm_v_heads / p1.dims.ssm_k_heads;
  for (int j = 0; j < p1.dims.ssm_v_heads; j++) EXPECT_EQ(a1[j], j < vpk ? th.ssm_a : a0[j]) << j;
  // Full-attention layers (3) are untouched (raw bytes: attn_q is quantised).
  auto bytes = [](const Plan& p, const std::string& name) {
    for (size_t i = 0; i < p.tensors.size(); i++)
      if (p.tensors[i].name == name) {
        std::vector<uint8_t> b(p.tensors[i].n_bytes());
        fill_tensor_rows(p, i, b.data(), 0, p.tensors[i].n_rows());
        return b;
      }
    ADD_FAILURE() << "no tensor " << name;
    return std::vector<uint8_t>{};
  };
  EXPECT_EQ(bytes(p0, "blk.3.attn_q.weight"), bytes(p1, "blk.3.attn_q.weight"));
}

TEST(LruSimulation, HandComputedHitRate) {
  // One layer, 4 experts, k = 1, capacity 2: sequence 0 1 0 2 1 0 -> hits at t=2 (0) only;
  // t=4: 1 was evicted by 2 (LRU order 2,0) -> miss; t=5: 0 evicted by 1 -> miss.
  Selections s;
  for (int e : {0, 1, 0, 2, 1, 0}) s.push_back({{e}});
  EXPECT_NEAR(lru_hit_rate(s, 1, 4, 2, 0).hit_rate, 1.0 / 6, 1e-12);
  EXPECT_NEAR(lru_hit_rate(s, 1, 4, 3, 0).hit_rate, 3.0 / 6, 1e-12);  // 0, 1, 0 hit
  EXPECT_NEAR(lru_hit_rate(s, 1, 4, 4, 3).hit_rate, 2.0 / 3, 1e-12);  // after warm-up: 2 miss, 1 and 0 hit
}

// The study behind docs/synth.md: 80B router shapes (2048 x 512, top 10) over 4 layers, random
// hidden states, budgets of 10/25/50 % of the experts. Skewed routing must beat uniform routing
// at every budget, and the uniform hit rate must sit near the budget fraction (the LRU baseline).
TEST(LruSimulation, SkewRaisesHitRatesOnThe80bRouters) {
  const int n_tokens = 500, warmup = 100, n_layer = 4;
  std::printf("| router skew | AR(1) corr | top-1%% share | reuse prev | zipf fit | hit 10%% | hit 25%% | hit 50%% |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<double> uniform_hits;
  for (double skew : {0.0, 0.5, 1.0}) {
    for (double corr : {0.0, 0.9}) {
      Options o;
      o.preset = "80b";
      o.router_skew = skew;
      o.dim_overrides["n_layer"] = n_layer;
      const Plan plan = make_plan(o);
      const Selections s = route_random_states(plan, n_tokens, corr, 5);
      const RoutingStats st = routing_stats(s, n_layer, 512);
      std::vector<double> hit;
      for (double frac : {0.10, 0.25, 0.50})
        hit.push_back(lru_hit_rate(s, n_layer, 512, (int64_t)(frac * n_layer * 512), warmup).hit_rate);
      std::printf("| %.1f | %.1f | %.3f | %.3f | %.2f | %.3f | %.3f | %.3f |\n", skew, corr, st.top1pct_share,
                  st.reuse_previous, st.zipf_fit_exponent, hit[0], hit[1], hit[2]);
      if (skew == 0 && corr == 0) {
        uniform_hits = hit;
        EXPECT_NEAR(hit[0], 0.10, 0.03);
        EXPECT_NEAR(hit[1], 0.25, 0.04);
        EXPECT_NEAR(hit[2], 0.50, 0.05);
      } else if (corr == 0) {
        for (int i = 0; i < 3; i++) EXPECT_GT(hit[i], uniform_hits[i] + 0.02) << "skew " << skew;
      }
    }
  }
}

}  // namespace
}  // namespace rl::synth
