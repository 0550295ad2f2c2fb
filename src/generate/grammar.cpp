#include "generate/grammar.h"

#include <algorithm>

#include "common/error.h"

namespace rl {

namespace {
uint32_t add_saturating(uint32_t a, uint32_t b) {
  return (a == Grammar::kNever || b == Grammar::kNever || a + b < a) ? Grammar::kNever : a + b;
}
}  // namespace

uint32_t GrammarBuilder::new_rule() {
  rules_.emplace_back();
  return (uint32_t)rules_.size() - 1;
}

void GrammarBuilder::add_alternative(uint32_t rule, Sequence seq) { rules_[rule].push_back(std::move(seq)); }

uint32_t GrammarBuilder::rule_of(std::vector<Sequence> alternatives) {
  const uint32_t id = new_rule();
  rules_[id] = std::move(alternatives);
  return id;
}

GrammarBuilder::Symbol GrammarBuilder::bytes(const ByteSet& set) {
  // Grammars reuse a few sets (digits, string characters) many times: store each once.
  for (size_t i = 0; i < byte_sets_.size(); ++i)
    if (byte_sets_[i].bits == set.bits) return {false, (uint32_t)i};
  byte_sets_.push_back(set);
  return {false, (uint32_t)byte_sets_.size() - 1};
}

GrammarBuilder::Sequence GrammarBuilder::literal(std::string_view text) {
  Sequence seq;
  for (char c : text) seq.push_back(bytes(ByteSet().add((uint8_t)c)));
  return seq;
}

uint32_t GrammarBuilder::repeat(const Sequence& item, const Sequence& separator, int64_t min_count,
                                int64_t max_count) {
  const Sequence next = concat(separator, item);
  // tail(k): at most k more items, each after a separator (k < 0: any number).
  auto tail = [&](int64_t k) -> Sequence {
    if (k == 0) return {};
    if (k < 0) {
      const uint32_t t = new_rule();
      add_alternative(t, concat(next, {rule(t)}));
      add_alternative(t, {});
      return {rule(t)};
    }
    uint32_t t = rule_of({{}});  // zero more
    for (int64_t i = 1; i <= k; ++i) t = rule_of({concat(next, {rule(t)}), {}});
    return {rule(t)};
  };
  if (max_count >= 0 && max_count < min_count) return rule_of({});  // no count fits: nothing matches
  if (max_count == 0) return rule_of({{}});
  // Without a separator, "any number" is the tail rule itself: one state for every count, so
  // the automaton's states (and its cached walks) do not depend on how many items came before.
  if (min_count == 0 && max_count < 0 && separator.empty()) {
    const uint32_t t = new_rule();
    add_alternative(t, concat(item, {rule(t)}));
    add_alternative(t, {});
    return t;
  }
  if (min_count == 0) return rule_of({{}, concat(item, tail(max_count < 0 ? -1 : max_count - 1))});
  Sequence seq = item;
  for (int64_t i = 1; i < min_count; ++i) seq = concat(seq, next);
  return rule_of({concat(seq, tail(max_count < 0 ? -1 : max_count - min_count))});
}

Grammar GrammarBuilder::finish(uint32_t start, std::string_view what) {
  // After a reasoning block: up to two newlines, then the value.
  const Sequence nl = literal("\n");
  const uint32_t after = rule_of({{rule(start)}, concat(nl, {rule(start)}), concat(concat(nl, nl), {rule(start)})});

  // Fewest bytes of each rule, by iteration to a fixed point (rules refer to each other).
  const size_t n = rules_.size();
  std::vector<uint32_t> min_len(n, Grammar::kNever);
  auto cost = [&](const Sequence& seq) {
    uint32_t c = 0;
    for (const Symbol& s : seq) c = add_saturating(c, s.is_rule ? min_len[s.value] : 1);
    return c;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r)
      for (const Sequence& alt : rules_[r])
        if (uint32_t c = cost(alt); c < min_len[r]) {
          min_len[r] = c;
          changed = true;
        }
  }
  if (min_len[start] == Grammar::kNever) fail("{} admits no value (its language is empty)", what);

  // A rule that can reach itself without consuming a byte would loop the automaton forever.
  // Depth-first over "may start with" edges (a rule leftmost, or after rules that may be empty),
  // with an explicit stack: chains of optional members are long.
  std::vector<int> visiting(n, 0);  // 0 new, 1 on the path, 2 done
  auto nullable = [&](const Symbol& s) { return s.is_rule && min_len[s.value] == 0; };
  auto leftmost = [&](uint32_t r) {
    std::vector<uint32_t> out;
    for (const Sequence& alt : rules_[r]) {
      if (cost(alt) == Grammar::kNever) continue;
      for (const Symbol& s : alt) {
        if (s.is_rule) out.push_back(s.value);
        if (!nullable(s)) break;
      }
    }
    return out;
  };
  for (uint32_t root = 0; root < n; ++root) {
    if (visiting[root]) continue;
    std::vector<std::pair<uint32_t, std::vector<uint32_t>>> path;  // rule, its edges not yet followed
    visiting[root] = 1;
    path.emplace_back(root, leftmost(root));
    while (!path.empty()) {
      auto& [r, edges] = path.back();
      if (edges.empty()) {
        visiting[r] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t next = edges.back();
      edges.pop_back();
      if (visiting[next] == 1) fail("{} is too complex: a repetition of something that may be empty", what);
      if (visiting[next] == 0) {
        visiting[next] = 1;
        path.emplace_back(next, leftmost(next));
      }
    }
  }

  Grammar g;
  g.byte_sets_ = byte_sets_;
  g.rules_.resize(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Sequence& alt : rules_[r]) {
      if (cost(alt) == Grammar::kNever) continue;  // can never complete: never enter it
      g.rules_[r].push_back((uint32_t)g.elements_.size());
      for (const Symbol& s : alt)
        g.elements_.push_back({s.is_rule ? Grammar::Kind::Rule : Grammar::Kind::Bytes, s.value});
      g.elements_.push_back({Grammar::Kind::End, 0});
    }
  }
  // The entry positions: one-element sequences that refer to the start rules.
  for (uint32_t* entry : {&g.entry_, &g.entry_after_reasoning_}) {
    *entry = (uint32_t)g.elements_.size();
    g.elements_.push_back({Grammar::Kind::Rule, entry == &g.entry_ ? start : after});
    g.elements_.push_back({Grammar::Kind::End, 0});
  }
  g.min_suffix_.assign(g.elements_.size(), 0);
  for (size_t i = g.elements_.size(); i-- > 0;) {
    const Grammar::Element& e = g.elements_[i];
    if (e.kind == Grammar::Kind::End) continue;
    g.min_suffix_[i] = add_saturating(e.kind == Grammar::Kind::Bytes ? 1 : min_len[e.arg], g.min_suffix_[i + 1]);
  }
  // First bytes, by iteration to a fixed point: a rule's are those of its alternatives.
  std::vector<ByteSet> rule_first(n);
  g.first_.assign(g.elements_.size(), ByteSet());
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = g.elements_.size(); i-- > 0;) {
      const Grammar::Element& e = g.elements_[i];
      if (e.kind == Grammar::Kind::End) continue;
      ByteSet f = e.kind == Grammar::Kind::Bytes ? g.byte_sets_[e.arg] : rule_first[e.arg];
      if (e.kind == Grammar::Kind::Rule && min_len[e.arg] == 0) f.add_all(g.first_[i + 1]);
      g.first_[i] = f;
    }
    for (size_t r = 0; r < n; ++r) {
      ByteSet f;
      for (uint32_t alt : g.rules_[r]) f.add_all(g.first_[alt]);
      if (f.bits != rule_first[r].bits) {
        rule_first[r] = f;
        changed = true;
      }
    }
  }
  return g;
}

}  // namespace rl
