#include "synth/routing_study.h"

#include <algorithm>
#include <cmath>
#include <list>
#include <numeric>
#include <string>
#include <unordered_map>

#include "common/error.h"
#include "synth/random_blocks.h"

namespace rl::synth {

namespace {

// The k largest logits, ties to the lower id (DESIGN.md §1).
std::vector<int32_t> top_k(const std::vector<float>& logits, int k) {
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  idx.resize(k);
  return idx;
}

// Eight independent partial sums so the compiler vectorises the loop (fp32 sums are not
// reassociated otherwise); the study needs ~10^10 of these multiply-adds.
float dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
  float s = 0;
  for (; i < n; i++) s += a[i] * b[i];
  for (float v : acc) s += v;
  return s;
}

size_t router_index(const Plan& plan, int layer) {
  const std::string name = "blk." + std::to_string(layer) + ".ffn_gate_inp.weight";
  for (size_t i = 0; i < plan.tensors.size(); i++)
    if (plan.tensors[i].name == name) {
      if (plan.tensors[i].type != GgmlType::F32) fail("routing study: {} is not F32", name);
      return i;
    }
  fail("routing study: the plan has no {}", name);
}

class TopkRecorder : public TraceSink {
 public:
  explicit TopkRecorder(int n_layer) : per_layer(n_layer) {}
  void tensor(std::string_view, int, int, const float*) override {}
  void ids(std::string_view name, int n_tokens, int width, const int32_t* data) override {
    constexpr std::string_view prefix = "ffn_moe_topk-";
    if (name.substr(0, prefix.size()) != prefix) return;
    const int layer = std::stoi(std::string(name.substr(prefix.size())));
    if (layer < 0 || layer >= (int)per_layer.size()) return;
    for (int t = 0; t < n_tokens; t++) per_layer[layer].emplace_back(data + (size_t)t * width, data + (size_t)(t + 1) * width);
  }
  std::vector<std::vector<std::vector<int32_t>>> per_layer;  // [layer][token] -> ids
};

}  // namespace

Selections route_random_states(const Plan& plan, int n_tokens, double correlation, uint64_t seed) {
  const Dims& d = plan.dims;
  Selections sel(n_tokens, std::vector<std::vector<int32_t>>(d.n_layer));
  const double keep = correlation, fresh = std::sqrt(1.0 - correlation * correlation);
  for (int L = 0; L < d.n_layer; L++) {
    std::vector<float> router((size_t)d.n_expert * d.n_embd);  // [n_expert][n_embd]
    fill_tensor_rows(plan, router_index(plan, L), reinterpret_cast<uint8_t*>(router.data()), 0, d.n_expert);
    Rng rng(mix_seed(seed, 0x5717D7u, (uint64_t)L));
    std::vector<float> h(d.n_embd), logits(d.n_expert);
    for (auto& v : h) v = rng.normal();
    for (int t = 0; t < n_tokens; t++) {
      if (t > 0)
        for (auto& v : h) v = (float)(keep * v + fresh * rng.normal());
      for (int e = 0; e < d.n_expert; e++) logits[e] = dot(router.data() + (size_t)e * d.n_embd, h.data(), d.n_embd);
      sel[t][L] = top_k(logits, d.n_expert_used);
    }
  }
  return sel;
}

Selections route_through_session(Session& session, std::span<const int32_t> tokens, int n_layer) {
  TopkRecorder rec(n_layer);
  session.set_trace(&rec);
  try {
    for (int32_t t : tokens) session.decode(t);
  } catch (...) {
    session.set_trace(nullptr);
    throw;
  }
  session.set_trace(nullptr);
  Selections sel(tokens.size(), std::vector<std::vector<int32_t>>(n_layer));
  for (int L = 0; L < n_layer; L++) {
    if (rec.per_layer[L].size() != tokens.size())
      fail("routing study: layer {} traced {} router selections for {} tokens", L, rec.per_layer[L].size(), tokens.size());
    for (size_t t = 0; t < tokens.size(); t++) sel[t][L] = rec.per_layer[L][t];
  }
  return sel;
}

LruStats lru_hit_rate(const Selections& s, int n_layer, int n_expert, int64_t capacity, int warmup_tokens) {
  LruStats out;
  out.capacity = capacity;
  std::list<int64_t> order;  // most recent first
  std::unordered_map<int64_t, std::list<int64_t>::iterator> where;
  int64_t hits = 0, lookups = 0;
  for (size_t t = 0; t < s.size(); t++) {
    for (int L = 0; L < n_layer; L++) {
      for (int32_t e : s[t][L]) {
        const int64_t key = (int64_t)L * n_expert + e;
        auto it = where.find(key);
        const bool hit = it != where.end();
        if ((int)t >= warmup_tokens) {
          lookups++;
          hits += hit;
        }
        if (hit) {
          order.splice(order.begin(), order, it->second);
        } else {
          if (capacity <= 0) continue;
          if ((int64_t)order.size() >= capacity) {
            where.erase(order.back());
            order.pop_back();
          }
          order.push_front(key);
          where[key] = order.begin();
        }
      }
    }
  }
  out.hit_rate = lookups ? (double)hits / (double)lookups : 0.0;
  return out;
}

RoutingStats routing_stats(const Selections& s, int n_layer, int n_expert) {
  RoutingStats r;
  if (s.empty()) return r;
  const int k = (int)s[0][0].size();
  r.reuse_uniform = (double)k / n_expert;
  std::vector<double> mean_count_by_rank(n_expert, 0.0);
  double top_share = 0, reuse = 0;
  int64_t reuse_pairs = 0;
  const int top_n = std::max(1, (int)std::ceil(0.01 * n_expert));
  for (int L = 0; L < n_layer; L++) {
    std::vector<int64_t> count(n_expert, 0);
    for (size_t t = 0; t < s.size(); t++) {
      for (int32_t e : s[t][L]) count[e]++;
      if (t > 0) {
        int common = 0;
        for (int32_t e : s[t][L])
          common += std::find(s[t - 1][L].begin(), s[t - 1][L].end(), e) != s[t - 1][L].end();
        reuse += (double)common / k;
        reuse_pairs++;
      }
    }
    std::sort(count.begin(), count.end(), std::greater<>());
    const int64_t total = std::accumulate(count.begin(), count.end(), int64_t{0});
    top_share += (double)std::accumulate(count.begin(), count.begin() + top_n, int64_t{0}) / (double)total;
    for (int i = 0; i < n_expert; i++) mean_count_by_rank[i] += (double)count[i] / n_layer;
  }
  r.top1pct_share = top_share / n_layer;
  r.reuse_previous = reuse_pairs ? reuse / reuse_pairs : 0.0;
  // Slope of log(count) against log(rank) over the ranks that were used at all.
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  int n = 0;
  for (int i = 0; i < n_expert; i++) {
    if (mean_count_by_rank[i] <= 0) continue;
    const double x = std::log(i + 1.0), y = std::log(mean_count_by_rank[i]);
    sx += x, sy += y, sxx += x * x, sxy += x * y, n++;
  }
  if (n >= 2) r.zipf_fit_exponent = -(n * sxy - sx * sy) / (n * sxx - sx * sx);
  return r;
}

}  // namespace rl::synth
