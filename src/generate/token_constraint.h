// Constrained decoding: runs a Grammar as a pushdown automaton over the bytes of the generated
// tokens and says, before each sampling step, which vocabulary tokens keep the output a prefix
// of some document of the grammar.
//
// The state is a set of stacks (the grammar is not deterministic: anyOf, optional members); a
// stack is a chain of positions in rule sequences. A rule on top is expanded when the next byte
// is known, into the alternatives that can start with it. A token is allowed when some stack
// survives all of its bytes. Walking the TokenTrie instead of the
// vocabulary shares the work of common prefixes and drops whole subtrees at the first rejected
// byte. What a walk finds depends only on the top few positions of a stack until the walk pops
// below them, so its result is cached under those positions (most steps of a long string reuse
// one entry); only the tokens that pop below (a string's closing quote and what follows) are
// walked again each step against the real rest of the stack.
//
// Budget: with `budget` tokens left, a token is allowed only when the document can still be
// completed after it with one token per byte and an end-of-generation token within the budget
// (every byte is a token of a byte-level vocabulary), so a generation that could finish in time
// always does. End of generation is allowed only where the document is complete.
//
// after_reasoning: the reply first holds a reasoning block that the constraint leaves free
// (only the end-of-generation ids are held back) until "</think>"; the document starts after it.
// When the budget left would no longer hold "</think>" and the shortest document, the reasoning
// is closed: only the tokens that continue "</think>" are allowed.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "generate/grammar.h"
#include "generate/sampler.h"
#include "generate/token_trie.h"

namespace rl {

// What a request asks the output to be; empty grammar: no constraint.
struct OutputConstraint {
  std::shared_ptr<const Grammar> grammar;
  bool after_reasoning = false;
  explicit operator bool() const { return grammar != nullptr; }
};

class TokenConstraint {
 public:
  TokenConstraint(const Grammar& grammar, const TokenTrie& trie, bool after_reasoning);
  ~TokenConstraint();

  // The tokens allowed next, with `budget` sampling steps left including this one.
  void allowed_tokens(int budget, TokenMask& mask);
  // Follows a generated token (an end-of-generation id: no change). Throws rl::Error when the
  // token breaks the document (it was not allowed).
  void accept(int32_t token);

  // Byte-level view, for tests and tools.
  bool in_reasoning() const { return in_reasoning_; }
  bool complete() const;                // the document may end here
  bool advance(std::string_view bytes);  // false, and no change, when a byte is rejected
  bool accepts(std::string_view bytes);  // whether advance(bytes) would succeed (no change)
  ByteSet next_bytes();                 // the bytes that may come next
  std::string shortest_completion() const;
  uint32_t distance() const;            // fewest bytes to a complete document

  // Statistics: walks of the trie (cache misses) and cache hits since construction.
  size_t trie_walks() const { return walks_; }
  size_t cache_hits() const { return hits_; }

 private:
  struct Impl;  // the automaton, the trie walks and their cache
  std::unique_ptr<Impl> impl_;
  bool in_reasoning_;
  size_t walks_ = 0, hits_ = 0;
};

}  // namespace rl
