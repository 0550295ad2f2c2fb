// ExpertCache: the host-side policy that maps routed experts (layer, expert) to fixed-size GPU
// slots under a byte budget, with LRU or LRFU replacement (DESIGN.md §4, docs/cache.md). It owns no device memory and
// makes no copies: a backend asks it which slot each selected expert lives in (or must be copied
// into), copies the misses, then commits (or aborts) the reservation. Pure CPU, unit-tested in CI.
//
// One reservation at a time: reserve() → copy the misses → commit() (copies enqueued) or abort()
// (copies failed). The experts of an open reservation are pinned: the reservation never evicts one
// of its own keys, so a set of k experts needs at least k slots. reserve_ahead() is the same cycle
// for a layer's predicted experts before the layer routes (prefetch).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace rl {

// Which resident expert a miss evicts (among those the open reservation does not pin).
struct CachePolicy {
  enum class Kind {
    kLru,   // lru: the least recently used
    kLrfu,  // lrfu: the lowest combined recency and frequency (below)
  };
  Kind kind = Kind::kLru;
  // LRFU: every access of a key (a reservation that requests it, a touch of a resident one) adds
  // 1 to its score, and scores halve every half_life accesses of the cache (one access = one
  // reserve() or touch() call, so a decode token is n_layers of them). The score is kept for keys
  // that are evicted too, so an expert often used comes back with its history. A small half-life
  // approaches LRU, a large one LFU.
  double half_life = 0;
};
// The LRFU half-life of --cache-policy lrfu, in passes (a pass = one access of every layer):
// of those bench/cache_policy_sim compared on the skewed 80B's recordings, the best or within 0.2
// points of it at every budget (docs/PERF.md).
constexpr double kDefaultLrfuHalfLifePasses = 128;
// "lru" or "lrfu" (half_life is set by the caller); throws rl::Error naming --cache-policy.
CachePolicy::Kind parse_cache_policy(const std::string& name);
const char* cache_policy_name(CachePolicy::Kind kind);

class ExpertCache {
 public:
  // A key names one routed expert: layer * n_experts + expert.
  using Key = int32_t;
  static constexpr Key kNoKey = -1;

  struct Entry {
    int expert = 0;
    int slot = 0;            // where the expert is (hit) or must be copied to (miss)
    bool hit = false;
    Key evicted = kNoKey;    // on a miss: the key whose slot this takes, kNoKey for a free slot
  };

  struct Reservation {
    int layer = -1;
    std::vector<Entry> entries;  // in the order of the request
    int n_misses() const;
  };

  struct Stats {
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t evictions = 0;
    uint64_t bytes_copied = 0;
    double copy_seconds = 0;  // wall time the backend spent on copies (record_copy)
    // Prefetch (reserve_ahead): experts predicted; of those, the ones the layer then requested (the
    // prediction's accuracy is predicted_used / predicted); the predicted misses copied ahead
    // (committed); of those, the ones the layer then requested (prefetch_hits, also counted in
    // hits) and the ones it did not (prefetch_wasted: a copy for nothing).
    uint64_t predicted = 0;
    uint64_t predicted_used = 0;
    uint64_t prefetched = 0;
    uint64_t prefetch_hits = 0;
    uint64_t prefetch_wasted = 0;
    // Misses used where they are, without a slot (bypass(): the GPU-routed token's experts read in
    // place from host memory); also counted in misses.
    uint64_t bypassed = 0;
    double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
    // Sums the counters of another period (the bench adds its runs).
    Stats& operator+=(const Stats& o);
  };

  // Called on every change of residency: (key, -1) when a key leaves (at reserve, as soon as its
  // slot is promised to a miss, since the copy will overwrite it), (key, slot) when a miss becomes
  // resident at commit. The CUDA backend keeps
  // its device residency table in step through it.
  using ResidencyListener = std::function<void(Key key, int slot)>;

  // slots = min(budget_bytes / slot_bytes, n_layers * n_experts). Throws rl::Error when the budget
  // holds fewer than min_slots slots (min_slots = experts one layer selects per token), or an LRFU
  // policy with a half-life that is not positive.
  ExpertCache(int n_layers, int n_experts, size_t slot_bytes, size_t budget_bytes, int min_slots,
              CachePolicy policy = {});

  int n_layers() const { return n_layers_; }
  int n_experts() const { return n_experts_; }
  int n_slots() const { return n_slots_; }
  size_t slot_bytes() const { return slot_bytes_; }
  const CachePolicy& policy() const { return policy_; }
  // True when every expert of the model has a slot (the whole model can be resident).
  bool holds_all() const { return n_slots_ == n_layers_ * n_experts_; }
  int n_resident() const { return n_resident_; }

  Key key(int layer, int expert) const { return layer * n_experts_ + expert; }
  int layer_of(Key k) const { return k / n_experts_; }
  int expert_of(Key k) const { return k % n_experts_; }

  // Slot of a resident expert, or -1. Does not touch the LRU order.
  int lookup(int layer, int expert) const;

  // Reserves slots for `experts` of `layer` (distinct ids). Hits move to most-recently-used (and,
  // with LRFU, every requested key's score is raised); each miss takes a free slot or evicts the
  // policy's victim among the keys not in this request (LRU: the least recently used; LRFU: the
  // lowest score, ties to the lower slot). Throws rl::Error on an id out of range, a duplicate, or a reservation already open.
  const Reservation& reserve(int layer, std::span<const int> experts);
  // The copies into the miss slots are enqueued: the misses become resident (listener called).
  void commit();
  // The copies failed: the miss slots hold nothing usable and become free. Their previous keys
  // stay gone (a copy may have overwritten part of them).
  void abort();

  // Prefetch: reserves slots for the predicted experts of `layer` that are not resident, to be
  // copied before the layer routes; the layer's reserve() then finds them resident. Unlike
  // reserve(), a resident predicted expert is left as it is (neither counted nor moved in the
  // replacement order); a miss takes a free slot or the policy's victim among the keys that are
  // neither predicted nor one of `in_use` of `in_use_layer` (the layer in flight, whose kernels may
  // still read their slots); a miss that finds no such slot is left out. The entries are the
  // misses given slots, in request order. A prefetched expert enters at the cold end (LRU: the
  // least recently used; LRFU: with its score unraised), so when the prediction was wrong its slot
  // is the next one taken. commit() / abort() close it as a reservation. The layer's next reserve()
  // counts the prediction's statistics (Stats::predicted_used, prefetch_hits, prefetch_wasted).
  // Throws as reserve() on bad ids, or on in_use ids out of range.
  const Reservation& reserve_ahead(int layer, std::span<const int> experts, int in_use_layer,
                                   std::span<const int> in_use);
  bool reservation_open() const { return open_; }

  // Refreshes the LRU stamps (and LRFU scores) of experts used without a reservation (GPU-routed
  // tokens); each resident one counts as a hit. Experts not resident are skipped.
  void touch(int layer, std::span<const int> experts);
  // Counts misses used without a slot (read in place from host memory by a GPU-routed token; the
  // backend may then reserve some of them to bring them in): each counts as a miss and a bypass,
  // and with LRFU raises the expert's score (kept while it is not resident), so an expert often
  // read in place has its history when it is brought in. No slot and no replacement order
  // changes. Throws rl::Error on an id out of range or an expert that is resident.
  void bypass(int layer, std::span<const int> experts);
  // Counts n hits of experts used without a reservation on a cache that holds every expert (the
  // GPU-grouped prefill): nothing is ever evicted, so the LRU order does not matter and is left as
  // it is. Throws rl::Error unless holds_all().
  void count_hits(uint64_t n);

  void record_copy(size_t bytes, double seconds);
  const Stats& stats() const { return stats_; }
  void reset_stats() { stats_ = Stats{}; }

  void set_listener(ResidencyListener fn) { listener_ = std::move(fn); }

  // The experts one layer of a pass requests, in the order the CUDA backend reserves them (in
  // batches of at most n_slots): a token's k selections as routed (n_tokens = 1), else the
  // distinct ids ascending. ids: [n_tokens][k].
  static std::vector<int> layer_request(std::span<const int32_t> ids, int n_tokens, int k);

 private:
  // The policy's order of the occupied slots; each policy keeps only its own (LRU the list,
  // LRFU the scores).
  void order_access(Key k, int slot);  // key k in `slot` was accessed (a hit, or a miss taking it)
  void order_remove(int slot);         // the slot's key leaves (evicted, or an aborted miss)
  int pick_victim() const;             // the policy's victim among unpinned occupied slots, -1 when none
  // LRU: the list of occupied slots.
  void unlink(int slot);
  void push_front(int slot);  // most recently used
  void push_back(int slot);   // least recently used
  // LRFU: the key's score raised by one access at the current tick; its slot re-ordered.
  void score_access(Key k, int slot);
  void raise_score(Key k);  // LRFU: one access at the current tick added to k's score (resident or not)
  void notify(Key k, int slot) {
    if (listener_) listener_(k, slot);
  }
  // Opens a request of `experts` of `layer`: checks it, starts a new pin epoch and marks the experts
  // as requested in it.
  void begin_request(int layer, std::span<const int> experts);
  // Gives the open request's miss entry `e` a slot (free, else the policy's victim, whose key is
  // evicted); false when every occupied slot is pinned.
  bool take_slot(Entry& e);
  // The pending prediction's statistics, then cleared: against the experts of the request just
  // begun (its layer's reserve()), or with none of its experts used (against_request false).
  void settle_prediction(bool against_request);

  int n_layers_, n_experts_, n_slots_;
  size_t slot_bytes_;
  CachePolicy policy_;
  int n_resident_ = 0;
  std::vector<int> slot_of_key_;   // [n_layers * n_experts] → slot, -1 when absent
  std::vector<Key> key_of_slot_;   // [n_slots] → key, kNoKey when free
  // LRU: a list over occupied slots (head = most recent). Free slots are on a stack.
  std::vector<int> prev_, next_;  // [n_slots], empty under LRFU
  int head_ = -1, tail_ = -1;
  std::vector<int> free_slots_;
  std::vector<uint32_t> pinned_epoch_;  // [n_slots]: == epoch_ while pinned by the open reservation
  std::vector<uint32_t> requested_epoch_;  // [n_experts]: == epoch_ once reserve() has seen the expert
  uint32_t epoch_ = 0;
  // LRFU: a key's score at tick t is 2^(log_score - t / half_life); storing the time-free
  // log_score (-inf: never accessed) keeps the order of the occupied slots fixed as time passes.
  std::vector<double> log_score_;              // [n_layers * n_experts]
  std::set<std::pair<double, int>> by_score_;  // (log_score, slot) of occupied slots, lowest first
  uint64_t tick_ = 0;                          // reserve() and touch() calls so far
  bool open_ = false;
  bool open_ahead_ = false;  // the open reservation is reserve_ahead()'s
  Reservation res_;
  // The prediction waiting for its layer's reserve(): the layer (-1: none), its experts, and the keys
  // copied ahead for it.
  int predicted_layer_ = -1;
  std::vector<int> predicted_;
  std::vector<Key> prefetched_;
  Stats stats_;
  ResidencyListener listener_;
};

}  // namespace rl
