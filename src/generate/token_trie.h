// The vocabulary as a trie of token bytes, for walking a byte automaton against every token at
// once: tokens that share a prefix share the work of matching it, and a prefix the automaton
// rejects removes every token below it. Control tokens (<|im_start|>, end-of-generation ids) are
// not in the trie: a constrained output never contains them, except an end-of-generation id
// where the document is complete.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace rl {

class Tokenizer;

class TokenTrie {
 public:
  struct Edge {
    uint8_t byte;
    uint32_t child;
  };
  struct Node {
    uint32_t edge_begin = 0, edge_count = 0;    // into edges()
    uint32_t token_begin = 0, token_count = 0;  // into tokens(): the tokens whose bytes end here
  };

  explicit TokenTrie(const Tokenizer& tokenizer);

  static constexpr uint32_t kRoot = 0;
  const Node& node(uint32_t id) const { return nodes_[id]; }
  const Edge* edges(const Node& n) const { return edges_.data() + n.edge_begin; }
  const int32_t* tokens(const Node& n) const { return tokens_.data() + n.token_begin; }

  int n_vocab() const { return n_vocab_; }
  size_t max_token_bytes() const { return max_token_bytes_; }
  const std::string& bytes(int32_t token) const { return pieces_[token]; }
  const std::vector<int32_t>& end_of_generation() const { return eog_; }
  // Every token in the trie (what an unconstrained reply may use), as a bit set of n_vocab bits.
  const std::vector<uint64_t>& trie_tokens() const { return trie_tokens_; }

 private:
  int n_vocab_ = 0;
  size_t max_token_bytes_ = 0;
  std::vector<std::string> pieces_;  // [n_vocab]; empty for tokens outside the trie
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> eog_;
  std::vector<uint64_t> trie_tokens_;
};

}  // namespace rl
