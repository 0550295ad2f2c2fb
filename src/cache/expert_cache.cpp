#include "cache/expert_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace rl {

CachePolicy::Kind parse_cache_policy(const std::string& name) {
  if (name == "lru") return CachePolicy::Kind::kLru;
  if (name == "lrfu") return CachePolicy::Kind::kLrfu;
  fail("--cache-policy: unknown policy '{}' (lru or lrfu)", name);
}

const char* cache_policy_name(CachePolicy::Kind kind) {
  return kind == CachePolicy::Kind::kLrfu ? "lrfu" : "lru";
}

int ExpertCache::Reservation::n_misses() const {
  int n = 0;
  for (const Entry& e : entries) n += e.hit ? 0 : 1;
  return n;
}

ExpertCache::ExpertCache(int n_layers, int n_experts, size_t slot_bytes, size_t budget_bytes,
                         int min_slots, CachePolicy policy)
    : n_layers_(n_layers), n_experts_(n_experts), slot_bytes_(slot_bytes), policy_(policy) {
  if (n_layers <= 0 || n_experts <= 0 || slot_bytes == 0)
    fail("expert cache: invalid shape ({} layers, {} experts, slot of {} bytes)", n_layers,
         n_experts, slot_bytes);
  const size_t total = (size_t)n_layers * (size_t)n_experts;
  n_slots_ = (int)std::min(budget_bytes / slot_bytes, total);
  if (n_slots_ < min_slots)
    fail("--cache-mib: a budget of {} MiB holds {} expert slots of {:.2f} MiB, but a token needs {} "
         "experts of one layer at once (at least {:.0f} MiB)",
         budget_bytes >> 20, n_slots_, slot_bytes / 1048576.0, min_slots,
         std::ceil(min_slots * (double)slot_bytes / 1048576.0));
  slot_of_key_.assign(total, -1);
  key_of_slot_.assign(n_slots_, kNoKey);
  pinned_epoch_.assign(n_slots_, 0);
  requested_epoch_.assign(n_experts, 0);
  if (policy_.kind == CachePolicy::Kind::kLrfu) {
    if (!(policy_.half_life > 0) || !std::isfinite(policy_.half_life))
      fail("expert cache: the LRFU half-life must be a positive number of accesses (got {})", policy_.half_life);
    log_score_.assign(total, -std::numeric_limits<double>::infinity());
  } else {
    prev_.assign(n_slots_, -1);
    next_.assign(n_slots_, -1);
  }
  free_slots_.reserve(n_slots_);
  for (int s = n_slots_ - 1; s >= 0; s--) free_slots_.push_back(s);  // slot 0 is handed out first
}

int ExpertCache::lookup(int layer, int expert) const {
  if (layer < 0 || layer >= n_layers_ || expert < 0 || expert >= n_experts_) return -1;
  return slot_of_key_[key(layer, expert)];
}

void ExpertCache::unlink(int slot) {
  const int p = prev_[slot], n = next_[slot];
  if (p >= 0) next_[p] = n; else head_ = n;
  if (n >= 0) prev_[n] = p; else tail_ = p;
  prev_[slot] = next_[slot] = -1;
}

void ExpertCache::push_back(int slot) {
  next_[slot] = -1;
  prev_[slot] = tail_;
  if (tail_ >= 0) next_[tail_] = slot;
  tail_ = slot;
  if (head_ < 0) head_ = slot;
}

void ExpertCache::push_front(int slot) {
  prev_[slot] = -1;
  next_[slot] = head_;
  if (head_ >= 0) prev_[head_] = slot;
  head_ = slot;
  if (tail_ < 0) tail_ = slot;
}

void ExpertCache::order_access(Key k, int slot) {
  if (policy_.kind == CachePolicy::Kind::kLrfu) {
    score_access(k, slot);
    return;
  }
  if (prev_[slot] >= 0 || head_ == slot) unlink(slot);  // (a slot just taken is not in the list)
  push_front(slot);
}

void ExpertCache::order_remove(int slot) {
  if (policy_.kind == CachePolicy::Kind::kLrfu) by_score_.erase({log_score_[key_of_slot_[slot]], slot});
  else unlink(slot);
}

void ExpertCache::score_access(Key k, int slot) {
  // A resident key's node is moved, not reallocated (a decode token raises n_layers * k of them).
  auto node = by_score_.extract({log_score_[k], slot});
  raise_score(k);
  if (node.empty()) {
    by_score_.emplace(log_score_[k], slot);
  } else {
    node.value().first = log_score_[k];
    by_score_.insert(std::move(node));
  }
}

void ExpertCache::raise_score(Key k) {
  const double now = (double)tick_ / policy_.half_life;
  log_score_[k] = now + std::log2(1.0 + std::exp2(log_score_[k] - now));
}

int ExpertCache::pick_victim() const {
  if (policy_.kind == CachePolicy::Kind::kLrfu) {
    for (const auto& [score, slot] : by_score_)
      if (pinned_epoch_[slot] != epoch_) return slot;
    return -1;
  }
  int slot = tail_;
  while (slot >= 0 && pinned_epoch_[slot] == epoch_) slot = prev_[slot];
  return slot;
}

void ExpertCache::begin_request(int layer, std::span<const int> experts) {
  if (open_) fail("expert cache: reserve() while a reservation is open (commit or abort it first)");
  if (layer < 0 || layer >= n_layers_) fail("expert cache: layer {} out of range [0, {})", layer, n_layers_);
  if ((int)experts.size() > n_slots_)
    fail("expert cache: {} experts requested at once but the cache has {} slots", experts.size(),
         n_slots_);
  epoch_++;
  if (epoch_ == 0) {  // wrapped: clear stale pins and marks
    std::fill(pinned_epoch_.begin(), pinned_epoch_.end(), 0);
    std::fill(requested_epoch_.begin(), requested_epoch_.end(), 0);
    epoch_ = 1;
  }
  for (int e : experts) {  // (one pass: a prefill layer requests most of its experts at once)
    if (e < 0 || e >= n_experts_) fail("expert cache: expert {} out of range [0, {})", e, n_experts_);
    if (requested_epoch_[e] == epoch_) fail("expert cache: expert {} requested twice", e);
    requested_epoch_[e] = epoch_;
  }
  res_.layer = layer;
  res_.entries.clear();
}

bool ExpertCache::take_slot(Entry& e) {
  int slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = pick_victim();
    if (slot < 0) return false;
    order_remove(slot);
    const Key old = key_of_slot_[slot];
    e.evicted = old;
    slot_of_key_[old] = -1;
    n_resident_--;
    stats_.evictions++;
    notify(old, -1);
  }
  e.slot = slot;
  key_of_slot_[slot] = key(res_.layer, e.expert);
  pinned_epoch_[slot] = epoch_;
  return true;
}

void ExpertCache::settle_prediction(bool against_request) {
  if (predicted_layer_ < 0) return;
  auto requested = [&](int expert) { return against_request && requested_epoch_[expert] == epoch_; };
  for (int ex : predicted_) stats_.predicted_used += requested(ex) ? 1 : 0;
  // A prefetched expert counts as used only if it is still resident (nothing evicted it since).
  for (Key k : prefetched_) {
    if (requested(expert_of(k)) && slot_of_key_[k] >= 0) stats_.prefetch_hits++;
    else stats_.prefetch_wasted++;
  }
  predicted_layer_ = -1;
  predicted_.clear();
  prefetched_.clear();
}

const ExpertCache::Reservation& ExpertCache::reserve(int layer, std::span<const int> experts) {
  begin_request(layer, experts);
  if (predicted_layer_ == layer) settle_prediction(true);
  res_.entries.assign(experts.size(), Entry{});
  tick_++;

  // Hits first, so that no miss evicts an expert this same request needs.
  for (size_t i = 0; i < experts.size(); i++) {
    Entry& e = res_.entries[i];
    e.expert = experts[i];
    const int slot = slot_of_key_[key(layer, experts[i])];
    if (slot < 0) continue;
    e.hit = true;
    e.slot = slot;
    pinned_epoch_[slot] = epoch_;
    order_access(key(layer, experts[i]), slot);
    stats_.hits++;
  }
  for (Entry& e : res_.entries) {
    if (e.hit) continue;
    // Cannot fail: n_slots >= request size and only this request's slots are pinned.
    if (!take_slot(e)) fail("expert cache: no slot to evict for layer {} expert {}", layer, e.expert);
    order_access(key(layer, e.expert), e.slot);
    stats_.misses++;
  }
  open_ = true;
  open_ahead_ = false;
  return res_;
}

const ExpertCache::Reservation& ExpertCache::reserve_ahead(int layer, std::span<const int> experts, int in_use_layer,
                                                           std::span<const int> in_use) {
  begin_request(layer, experts);
  settle_prediction(false);  // a prediction its layer never reserved: nothing of it was used
  for (int ex : in_use) {
    if (ex < 0 || ex >= n_experts_ || in_use_layer < 0 || in_use_layer >= n_layers_)
      fail("expert cache: in-use expert {} of layer {} out of range", ex, in_use_layer);
    const int slot = lookup(in_use_layer, ex);
    if (slot >= 0) pinned_epoch_[slot] = epoch_;
  }
  for (int ex : experts) {
    const int slot = slot_of_key_[key(layer, ex)];
    if (slot >= 0) pinned_epoch_[slot] = epoch_;
  }
  predicted_layer_ = layer;
  predicted_.assign(experts.begin(), experts.end());
  stats_.predicted += experts.size();
  for (int ex : experts) {
    if (slot_of_key_[key(layer, ex)] >= 0) continue;
    Entry e;
    e.expert = ex;
    if (!take_slot(e)) break;  // every other slot is pinned: the rest of the prediction is left out
    // At the cold end: a wrong prediction's slot is the next one a miss takes.
    if (policy_.kind == CachePolicy::Kind::kLrfu) by_score_.emplace(log_score_[key(layer, ex)], e.slot);
    else push_back(e.slot);
    res_.entries.push_back(e);
  }
  open_ = true;
  open_ahead_ = true;
  return res_;
}

void ExpertCache::commit() {
  if (!open_) fail("expert cache: commit() without an open reservation");
  for (const Entry& e : res_.entries) {
    if (e.hit) continue;
    const Key k = key(res_.layer, e.expert);
    slot_of_key_[k] = e.slot;
    n_resident_++;
    notify(k, e.slot);
    if (open_ahead_) prefetched_.push_back(k), stats_.prefetched++;
  }
  open_ = false;
  open_ahead_ = false;
  epoch_++;  // unpin
}

void ExpertCache::abort() {
  if (!open_) fail("expert cache: abort() without an open reservation");
  for (const Entry& e : res_.entries) {
    if (e.hit) continue;
    order_remove(e.slot);  // (under LRFU the aborted request still counts in the key's score)
    key_of_slot_[e.slot] = kNoKey;
    free_slots_.push_back(e.slot);
  }
  open_ = false;
  open_ahead_ = false;
  epoch_++;
}

void ExpertCache::touch(int layer, std::span<const int> experts) {
  tick_++;
  for (int ex : experts) {
    const int slot = lookup(layer, ex);
    if (slot < 0) continue;
    stats_.hits++;
    order_access(key(layer, ex), slot);
  }
}

void ExpertCache::bypass(int layer, std::span<const int> experts) {
  if (layer < 0 || layer >= n_layers_) fail("expert cache: bypass of layer {} out of 0..{}", layer, n_layers_ - 1);
  for (int ex : experts) {
    if (ex < 0 || ex >= n_experts_)
      fail("expert cache: bypass of expert {} out of 0..{} (layer {})", ex, n_experts_ - 1, layer);
    if (lookup(layer, ex) >= 0) fail("expert cache: bypass of expert {} of layer {}, which is resident", ex, layer);
  }
  for (int ex : experts) {
    stats_.misses++;
    stats_.bypassed++;
    if (policy_.kind == CachePolicy::Kind::kLrfu) raise_score(key(layer, ex));
  }
}

void ExpertCache::count_hits(uint64_t n) {
  if (!holds_all())
    fail("expert cache: count_hits() on a cache that does not hold every expert ({} slots for {} experts)", n_slots_,
         n_layers_ * n_experts_);
  stats_.hits += n;
}

std::vector<int> ExpertCache::layer_request(std::span<const int32_t> ids, int n_tokens, int k) {
  std::vector<int> request(ids.begin(), ids.begin() + (size_t)n_tokens * k);
  if (n_tokens > 1) {
    std::sort(request.begin(), request.end());
    request.erase(std::unique(request.begin(), request.end()), request.end());
  }
  return request;
}

ExpertCache::Stats& ExpertCache::Stats::operator+=(const Stats& o) {
  hits += o.hits;
  misses += o.misses;
  evictions += o.evictions;
  bytes_copied += o.bytes_copied;
  copy_seconds += o.copy_seconds;
  predicted += o.predicted;
  predicted_used += o.predicted_used;
  prefetched += o.prefetched;
  prefetch_hits += o.prefetch_hits;
  prefetch_wasted += o.prefetch_wasted;
  bypassed += o.bypassed;
  return *this;
}

void ExpertCache::record_copy(size_t bytes, double seconds) {
  stats_.bytes_copied += bytes;
  stats_.copy_seconds += seconds;
}

}  // namespace rl
