// Grammar pieces for the inside of a JSON string: one character of any kind (as JSON writes it:
// plain UTF-8, a short escape, a \u escape), a set of characters, and the strings of a regular
// expression (JSON Schema `pattern`), always in the JSON-encoded form a document carries.
//
// Where Python's `re` (what jsonschema checks a pattern with) and these grammars could disagree,
// the grammars keep to a smaller set that both accept: \d, \w and \s stand for their ASCII
// members, negated sets for ASCII characters only, \u escapes never make surrogates, and a
// pattern without anchors is matched whole (a string the pattern matches whole also contains a
// match).
#pragma once
#include <bitset>
#include <string>
#include <string_view>
#include <vector>

#include "generate/grammar.h"

namespace rl {

// A set of characters: ASCII members, optionally every non-ASCII character, and single
// non-ASCII characters (as UTF-8).
struct CharClass {
  std::bitset<128> ascii;
  bool all_non_ascii = false;
  std::vector<std::string> non_ascii;

  static CharClass any_char();  // every character (what a free string holds)
};

// A rule matching one character of `chars`, JSON-encoded (`"` as \", control characters
// escaped). with_u_escapes: also \uXXXX forms of any non-surrogate character (free strings only:
// a \u escape can spell any character, so a restricted set must not allow them).
uint32_t json_char_rule(GrammarBuilder& b, const CharClass& chars, bool with_u_escapes);

// A rule matching one character of `chars` written as itself (raw UTF-8, no escapes): text
// outside JSON, such as a Qwen3-Coder string parameter.
uint32_t raw_char_rule(GrammarBuilder& b, const CharClass& chars);

// A rule matching the JSON-encoded body (between the quotes) of the strings `pattern` matches.
// Throws rl::Error naming the construct when the pattern uses one outside the supported set
// (back-references, lookaround, anchors inside the pattern).
uint32_t regex_rule(GrammarBuilder& b, std::string_view pattern);

// The JSON-encoded body of `text` (no quotes), as a grammar sequence.
GrammarBuilder::Sequence json_string_body(GrammarBuilder& b, std::string_view text);

}  // namespace rl
