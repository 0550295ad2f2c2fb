// The bookkeeping of KV rows shared between a session and its snapshots (model/kv_share.h), on a
// store of one int a position: what a snapshot reads back never changes whatever the session
// writes; a write freezes only the rows it reaches, once for every snapshot that needs them; a
// session that goes away freezes everything (handing its store over when no copy can be made);
// a copy that cannot be made loses only the snapshots that needed it.
#include "model/kv_share.h"

#include <gtest/gtest.h>

#include <new>
#include <numeric>
#include <vector>

namespace rl {
namespace {

struct FakeRows {
  std::vector<int> values;
  size_t bytes() const { return values.size() * 120; }  // 120 bytes a row: divides among 2, 3, 4 holders
};
using Store = std::vector<int>;  // [position]
using Ledger = KvLedger<FakeRows, Store>;
using Share = KvShare<FakeRows, Store>;

class KvShareTest : public ::testing::Test {
 protected:
  KvShareTest() : store_(10), ledger_(store_, [this](size_t a, size_t b) { return freeze(a, b); }, [this] {
    surrendered_++;
    return std::make_shared<const FakeRows>(FakeRows{std::move(store_)});
  }) {
    std::iota(store_.begin(), store_.end(), 0);
  }
  std::shared_ptr<const FakeRows> freeze(size_t from, size_t to) {
    if (out_of_memory_) throw std::bad_alloc();
    freezes_.push_back({from, to});
    return std::make_shared<const FakeRows>(FakeRows{Store(store_.begin() + from, store_.begin() + to)});
  }
  // What a share reads back: its live rows from its session's store, then its pieces.
  static std::vector<int> content(const Share& s) {
    std::vector<int> out;
    for (size_t p = 0; p < s.live_rows(); p++) out.push_back(s.ledger()->store()[p]);
    for (const KvPiece<FakeRows>& piece : s.pieces())
      for (size_t p = piece.begin; p < piece.end; p++) out.push_back(piece.rows->values[p - piece.begin]);
    return out;
  }
  static std::vector<int> count(int n) {
    std::vector<int> v(n);
    std::iota(v.begin(), v.end(), 0);
    return v;
  }
  // The session writes -1 from position `from` on, as a pass would after before_write.
  void write_from(size_t from) {
    ledger_.before_write(from);
    std::fill(store_.begin() + from, store_.end(), -1);
  }

  Store store_;
  Ledger ledger_;
  std::vector<std::pair<size_t, size_t>> freezes_;
  int surrendered_ = 0;
  bool out_of_memory_ = false;
};

TEST_F(KvShareTest, AWriteFreezesOnlyTheRowsItReachesOnceForAll) {
  Share a, b, c;
  ledger_.share(a, 4);
  ledger_.share(b, 8);
  ledger_.share(c, 10);
  EXPECT_EQ(a.bytes() + b.bytes() + c.bytes(), 0u) << "live rows cost the snapshots nothing";
  write_from(10);
  EXPECT_TRUE(freezes_.empty()) << "a write past every snapshot freezes nothing";
  write_from(6);
  ASSERT_EQ(freezes_, (std::vector<std::pair<size_t, size_t>>{{6, 10}}));
  EXPECT_EQ(content(a), count(4));
  EXPECT_EQ(content(b), count(8));
  EXPECT_EQ(content(c), count(10));
  EXPECT_EQ(a.bytes(), 0u);
  EXPECT_EQ(b.bytes() + c.bytes(), 480u) << "rows 6..9 held once, divided between b and c";
  write_from(2);
  EXPECT_EQ(freezes_.back(), (std::pair<size_t, size_t>{2, 6}));
  EXPECT_EQ(content(a), count(4));
  EXPECT_EQ(content(b), count(8));
  EXPECT_EQ(content(c), count(10));
  EXPECT_EQ(a.bytes() + b.bytes() + c.bytes(), 960u) << "rows 2..5 held once, divided among the three";
  EXPECT_EQ(ledger_.references(), 3u);
}

TEST_F(KvShareTest, ASnapshotThatGoesFirstIsForgotten) {
  {
    Share gone;
    ledger_.share(gone, 9);
  }
  EXPECT_EQ(ledger_.references(), 0u);
  write_from(0);
  EXPECT_TRUE(freezes_.empty());
}

TEST_F(KvShareTest, ClosingFreezesEveryReferenceAndHandsTheStoreOverWithoutMemory) {
  Share a, b;
  ledger_.share(a, 3);
  ledger_.share(b, 7);
  out_of_memory_ = true;
  ledger_.close();
  EXPECT_EQ(surrendered_, 1);
  EXPECT_TRUE(store_.empty()) << "the store itself went to the snapshots";
  EXPECT_EQ(a.ledger(), nullptr);
  EXPECT_EQ(content(a), count(3));
  EXPECT_EQ(content(b), count(7));
  EXPECT_EQ(a.bytes() + b.bytes(), 1200u) << "the whole store, 10 rows";
}

TEST_F(KvShareTest, ClosingCopiesWhatTheReferencesReach) {
  auto a = std::make_unique<Share>();
  ledger_.share(*a, 5);
  ledger_.close();
  EXPECT_EQ(surrendered_, 0);
  ASSERT_EQ(freezes_, (std::vector<std::pair<size_t, size_t>>{{0, 5}}));
  std::fill(store_.begin(), store_.end(), -1);
  EXPECT_EQ(content(*a), count(5));
  EXPECT_EQ(a->bytes(), 600u);
}

TEST_F(KvShareTest, ACopyWithoutMemoryLosesOnlyTheSnapshotsThatNeededIt) {
  Share a, b;
  ledger_.share(a, 4);
  ledger_.share(b, 8);
  out_of_memory_ = true;
  EXPECT_NO_THROW(write_from(5));
  EXPECT_FALSE(a.lost());
  EXPECT_EQ(content(a), count(4));
  EXPECT_TRUE(b.lost());
  EXPECT_EQ(b.bytes(), 0u);
  EXPECT_EQ(ledger_.references(), 1u);
}

// Adopting back into the session whose rows a snapshot references copies only its frozen pieces;
// adopting into another session copies its live rows too, and moves the reference there.
TEST_F(KvShareTest, AdoptCopiesWhatTheSessionDoesNotHold) {
  Share a, b;
  ledger_.share(a, 6);
  ledger_.share(b, 9);
  size_t live_copied = 0, piece_rows = 0;
  auto copy_live = [&](const Store&, size_t n) { live_copied += n; };
  auto copy_piece = [&](const KvPiece<FakeRows>& p) {
    for (size_t pos = p.begin; pos < p.end; pos++) store_[pos] = p.rows->values[pos - p.begin];
    piece_rows += p.end - p.begin;
  };
  ledger_.adopt(a, copy_live, copy_piece);
  EXPECT_EQ(live_copied + piece_rows, 0u) << "rows intact here: nothing copied";
  EXPECT_TRUE(freezes_.empty()) << "nor frozen for b";
  write_from(3);
  ledger_.adopt(b, copy_live, copy_piece);
  EXPECT_EQ(piece_rows, 6u);
  EXPECT_EQ(b.bytes(), 0u) << "its rows are live here again";
  EXPECT_EQ(content(b), count(9));
  EXPECT_EQ(content(a), count(6));

  Store other_store(10, -7);
  Ledger other(other_store, [](size_t, size_t) -> std::shared_ptr<const FakeRows> { throw std::bad_alloc(); },
               [] { return std::make_shared<const FakeRows>(); });
  other.adopt(b, [&](const Store& source, size_t n) {
    std::copy(source.begin(), source.begin() + n, other_store.begin());
    live_copied += n;
  }, copy_piece);
  EXPECT_EQ(live_copied, 9u);
  EXPECT_EQ(b.ledger(), &other);
  EXPECT_EQ(content(b), count(9));
  EXPECT_EQ(ledger_.references(), 1u);
  other.share(b, 0);  // before `other` goes: its close() would find nothing to copy
}

}  // namespace
}  // namespace rl
