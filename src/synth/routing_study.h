// What a cache of experts would see on a synthetic model: the expert selections of a token
// sequence, and the hit rate of an LRU cache over (layer, expert) keys at a given budget.
// docs/synth.md reports these numbers for the presets and router skews.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/session.h"
#include "synth/synth.h"

namespace rl::synth {

// selections[token][layer] = the k expert ids chosen for that token in that layer.
using Selections = std::vector<std::vector<std::vector<int32_t>>>;

// Routes n_tokens random hidden states through the routers the plan would write (top-k of
// softmax = top-k of the logits, ties to the lower id). Hidden states are isotropic Gaussian of
// RMS 1 (what RMSNorm hands the router), AR(1)-correlated over tokens with coefficient
// `correlation` (0 = independent tokens). Needs F32 routers (every recipe has them).
Selections route_random_states(const Plan& plan, int n_tokens, double correlation, uint64_t seed);

// Runs `tokens` through a session (one token at a time, as decode does) and records the
// router's top-k of every layer from the trace ("ffn_moe_topk-L").
Selections route_through_session(Session& session, std::span<const int32_t> tokens, int n_layer);

struct LruStats {
  int64_t capacity = 0;  // experts the cache holds (all layers together)
  double hit_rate = 0;   // hits / lookups after the warm-up tokens
};

// A global LRU over (layer, expert) keys, looked up in token order and, within a token, in layer
// order (the order decode needs them). Lookups of the first `warmup_tokens` tokens fill the cache
// but are not counted.
LruStats lru_hit_rate(const Selections& s, int n_layer, int n_expert, int64_t capacity, int warmup_tokens);

// Summary statistics of a selection trace.
struct RoutingStats {
  double top1pct_share = 0;      // share of all selections that go to the 1 % most-used experts of each layer
  double reuse_previous = 0;     // mean fraction of a token's experts that the previous token also used (same layer)
  double reuse_uniform = 0;      // the same fraction under independent uniform routing: k / n_expert
  double zipf_fit_exponent = 0;  // least-squares slope of log(count) on log(rank), negated (ranks with count > 0)
};
RoutingStats routing_stats(const Selections& s, int n_layer, int n_expert);

}  // namespace rl::synth
