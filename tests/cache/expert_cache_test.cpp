// ExpertCache policy tests (CPU only): slot assignment, LRU order, pins, commit/abort, listener,
// statistics, and randomized comparisons against plain reference LRU and LRFU caches that track
// slots.
#include "cache/expert_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <list>
#include <map>
#include <random>
#include <set>

#include "common/error.h"

namespace rl {
namespace {

constexpr size_t kSlot = 1000;

std::vector<int> ids(std::initializer_list<int> v) { return std::vector<int>(v); }

TEST(ExpertCache, SlotCountFromBudgetAndCap) {
  ExpertCache a(4, 8, kSlot, 10 * kSlot + 999, 2);
  EXPECT_EQ(a.n_slots(), 10);
  EXPECT_FALSE(a.holds_all());
  ExpertCache b(4, 8, kSlot, 1000 * kSlot, 2);
  EXPECT_EQ(b.n_slots(), 32);
  EXPECT_TRUE(b.holds_all());
}

// touch() (GPU-routed tokens): resident experts become most recently used and count as hits;
// absent ones are skipped and count nothing.
TEST(ExpertCache, TouchRefreshesLruAndCountsHits) {
  ExpertCache c(1, 8, kSlot, 3 * kSlot, 1);
  for (int e : {0, 1, 2}) {
    auto one = ids({e});
    c.reserve(0, one);
    c.commit();
  }
  c.reset_stats();
  auto used = ids({0, 7});  // 0 resident (least recent), 7 absent
  c.touch(0, used);
  EXPECT_EQ(c.stats().hits, 1u);
  EXPECT_EQ(c.stats().misses, 0u);
  auto next = ids({3});  // must evict the least recent, now expert 1
  const auto& r = c.reserve(0, next);
  ASSERT_EQ(r.entries.size(), 1u);
  EXPECT_EQ(r.entries[0].evicted, c.key(0, 1));
  c.commit();
  EXPECT_GE(c.lookup(0, 0), 0);
}

// count_hits() (the GPU-grouped prefill) adds hits on a cache that holds every expert and leaves
// the residency as it is; on a bounded cache, whose LRU order matters, it is refused.
TEST(ExpertCache, CountHitsOnlyWhenEverythingFits) {
  ExpertCache all(2, 4, kSlot, 8 * kSlot, 1);
  ASSERT_TRUE(all.holds_all());
  auto four = ids({0, 1, 2, 3});
  all.reserve(1, four);
  all.commit();
  all.reset_stats();
  all.count_hits(7);
  all.count_hits(5);
  EXPECT_EQ(all.stats().hits, 12u);
  EXPECT_EQ(all.stats().misses, 0u);
  EXPECT_EQ(all.n_resident(), 4);
  ExpertCache bounded(2, 4, kSlot, 7 * kSlot, 1);
  EXPECT_THROW(bounded.count_hits(1), Error);
  EXPECT_EQ(bounded.stats().hits, 0u);
}

TEST(ExpertCache, BudgetTooSmallNamesTheFlag) {
  try {
    ExpertCache c(4, 8, 1 << 20, 3 << 20, 4);
    FAIL() << "expected rl::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cache-mib"), std::string::npos) << e.what();
  }
}

TEST(ExpertCache, MissThenHit) {
  ExpertCache c(2, 8, kSlot, 4 * kSlot, 2);
  auto e = ids({3, 5});
  const auto& r = c.reserve(1, e);
  ASSERT_EQ(r.entries.size(), 2u);
  EXPECT_FALSE(r.entries[0].hit);
  EXPECT_FALSE(r.entries[1].hit);
  EXPECT_EQ(r.entries[0].evicted, ExpertCache::kNoKey);
  EXPECT_NE(r.entries[0].slot, r.entries[1].slot);
  EXPECT_EQ(c.lookup(1, 3), -1);  // not resident before commit
  const int s3 = r.entries[0].slot;
  c.commit();
  EXPECT_EQ(c.lookup(1, 3), s3);
  EXPECT_EQ(c.lookup(0, 3), -1);
  const auto& r2 = c.reserve(1, e);
  EXPECT_TRUE(r2.entries[0].hit);
  EXPECT_EQ(r2.entries[0].slot, s3);
  c.commit();
  EXPECT_EQ(c.stats().hits, 2u);
  EXPECT_EQ(c.stats().misses, 2u);
  EXPECT_DOUBLE_EQ(c.stats().hit_rate(), 0.5);
}

TEST(ExpertCache, EvictsLeastRecentlyUsedAndReportsKey) {
  ExpertCache c(1, 16, kSlot, 3 * kSlot, 1);
  for (int ex : {0, 1, 2}) {
    int one[] = {ex};
    c.reserve(0, one);
    c.commit();
  }
  int again[] = {0};  // 0 becomes most recent: LRU order now 1, 2, 0
  EXPECT_TRUE(c.reserve(0, again).entries[0].hit);
  c.commit();
  const int slot1 = c.lookup(0, 1);
  int fresh[] = {7};
  const auto& r = c.reserve(0, fresh);
  EXPECT_FALSE(r.entries[0].hit);
  EXPECT_EQ(r.entries[0].evicted, c.key(0, 1));
  EXPECT_EQ(r.entries[0].slot, slot1);
  c.commit();
  EXPECT_EQ(c.lookup(0, 1), -1);
  EXPECT_EQ(c.lookup(0, 7), slot1);
  EXPECT_EQ(c.stats().evictions, 1u);
}

TEST(ExpertCache, ReservationNeverEvictsItsOwnExperts) {
  ExpertCache c(1, 16, kSlot, 3 * kSlot, 3);
  auto a = ids({0, 1, 2});
  c.reserve(0, a);
  c.commit();
  // 0 is the LRU victim, but this request needs it: 1 must go instead.
  auto b = ids({5, 0, 9});
  const auto& r = c.reserve(0, b);
  EXPECT_FALSE(r.entries[0].hit);
  EXPECT_TRUE(r.entries[1].hit);
  EXPECT_FALSE(r.entries[2].hit);
  std::set<int> evicted = {r.entries[0].evicted, r.entries[2].evicted};
  EXPECT_EQ(evicted, (std::set<int>{c.key(0, 1), c.key(0, 2)}));
  std::set<int> slots = {r.entries[0].slot, r.entries[1].slot, r.entries[2].slot};
  EXPECT_EQ(slots.size(), 3u);
  c.commit();
}

TEST(ExpertCache, AbortFreesMissSlotsAndDropsVictims) {
  ExpertCache c(1, 16, kSlot, 2 * kSlot, 1);
  auto a = ids({0, 1});
  c.reserve(0, a);
  c.commit();
  auto b = ids({1, 4});
  const auto& r = c.reserve(0, b);
  EXPECT_TRUE(r.entries[0].hit);
  EXPECT_EQ(r.entries[1].evicted, c.key(0, 0));
  c.abort();
  EXPECT_EQ(c.lookup(0, 4), -1);
  EXPECT_EQ(c.lookup(0, 0), -1);  // its slot may have been partly overwritten
  EXPECT_GE(c.lookup(0, 1), 0);
  EXPECT_EQ(c.n_resident(), 1);
  // The freed slot is reused without an eviction.
  int d[] = {6};
  const auto& r2 = c.reserve(0, d);
  EXPECT_EQ(r2.entries[0].evicted, ExpertCache::kNoKey);
  c.commit();
  EXPECT_EQ(c.n_resident(), 2);
}

TEST(ExpertCache, RejectsBadRequests) {
  ExpertCache c(2, 8, kSlot, 4 * kSlot, 2);
  auto dup = ids({1, 1});
  EXPECT_THROW(c.reserve(0, dup), Error);
  auto dup_apart = ids({1, 2, 1});
  EXPECT_THROW(c.reserve(0, dup_apart), Error);
  // A rejected request leaves no marks: the same experts once each, twice in a row, are accepted.
  auto pair = ids({2, 1});
  for (int round = 0; round < 2; round++) {
    c.reserve(0, pair);
    c.commit();
  }
  auto range = ids({8});
  EXPECT_THROW(c.reserve(0, range), Error);
  auto ok = ids({1});
  EXPECT_THROW(c.reserve(2, ok), Error);
  auto big = ids({0, 1, 2, 3, 4});
  EXPECT_THROW(c.reserve(0, big), Error);
  c.reserve(0, ok);
  EXPECT_THROW(c.reserve(0, ok), Error);  // one reservation at a time
  c.commit();
  EXPECT_THROW(c.commit(), Error);
  EXPECT_THROW(c.abort(), Error);
}

TEST(ExpertCache, ListenerTracksResidency) {
  ExpertCache c(2, 4, kSlot, 3 * kSlot, 1);
  std::map<int, int> table;  // what a device residency table would hold
  c.set_listener([&](ExpertCache::Key k, int slot) {
    if (slot < 0) table.erase(k); else table[k] = slot;
  });
  std::mt19937 rng(7);
  for (int step = 0; step < 500; step++) {
    const int layer = rng() % 2;
    std::vector<int> all = {0, 1, 2, 3};
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int> req(all.begin(), all.begin() + 1 + rng() % 3);
    c.reserve(layer, req);
    if (rng() % 5 == 0) c.abort(); else c.commit();
    for (int l = 0; l < 2; l++)
      for (int e = 0; e < 4; e++) {
        auto it = table.find(c.key(l, e));
        EXPECT_EQ(c.lookup(l, e), it == table.end() ? -1 : it->second);
      }
    EXPECT_EQ((int)table.size(), c.n_resident());
  }
}

// Reference: a textbook LRU over keys (list + maps) that also keeps the slot of every key: a miss
// with a victim takes the victim's slot, a miss without one any free slot (the reference does not
// prescribe which), aborted misses free their slots, the experts of a request are pinned.
// With an LRFU policy the victim is instead the resident key of least score, computed as the
// definition reads: the sum over the key's accesses (every reserve or touch call is one tick; a
// request raises every key it names, a touch the resident ones) of 2^(-(now - tick) / half_life),
// ties to the lower slot.
class ReferenceLru {
 public:
  ReferenceLru(int n_slots, int n_keys, CachePolicy policy = {})
      : n_slots_(n_slots), resident_slot_(n_keys, -1), policy_(policy), accesses_(n_keys) {
    for (int s = 0; s < n_slots; s++) free_.insert(s);
  }

  // Checks one reservation entry by entry against the reference and applies it.
  void reserve(const ExpertCache& c, int layer, const std::vector<int>& req, const ExpertCache::Reservation& r,
               int step) {
    ASSERT_EQ(r.entries.size(), req.size()) << "step " << step;
    std::set<int> wanted;
    for (int e : req) wanted.insert(c.key(layer, e));
    tick_++;
    for (int key : wanted) accesses_[key].push_back(tick_);
    // Hits first, in request order, each becoming the most recent.
    for (size_t i = 0; i < req.size(); i++) {
      const int key = c.key(layer, req[i]);
      const ExpertCache::Entry& e = r.entries[i];
      ASSERT_EQ(e.expert, req[i]) << "step " << step;
      const bool hit = resident_slot_[key] >= 0;
      ASSERT_EQ(e.hit, hit) << "step " << step << " expert " << req[i];
      if (!hit) continue;
      ASSERT_EQ(e.slot, resident_slot_[key]) << "step " << step << ": a hit must name the expert's slot";
      ASSERT_EQ(e.evicted, ExpertCache::kNoKey) << "step " << step;
      lru_.remove(key);
      lru_.push_front(key);
      hits++;
    }
    // Then the misses, in request order: a free slot, else the slot of the least recent key not
    // in this request.
    for (size_t i = 0; i < req.size(); i++) {
      const ExpertCache::Entry& e = r.entries[i];
      if (e.hit) continue;
      const int key = c.key(layer, req[i]);
      misses++;
      if (!free_.empty()) {
        ASSERT_EQ(e.evicted, ExpertCache::kNoKey) << "step " << step << ": a free slot was left";
        ASSERT_EQ(free_.count(e.slot), 1u)
            << "step " << step << ": slot " << e.slot << " is not free (it holds key " << owner_of(e.slot) << ")";
        free_.erase(e.slot);
      } else {
        int victim = ExpertCache::kNoKey;
        if (policy_.kind == CachePolicy::Kind::kLrfu) {
          double least = 0;
          for (int key : lru_)
            if (!wanted.count(key) && (victim == ExpertCache::kNoKey || score(key) < least ||
                                       (score(key) == least && slot_of(key) < slot_of(victim)))) {
              victim = key;
              least = score(key);
            }
        } else {
          for (auto it = lru_.rbegin(); it != lru_.rend(); ++it)
            if (!wanted.count(*it)) {
              victim = *it;
              break;
            }
        }
        ASSERT_NE(victim, ExpertCache::kNoKey) << "step " << step << ": the reference has no victim";
        ASSERT_EQ(e.evicted, victim) << "step " << step;
        ASSERT_EQ(e.slot, slot_of(victim)) << "step " << step << ": a miss must take its victim's slot";
        lru_.remove(victim);
        resident_slot_[victim] = -1;
        pending_slot_.erase(victim);
        evictions++;
      }
      lru_.push_front(key);
      pending_slot_[key] = e.slot;
    }
  }
  void commit() {
    for (const auto& [key, slot] : pending_slot_) resident_slot_[key] = slot;
    pending_slot_.clear();
  }
  void abort() {
    for (const auto& [key, slot] : pending_slot_) {
      lru_.remove(key);
      free_.insert(slot);
    }
    pending_slot_.clear();
  }
  void touch(const ExpertCache& c, int layer, const std::vector<int>& experts) {
    tick_++;
    for (int e : experts) {
      const int key = c.key(layer, e);
      if (resident_slot_[key] < 0) continue;
      accesses_[key].push_back(tick_);
      lru_.remove(key);
      lru_.push_front(key);
      hits++;
    }
  }

  // The cache's view of every key equals the reference's, so no slot holds two resident keys.
  void expect_same_residency(const ExpertCache& c, int step) const {
    std::map<int, int> key_on_slot;
    int resident = 0;
    for (int key = 0; key < (int)resident_slot_.size(); key++) {
      const int slot = c.lookup(c.layer_of(key), c.expert_of(key));
      ASSERT_EQ(slot, resident_slot_[key]) << "step " << step << " key " << key;
      if (slot < 0) continue;
      resident++;
      ASSERT_LT(slot, n_slots_);
      const auto [it, fresh] = key_on_slot.emplace(slot, key);
      ASSERT_TRUE(fresh) << "step " << step << ": keys " << it->second << " and " << key << " both on slot " << slot;
    }
    ASSERT_EQ(c.n_resident(), resident) << "step " << step;
  }

  uint64_t hits = 0, misses = 0, evictions = 0;

 private:
  double score(int key) const {
    double sum = 0;
    for (uint64_t t : accesses_[key]) sum += std::pow(2.0, -double(tick_ - t) / policy_.half_life);
    return sum;
  }
  int slot_of(int key) const {
    if (auto it = pending_slot_.find(key); it != pending_slot_.end()) return it->second;
    return resident_slot_[key];
  }
  int owner_of(int slot) const {
    for (int key = 0; key < (int)resident_slot_.size(); key++)
      if (slot_of(key) == slot) return key;
    return ExpertCache::kNoKey;
  }
  int n_slots_;
  std::vector<int> resident_slot_;  // [key] -> slot once committed, -1 when absent
  std::map<int, int> pending_slot_;  // misses of the open reservation -> their slots
  std::list<int> lru_;               // front = most recent; resident and pending keys
  std::set<int> free_;
  CachePolicy policy_;
  std::vector<std::vector<uint64_t>> accesses_;  // [key] -> ticks of its accesses
  uint64_t tick_ = 0;
};

// Random reservations (skewed popularity, so there are hits, misses and evictions), commits and
// aborts, and touches, at a cache of exactly k slots, a bounded one and one that holds every
// expert: every entry (hit, slot, victim), the statistics and the residency of every key after
// every step equal the reference's.
void expect_matches_reference(CachePolicy policy) {
  const int n_layers = 3, n_experts = 20, k = 4;
  for (int n_slots : {k, 12, n_layers * n_experts}) {
    SCOPED_TRACE("slots " + std::to_string(n_slots));
    ExpertCache c(n_layers, n_experts, kSlot, n_slots * kSlot, k, policy);
    ASSERT_EQ(c.n_slots(), n_slots);
    ReferenceLru ref(n_slots, n_layers * n_experts, policy);
    std::mt19937 rng(11 + n_slots);
    std::discrete_distribution<int> skew({8, 6, 5, 4, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
    int aborts = 0;
    for (int step = 0; step < 3000; step++) {
      const int layer = rng() % n_layers;
      std::vector<int> req;
      const int want = 1 + rng() % k;
      while ((int)req.size() < want) {
        const int e = skew(rng);
        if (std::find(req.begin(), req.end(), e) == req.end()) req.push_back(e);
      }
      if (rng() % 8 == 0) {
        c.touch(layer, req);
        ref.touch(c, layer, req);
      } else {
        const auto& r = c.reserve(layer, req);
        ASSERT_NO_FATAL_FAILURE(ref.reserve(c, layer, req, r, step));
        if (rng() % 10 == 0) {
          c.abort();
          ref.abort();
          aborts++;
        } else {
          c.commit();
          ref.commit();
        }
      }
      ASSERT_NO_FATAL_FAILURE(ref.expect_same_residency(c, step));
      ASSERT_EQ(c.stats().hits, ref.hits) << "step " << step;
      ASSERT_EQ(c.stats().misses, ref.misses) << "step " << step;
      ASSERT_EQ(c.stats().evictions, ref.evictions) << "step " << step;
    }
    EXPECT_GT(ref.hits, 0u);
    EXPECT_GT(ref.misses, 0u);
    EXPECT_GT(aborts, 0);
    if (n_slots < n_layers * n_experts) EXPECT_GT(ref.evictions, 0u);
    else EXPECT_EQ(ref.evictions, 0u);
  }
}

TEST(ExpertCache, MatchesReferenceLruSlotForSlot) { expect_matches_reference(CachePolicy{}); }

// Half-lives of a few accesses (recency dominates) and of many (frequency dominates).
TEST(ExpertCache, MatchesReferenceLrfuSlotForSlot) {
  for (double half_life : {3.7, 41.3}) {
    SCOPED_TRACE("half-life " + std::to_string(half_life));
    expect_matches_reference(CachePolicy{CachePolicy::Kind::kLrfu, half_life});
  }
}

// Hand-computed: one layer, 2 slots, half-life 4 accesses. Expert 0 is requested at ticks 1 and 2,
// expert 1 at tick 3; at tick 4 expert 2 misses. Scores then: expert 0 (2^-3/4 + 2^-2/4) = 1.30,
// expert 1 2^-1/4 = 0.84, so LRFU evicts expert 1 where LRU evicts expert 0 (least recent).
TEST(ExpertCache, LrfuKeepsTheFrequentExpertLruEvicts) {
  for (auto kind : {CachePolicy::Kind::kLru, CachePolicy::Kind::kLrfu}) {
    ExpertCache c(1, 4, kSlot, 2 * kSlot, 1, CachePolicy{kind, 4});
    for (int e : {0, 0, 1}) {
      auto one = ids({e});
      c.reserve(0, one);
      c.commit();
    }
    auto two = ids({2});
    const auto& r = c.reserve(0, two);
    ASSERT_EQ(r.entries.size(), 1u);
    EXPECT_EQ(r.entries[0].evicted, kind == CachePolicy::Kind::kLrfu ? c.key(0, 1) : c.key(0, 0))
        << cache_policy_name(kind);
    c.commit();
  }
}

// bypass() (experts a GPU-routed token read in place): each counts as a miss and a bypass, takes
// no slot, and a resident expert or an id out of range is refused.
TEST(ExpertCache, BypassCountsMissesWithoutSlots) {
  ExpertCache c(2, 8, kSlot, 2 * kSlot, 1);
  auto zero = ids({0});
  c.reserve(0, zero);
  c.commit();
  auto two = ids({3, 4});
  c.bypass(0, two);
  EXPECT_EQ(c.stats().misses, 3u);
  EXPECT_EQ(c.stats().bypassed, 2u);
  EXPECT_EQ(c.stats().hits, 0u);
  EXPECT_EQ(c.lookup(0, 3), -1);
  EXPECT_EQ(c.lookup(0, 4), -1);
  EXPECT_EQ(c.n_resident(), 1);
  EXPECT_THROW(c.bypass(0, zero), Error);  // resident
  auto bad = ids({8});
  EXPECT_THROW(c.bypass(0, bad), Error);
  EXPECT_THROW(c.bypass(2, two), Error);
  ExpertCache::Stats sum;
  sum += c.stats();
  sum += c.stats();
  EXPECT_EQ(sum.bypassed, 4u);
}

// With LRFU a bypassed expert keeps the score of its reads: expert 2, read in place three times and
// then brought in, outscores expert 1 (brought in once, touched once), so the next miss evicts 1;
// without the reads it evicts 2 (hand-computed with a half-life of 1000 accesses, where scores are
// nearly access counts: 4 against 2, and 1 against 2). LRU evicts 2 either way (1 is more recent).
TEST(ExpertCache, BypassedReadsCountInLrfuScores) {
  for (auto kind : {CachePolicy::Kind::kLru, CachePolicy::Kind::kLrfu}) {
    for (bool reads : {false, true}) {
      ExpertCache c(1, 4, kSlot, 2 * kSlot, 1, CachePolicy{kind, 1000});
      for (int e : {0, 1}) {
        auto one = ids({e});
        c.reserve(0, one);
        c.commit();
      }
      auto two = ids({2});
      if (reads)
        for (int i = 0; i < 3; i++) c.bypass(0, two);
      const auto& r2 = c.reserve(0, two);
      ASSERT_EQ(r2.entries.size(), 1u);
      EXPECT_EQ(r2.entries[0].evicted, c.key(0, 0));
      c.commit();
      auto one = ids({1});
      c.touch(0, one);
      auto three = ids({3});
      const auto& r3 = c.reserve(0, three);
      ASSERT_EQ(r3.entries.size(), 1u);
      const bool lrfu_with_reads = kind == CachePolicy::Kind::kLrfu && reads;
      EXPECT_EQ(r3.entries[0].evicted, lrfu_with_reads ? c.key(0, 1) : c.key(0, 2))
          << cache_policy_name(kind) << (reads ? " with reads" : " without reads");
      c.commit();
    }
  }
}

TEST(ExpertCache, PolicyNamesAndBadHalfLife) {
  EXPECT_EQ(parse_cache_policy("lru"), CachePolicy::Kind::kLru);
  EXPECT_EQ(parse_cache_policy("lrfu"), CachePolicy::Kind::kLrfu);
  EXPECT_STREQ(cache_policy_name(CachePolicy::Kind::kLrfu), "lrfu");
  try {
    parse_cache_policy("arc");
    FAIL() << "expected rl::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cache-policy"), std::string::npos) << e.what();
  }
  for (double bad : {0.0, -1.0, std::nan("")})
    EXPECT_THROW(ExpertCache(1, 4, kSlot, 4 * kSlot, 1, CachePolicy{CachePolicy::Kind::kLrfu, bad}), Error);
}

// The request of one layer of a pass: a decode token's selections in routed order, a prefill
// chunk's distinct ids ascending.
TEST(ExpertCache, LayerRequestAsTheEngineReserves) {
  const std::vector<int32_t> one = {7, 2, 5};
  EXPECT_EQ(ExpertCache::layer_request(one, 1, 3), ids({7, 2, 5}));
  const std::vector<int32_t> chunk = {7, 2, 5, 2, 9, 7};
  EXPECT_EQ(ExpertCache::layer_request(chunk, 2, 3), ids({2, 5, 7, 9}));
}

TEST(ExpertCache, CopyStatistics) {
  ExpertCache c(1, 4, kSlot, 4 * kSlot, 1);
  c.record_copy(3000, 0.5);
  c.record_copy(1000, 0.25);
  EXPECT_EQ(c.stats().bytes_copied, 4000u);
  EXPECT_DOUBLE_EQ(c.stats().copy_seconds, 0.75);
  c.reset_stats();
  EXPECT_EQ(c.stats().bytes_copied, 0u);
}

}  // namespace
}  // namespace rl
