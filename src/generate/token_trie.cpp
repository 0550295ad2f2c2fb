#include "generate/token_trie.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"

namespace rl {

TokenTrie::TokenTrie(const Tokenizer& tokenizer) : n_vocab_(tokenizer.n_vocab()) {
  pieces_.resize(n_vocab_);
  trie_tokens_.assign((n_vocab_ + 63) / 64, 0);
  std::vector<int32_t> order;
  for (int32_t id = 0; id < n_vocab_; ++id) {
    if (tokenizer.is_eog(id)) eog_.push_back(id);
    if (tokenizer.is_eog(id) || tokenizer.is_control(id)) continue;
    pieces_[id] = tokenizer.piece(id);
    if (pieces_[id].empty()) continue;
    order.push_back(id);
    max_token_bytes_ = std::max(max_token_bytes_, pieces_[id].size());
    trie_tokens_[id >> 6] |= uint64_t(1) << (id & 63);
  }
  // Sorted by bytes, the tokens below any prefix form one range: build the trie range by range.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return pieces_[a] < pieces_[b]; });
  auto build = [&](auto& self, size_t lo, size_t hi, size_t depth) -> uint32_t {
    const uint32_t id = (uint32_t)nodes_.size();
    nodes_.emplace_back();
    nodes_[id].token_begin = (uint32_t)tokens_.size();
    while (lo < hi && pieces_[order[lo]].size() == depth) tokens_.push_back(order[lo++]);
    nodes_[id].token_count = (uint32_t)tokens_.size() - nodes_[id].token_begin;
    std::vector<Edge> children;
    while (lo < hi) {
      const uint8_t b = (uint8_t)pieces_[order[lo]][depth];
      size_t end = lo;
      while (end < hi && (uint8_t)pieces_[order[end]][depth] == b) ++end;
      children.push_back({b, self(self, lo, end, depth + 1)});
      lo = end;
    }
    nodes_[id].edge_begin = (uint32_t)edges_.size();
    nodes_[id].edge_count = (uint32_t)children.size();
    edges_.insert(edges_.end(), children.begin(), children.end());
    return id;
  };
  build(build, 0, order.size(), 0);
}

}  // namespace rl
