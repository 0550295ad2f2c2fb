#include "generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "common/error.h"

namespace rl {

void SamplingParams::validate() const {
  if (!std::isfinite(temperature)) fail("--temp: must be a finite number, got {}", temperature);
  if (!(top_p > 0.0f) || !std::isfinite(top_p)) fail("--top-p: must be in (0, 1], got {}", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) fail("--min-p: must be in [0, 1], got {}", min_p);
  if (!(repeat_penalty > 0.0f) || !std::isfinite(repeat_penalty))
    fail("--repeat-penalty: must be > 0, got {}", repeat_penalty);
  if (repeat_last_n < -1) fail("--repeat-last-n: must be >= -1, got {}", repeat_last_n);
  if (!std::isfinite(presence_penalty)) fail("--presence-penalty: must be finite");
  if (!std::isfinite(frequency_penalty)) fail("--frequency-penalty: must be finite");
}

std::string SamplingParams::describe() const {
  if (greedy())
    return fmt::format("greedy repeat_penalty {:.2f} presence {:.2f} frequency {:.2f}",
                       repeat_penalty, presence_penalty, frequency_penalty);
  return fmt::format(
      "temp {:.2f} top_k {} top_p {:.2f} min_p {:.2f} repeat_penalty {:.2f} presence {:.2f} "
      "frequency {:.2f} seed {}",
      temperature, top_k, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty, seed);
}

Sampler::Sampler(SamplingParams params) : params_(params), rng_(params.seed) {
  params_.validate();
}

void Sampler::accept(int32_t token) { history_.push_back(token); }

void Sampler::reset_history() { history_.clear(); }

size_t TokenMask::count() const {
  size_t n = 0;
  for (uint64_t w : words_) n += (size_t)__builtin_popcountll(w);
  return n;
}

// Penalties touch only the tokens of the window, so the copy is the only O(n_vocab) cost.
std::span<const float> Sampler::penalised(std::span<const float> logits, const TokenMask* mask) const {
  const bool any = params_.repeat_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                   params_.frequency_penalty != 0.0f;
  const bool penalties = any && !history_.empty() && params_.repeat_last_n != 0;
  if (!mask && !penalties) return logits;
  scratch_.assign(logits.begin(), logits.end());
  std::vector<float>& out = scratch_;
  if (mask) {
    if (mask->empty()) fail("sampler: the output constraint allows no token");
    for (size_t i = 0; i < out.size(); ++i)
      if (!mask->allows((int32_t)i)) out[i] = -INFINITY;
  }
  if (!penalties) return out;
  size_t window = params_.repeat_last_n < 0 ? history_.size()
                                            : std::min(history_.size(), (size_t)params_.repeat_last_n);
  std::unordered_map<int32_t, int> counts;
  for (size_t i = history_.size() - window; i < history_.size(); ++i) counts[history_[i]]++;
  for (auto [token, count] : counts) {
    if (token < 0 || (size_t)token >= out.size()) continue;
    float& l = out[token];
    if (params_.repeat_penalty != 1.0f) l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    l -= (float)count * params_.frequency_penalty + params_.presence_penalty;
  }
  return out;
}

namespace {

// The k tokens that come first in `before`'s order (descending logit, lower id first among equals),
// in that order: one pass over the row with the k best so far in a heap whose top is the last of
// them (a later token enters only with a larger logit than that one's, as it has the higher id).
template <class Before>
std::vector<int32_t> first_k(std::span<const float> l, size_t k, Before before) {
  std::vector<int32_t> heap;
  heap.reserve(k);
  for (size_t i = 0; i < k; ++i) heap.push_back((int32_t)i);
  std::make_heap(heap.begin(), heap.end(), before);
  float last = l[heap.front()];
  for (size_t i = first_above(l, k, last); i < l.size(); i = first_above(l, i + 1, last)) {
    std::pop_heap(heap.begin(), heap.end(), before);
    heap.back() = (int32_t)i;
    std::push_heap(heap.begin(), heap.end(), before);
    last = l[heap.front()];
  }
  std::sort_heap(heap.begin(), heap.end(), before);
  return heap;
}

}  // namespace

std::vector<std::pair<int32_t, float>> Sampler::candidates(std::span<const float> logits,
                                                           const TokenMask* mask) const {
  return filtered(logits, /*sorted=*/true, mask);
}

std::vector<std::pair<int32_t, float>> Sampler::filtered(std::span<const float> logits, bool sorted_output,
                                                         const TokenMask* mask) const {
  const std::span<const float> l = penalised(logits, mask);
  if (params_.greedy()) return {{argmax(l), 1.0f}};

  // Order: descending logit, lower id first among equals.
  auto before = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::vector<int32_t> order;
  if (params_.top_k > 0 && (size_t)params_.top_k < l.size()) {
    order = first_k(l, (size_t)params_.top_k, before);
  } else {
    order.resize(l.size());
    std::iota(order.begin(), order.end(), 0);
  }
  // Masked-out tokens (-infinity) have no probability: none may survive, not even as a fallback.
  if (mask) std::erase_if(order, [&](int32_t t) { return l[t] == -INFINITY; });

  // Softmax of logits / temperature over the top-k survivors (double: 150k terms). `weight` is
  // the unnormalised probability; `norm` its sum over every survivor.
  const double inv_t = 1.0 / params_.temperature;
  float top_logit = l[order[0]];
  for (int32_t t : order) top_logit = std::max(top_logit, l[t]);
  std::vector<double>& w = weights_;  // [n_vocab]; only the survivors' entries are written and read
  w.resize(l.size());
  double norm = 0;
  for (int32_t t : order) norm += w[t] = std::exp((double)(l[t] - top_logit) * inv_t);
  auto weight = [&](int32_t t) { return w[t]; };

  // min-p depends only on the most probable token (weight 1), so it filters before any sorting.
  if (params_.min_p > 0.0f) {
    std::erase_if(order, [&](int32_t t) { return weight(t) < params_.min_p; });
  }
  // top-p needs the most probable tokens in order, but only until their mass reaches top_p:
  // sort a growing prefix instead of the whole vocabulary (150k tokens, each step).
  size_t sorted = order.size() <= (size_t)std::max(params_.top_k, 0) ? order.size() : 0;
  if (params_.top_p < 1.0f && sorted < order.size()) {
    size_t k = std::min<size_t>(64, order.size());
    while (true) {
      std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
      double mass = 0;
      for (size_t i = 0; i < k; ++i) mass += weight(order[i]);
      if (mass >= params_.top_p * norm || k == order.size()) break;
      k = std::min(order.size(), k * 4);
    }
    sorted = k;
  }
  // Without top-p a draw does not care about order: only candidates() pays for the full sort.
  if (sorted_output && params_.top_p >= 1.0f && sorted < order.size())
    std::sort(order.begin(), order.end(), before);

  size_t keep = order.size();
  if (params_.top_p < 1.0f) {  // the shortest prefix whose mass reaches top_p (at least one)
    double cum = 0;
    size_t n = 0;
    while (n < sorted) {  // the sorted prefix holds at least top_p of the mass
      cum += weight(order[n++]) / norm;
      if (cum >= params_.top_p) break;
    }
    keep = n;
  }

  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += weight(order[i]);
  std::vector<std::pair<int32_t, float>> out(keep);
  for (size_t i = 0; i < keep; ++i) out[i] = {order[i], (float)(weight(order[i]) / mass)};
  return out;
}

// 53 random bits -> [0, 1): the same stream on every platform for a given seed.
double Sampler::uniform01() { return (double)(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::sample(std::span<const float> logits, const TokenMask* mask) {
  if (logits.empty()) fail("sampler: empty logits");
  auto cands = filtered(logits, /*sorted=*/false, mask);
  if (cands.size() == 1) return cands[0].first;
  const double u = uniform01();
  double cum = 0;
  for (auto& [token, prob] : cands) {
    cum += prob;
    if (u < cum) return token;
  }
  return cands.back().first;  // u rounded past the float sum
}

}  // namespace rl
