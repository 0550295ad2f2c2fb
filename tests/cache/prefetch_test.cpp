// ExpertCache::reserve_ahead (prefetch of a layer's predicted experts, CPU only): which misses get
// slots, that the layer in flight's experts are never evicted, that a wrong prediction's slot is the
// next one taken, the prediction's statistics, abort; and a randomized run of the engine's cycle
// (reserve layer L, prefetch L+1 sparing L, reserve L+1) checked against the cache's invariants.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "cache/expert_cache.h"
#include "common/error.h"

namespace rl {
namespace {

constexpr size_t kSlot = 1000;

std::vector<int> ids(std::initializer_list<int> v) { return std::vector<int>(v); }

void reserve_commit(ExpertCache& c, int layer, std::vector<int> experts) {
  c.reserve(layer, experts);
  c.commit();
}

// 4 slots: layer 0's experts {0, 1} least recently used, then layer 1's {0, 1}. A prefetch of layer 1's
// {0, 5, 6} while layer 0's {0, 1} are in flight: 1:0 is resident (left as it is), 1:5 may only take
// the slot of 1:1 (LRU alone would take 0:0's), and 1:6 finds no slot and is left out.
TEST(ExpertCachePrefetch, SparesTheLayerInUseAndTakesOnlyMisses) {
  for (auto kind : {CachePolicy::Kind::kLru, CachePolicy::Kind::kLrfu}) {
    SCOPED_TRACE(cache_policy_name(kind));
    ExpertCache c(2, 8, kSlot, 4 * kSlot, 2, CachePolicy{kind, 1e6});
    reserve_commit(c, 0, {0, 1});
    reserve_commit(c, 1, {0, 1});
    const auto before = c.stats();
    auto predicted = ids({0, 5, 6}), in_use = ids({0, 1});
    const auto& r = c.reserve_ahead(1, predicted, 0, in_use);
    ASSERT_EQ(r.entries.size(), 1u);
    EXPECT_EQ(r.entries[0].expert, 5);
    EXPECT_FALSE(r.entries[0].hit);
    EXPECT_EQ(r.entries[0].evicted, c.key(1, 1));
    EXPECT_EQ(r.entries[0].slot, 3);  // (slots were handed out in order: 1:1 held slot 3)
    c.commit();
    EXPECT_GE(c.lookup(0, 0), 0);
    EXPECT_GE(c.lookup(0, 1), 0);
    EXPECT_EQ(c.lookup(1, 5), 3);
    EXPECT_LT(c.lookup(1, 6), 0);
    // A prefetch counts no hit or miss of its own.
    EXPECT_EQ(c.stats().hits, before.hits);
    EXPECT_EQ(c.stats().misses, before.misses);
    EXPECT_EQ(c.stats().predicted, 3u);
    EXPECT_EQ(c.stats().prefetched, 1u);
  }
}

// The layer then routes {5, 0, 3}: 5 (prefetched) and 0 are hits, 3 a miss; of the prediction {0, 5, 6}
// two were used, and the one prefetched was a hit.
TEST(ExpertCachePrefetch, TheLayersReservationCountsThePrediction) {
  ExpertCache c(2, 8, kSlot, 6 * kSlot, 2);
  reserve_commit(c, 0, {0, 1});
  reserve_commit(c, 1, {0, 1});
  auto predicted = ids({0, 5, 6}), in_use = ids({0, 1});
  c.reserve_ahead(1, predicted, 0, in_use);
  c.commit();
  c.reset_stats();  // (the pending prediction stays: only the counters restart)
  auto routed = ids({5, 0, 3});
  const auto& r = c.reserve(1, routed);
  EXPECT_TRUE(r.entries[0].hit);
  EXPECT_TRUE(r.entries[1].hit);
  EXPECT_FALSE(r.entries[2].hit);
  c.commit();
  const auto s = c.stats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.predicted_used, 2u);
  EXPECT_EQ(s.prefetch_hits, 1u);
  EXPECT_EQ(s.prefetch_wasted, 1u);  // 6 was copied and not routed
  // Settled once: the layer's next reservation counts nothing more.
  reserve_commit(c, 1, {5, 6});
  EXPECT_EQ(c.stats().predicted_used, 2u);
  EXPECT_EQ(c.stats().prefetch_hits, 1u);
  EXPECT_EQ(c.stats().prefetch_wasted, 1u);
}

// A prefetched expert the layer did not route is the next victim (it entered at the cold end),
// under either policy, though the resident experts are older.
TEST(ExpertCachePrefetch, AWrongPredictionsSlotIsTakenFirst) {
  for (auto kind : {CachePolicy::Kind::kLru, CachePolicy::Kind::kLrfu}) {
    SCOPED_TRACE(cache_policy_name(kind));
    ExpertCache c(2, 8, kSlot, 4 * kSlot, 1, CachePolicy{kind, 1e6});
    reserve_commit(c, 0, {0, 1, 2});
    auto predicted = ids({7}), in_use = ids({0, 1, 2});
    c.reserve_ahead(1, predicted, 0, in_use);
    c.commit();
    auto routed = ids({4});
    const auto& r = c.reserve(1, routed);
    ASSERT_EQ(r.entries.size(), 1u);
    EXPECT_EQ(r.entries[0].evicted, c.key(1, 7));
    c.commit();
    EXPECT_EQ(c.stats().prefetch_wasted, 1u);
    EXPECT_EQ(c.stats().prefetch_hits, 0u);
    EXPECT_EQ(c.stats().predicted_used, 0u);
  }
}

// A prefetched expert evicted before its layer routes (another layer's miss took its cold slot) is a
// miss when the layer routes it, and the copy counts as wasted, not as a prefetch hit.
TEST(ExpertCachePrefetch, AnEvictedPrefetchIsNotAHit) {
  ExpertCache c(3, 8, kSlot, 3 * kSlot, 1);
  reserve_commit(c, 0, {0, 1});
  auto predicted = ids({7}), in_use = ids({0, 1});
  c.reserve_ahead(1, predicted, 0, in_use);
  c.commit();
  reserve_commit(c, 2, {4});  // evicts 1:7
  EXPECT_LT(c.lookup(1, 7), 0);
  auto routed = ids({7});
  EXPECT_FALSE(c.reserve(1, routed).entries[0].hit);
  c.commit();
  EXPECT_EQ(c.stats().prefetch_hits, 0u);
  EXPECT_EQ(c.stats().prefetch_wasted, 1u);
  EXPECT_EQ(c.stats().predicted_used, 1u);  // the prediction itself was right
}

// An aborted prefetch (its copies failed) frees its slots and copies nothing; the prediction's
// accuracy is still counted when the layer routes. Bad in-use ids are refused.
TEST(ExpertCachePrefetch, AbortAndBadRequests) {
  ExpertCache c(2, 8, kSlot, 4 * kSlot, 1);
  reserve_commit(c, 0, {0});
  auto predicted = ids({3, 4}), in_use = ids({0});
  const auto& r = c.reserve_ahead(1, predicted, 0, in_use);
  EXPECT_EQ(r.entries.size(), 2u);
  c.abort();
  EXPECT_LT(c.lookup(1, 3), 0);
  EXPECT_LT(c.lookup(1, 4), 0);
  EXPECT_EQ(c.stats().prefetched, 0u);
  reserve_commit(c, 1, {3});
  EXPECT_EQ(c.stats().predicted_used, 1u);
  EXPECT_EQ(c.stats().prefetch_hits, 0u);
  EXPECT_EQ(c.stats().prefetch_wasted, 0u);
  auto bad_use = ids({9});
  EXPECT_THROW(c.reserve_ahead(1, predicted, 0, bad_use), Error);
  EXPECT_THROW(c.reserve_ahead(1, predicted, 2, in_use), Error);
  auto twice = ids({3, 3});
  EXPECT_THROW(c.reserve_ahead(1, twice, 0, in_use), Error);
  c.reserve_ahead(1, predicted, 0, in_use);
  EXPECT_THROW(c.reserve(0, in_use), Error);  // one reservation at a time
  c.commit();
}

// The engine's decode cycle on random selections, both policies and a budget of 2k to 5k slots:
// reserve layer L, prefetch layer L+1 (a prediction of which part is right) sparing L's experts,
// then reserve L+1. Invariants: the prefetch never evicts one of L's experts, every resident key has
// its own slot, the counters add up (prefetched = hits + wasted once every prediction is settled).
TEST(ExpertCachePrefetch, RandomDecodeCycleKeepsTheInvariants) {
  const int n_layers = 6, n_experts = 24, k = 4;
  for (auto kind : {CachePolicy::Kind::kLru, CachePolicy::Kind::kLrfu}) {
    for (int n_slots : {2 * k, 3 * k + 1, 5 * k}) {
      SCOPED_TRACE(std::string(cache_policy_name(kind)) + " slots " + std::to_string(n_slots));
      ExpertCache c(n_layers, n_experts, kSlot, (size_t)n_slots * kSlot, k, CachePolicy{kind, 30});
      std::mt19937 rng(17 + n_slots);
      auto pick = [&](int n) {
        std::vector<int> all(n_experts);
        for (int i = 0; i < n_experts; i++) all[i] = i;
        std::shuffle(all.begin(), all.end(), rng);
        return std::vector<int>(all.begin(), all.begin() + n);
      };
      std::vector<int> routed = pick(k);
      for (int step = 0; step < 300; step++) {
        const int L = step % n_layers;
        reserve_commit(c, L, routed);
        if (L + 1 == n_layers) {
          routed = pick(k);
          continue;
        }
        std::vector<int> next = pick(k), predicted = next;
        predicted.resize(k / 2);
        for (int ex : pick(k))
          if ((int)predicted.size() < k && std::find(predicted.begin(), predicted.end(), ex) == predicted.end())
            predicted.push_back(ex);
        std::vector<int> in_use_slots;
        for (int ex : routed) in_use_slots.push_back(c.lookup(L, ex));
        const auto& r = c.reserve_ahead(L + 1, predicted, L, routed);
        for (const auto& e : r.entries)
          for (int s : in_use_slots) ASSERT_NE(e.slot, s) << "the prefetch took a slot of the layer in flight";
        c.commit();
        for (int ex : routed) ASSERT_GE(c.lookup(L, ex), 0);
        routed = next;
      }
      std::set<int> slots;
      int resident = 0;
      for (int L = 0; L < n_layers; L++)
        for (int ex = 0; ex < n_experts; ex++)
          if (int s = c.lookup(L, ex); s >= 0) {
            ASSERT_TRUE(slots.insert(s).second) << "slot " << s << " held twice";
            resident++;
          }
      EXPECT_EQ(resident, c.n_resident());
      const auto st = c.stats();
      EXPECT_GT(st.prefetched, 0u);
      EXPECT_GT(st.prefetch_hits, 0u);
      EXPECT_GT(st.prefetch_wasted, 0u);
      EXPECT_EQ(st.prefetched, st.prefetch_hits + st.prefetch_wasted);
      EXPECT_GE(st.predicted_used, st.prefetch_hits);
      EXPECT_LE(st.predicted_used, st.predicted);
    }
  }
}

}  // namespace
}  // namespace rl
