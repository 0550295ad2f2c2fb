// A context-free grammar over bytes, the form every output constraint compiles to (JSON Schema,
// JSON mode, tool calls). Rules are lists of alternatives; an alternative is a sequence of
// elements, each a set of bytes or a reference to a rule. TokenConstraint runs it as a pushdown
// automaton (a set of stacks of positions), so a rule may refer to itself (nested values), but
// never in its leftmost position: the builders here write no left recursion.
//
// finish() computes, for every position, the fewest bytes that complete its sequence, drops the
// alternatives that can never complete (so every prefix the automaton accepts can be finished)
// and fails when the start rule itself can never complete (an empty language).
#pragma once
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace rl {

// A set of byte values.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  ByteSet& add(uint8_t b) { bits[b >> 6] |= uint64_t(1) << (b & 63); return *this; }
  ByteSet& add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add((uint8_t)b);
    return *this;
  }
  ByteSet& add_all(const ByteSet& o) {
    for (int i = 0; i < 4; ++i) bits[i] |= o.bits[i];
    return *this;
  }
  ByteSet complement() const {
    ByteSet c;
    for (int i = 0; i < 4; ++i) c.bits[i] = ~bits[i];
    return c;
  }
  bool empty() const { return !(bits[0] | bits[1] | bits[2] | bits[3]); }
  static ByteSet of(std::string_view chars) {
    ByteSet s;
    for (char c : chars) s.add((uint8_t)c);
    return s;
  }
};

class Grammar {
 public:
  enum class Kind : uint8_t { Bytes, Rule, End };
  struct Element {
    Kind kind;
    uint32_t arg;  // Bytes: index into byte_sets(); Rule: rule id; End: unused
  };
  static constexpr uint32_t kNever = std::numeric_limits<uint32_t>::max();  // cannot complete

  // The position the automaton starts at (a reference to the start rule): the value itself, or
  // (after a reasoning block) up to two newlines and then the value, since the Thinking template
  // writes "</think>\n\n".
  uint32_t entry(bool after_reasoning) const { return after_reasoning ? entry_after_reasoning_ : entry_; }

  const Element& at(uint32_t pos) const { return elements_[pos]; }
  const ByteSet& byte_set(uint32_t index) const { return byte_sets_[index]; }
  // Start positions of the rule's alternatives (into at()).
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return rules_[rule]; }
  // Fewest bytes from `pos` to the end of its sequence (0: the rest may be empty).
  uint32_t min_suffix(uint32_t pos) const { return min_suffix_[pos]; }
  // The bytes the rest of the sequence from `pos` may start with (before its end).
  const ByteSet& first_bytes(uint32_t pos) const { return first_[pos]; }
  size_t rule_count() const { return rules_.size(); }
  size_t element_count() const { return elements_.size(); }

 private:
  friend class GrammarBuilder;
  std::vector<Element> elements_;              // all sequences, each closed by an End element
  std::vector<ByteSet> byte_sets_;
  std::vector<std::vector<uint32_t>> rules_;   // rule id -> alternative start positions
  std::vector<uint32_t> min_suffix_;           // per element position
  std::vector<ByteSet> first_;                 // per element position
  uint32_t entry_ = 0, entry_after_reasoning_ = 0;
};

// Builds a Grammar. A sequence is a list of symbols; literal() and bytes() make symbols, rule()
// makes a reference to a rule declared with new_rule() (so rules can refer to each other before
// they are defined).
class GrammarBuilder {
 public:
  struct Symbol {
    bool is_rule;
    uint32_t value;  // rule id, or index into the builder's byte sets
  };
  using Sequence = std::vector<Symbol>;

  uint32_t new_rule();
  void add_alternative(uint32_t rule, Sequence seq);
  // A rule with these alternatives.
  uint32_t rule_of(std::vector<Sequence> alternatives);

  Symbol bytes(const ByteSet& set);
  static Symbol rule(uint32_t id) { return {true, id}; }
  Sequence literal(std::string_view text);

  // `item` repeated between min_count and max_count times (max_count < 0: no upper bound), with
  // `separator` between two items. The rules grow with max_count: callers bound it.
  uint32_t repeat(const Sequence& item, const Sequence& separator, int64_t min_count, int64_t max_count);

  // Fails with rl::Error("... admits no value") when `start` can never complete.
  Grammar finish(uint32_t start, std::string_view what);

 private:
  std::vector<std::vector<Sequence>> rules_;
  std::vector<ByteSet> byte_sets_;
};

// Appends b to a (sequence concatenation).
inline GrammarBuilder::Sequence concat(GrammarBuilder::Sequence a, const GrammarBuilder::Sequence& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace rl
