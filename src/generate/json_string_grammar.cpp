#include "generate/json_string_grammar.h"

#include <cctype>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/utf8.h"

namespace rl {

using Sequence = GrammarBuilder::Sequence;

CharClass CharClass::any_char() {
  CharClass c;
  c.ascii.set();
  c.all_non_ascii = true;
  return c;
}

Sequence json_string_body(GrammarBuilder& b, std::string_view text) {
  const std::string quoted = nlohmann::json(std::string(text)).dump();
  return b.literal(std::string_view(quoted).substr(1, quoted.size() - 2));
}

namespace {

// The UTF-8 encodings of every code point from U+0080 on (no surrogates, no overlong forms).
void add_utf8_multibyte(GrammarBuilder& b, std::vector<Sequence>& alts) {
  ByteSet cont;
  cont.add_range(0x80, 0xBF);
  auto set = [&](uint8_t lo, uint8_t hi) { return b.bytes(ByteSet().add_range(lo, hi)); };
  const auto c = b.bytes(cont);
  alts.push_back({set(0xC2, 0xDF), c});
  alts.push_back({set(0xE0, 0xE0), set(0xA0, 0xBF), c});
  alts.push_back({set(0xE1, 0xEC), c, c});
  alts.push_back({set(0xED, 0xED), set(0x80, 0x9F), c});
  alts.push_back({set(0xEE, 0xEF), c, c});
  alts.push_back({set(0xF0, 0xF0), set(0x90, 0xBF), c, c});
  alts.push_back({set(0xF1, 0xF3), c, c, c});
  alts.push_back({set(0xF4, 0xF4), set(0x80, 0x8F), c, c});
}

}  // namespace

uint32_t json_char_rule(GrammarBuilder& b, const CharClass& chars, bool with_u_escapes) {
  std::vector<Sequence> alts;
  ByteSet plain;  // characters written as themselves
  for (int ch = 0; ch < 128; ++ch) {
    if (!chars.ascii[ch]) continue;
    if (ch >= 0x20 && ch != '"' && ch != '\\') plain.add((uint8_t)ch);
    else alts.push_back(json_string_body(b, std::string(1, (char)ch)));
  }
  if (!plain.empty()) alts.push_back({b.bytes(plain)});
  if (chars.all_non_ascii) add_utf8_multibyte(b, alts);
  for (const std::string& s : chars.non_ascii) alts.push_back(b.literal(s));
  if (with_u_escapes) {
    ByteSet hex = ByteSet::of("0123456789abcdefABCDEF");
    ByteSet hex_not_d = ByteSet::of("0123456789abcefABCEF");
    const auto h = b.bytes(hex);
    alts.push_back(concat(b.literal("\\u"), {b.bytes(hex_not_d), h, h, h}));
    alts.push_back(concat(b.literal("\\u"), {b.bytes(ByteSet::of("dD")), b.bytes(ByteSet::of("01234567")), h, h}));
    if (chars.ascii['/']) alts.push_back(b.literal("\\/"));
  }
  return b.rule_of(std::move(alts));
}

uint32_t raw_char_rule(GrammarBuilder& b, const CharClass& chars) {
  std::vector<Sequence> alts;
  ByteSet ascii;
  for (int ch = 0; ch < 128; ++ch)
    if (chars.ascii[ch]) ascii.add((uint8_t)ch);
  if (!ascii.empty()) alts.push_back({b.bytes(ascii)});
  if (chars.all_non_ascii) add_utf8_multibyte(b, alts);
  for (const std::string& s : chars.non_ascii) alts.push_back(b.literal(s));
  return b.rule_of(std::move(alts));
}

namespace {

// Recursive descent over a pattern, writing grammar rules as it goes.
class RegexCompiler {
 public:
  RegexCompiler(GrammarBuilder& b, std::string_view pattern) : b_(b), p_(pattern) {}

  uint32_t compile() {
    if (!p_.empty() && p_.front() == '^') p_.remove_prefix(1);
    if (!p_.empty() && p_.back() == '$' && (p_.size() < 2 || p_[p_.size() - 2] != '\\')) p_.remove_suffix(1);
    const uint32_t r = alternation();
    if (i_ != p_.size()) bad(fmt::format("an unmatched ')' at offset {}", i_));
    return r;
  }

 private:
  [[noreturn]] void bad(const std::string& what) const { fail("pattern: {} is not supported", what); }
  bool more() const { return i_ < p_.size(); }
  char peek() const { return p_[i_]; }

  uint32_t alternation() {
    constexpr int kMaxNesting = 64;  // bounds the recursion, as the request's JSON depth is bounded
    if (++nesting_ > kMaxNesting) bad(fmt::format("groups nested deeper than {}", kMaxNesting));
    std::vector<Sequence> alts{concatenation()};
    while (more() && peek() == '|') {
      ++i_;
      alts.push_back(concatenation());
    }
    --nesting_;
    return b_.rule_of(std::move(alts));
  }

  Sequence concatenation() {
    Sequence seq;
    while (more() && peek() != '|' && peek() != ')') seq = concat(seq, quantified(atom()));
    return seq;
  }

  Sequence quantified(Sequence atom) {
    if (!more()) return atom;
    int64_t lo = 0, hi = -1;
    const char c = peek();
    if (c == '*') {
      ++i_;
    } else if (c == '+') {
      ++i_, lo = 1;
    } else if (c == '?') {
      ++i_, hi = 1;
    } else if (c == '{' && i_ + 1 < p_.size() && std::isdigit((unsigned char)p_[i_ + 1])) {
      ++i_;
      lo = number();
      hi = lo;
      if (more() && peek() == ',') {
        ++i_;
        hi = more() && std::isdigit((unsigned char)peek()) ? number() : -1;
      }
      if (!more() || peek() != '}') bad("a malformed {m,n} repetition");
      ++i_;
      if (hi >= 0 && hi < lo) bad("a repetition {m,n} with n < m");
    } else {
      return atom;
    }
    if (more() && peek() == '?') ++i_;  // lazy: the same strings
    if (more() && (peek() == '+' || peek() == '*' || peek() == '{')) bad("a repetition of a repetition");
    // Counts are bounded so the rules stay small; fewer repetitions are still matches.
    constexpr int64_t kMaxCount = 256;
    if (lo > kMaxCount) bad(fmt::format("a repetition of more than {} times", kMaxCount));
    if (hi > kMaxCount) hi = kMaxCount;
    return {GrammarBuilder::rule(b_.repeat(atom, {}, lo, hi))};
  }

  int64_t number() {
    int64_t v = 0;
    while (more() && std::isdigit((unsigned char)peek()) && v < 1000000) v = v * 10 + (p_[i_++] - '0');
    return v;
  }

  Sequence atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (more() && peek() == '?') {
        if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') i_ += 2;
        else bad("a group of the form (?...) other than (?:...)");
      }
      const uint32_t r = alternation();
      if (!more() || peek() != ')') bad("an unclosed group");
      ++i_;
      return {GrammarBuilder::rule(r)};
    }
    if (c == '^' || c == '$') bad(fmt::format("the anchor '{}' inside the pattern", c));
    if (c == '*' || c == '+' || c == '?') bad(fmt::format("'{}' with nothing to repeat", c));
    if (c == '[') return {GrammarBuilder::rule(json_char_rule(b_, bracket_class(), false))};
    if (c == '.') {
      ++i_;
      CharClass any = CharClass::any_char();
      any.ascii.reset('\n');
      return {GrammarBuilder::rule(json_char_rule(b_, any, false))};
    }
    if (c == '\\') {
      CharClass cls;
      if (escape_class(cls)) return {GrammarBuilder::rule(json_char_rule(b_, cls, false))};
    }
    return json_string_body(b_, literal_char());
  }

  // One literal character at i_ (an escaped one, or a whole UTF-8 sequence).
  std::string literal_char() {
    if (p_[i_] == '\\') {
      if (i_ + 1 >= p_.size()) bad("a trailing backslash");
      const char e = p_[i_ + 1];
      i_ += 2;
      switch (e) {
        case 'n': return "\n";
        case 't': return "\t";
        case 'r': return "\r";
        case 'f': return "\f";
        case 'v': return "\v";
        default: break;
      }
      if (std::isalnum((unsigned char)e)) bad(fmt::format("the escape \\{}", e));
      return std::string(1, e);
    }
    const size_t n = (size_t)utf8_sequence_length((uint8_t)p_[i_]);
    if (i_ + n > p_.size()) bad("a truncated UTF-8 character");
    std::string s(p_.substr(i_, n));
    i_ += n;
    return s;
  }

  // \d \D \w \W \s \S at i_: fills `cls` and returns true; any other escape: false.
  bool escape_class(CharClass& cls) {
    if (i_ + 1 >= p_.size()) return false;
    const char e = p_[i_ + 1];
    std::bitset<128> set;
    switch (std::tolower((unsigned char)e)) {
      case 'd': for (char c = '0'; c <= '9'; ++c) set.set(c); break;
      case 'w':
        for (int c = 0; c < 128; ++c)
          if (std::isalnum(c) || c == '_') set.set(c);
        break;
      case 's': for (char c : std::string(" \t\n\r\f\v")) set.set((unsigned char)c); break;
      default: return false;
    }
    i_ += 2;
    cls.ascii |= std::isupper((unsigned char)e) ? ~set : set;  // negated forms: ASCII only
    return true;
  }

  CharClass bracket_class() {
    ++i_;  // '['
    const bool negated = more() && peek() == '^';
    if (negated) ++i_;
    CharClass cls;
    bool first = true;
    while (more() && (peek() != ']' || first)) {
      first = false;
      if (peek() == '\\' && i_ + 1 < p_.size()) {
        const bool upper = std::isupper((unsigned char)p_[i_ + 1]);
        CharClass sub;
        if (escape_class(sub)) {
          if (negated && upper) bad("a negated class inside a negated set");
          cls.ascii |= sub.ascii;
          continue;
        }
      }
      const std::string lo = literal_char();
      if (more() && peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        const std::string hi = literal_char();
        if (lo.size() != 1 || hi.size() != 1 || (unsigned char)lo[0] >= 128 || (unsigned char)hi[0] >= 128)
          bad("a character range outside ASCII");
        if (hi[0] < lo[0]) bad("a reversed character range");
        for (int c = lo[0]; c <= hi[0]; ++c) cls.ascii.set(c);
      } else if (lo.size() == 1 && (unsigned char)lo[0] < 128) {
        cls.ascii.set((unsigned char)lo[0]);
      } else {
        if (negated) bad("a non-ASCII character in a negated set");
        cls.non_ascii.push_back(lo);
      }
    }
    if (!more()) bad("an unclosed character set");
    ++i_;  // ']'
    if (negated) cls.ascii.flip();  // ASCII only: see the header
    return cls;
  }

  GrammarBuilder& b_;
  std::string_view p_;
  size_t i_ = 0;
  int nesting_ = 0;
};

}  // namespace

uint32_t regex_rule(GrammarBuilder& b, std::string_view pattern) { return RegexCompiler(b, pattern).compile(); }

}  // namespace rl
