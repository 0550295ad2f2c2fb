#include "generate/prompt_cache.h"

#include <algorithm>

#include "common/error.h"
#include "model/session.h"

namespace rl {

size_t PromptCache::bytes() const {
  size_t n = 0;
  for (const Entry& e : entries_) n += e.snapshot->bytes();
  return n;
}

// Lost snapshots go first (kv_share.h: no memory was there to keep their rows). Shares of rows
// frozen for several snapshots grow as others go, so an entry's bytes taken off the sum as it goes
// leave the sum low: it is taken again once the estimate is within the budget, and the loop goes
// on while that is still over (one or two sums, not one per eviction).
void PromptCache::evict_to(size_t budget) {
  entries_.remove_if([](const Entry& e) { return e.snapshot->lost(); });
  for (size_t total = bytes(); !entries_.empty() && total > budget; total = bytes()) {
    while (!entries_.empty() && total > budget) {
      total -= std::min(total, entries_.back().snapshot->bytes());
      entries_.pop_back();
    }
  }
}

void PromptCache::put(std::span<const int32_t> tokens, std::unique_ptr<SessionSnapshot> snapshot) {
  if (!snapshot) return;
  if ((size_t)snapshot->position() != tokens.size())
    fail("prompt cache: snapshot at position {} stored under {} tokens", snapshot->position(), tokens.size());
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (std::ranges::equal(it->tokens, tokens)) {
      entries_.erase(it);
      break;
    }
  }
  if (snapshot->bytes() > max_bytes_) return;
  entries_.push_front(Entry{std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(snapshot)});
  evict_to(max_bytes_);
}

void PromptCache::put(std::span<const int32_t> tokens, const Session& session) {
  if (max_bytes_ > 0) put(tokens, session.snapshot());
}

int PromptCache::restore_longest_prefix(std::span<const int32_t> prompt, size_t max_len, Session& session) {
  evict_to(max_bytes_);  // sessions written or released since the last call froze shared rows
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const size_t n = it->tokens.size();
    if (n == 0 || n > max_len || n > prompt.size()) continue;
    if (best != entries_.end() && n <= best->tokens.size()) continue;
    if (std::equal(it->tokens.begin(), it->tokens.end(), prompt.begin())) best = it;
  }
  if (best == entries_.end()) {
    ++misses_;
    return 0;
  }
  session.restore(*best->snapshot);
  entries_.splice(entries_.begin(), entries_, best);  // now the most recently used
  ++hits_;
  const int n = (int)entries_.front().tokens.size();
  evict_to(max_bytes_);  // the restore froze rows other snapshots shared with the session
  return n;
}

}  // namespace rl
