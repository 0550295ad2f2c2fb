#include "synth/router_skew.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"
#include "synth/random_blocks.h"

namespace rl::synth {

std::vector<double> zipf_selection_targets(int n_expert, int k, double exponent, double cap) {
  if (n_expert <= 0 || k <= 0 || k > n_expert) fail("router skew: need 0 < k <= n_expert (k {}, n_expert {})", k, n_expert);
  if (cap * n_expert < k) fail("router skew: cap {} cannot give {} selections over {} experts", cap, k, n_expert);
  std::vector<double> raw(n_expert);
  for (int r = 0; r < n_expert; r++) raw[r] = std::pow((double)(r + 1), -exponent);
  // Water filling: find c with sum_r min(cap, c raw_r) = k by bisection on log c.
  auto total = [&](double c) {
    double s = 0;
    for (double v : raw) s += std::min(cap, c * v);
    return s;
  };
  double lo = 0, hi = 1;
  while (total(hi) < k) hi *= 2;
  for (int it = 0; it < 200; it++) {
    const double mid = 0.5 * (lo + hi);
    (total(mid) < k ? lo : hi) = mid;
  }
  std::vector<double> p(n_expert);
  for (int r = 0; r < n_expert; r++) p[r] = std::min(cap, hi * raw[r]);
  return p;
}

namespace {

// Fraction of samples in which each rank is among the top k of gain_r * xi_r.
std::vector<double> selection_frequencies(const std::vector<float>& gains, int k, int n_samples, Rng& rng) {
  const int n = (int)gains.size();
  std::vector<int> hits(n, 0);
  std::vector<std::pair<float, int>> logits(n);
  for (int s = 0; s < n_samples; s++) {
    for (int e = 0; e < n; e++) logits[e] = {gains[e] * rng.normal(), e};
    std::nth_element(logits.begin(), logits.begin() + (k - 1), logits.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (int j = 0; j < k; j++) hits[logits[j].second]++;
  }
  std::vector<double> f(n);
  for (int e = 0; e < n; e++) f[e] = (hits[e] + 0.5) / (n_samples + 1.0);
  return f;
}

// Upper-tail quantile of N(0, 1): the x with P(xi > x) = q, by bisection on erfc (exact enough
// for a fixed point that is itself estimated by Monte Carlo).
double upper_quantile(double q) {
  double lo = -10, hi = 10;
  for (int it = 0; it < 80; it++) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(mid / std::sqrt(2.0)) > q ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

}  // namespace

std::vector<float> router_gains(int n_expert, int k, double exponent, uint64_t seed) {
  std::vector<float> gains(n_expert, 1.0f);
  if (exponent == 0) return gains;
  if (exponent < 0 || !std::isfinite(exponent)) fail("--router-skew {}: must be a finite number >= 0", exponent);
  const std::vector<double> target = zipf_selection_targets(n_expert, k, exponent, kMaxSelectionProbability);
  // Enough samples that the rarest expert is still hit ~50 times per iteration.
  const double p_min = *std::min_element(target.begin(), target.end());
  const int n_samples = (int)std::clamp(50.0 / p_min, 2000.0, 20000.0);
  Rng rng(mix_seed(seed, 0x52077E5u, (uint64_t)n_expert * 1000 + k));
  for (int it = 0; it < 12; it++) {
    const std::vector<double> f = selection_frequencies(gains, k, n_samples, rng);
    // Model: expert e is selected when g_e xi_e exceeds a threshold t shared by all experts (true
    // for many experts), so f_e = P(xi > t / g_e). The measured f gives t_e = g_e Q(f_e); the gain
    // that hits the target under the same threshold is t_e / Q(p_e). Q = upper-tail quantile.
    double sum_sq = 0;
    for (int e = 0; e < n_expert; e++) {
      const double t = gains[e] * upper_quantile(f[e]);
      const double want = upper_quantile(target[e]);
      double g = t / want;
      // Both quantiles are positive while f, p < 1/2 (cap 0.4); keep a damped step otherwise.
      if (!(g > 0) || !std::isfinite(g)) g = gains[e] * std::sqrt(target[e] / f[e]);
      gains[e] = (float)std::clamp(g, 1e-3, 1e3);
      sum_sq += (double)gains[e] * gains[e];
    }
    // Top-k is invariant to a common scale; keep RMS 1 so the router's overall spread is kept.
    const float norm = (float)std::sqrt(sum_sq / n_expert);
    for (auto& g : gains) g /= norm;
  }
  return gains;
}

std::vector<std::vector<int>> expert_ranks(int n_layer, int n_expert, uint64_t seed) {
  std::vector<std::vector<int>> ranks(n_layer, std::vector<int>(n_expert));
  for (int l = 0; l < n_layer; l++) {
    std::vector<int> expert_of_rank(n_expert);
    std::iota(expert_of_rank.begin(), expert_of_rank.end(), 0);
    Rng rng(mix_seed(seed, 0xE4BE27u, (uint64_t)l));
    for (int i = n_expert - 1; i > 0; i--) std::swap(expert_of_rank[i], expert_of_rank[rng.range(0, i)]);
    for (int r = 0; r < n_expert; r++) ranks[l][expert_of_rank[r]] = r;
  }
  return ranks;
}

}  // namespace rl::synth
