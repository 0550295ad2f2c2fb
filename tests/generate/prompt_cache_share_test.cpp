// The PromptCache's budget over snapshots whose KV rows are shared with a live session (CPU
// oracle, model B, f32 cache): stored, they cost their recurrent states; once the session
// overwrites their rows, the copy frozen for them (once for all of them, model/kv_share.h) counts,
// and the next put evicts the least recently used down to the budget. A snapshot whose rows were
// lost (no memory to freeze them) is dropped, not restored.
#include <gtest/gtest.h>

#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/model_b_test.h"
#include "fakes.h"
#include "generate/prompt_cache.h"

namespace rl {
namespace {

class PromptCacheSharedRows : public test::ModelBBackendTest {
 protected:
  void SetUp() override {
    ModelBBackendTest::SetUp();
    if (IsSkipped()) return;
    recurrent = model_->config().recurrent_state_bytes();
    row = model_->config().kv_bytes_per_token();
  }
  size_t recurrent = 0, row = 0;  // a snapshot's recurrent state bytes; KV bytes a position
  std::vector<int32_t> tokens(size_t from, size_t n) const {
    return std::vector<int32_t>(tokens_.begin() + from, tokens_.begin() + from + n);
  }
};

TEST_F(PromptCacheSharedRows, BudgetCountsRowsFrozenAfterTheyWereStored) {
  PromptCache cache(3 * recurrent + 60 * row);
  auto s = backend_->new_session(256);
  s->prefill(tokens(0, 40));
  cache.put(tokens(0, 40), s->snapshot());
  s->prefill(tokens(40, 20));
  cache.put(tokens(0, 60), s->snapshot());
  EXPECT_EQ(cache.bytes(), 2 * recurrent) << "both share the session's rows";

  s->reset();
  s->prefill(tokens(100, 10));  // overwrites rows 0..9: rows 0..59 frozen once for both
  EXPECT_EQ(cache.bytes(), 2 * recurrent + 60 * row);
  cache.put(tokens(100, 10), s->snapshot());
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.bytes(), cache.max_bytes());

  s->reset();
  s->prefill(tokens(130, 5));  // the third entry's 10 rows frozen: over the budget now
  EXPECT_EQ(cache.bytes(), 3 * recurrent + 70 * row);
  cache.put(tokens(130, 5), s->snapshot());
  // The 40- and then the 60-token entry go (the first leaves its share of rows 0..59 to the second).
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.bytes(), 2 * recurrent + 10 * row);

  // The 10-token entry restores its frozen rows: the continuation is a fresh run's.
  std::vector<int32_t> prompt = tokens(100, 10);
  prompt.push_back(7);
  auto other = backend_->new_session(256);
  ASSERT_EQ(cache.restore_longest_prefix(prompt, prompt.size() - 1, *other), 10);
  auto fresh = backend_->new_session(256);
  fresh->prefill(tokens(100, 10));
  EXPECT_EQ(other->decode(7), fresh->decode(7));
}

// A session that goes away freezes the rows its snapshots shared: trim() brings the cache back
// within its budget at once (the server calls it before making a session), not at the next put.
TEST_F(PromptCacheSharedRows, TrimEvictsRowsFrozenByASessionThatWent) {
  PromptCache cache(2 * recurrent + 10 * row);
  auto s = backend_->new_session(256);
  s->prefill(tokens(0, 30));
  cache.put(tokens(0, 30), s->snapshot());
  s->prefill(tokens(30, 20));
  cache.put(tokens(0, 50), s->snapshot());
  EXPECT_EQ(cache.bytes(), 2 * recurrent);
  s.reset();  // rows 0..49 frozen once for both: over the budget until something evicts
  EXPECT_EQ(cache.bytes(), 2 * recurrent + 50 * row);
  EXPECT_GT(cache.bytes(), cache.max_bytes());
  cache.trim();
  // The least recently used (30-token) entry goes; the other then holds the frozen rows alone.
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.bytes(), recurrent + 50 * row);
  EXPECT_LE(cache.bytes(), cache.max_bytes());
}

// A lost snapshot (its rows could not be frozen) is dropped at the next lookup, which misses
// instead of failing: the request prefills from the start.
TEST(PromptCacheLostRows, LostSnapshotsAreDroppedNotRestored) {
  struct Losable : SessionSnapshot {
    bool gone = false;
    size_t bytes() const override { return 10; }
    int position() const override { return 3; }
    bool lost() const override { return gone; }
  };
  auto snap = std::make_unique<Losable>();
  Losable* losable = snap.get();
  PromptCache cache(2000);  // FakeSnapshot: 1,004 bytes
  cache.put(std::vector<int32_t>{1, 2, 3}, std::move(snap));
  cache.put(std::vector<int32_t>{1}, std::make_unique<test::FakeSnapshot>(std::vector<int32_t>{1}));
  losable->gone = true;
  test::FakeSession session(16, [](const std::vector<int32_t>&) { return (int32_t)1; });
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  EXPECT_EQ(cache.restore_longest_prefix(prompt, prompt.size() - 1, session), 1) << "the shorter entry instead";
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(session.restores, 1);
}

}  // namespace
}  // namespace rl
