// Snapshots that share their KV rows with the session (model/kv_share.h): whatever the session
// does after a snapshot (continue, rewind to another snapshot, diverge, reset, batched decode, go
// away), restoring the snapshot continues exactly as a fresh session fed the same tokens, and
// bytes() is what the snapshot holds alone: the recurrent states, plus its share of the rows frozen
// for it once the session overwrote them. Model B, f32 cache: 1,024 bytes of KV a token.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cpu/cpu_backend.h"
#include "model/parity.h"
#include "model_b_test.h"

namespace rl {
namespace {

constexpr size_t kKvBytesPerToken = 1024;  // model B, f32: 1 attention layer x K and V x 2 heads x 128 x 4 bytes

class SnapshotShareTest : public test::ModelBBackendTest {
 protected:
  void SetUp() override {
    ModelBBackendTest::SetUp();
    if (IsSkipped()) return;
    recurrent_ = model_->config().recurrent_state_bytes();
    ASSERT_EQ(model_->config().kv_bytes_per_token(), kKvBytesPerToken);
  }
  // `s`, at position n, gives for `next` the logits of a fresh session fed tokens_[0, n) (bit for bit).
  void expect_continues_fresh(Session& s, size_t n, int32_t next, const char* what) const {
    ASSERT_EQ(s.position(), (int)n) << what;
    const std::vector<float> got = s.decode(next);
    auto fresh = backend_->new_session(256);
    fresh->prefill(span(0, n));
    const std::vector<float> want = fresh->decode(next);
    ASSERT_EQ(got.size(), want.size()) << what;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << what << ": rel rms " << relative_rms(got, want);
  }

  size_t recurrent_ = 0;
};

// Snapshot A at 40, decode on, snapshot B at 50; rewind to A (rows intact: nothing frozen) and
// diverge: B gets its own copy of its rows 40..49 only; A is untouched. Then B, A, and B again
// after a reset and another prompt, each continue as a fresh run of their tokens.
TEST_F(SnapshotShareTest, RewindDivergeAndRestoreEqualFreshRuns) {
  auto s = backend_->new_session(256);
  s->prefill(span(0, 40));
  const auto a = s->snapshot();
  for (size_t i = 40; i < 50; i++) s->decode(tokens_[i]);
  const auto b = s->snapshot();
  EXPECT_EQ(a->bytes(), recurrent_) << "rows shared with the session cost the snapshot nothing";
  EXPECT_EQ(b->bytes(), recurrent_);

  s->restore(*a);
  EXPECT_EQ(s->position(), 40);
  EXPECT_EQ(b->bytes(), recurrent_) << "a restore that writes no row freezes nothing";
  s->prefill(span(100, 20));  // diverges: rows 40..59 now hold other tokens
  EXPECT_EQ(b->bytes(), recurrent_ + 10 * kKvBytesPerToken) << "B copies the 10 rows it lost, no more";
  EXPECT_EQ(a->bytes(), recurrent_);

  s->restore(*b);
  expect_continues_fresh(*s, 50, tokens_[50], "B after the divergence");
  EXPECT_EQ(b->bytes(), recurrent_) << "restored: B references this session's rows again";
  s->restore(*a);
  expect_continues_fresh(*s, 40, 7, "A after B's restore");

  s->reset();
  s->prefill(span(120, 30));
  EXPECT_EQ(a->bytes() + b->bytes(), 2 * recurrent_ + 50 * kKvBytesPerToken) << "one copy of rows 0..49 for both";
  s->restore(*b);
  expect_continues_fresh(*s, 50, tokens_[50], "B after a reset and a new prompt");
  s->restore(*a);
  expect_continues_fresh(*s, 40, tokens_[40], "A after a reset and a new prompt");
}

// A snapshot outlives its session: it then holds its rows alone, and restores into another
// session as a fresh run.
TEST_F(SnapshotShareTest, SnapshotOutlivesItsSession) {
  auto s = backend_->new_session(256);
  s->prefill(span(0, 30));
  auto snap = s->snapshot();
  s->decode(tokens_[30]);
  s.reset();
  EXPECT_EQ(snap->bytes(), recurrent_ + 30 * kKvBytesPerToken);
  auto other = backend_->new_session(64);
  other->restore(*snap);
  EXPECT_EQ(snap->bytes(), recurrent_) << "restored: it references the new session's rows";
  expect_continues_fresh(*other, 30, tokens_[30], "restored after its session went");
}

// Restored into another session, a snapshot references that session's rows: the first session's
// writes no longer concern it, the second's do.
TEST_F(SnapshotShareTest, RestoreIntoAnotherSessionMovesTheReference) {
  auto first = backend_->new_session(256);
  first->prefill(span(0, 30));
  const auto snap = first->snapshot();
  auto second = backend_->new_session(256);
  second->restore(*snap);
  first->reset();
  first->prefill(span(60, 40));
  EXPECT_EQ(snap->bytes(), recurrent_);
  second->prefill(span(60, 5));  // from position 30: none of the snapshot's rows
  EXPECT_EQ(snap->bytes(), recurrent_);
  second->reset();
  second->prefill(span(90, 12));
  EXPECT_EQ(snap->bytes(), recurrent_ + 30 * kKvBytesPerToken);
  first->restore(*snap);
  expect_continues_fresh(*first, 30, tokens_[30], "restored into the first again");
}

// A restore writes KV rows as a pass does: the snapshots that share the session's rows get their
// own copy of them first.
TEST_F(SnapshotShareTest, RestoringAnotherSnapshotFreezesTheSessionsOwn) {
  auto s = backend_->new_session(256);
  s->prefill(span(0, 40));
  const auto mine = s->snapshot();
  auto other = backend_->new_session(256);
  other->prefill(span(100, 30));
  const auto theirs = other->snapshot();
  s->restore(*theirs);  // rows 0..29 of s now hold other tokens
  EXPECT_EQ(mine->bytes(), recurrent_ + 40 * kKvBytesPerToken);
  s->restore(*mine);
  expect_continues_fresh(*s, 40, tokens_[40], "the session's own snapshot after another's restore");
}

// Rows frozen for two snapshots are held once and counted once; when one goes, the other holds
// them alone.
TEST_F(SnapshotShareTest, FrozenRowsSharedByTwoSnapshotsAreCountedOnce) {
  auto s = backend_->new_session(256);
  s->prefill(span(0, 20));
  auto short_snap = s->snapshot();
  s->prefill(span(20, 20));
  const auto long_snap = s->snapshot();
  s->reset();
  s->prefill(span(80, 8));
  EXPECT_EQ(short_snap->bytes() + long_snap->bytes(), 2 * recurrent_ + 40 * kKvBytesPerToken);
  short_snap.reset();
  EXPECT_EQ(long_snap->bytes(), recurrent_ + 40 * kKvBytesPerToken);
  s->restore(*long_snap);
  expect_continues_fresh(*s, 40, tokens_[40], "the longer snapshot");
}

// The batched pass writes KV rows too: a session rewound to A and advanced by decode_batch
// freezes B's rows first.
TEST_F(SnapshotShareTest, BatchedDecodeFreezesRowsItOverwrites) {
  auto s = backend_->new_session(256);
  auto other = backend_->new_session(256);
  other->prefill(span(100, 10));
  s->prefill(span(0, 30));
  const auto a = s->snapshot();
  s->prefill(span(30, 5));
  const auto b = s->snapshot();
  s->restore(*a);
  Session* both[] = {s.get(), other.get()};
  const int32_t next[] = {9, 11};
  backend_->decode_batch(both, next);
  EXPECT_EQ(b->bytes(), recurrent_ + 5 * kKvBytesPerToken);
  s->restore(*b);
  expect_continues_fresh(*s, 35, tokens_[35], "B after a batched decode");
}

}  // namespace
}  // namespace rl
