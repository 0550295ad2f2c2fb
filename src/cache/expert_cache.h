// ExpertCache: the host-side policy that maps routed experts (layer, expert) to fixed-size GPU
// slots under a byte budget, with LRU replacement (DESIGN.md §4). It owns no device memory and
// makes no copies: a backend asks it which slot each selected expert lives in (or must be copied
// into), copies the misses, then commits (or aborts) the reservation. Pure CPU, unit-tested in CI.
//
// One reservation at a time: reserve() → copy the misses → commit() (copies enqueued) or abort()
// (copies failed). The experts of an open reservation are pinned: the reservation never evicts one
// of its own keys, so a set of k experts needs at least k slots.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace rl {

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
    double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
  };

  // Called on every change of residency: (key, -1) when a key leaves (at reserve, as soon as its
  // slot is promised to a miss, since the copy will overwrite it), (key, slot) when a miss becomes
  // resident at commit. The CUDA backend keeps
  // its device residency table in step through it.
  using ResidencyListener = std::function<void(Key key, int slot)>;

  // slots = min(budget_bytes / slot_bytes, n_layers * n_experts). Throws rl::Error when the budget
  // holds fewer than min_slots slots (min_slots = experts one layer selects per token).
  ExpertCache(int n_layers, int n_experts, size_t slot_bytes, size_t budget_bytes, int min_slots);

  int n_layers() const { return n_layers_; }
  int n_experts() const { return n_experts_; }
  int n_slots() const { return n_slots_; }
  size_t slot_bytes() const { return slot_bytes_; }
  // True when every expert of the model has a slot (the whole model can be resident).
  bool holds_all() const { return n_slots_ == n_layers_ * n_experts_; }
  int n_resident() const { return n_resident_; }

  Key key(int layer, int expert) const { return layer * n_experts_ + expert; }
  int layer_of(Key k) const { return k / n_experts_; }
  int expert_of(Key k) const { return k % n_experts_; }

  // Slot of a resident expert, or -1. Does not touch the LRU order.
  int lookup(int layer, int expert) const;

  // Reserves slots for `experts` of `layer` (distinct ids). Hits move to most-recently-used;
  // each miss takes a free slot or evicts the least-recently-used key that is not in this
  // request. Throws rl::Error on an id out of range, a duplicate, or a reservation already open.
  const Reservation& reserve(int layer, std::span<const int> experts);
  // The copies into the miss slots are enqueued: the misses become resident (listener called).
  void commit();
  // The copies failed: the miss slots hold nothing usable and become free. Their previous keys
  // stay gone (a copy may have overwritten part of them).
  void abort();
  bool reservation_open() const { return open_; }

  // Refreshes the LRU stamps of experts used without a reservation (GPU-routed tokens); each
  // resident one counts as a hit. Experts not resident are skipped.
  void touch(int layer, std::span<const int> experts);
  // Counts n hits of experts used without a reservation on a cache that holds every expert (the
  // GPU-grouped prefill): nothing is ever evicted, so the LRU order does not matter and is left as
  // it is. Throws rl::Error unless holds_all().
  void count_hits(uint64_t n);

  void record_copy(size_t bytes, double seconds);
  const Stats& stats() const { return stats_; }
  void reset_stats() { stats_ = Stats{}; }

  void set_listener(ResidencyListener fn) { listener_ = std::move(fn); }

 private:
  void unlink(int slot);
  void push_front(int slot);  // most recently used
  void notify(Key k, int slot) {
    if (listener_) listener_(k, slot);
  }

  int n_layers_, n_experts_, n_slots_;
  size_t slot_bytes_;
  int n_resident_ = 0;
  std::vector<int> slot_of_key_;   // [n_layers * n_experts] → slot, -1 when absent
  std::vector<Key> key_of_slot_;   // [n_slots] → key, kNoKey when free
  // LRU list over occupied slots (head = most recent); free slots on a stack.
  std::vector<int> prev_, next_;
  int head_ = -1, tail_ = -1;
  std::vector<int> free_slots_;
  std::vector<uint32_t> pinned_epoch_;  // [n_slots]: == epoch_ while pinned by the open reservation
  std::vector<uint32_t> requested_epoch_;  // [n_experts]: == epoch_ once reserve() has seen the expert
  uint32_t epoch_ = 0;
  bool open_ = false;
  Reservation res_;
  Stats stats_;
  ResidencyListener listener_;
};

}  // namespace rl
