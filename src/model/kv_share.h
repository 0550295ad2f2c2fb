// Snapshots that share KV rows with a live session instead of copying them.
//
// A session's KV cache is one contiguous store that the attention kernels read. A snapshot taken
// at position q references rows [0, q) of that store (KvShare) and copies only the recurrent
// states. Before the session writes rows from position p on, every snapshot that still references
// rows at or past p has them frozen (KvLedger::before_write): one copy of rows [p, r) (r: the
// furthest such a snapshot reaches), shared by all of them. A snapshot's rows are then [0, live)
// in the session's store followed by frozen pieces up to q, and what they hold never changes
// after the snapshot is taken. Restoring into the session whose rows it references copies only
// its frozen pieces back (none while its rows are intact); restoring into another session copies
// every row. Either way the snapshot then references that session's rows again and drops its
// pieces.
//
// Memory: a frozen copy is allocated when a session writes, which the server's admission does not
// budget for; when it cannot be allocated, the snapshots that needed it are lost (lost(): they
// cannot be restored, and the PromptCache drops them) and the write goes on.
//
// Ownership: frozen pieces are reference-counted. The session's store is never freed while
// referenced: its destructor calls close(), which freezes every reference (one copy of the rows
// they reach; when that copy cannot be allocated, the store itself is handed over).
// KvShare::bytes(): each frozen piece's bytes divided among the snapshots that hold it (rounded
// down), so a sum over snapshots is what they hold together; rows referenced in a live session
// cost nothing more (the session holds them anyway).
//
// Threads: nothing here is synchronised. A session and the snapshots taken from or restored into
// it are used from one thread (the CLI's loop; the server's worker, server/scheduler.h).
#pragma once
#include <algorithm>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "common/error.h"
#include "model/session.h"

namespace rl {

// Rows: a backend's frozen KV rows of every attention layer, with size_t bytes() const.
template <class Rows>
struct KvPiece {
  std::shared_ptr<const Rows> rows;
  size_t begin = 0, end = 0;  // the positions this piece gives its snapshot; rows' row 0 is begin
};

template <class Rows, class Store>
class KvLedger;

// A snapshot's KV rows [0, position): [0, live_rows()) in the store of ledger()'s session, then
// pieces() in order.
template <class Rows, class Store>
class KvShare {
 public:
  KvShare() = default;
  KvShare(const KvShare&) = delete;
  KvShare& operator=(const KvShare&) = delete;
  ~KvShare() {
    if (ledger_) ledger_->forget(this);
  }

  size_t position() const { return position_; }
  // Its rows are gone (KvLedger::before_write could not copy them): it cannot be restored.
  bool lost() const { return lost_; }
  void check_restorable() const {
    if (lost_)
      fail("restore: the snapshot's KV rows were lost (no memory to copy them when its session overwrote them)");
  }
  size_t live_rows() const { return live_; }
  const KvLedger<Rows, Store>* ledger() const { return ledger_; }
  const std::vector<KvPiece<Rows>>& pieces() const { return pieces_; }
  // What this snapshot holds alone: its share of each frozen piece.
  size_t bytes() const {
    size_t n = 0;
    for (const KvPiece<Rows>& p : pieces_) n += p.rows->bytes() / (size_t)p.rows.use_count();
    return n;
  }

 private:
  friend class KvLedger<Rows, Store>;
  KvLedger<Rows, Store>* ledger_ = nullptr;
  size_t position_ = 0, live_ = 0;
  bool lost_ = false;
  std::vector<KvPiece<Rows>> pieces_;
};

// A session's side: the snapshots that reference rows of its store.
template <class Rows, class Store>
class KvLedger {
 public:
  // freeze(from, to): a copy of the store's rows [from, to), its row 0 at position `from`.
  using Freeze = std::function<std::shared_ptr<const Rows>(size_t from, size_t to)>;
  // surrender(): the store itself as frozen rows (row 0 at position 0), for close() when a copy
  // cannot be allocated; the session is going away and no longer uses it.
  using Surrender = std::function<std::shared_ptr<const Rows>()>;

  KvLedger(const Store& store, Freeze freeze, Surrender surrender)
      : store_(store), freeze_(std::move(freeze)), surrender_(std::move(surrender)) {}
  KvLedger(const KvLedger&) = delete;
  KvLedger& operator=(const KvLedger&) = delete;
  ~KvLedger() { close(); }

  const Store& store() const { return store_; }
  size_t references() const { return shares_.size(); }

  // `share` now holds rows [0, position) of this session's store (and nothing it held before).
  void share(KvShare<Rows, Store>& s, size_t position) {
    if (s.ledger_) s.ledger_->forget(&s);
    s.pieces_.clear();
    s.position_ = s.live_ = position;
    s.lost_ = false;
    if (position == 0) return;
    shares_.push_back(&s);
    s.ledger_ = this;
  }

  // Called before the session writes any row at or past position `from`. When the frozen copy
  // cannot be made (no memory), the snapshots that needed it are lost instead: the write, which
  // the session's own memory was sized for, does not fail for them.
  void before_write(size_t from) {
    size_t reach = from;
    for (const KvShare<Rows, Store>* s : shares_) reach = std::max(reach, s->live_);
    if (reach == from) return;
    std::shared_ptr<const Rows> rows;
    try {
      rows = freeze_(from, reach);
    } catch (const std::exception&) {
      lose_from(from);
      return;
    }
    freeze_from(from, std::move(rows));
  }

  // The session is going away: every reference is frozen.
  void close() noexcept {
    if (shares_.empty()) return;
    size_t reach = 0;
    for (const KvShare<Rows, Store>* s : shares_) reach = std::max(reach, s->live_);
    std::shared_ptr<const Rows> rows;
    try {
      rows = freeze_(0, reach);
    } catch (...) {
      // No memory for the copy: the session's own store goes to the snapshots. That hand-over
      // allocates too (a small holder); if even it fails, the snapshots are lost, not the process
      // (this runs in a destructor).
      try {
        rows = surrender_();
      } catch (...) {
        lose_from(0);  // every share has live rows, so none is left
        return;
      }
    }
    freeze_from(0, std::move(rows));
  }

  // Restores `s`'s rows into this session's store and makes `s` reference them here.
  // copy_live(source, n): rows [0, n) of another session's store into this one's;
  // copy_piece(piece): the piece's rows into this store at positions [begin, end).
  template <class CopyLive, class CopyPiece>
  void adopt(KvShare<Rows, Store>& s, CopyLive&& copy_live, CopyPiece&& copy_piece) {
    const bool here = s.ledger_ == this;
    // Rows intact here are not written, so nothing is frozen for them (rows past them stay
    // shared until a pass writes there).
    if (!here || !s.pieces_.empty()) before_write(here ? s.live_ : 0);
    if (!here && s.live_ > 0) copy_live(s.ledger_->store(), s.live_);
    for (const KvPiece<Rows>& p : s.pieces_) copy_piece(p);
    share(s, s.position_);
  }

 private:
  friend class KvShare<Rows, Store>;
  void forget(KvShare<Rows, Store>* s) {
    shares_.erase(std::remove(shares_.begin(), shares_.end(), s), shares_.end());
    s->ledger_ = nullptr;
  }
  void lose_from(size_t from) {
    std::erase_if(shares_, [from](KvShare<Rows, Store>* s) {
      if (s->live_ <= from) return false;
      s->lost_ = true;
      s->live_ = 0;
      s->pieces_.clear();
      s->ledger_ = nullptr;
      return true;
    });
  }
  // Every share reaching past `from` gets rows [from, its live end) from `rows`.
  void freeze_from(size_t from, std::shared_ptr<const Rows> rows) {
    std::vector<KvShare<Rows, Store>*> kept;
    for (KvShare<Rows, Store>* s : shares_) {
      if (s->live_ > from) {
        s->pieces_.insert(s->pieces_.begin(), KvPiece<Rows>{rows, from, s->live_});
        s->live_ = from;
      }
      if (s->live_ > 0)
        kept.push_back(s);
      else
        s->ledger_ = nullptr;
    }
    shares_ = std::move(kept);
  }

  const Store& store_;
  Freeze freeze_;
  Surrender surrender_;
  std::vector<KvShare<Rows, Store>*> shares_;
};

// The part of a backend's snapshot that this file defines: the recurrent states' bytes (the
// backend copies the states themselves) and the KV rows shared with a session.
template <class Rows, class Store>
class KvSharingSnapshot : public SessionSnapshot {
 public:
  size_t bytes() const override { return recurrent_bytes + kv.bytes(); }
  int position() const override { return (int)kv.position(); }
  bool lost() const override { return kv.lost(); }
  size_t recurrent_bytes = 0;
  // Mutable: a restore makes it reference the rows of the session restored into; what the
  // snapshot holds does not change.
  mutable KvShare<Rows, Store> kv;
};

}  // namespace rl
