// Router skew: per-expert gains on the router rows so that expert popularity follows a capped
// Zipf law (docs/synth.md, "Router skew", gives the exact definition and measured hit rates).
#pragma once
#include <cstdint>
#include <vector>

namespace rl::synth {

// Target probability that the expert of popularity rank r (0-based) is among the k selected for
// a token: p_r = min(cap, c * (r + 1)^-S), with c chosen so that sum_r p_r = k.
std::vector<double> zipf_selection_targets(int n_expert, int k, double exponent, double cap);

// The largest selection probability used as cap: gains alone cannot push an expert above 1/2
// (a router row of huge norm wins exactly when its logit is positive), so the law is capped.
constexpr double kMaxSelectionProbability = 0.4;

// Gains g_r (by rank, RMS 1) such that top-k selection over logits g_r * xi_r, xi_r iid N(0, 1),
// picks rank r with probability zipf_selection_targets(...)[r]. Found by a deterministic
// Monte-Carlo fixed-point iteration (seeded by `seed`); exponent 0 gives all ones.
std::vector<float> router_gains(int n_expert, int k, double exponent, uint64_t seed);

// A random permutation of the experts per layer: rank[layer][expert] = popularity rank, so the
// popular experts differ between layers as they do in real models.
std::vector<std::vector<int>> expert_ranks(int n_layer, int n_expert, uint64_t seed);

}  // namespace rl::synth
