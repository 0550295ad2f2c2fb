#include "generate/token_constraint.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "common/error.h"
#include "common/format.h"

namespace rl {

namespace {

constexpr int kKeyDepth = 2;               // top positions a cached walk depends on
constexpr size_t kMaxStacks = 4096;       // a state with more is refused (a pathological grammar)
constexpr size_t kMaxCacheEntries = 1024;  // 19 KB each at 151,936 tokens
constexpr uint32_t kNoLimit = std::numeric_limits<uint32_t>::max();
constexpr std::string_view kReasoningEnd = "</think>";

// One entry of a stack: a position in a rule sequence, and the entry below it.
struct Cell {
  uint32_t pos;
  const Cell* parent;
};
const Cell kAccept{0, nullptr};  // below every stack: popping to it completes the document
const Cell kEscape{0, nullptr};  // below a cached walk's top positions: the walk left them
bool is_sentinel(const Cell* c) { return c == &kAccept || c == &kEscape; }

// The cells of walks, released in stack order (a subtree's cells die when its walk returns).
class Arena {
 public:
  const Cell* make(uint32_t pos, const Cell* parent) {
    if (used_ == chunks_.size() * kChunk) chunks_.push_back(std::make_unique<Cell[]>(kChunk));
    Cell* c = &chunks_[used_ / kChunk][used_ % kChunk];
    ++used_;
    *c = {pos, parent};
    return c;
  }
  size_t mark() const { return used_; }
  void rewind(size_t mark) { used_ = mark; }

 private:
  static constexpr size_t kChunk = 1 << 14;
  std::vector<std::unique_ptr<Cell[]>> chunks_;
  size_t used_ = 0;
};

bool same_stack(const Cell* a, const Cell* b) {
  while (a != b) {
    if (is_sentinel(a) || is_sentinel(b) || a->pos != b->pos) return false;
    a = a->parent;
    b = b->parent;
  }
  return true;
}

void push_unique(std::vector<const Cell*>& out, const Cell* c) {
  for (const Cell* o : out)
    if (same_stack(o, c)) return;
  if (out.size() >= kMaxStacks) fail("output constraint: the grammar is too ambiguous (over {} parses)", kMaxStacks);
  out.push_back(c);
}

}  // namespace

struct TokenConstraint::Impl {
  using Stack = std::vector<uint32_t>;  // positions, bottom first; empty: the document is complete
  // A trie edge on which a cached walk left its top positions.
  struct Escape {
    uint8_t byte;
    uint32_t child;  // the node after the byte
    bool consumed;   // the top positions consumed the byte (else the rest of the stack must)
  };
  struct CacheEntry {
    std::vector<uint64_t> accepted;  // tokens whose bytes stay within the top positions
    std::vector<Escape> escapes;     // where the walk popped below them
    uint32_t max_top_distance = 0;   // over accepted tokens: bytes to finish the top positions
  };
  // Where a walk puts what it finds.
  struct Sink {
    std::vector<uint64_t>* tokens;
    std::vector<Escape>* escapes;    // null: a real stack, nothing to escape from
    uint32_t limit;                  // allow a token only when the document can be finished in this many bytes
    uint32_t max_distance = 0;
    // The walk's first state and the bytes that lead from it back to itself (inside a string:
    // nearly all): below such a byte the walk goes on with the same stacks, simulating nothing.
    const std::vector<const Cell*>* root = nullptr;
    ByteSet loop;
    uint32_t root_distance = 0;
  };

  bool same_set(const std::vector<const Cell*>& a, const std::vector<const Cell*>& b) const {
    if (a.size() != b.size()) return false;
    for (const Cell* x : a)
      if (std::none_of(b.begin(), b.end(), [&](const Cell* y) { return same_stack(x, y); })) return false;
    return true;
  }

  // Walks the whole trie from `stacks`, with the loop bytes of that state.
  void walk_from(const std::vector<const Cell*>& stacks, Sink& sink) {
    sink.root = &stacks;
    sink.root_distance = min_distance(stacks);
    std::vector<const Cell*> next;
    for (int b = 0; b < 256; ++b) {
      const size_t mark = arena.mark();
      next.clear();
      int escaped = 0;
      for (const Cell* c : stacks) consume(c, (uint8_t)b, next, escaped);
      if (!escaped && same_set(next, stacks)) sink.loop.add((uint8_t)b);
      arena.rewind(mark);
    }
    walk(TokenTrie::kRoot, stacks, 0, sink, true);
  }

  void allow_tokens(const TokenTrie::Node& node, uint32_t distance, Sink& sink) const {
    if (distance > sink.limit) return;
    sink.max_distance = std::max(sink.max_distance, distance);
    const int32_t* toks = trie.tokens(node);
    for (uint32_t t = 0; t < node.token_count; ++t) (*sink.tokens)[(size_t)toks[t] >> 6] |= uint64_t(1) << (toks[t] & 63);
  }

  const Grammar& g;
  const TokenTrie& trie;
  const bool after_reasoning;
  std::vector<Stack> state;
  Arena arena;
  std::vector<std::vector<const Cell*>> levels;  // per trie depth: the stacks of a walk
  std::unordered_map<std::string, CacheEntry> cache;
  std::vector<int32_t> close_candidates;  // tokens with a '>': one of them may finish "</think>"
  std::string reasoning_tail;
  size_t walks = 0, hits = 0;

  Impl(const Grammar& g, const TokenTrie& trie, bool after_reasoning)
      : g(g), trie(trie), after_reasoning(after_reasoning) {
    state = start_state();
    levels.resize(trie.max_token_bytes() + 1);  // sized once: walks hold references into it
    if (after_reasoning)
      for (int32_t t = 0; t < trie.n_vocab(); ++t)
        if (trie.bytes(t).find('>') != std::string::npos) close_candidates.push_back(t);
  }

  // Drops finished sequences from the top, so equal states have equal stacks.
  const Cell* pop_finished(const Cell* c) const {
    while (!is_sentinel(c) && g.at(c->pos).kind == Grammar::Kind::End) c = c->parent;
    return c;
  }

  // Consumes `byte` on stack `c`, expanding rules on the way only into the alternatives that can
  // start with it (or be empty). Pushes the stacks after it. A stack that pops to kEscape (a
  // cached walk's bottom) sets kEscapedBefore (the byte is for the rest of the stack) or
  // kEscapedAfter (the byte was consumed, the rest of the stack continues) in `escaped`.
  static constexpr int kEscapedBefore = 1, kEscapedAfter = 2;
  void consume(const Cell* c, uint8_t byte, std::vector<const Cell*>& out, int& escaped, int depth = 0) {
    if (depth > 10000) fail("output constraint: the grammar nests without consuming input");
    for (;;) {
      if (c == &kEscape) escaped |= kEscapedBefore;
      if (is_sentinel(c)) return;  // complete (nothing may follow) or below a cached walk's view
      const Grammar::Element& e = g.at(c->pos);
      if (e.kind == Grammar::Kind::End) {
        c = c->parent;
        continue;
      }
      if (e.kind == Grammar::Kind::Bytes) {
        if (!g.byte_set(e.arg).has(byte)) return;
        const Cell* next = pop_finished(arena.make(c->pos + 1, c->parent));
        if (next == &kEscape) escaped |= kEscapedAfter;
        else push_unique(out, next);
        return;
      }
      if (!g.first_bytes(c->pos).has(byte) && g.min_suffix(c->pos) != 0) return;
      // A rule: continue after it (directly with the parent when it ends the sequence).
      const Cell* cont = g.at(c->pos + 1).kind == Grammar::Kind::End ? c->parent : arena.make(c->pos + 1, c->parent);
      for (uint32_t alt : g.alternatives(e.arg))
        if (g.first_bytes(alt).has(byte) || g.min_suffix(alt) == 0)
          consume(arena.make(alt, cont), byte, out, escaped, depth + 1);
      return;
    }
  }

  // Fewest bytes to a complete document: each position's shortest rest of its sequence, summed
  // down a stack of cells, or over positions [from, to) of a stack.
  uint32_t distance(const Cell* c) const {
    uint32_t d = 0;
    for (; !is_sentinel(c); c = c->parent) d += g.min_suffix(c->pos);
    return d;
  }
  uint32_t distance(const Stack& s, size_t from, size_t to) const {
    uint32_t d = 0;
    for (size_t i = from; i < to; ++i) d += g.min_suffix(s[i]);
    return d;
  }
  uint32_t distance(const Stack& s) const { return distance(s, 0, s.size()); }
  // The stack of the state nearest to a complete document (null for no stacks).
  const Stack* nearest_stack() const {
    const Stack* best = nullptr;
    uint32_t best_d = kNoLimit;
    for (const Stack& s : state)
      if (const uint32_t d = distance(s); d < best_d) best_d = d, best = &s;
    return best;
  }
  uint32_t state_distance() const {
    uint32_t d = kNoLimit;
    for (const Stack& s : state) d = std::min(d, distance(s));
    return d;
  }
  uint32_t min_distance(const std::vector<const Cell*>& stacks) const {
    uint32_t d = kNoLimit;
    for (const Cell* c : stacks) d = std::min(d, distance(c));
    return d;
  }

  // The cells of stack[from, to) on top of `bottom`; returns the top.
  const Cell* materialize(const Stack& s, size_t from, size_t to, const Cell* bottom) {
    const Cell* c = bottom;
    for (size_t i = from; i < to; ++i) c = arena.make(s[i], c);
    return c;
  }
  static Stack to_stack(const Cell* c) {
    Stack s;
    for (; !is_sentinel(c); c = c->parent) s.push_back(c->pos);
    std::reverse(s.begin(), s.end());
    return s;
  }

  std::vector<Stack> start_state() const { return {Stack{g.entry(after_reasoning)}}; }

  // Every token below trie node `node` that `stacks` accept (after the node's bytes).
  // at_root: `stacks` is the walk's first state (sink.root).
  void walk(uint32_t node, const std::vector<const Cell*>& stacks, size_t depth, Sink& sink, bool at_root = false) {
    const TokenTrie::Node& n = trie.node(node);
    const TokenTrie::Edge* edges = trie.edges(n);
    for (uint32_t i = 0; i < n.edge_count; ++i) {
      if (at_root && sink.loop.has(edges[i].byte)) {
        const TokenTrie::Node& child = trie.node(edges[i].child);
        if (child.token_count) allow_tokens(child, sink.root_distance, sink);
        if (child.edge_count) walk(edges[i].child, stacks, depth + 1, sink, true);
        continue;
      }
      const size_t mark = arena.mark();
      std::vector<const Cell*>& next = levels[depth];
      next.clear();
      int escaped = 0;
      for (const Cell* c : stacks) consume(c, edges[i].byte, next, escaped);
      if (escaped && sink.escapes) {
        if (escaped & kEscapedBefore) sink.escapes->push_back({edges[i].byte, edges[i].child, false});
        if (escaped & kEscapedAfter) sink.escapes->push_back({edges[i].byte, edges[i].child, true});
      }
      if (!next.empty()) {
        const TokenTrie::Node& child = trie.node(edges[i].child);
        if (child.token_count) allow_tokens(child, min_distance(next), sink);
        // Back in the first state (after a multi-byte character of a string, say)?
        const bool back = sink.root && !escaped && same_set(next, *sink.root);
        if (child.edge_count) walk(edges[i].child, back ? *sink.root : next, depth + 1, sink, back);
      }
      arena.rewind(mark);
    }
  }

  const CacheEntry& cached_walk(const Stack& s) {
    const size_t k = std::min<size_t>(kKeyDepth, s.size());
    const bool truncated = s.size() > (size_t)kKeyDepth;
    std::string key(1, truncated ? 'T' : 'W');
    key.append((const char*)(s.data() + s.size() - k), k * sizeof(uint32_t));
    if (auto it = cache.find(key); it != cache.end()) {
      ++hits;
      return it->second;
    }
    ++walks;
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    CacheEntry& e = cache[key];
    e.accepted.assign(trie.trie_tokens().size(), 0);
    arena.rewind(0);
    std::vector<const Cell*> tops{materialize(s, s.size() - k, s.size(), truncated ? &kEscape : &kAccept)};
    Sink sink{&e.accepted, &e.escapes, kNoLimit};
    walk_from(tops, sink);
    e.max_top_distance = sink.max_distance;
    return e;
  }

  void mask(int budget, TokenMask& mask) {
    std::vector<uint64_t>& words = mask.words();
    const uint32_t to_complete = state_distance();
    const bool complete = to_complete == 0;
    if (complete)
      for (int32_t t : trie.end_of_generation()) mask.allow(t);
    // The last step of the budget can only end a complete document.
    if (complete && budget == 1) return;
    // Room for the rest of the document and an end-of-generation token; none when it cannot fit.
    const uint32_t limit =
        budget >= 2 && to_complete <= (uint32_t)budget - 1 ? (uint32_t)budget - 2 : kNoLimit;
    for (const Stack& s : state) {
      if (s.empty()) continue;
      const CacheEntry& e = cached_walk(s);
      const size_t below = s.size() > (size_t)kKeyDepth ? s.size() - kKeyDepth : 0;
      const uint32_t below_distance = distance(s, 0, below);
      arena.rewind(0);
      if (limit != kNoLimit && below_distance + e.max_top_distance > limit) {
        // Near the end of the budget: walk this stack whole, checking each token's distance.
        std::vector<const Cell*> tops{materialize(s, 0, s.size(), &kAccept)};
        Sink sink{&words, nullptr, limit};
        walk_from(tops, sink);
        continue;
      }
      for (size_t i = 0; i < words.size(); ++i) words[i] |= e.accepted[i];
      if (e.escapes.empty()) continue;
      // The tokens that leave the top positions continue on the real rest of the stack.
      const Cell* rest = pop_finished(materialize(s, 0, below, &kAccept));
      Sink sink{&words, nullptr, limit};
      std::vector<const Cell*> after;
      for (const Escape& esc : e.escapes) {
        const size_t mark = arena.mark();
        after.clear();
        int unused = 0;
        if (esc.consumed) after.push_back(rest);
        else consume(rest, esc.byte, after, unused);
        const TokenTrie::Node& n = trie.node(esc.child);
        if (!after.empty() && n.token_count && min_distance(after) <= limit)
          for (uint32_t t = 0; t < n.token_count; ++t) mask.allow(trie.tokens(n)[t]);
        if (!after.empty() && n.edge_count) walk(esc.child, after, 0, sink);
        arena.rewind(mark);
      }
    }
    if (mask.empty()) fail("output constraint: no token can continue the document");
  }

  void reasoning_mask(int budget, TokenMask& mask) {
    // Bytes to a complete document if the reasoning closed now: the rest of "</think>", the
    // shortest document. When a free token (which may undo a partial "</think>") could leave too
    // little budget, the reasoning is closed: only tokens that continue "</think>" are allowed.
    const size_t matched = marker_prefix_tail(reasoning_tail, kReasoningEnd);
    const uint32_t doc = start_distance();
    const int64_t worst_after_free = (int64_t)kReasoningEnd.size() + doc;
    if (budget >= 2 && (int64_t)(kReasoningEnd.size() - matched) + doc <= budget - 1 &&
        worst_after_free > budget - 2) {
      const std::string_view rest = kReasoningEnd.substr(matched);
      for (size_t len = 1; len <= rest.size(); ++len) force_token(rest.substr(0, len), mask);
      if (!mask.empty()) return;  // else the vocabulary cannot spell it: leave the reasoning free
    }
    mask.allow_all_of(trie.trie_tokens());
    for (int32_t t : close_candidates) {
      const std::string text = reasoning_tail + trie.bytes(t);
      const size_t p = text.find(kReasoningEnd);
      if (p == std::string::npos) continue;
      std::vector<Stack> s = start_state();
      if (!advance_state(s, std::string_view(text).substr(p + kReasoningEnd.size())))
        mask.words()[(size_t)t >> 6] &= ~(uint64_t(1) << (t & 63));
    }
  }

  // Allows the tokens whose bytes are exactly `bytes`.
  void force_token(std::string_view bytes, TokenMask& mask) const {
    uint32_t node = TokenTrie::kRoot;
    for (char b : bytes) {
      const TokenTrie::Node& n = trie.node(node);
      const TokenTrie::Edge* e = trie.edges(n);
      const TokenTrie::Edge* end = e + n.edge_count;
      while (e != end && e->byte != (uint8_t)b) ++e;
      if (e == end) return;
      node = e->child;
    }
    const TokenTrie::Node& n = trie.node(node);
    for (uint32_t t = 0; t < n.token_count; ++t) mask.allow(trie.tokens(n)[t]);
  }

  uint32_t start_distance() const { return distance(start_state().front()); }

  bool advance_state(std::vector<Stack>& s, std::string_view bytes) {
    arena.rewind(0);
    std::vector<const Cell*> cur, next;
    for (const Stack& st : s) push_unique(cur, materialize(st, 0, st.size(), &kAccept));
    for (char b : bytes) {
      next.clear();
      int escaped = 0;
      for (const Cell* c : cur) consume(c, (uint8_t)b, next, escaped);
      if (next.empty()) return false;
      cur.swap(next);
    }
    s.clear();
    for (const Cell* c : cur) s.push_back(to_stack(c));
    return true;
  }

  void emit_suffix(uint32_t pos, std::string& out) const {
    for (; g.at(pos).kind != Grammar::Kind::End; ++pos) {
      const Grammar::Element& e = g.at(pos);
      if (e.kind == Grammar::Kind::Bytes) {
        const ByteSet& set = g.byte_set(e.arg);
        int pick = -1;  // the first printable byte of the set, else its first byte
        for (int b = 0x20; b < 256 && pick < 0; ++b)
          if (set.has((uint8_t)b)) pick = b;
        for (int b = 0; b < 0x20 && pick < 0; ++b)
          if (set.has((uint8_t)b)) pick = b;
        out += (char)pick;
        continue;
      }
      const auto& alts = g.alternatives(e.arg);
      emit_suffix(*std::min_element(alts.begin(), alts.end(),
                                    [&](uint32_t a, uint32_t b) { return g.min_suffix(a) < g.min_suffix(b); }),
                  out);
    }
  }
};

TokenConstraint::TokenConstraint(const Grammar& grammar, const TokenTrie& trie, bool after_reasoning)
    : impl_(std::make_unique<Impl>(grammar, trie, after_reasoning)), in_reasoning_(after_reasoning) {}

TokenConstraint::~TokenConstraint() = default;

void TokenConstraint::allowed_tokens(int budget, TokenMask& mask) {
  mask.reset(impl_->trie.n_vocab());
  if (in_reasoning_) impl_->reasoning_mask(budget, mask);
  else impl_->mask(budget, mask);
  walks_ = impl_->walks;
  hits_ = impl_->hits;
}

void TokenConstraint::accept(int32_t token) {
  const TokenTrie& trie = impl_->trie;
  if (std::find(trie.end_of_generation().begin(), trie.end_of_generation().end(), token) !=
      trie.end_of_generation().end())
    return;
  if (token < 0 || token >= trie.n_vocab() || trie.bytes(token).empty())
    fail("output constraint: token {} is not text the document can hold", token);
  const std::string& bytes = trie.bytes(token);
  if (in_reasoning_) {
    std::string& tail = impl_->reasoning_tail;
    tail += bytes;
    if (size_t p = tail.find(kReasoningEnd); p != std::string::npos) {
      in_reasoning_ = false;
      const std::string rest = tail.substr(p + kReasoningEnd.size());
      if (!advance(rest)) fail("output constraint: the text after </think> breaks the document");
    } else if (tail.size() > kReasoningEnd.size()) {
      tail.erase(0, tail.size() - (kReasoningEnd.size() - 1));
    }
    return;
  }
  if (!advance(bytes)) fail("output constraint: token {} breaks the document", token);
}

bool TokenConstraint::complete() const { return !in_reasoning_ && distance() == 0; }

bool TokenConstraint::advance(std::string_view bytes) {
  std::vector<Impl::Stack> s = impl_->state;
  if (!impl_->advance_state(s, bytes)) return false;
  impl_->state = std::move(s);
  return true;
}

ByteSet TokenConstraint::next_bytes() {
  ByteSet out;
  for (int b = 0; b < 256; ++b) {
    std::vector<Impl::Stack> s = impl_->state;
    const char byte = (char)b;
    if (impl_->advance_state(s, std::string_view(&byte, 1))) out.add((uint8_t)b);
  }
  return out;
}

bool TokenConstraint::accepts(std::string_view bytes) {
  std::vector<Impl::Stack> s = impl_->state;
  return impl_->advance_state(s, bytes);
}

uint32_t TokenConstraint::distance() const { return impl_->state_distance(); }

std::string TokenConstraint::shortest_completion() const {
  const Impl::Stack* best = impl_->nearest_stack();
  std::string out;
  if (best)
    for (size_t i = best->size(); i-- > 0;) impl_->emit_suffix((*best)[i], out);
  return out;
}

}  // namespace rl
