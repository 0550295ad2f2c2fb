#include "tokenizer/bpe.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstring>
#include <queue>

namespace rl {
namespace {

// FNV-1a, which can be continued over a second string: hash(a + b) = continue(hash(a), b).
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;
inline uint64_t fnv_continue(uint64_t h, std::string_view s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}
inline uint32_t fold(uint64_t h) { return (uint32_t)(h ^ (h >> 32)); }

size_t pow2_at_least(size_t n) {
  size_t p = 16;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

BpeModel::BpeModel(size_t expected_symbols, size_t expected_merges) {
  offsets_.reserve(expected_symbols + 1);
  offsets_.push_back(0);
  hashes_.reserve(expected_symbols);
  arena_.reserve(expected_symbols * 8);
  index_.assign(pow2_at_least(expected_symbols * 2 + 16), IndexSlot{0, -1});
  index_mask_ = index_.size() - 1;
  merge_slots_.assign(pow2_at_least(expected_merges * 4 / 3 + 16), MergeSlot{});
  merge_mask_ = merge_slots_.size() - 1;
}

uint32_t BpeModel::hash_text(std::string_view text) { return fold(fnv_continue(kFnvBasis, text)); }

int32_t BpeModel::find_symbol(std::string_view text, uint32_t h) const {
  for (size_t i = h & index_mask_;; i = (i + 1) & index_mask_) {
    const IndexSlot s = index_[i];
    if (s.id < 0) return -1;
    if (s.hash == h && symbol_text(s.id) == text) return s.id;
  }
}

int32_t BpeModel::find_concat(std::string_view a, std::string_view b) const {
  const uint32_t h = fold(fnv_continue(fnv_continue(kFnvBasis, a), b));
  for (size_t i = h & index_mask_;; i = (i + 1) & index_mask_) {
    const IndexSlot s = index_[i];
    if (s.id < 0) return -1;
    if (s.hash != h) continue;
    const std::string_view t = symbol_text(s.id);
    if (t.size() == a.size() + b.size() && t.substr(0, a.size()) == a && t.substr(a.size()) == b) return s.id;
  }
}

int32_t BpeModel::add_symbol(std::string_view text, uint32_t h) {
  if ((hashes_.size() + 1) * 2 > index_.size()) grow_symbol_index();
  const int32_t id = n_symbols();
  arena_.append(text);
  offsets_.push_back((uint32_t)arena_.size());
  hashes_.push_back(h);
  size_t i = h & index_mask_;
  while (index_[i].id >= 0) i = (i + 1) & index_mask_;
  index_[i] = IndexSlot{h, id};
  return id;
}

void BpeModel::grow_symbol_index() {
  index_.assign(index_.size() * 2, IndexSlot{0, -1});
  index_mask_ = index_.size() - 1;
  for (int32_t id = 0; id < (int32_t)hashes_.size(); ++id) {
    size_t i = hashes_[id] & index_mask_;
    while (index_[i].id >= 0) i = (i + 1) & index_mask_;
    index_[i] = IndexSlot{hashes_[id], id};
  }
}

void BpeModel::add_merge(int32_t left, int32_t right, int32_t result, int32_t rank) {
  if ((n_merges_ + 1) * 4 > merge_slots_.size() * 3) grow_merge_table();  // load <= 3/4
  const uint64_t key = pair_key(left, right);
  size_t i = mix(key) & merge_mask_;
  while (merge_slots_[i].key != kEmptyKey) {
    if (merge_slots_[i].key == key) return;  // first rank wins
    i = (i + 1) & merge_mask_;
  }
  merge_slots_[i].key = key;
  merge_slots_[i].merge = Merge{rank, result};
  ++n_merges_;
}

void BpeModel::grow_merge_table() {
  std::vector<MergeSlot> old = std::move(merge_slots_);
  merge_slots_.assign(old.size() * 2, MergeSlot{});
  merge_mask_ = merge_slots_.size() - 1;
  for (const MergeSlot& s : old) {
    if (s.key == kEmptyKey) continue;
    size_t i = mix(s.key) & merge_mask_;
    while (merge_slots_[i].key != kEmptyKey) i = (i + 1) & merge_mask_;
    merge_slots_[i] = s;
  }
}

void BpeModel::merge_word(std::vector<int32_t>& syms) const {
  if (syms.size() < 2) return;
  if (syms.size() <= kShortWordMax) {
    merge_word_short(syms);
  } else {
    merge_word_long(syms);
  }
}

void BpeModel::merge_word_short(std::vector<int32_t>& syms) const {
  size_t n = syms.size();
  if (n < 2) return;
  if (n > kShortWordMax) {
    merge_word_long(syms);
    return;
  }
  // rank[i] / result[i] describe the pair (sym[i], sym[i+1]); INT_MAX = no rule. Fixed-size
  // arrays on the stack: this runs once per distinct word, and allocation showed up in profiles.
  std::array<int32_t, kShortWordMax> sym, rank, result;
  std::copy(syms.begin(), syms.end(), sym.begin());
  auto rate = [&](size_t i) {
    const Merge* m = find_merge(sym[i], sym[i + 1]);
    rank[i] = m ? m->rank : INT_MAX;
    result[i] = m ? m->result : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) rate(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (rank[i] < rank[best]) best = i;  // strict: the leftmost of equal ranks wins
    }
    if (rank[best] == INT_MAX) break;
    sym[best] = result[best];
    // Remove symbol best+1 and pair best+1; pair best now spans the new right neighbour.
    for (size_t i = best + 1; i + 1 < n; ++i) sym[i] = sym[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) {
      rank[i] = rank[i + 1];
      result[i] = result[i + 1];
    }
    --n;
    if (best + 1 < n) rate(best);
    if (best > 0) rate(best - 1);
  }
  syms.assign(sym.begin(), sym.begin() + (std::ptrdiff_t)n);
}

void BpeModel::merge_word_long(std::vector<int32_t>& syms) const {
  const int32_t n = (int32_t)syms.size();
  if (n < 2) return;
  std::vector<int32_t> prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank, left, right, left_sym, right_sym, result;
  };
  // Lowest rank first; among equal ranks the leftmost (positions keep their order).
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> heap(later);
  auto offer = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    if (const Merge* m = find_merge(syms[l], syms[r])) heap.push({m->rank, l, r, syms[l], syms[r], m->result});
  };
  for (int32_t i = 0; i + 1 < n; ++i) offer(i, i + 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    // Stale: one side was merged away or changed since the candidate was queued.
    if (syms[c.left] != c.left_sym || syms[c.right] != c.right_sym || next[c.left] != c.right) continue;
    syms[c.left] = c.result;
    syms[c.right] = -1;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    offer(prev[c.left], c.left);
    offer(c.left, next[c.left]);
  }
  size_t out = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) syms[out++] = syms[i];
  syms.resize(out);
}

}  // namespace rl
