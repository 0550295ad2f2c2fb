// Session snapshots keyed by the tokens the session had processed, for reusing a prompt's common
// prefix across requests. A hybrid recurrent model (DeltaNet layers) cannot roll its state back,
// so the only reusable states are those saved at a boundary: a request whose prompt starts with a
// stored key restores that snapshot and prefills the rest.
//
// Least-recently-used eviction under a byte budget (the sum of SessionSnapshot::bytes()). A
// snapshot shares its KV rows with the session it came from and holds few bytes until that session
// overwrites them (model/kv_share.h), so what it holds can grow after it is stored: the sum is
// taken again whenever it is asked for, and put and restore evict down to the budget (and drop
// snapshots whose rows were lost for want of memory). Not thread-safe: one owner (the chat loop,
// or the server's single worker) uses it and the sessions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <vector>

#include "model/session.h"  // complete SessionSnapshot: entries own theirs

namespace rl {

class PromptCache {
 public:
  explicit PromptCache(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Stores the state of a session that has processed exactly `tokens` (snapshot->position() must
  // equal tokens.size()). Replaces an entry with the same key; evicts the least recently used
  // entries until the budget holds; a snapshot larger than the whole budget is not kept.
  void put(std::span<const int32_t> tokens, std::unique_ptr<SessionSnapshot> snapshot);
  // put of `session`'s snapshot, taken only where the cache can keep one: a budget of 0
  // (--prompt-cache-mib 0) takes none (on the GPU a snapshot allocates and copies the recurrent
  // states, and freeing it waits for the device).
  void put(std::span<const int32_t> tokens, const Session& session);

  // Restores into `session` the entry with the longest key that is a prefix of `prompt` and at
  // most max_len tokens long, and returns that length; 0 (session untouched) when none fits.
  int restore_longest_prefix(std::span<const int32_t> prompt, size_t max_len, Session& session);

  // Evicts down to the budget now: rows frozen for the entries since the last put or lookup (a
  // session released or overwritten) count from then on, so the owner trims before it needs the
  // memory they took (the server, before it makes a session).
  void trim() { evict_to(max_bytes_); }

  size_t bytes() const;  // what the entries hold now
  size_t max_bytes() const { return max_bytes_; }
  size_t size() const { return entries_.size(); }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    std::unique_ptr<SessionSnapshot> snapshot;
  };
  void evict_to(size_t budget);

  size_t max_bytes_;
  std::list<Entry> entries_;  // most recently used first
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace rl
