// ExpertCache policy tests (CPU only): slot assignment, LRU order, pins, commit/abort, listener,
// statistics, and a randomized comparison against a plain reference LRU.
#include "cache/expert_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// Reference: a textbook LRU over keys (list + map), with the same pin rule.
TEST(ExpertCache, MatchesReferenceLru) {
  const int n_layers = 3, n_experts = 20, n_slots = 12, k = 4;
  ExpertCache c(n_layers, n_experts, kSlot, n_slots * kSlot, k);
  std::list<int> lru;  // front = most recent
  std::mt19937 rng(11);
  std::discrete_distribution<int> skew({8, 6, 5, 4, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  uint64_t hits = 0, misses = 0;
  for (int step = 0; step < 3000; step++) {
    const int layer = rng() % n_layers;
    std::vector<int> req;
    while ((int)req.size() < k) {
      const int e = skew(rng);
      if (std::find(req.begin(), req.end(), e) == req.end()) req.push_back(e);
    }
    const auto& r = c.reserve(layer, req);
    std::set<int> wanted;
    for (int e : req) wanted.insert(c.key(layer, e));
    for (size_t i = 0; i < req.size(); i++) {
      const int key = c.key(layer, req[i]);
      const bool ref_hit = std::find(lru.begin(), lru.end(), key) != lru.end();
      ASSERT_EQ(r.entries[i].hit, ref_hit) << "step " << step;
      ref_hit ? hits++ : misses++;
    }
    // Reference: touch hits in request order, then for each miss evict the LRU non-wanted key.
    for (int e : req) {
      const int key = c.key(layer, e);
      auto it = std::find(lru.begin(), lru.end(), key);
      if (it != lru.end()) {
        lru.erase(it);
        lru.push_front(key);
      }
    }
    for (size_t i = 0; i < req.size(); i++) {
      if (r.entries[i].hit) continue;
      int expect_evicted = ExpertCache::kNoKey;
      if ((int)lru.size() == n_slots) {
        for (auto it = lru.rbegin(); it != lru.rend(); ++it)
          if (!wanted.count(*it)) {
            expect_evicted = *it;
            lru.erase(std::next(it).base());
            break;
          }
      }
      ASSERT_EQ(r.entries[i].evicted, expect_evicted) << "step " << step;
      lru.push_front(c.key(layer, req[i]));
    }
    c.commit();
  }
  EXPECT_EQ(c.stats().hits, hits);
  EXPECT_EQ(c.stats().misses, misses);
  EXPECT_GT(hits, 0u);
  EXPECT_GT(misses, 0u);
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
