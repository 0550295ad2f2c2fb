#include "generate/jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/utf8.h"
#include "generate/jinja_value.h"

namespace rl::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return std::isalpha((unsigned char)c) || c == '_'; }
bool is_name_char(char c) { return std::isalnum((unsigned char)c) || c == '_'; }

int line_of(std::string_view src, size_t pos) {
  return 1 + (int)std::count(src.begin(), src.begin() + (std::ptrdiff_t)std::min(pos, src.size()), '\n');
}

[[noreturn]] void syntax_error(std::string_view src, size_t pos, std::string_view what) {
  throw JinjaError(fmt::format("template syntax error at line {}: {}", line_of(src, pos), what));
}

// A string literal starting at src[pos] (a quote); returns the index after the closing quote.
// Escapes as Python reads them in a plain string literal.
size_t read_string(std::string_view src, size_t pos, std::string* out) {
  const char q = src[pos++];
  while (pos < src.size() && src[pos] != q) {
    char c = src[pos++];
    if (c != '\\' || pos >= src.size()) {
      if (out) *out += c;
      continue;
    }
    char e = src[pos++];
    std::string tmp;
    switch (e) {
      case 'n': tmp = "\n"; break;
      case 't': tmp = "\t"; break;
      case 'r': tmp = "\r"; break;
      case '0': tmp = std::string(1, '\0'); break;
      case 'b': tmp = "\b"; break;
      case 'f': tmp = "\f"; break;
      case 'v': tmp = "\v"; break;
      case '\\': tmp = "\\"; break;
      case '\'': tmp = "'"; break;
      case '"': tmp = "\""; break;
      case '\n': break;  // a backslash-newline continues the literal
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        if (pos + n > src.size()) syntax_error(src, pos, "truncated escape in a string");
        uint32_t cp = 0;
        for (size_t k = 0; k < n; ++k) {
          const char h = src[pos + k];
          if (!std::isxdigit((unsigned char)h)) syntax_error(src, pos, "bad escape in a string");
          cp = cp * 16 + (uint32_t)(std::isdigit((unsigned char)h) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        pos += n;
        append_utf8(tmp, cp);
        break;
      }
      default: tmp = std::string("\\") + e;  // Python keeps unknown escapes as written
    }
    if (out) *out += tmp;
  }
  if (pos >= src.size()) syntax_error(src, pos, "unclosed string literal");
  return pos + 1;
}

std::vector<Token> tokenize(std::string_view src, size_t begin, size_t end) {
  static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                               "=", "|", ".", ",", ":", "(", ")", "[", "]", "{", "}"};
  std::vector<Token> out;
  size_t p = begin;
  while (p < end) {
    const char c = src[p];
    if (is_space(c)) {
      ++p;
      continue;
    }
    Token t;
    if (is_name_start(c)) {
      size_t e = p;
      while (e < end && is_name_char(src[e])) ++e;
      t.type = Token::Type::Name;
      t.text = std::string(src.substr(p, e - p));
      p = e;
    } else if (std::isdigit((unsigned char)c)) {
      size_t e = p;
      while (e < end && (std::isdigit((unsigned char)src[e]) || src[e] == '_')) ++e;
      bool is_float = false;
      if (e + 1 < end && src[e] == '.' && std::isdigit((unsigned char)src[e + 1])) {
        is_float = true;
        ++e;
        while (e < end && std::isdigit((unsigned char)src[e])) ++e;
      }
      if (e < end && (src[e] == 'e' || src[e] == 'E')) {
        size_t x = e + 1;
        if (x < end && (src[x] == '+' || src[x] == '-')) ++x;
        if (x < end && std::isdigit((unsigned char)src[x])) {
          is_float = true;
          e = x;
          while (e < end && std::isdigit((unsigned char)src[e])) ++e;
        }
      }
      std::string digits;
      for (size_t k = p; k < e; ++k)
        if (src[k] != '_') digits += src[k];
      if (is_float) {
        t.type = Token::Type::Float;
        t.f = std::strtod(digits.c_str(), nullptr);
      } else {
        t.type = Token::Type::Int;
        errno = 0;
        t.i = std::strtoll(digits.c_str(), nullptr, 10);
        if (errno == ERANGE) syntax_error(src, p, "integer literal out of range");
      }
      p = e;
    } else if (c == '\'' || c == '"') {
      t.type = Token::Type::String;
      p = read_string(src, p, &t.text);
    } else {
      bool found = false;
      for (const char* op : kOps) {
        const size_t n = std::strlen(op);
        if (p + n <= end && src.substr(p, n) == op) {
          t.type = Token::Type::Op;
          t.text = op;
          p += n;
          found = true;
          break;
        }
      }
      if (!found) syntax_error(src, p, fmt::format("unexpected character '{}'", c));
    }
    out.push_back(std::move(t));
  }
  out.push_back(Token{});
  return out;
}

// The end of the tag whose body starts at `pos`: the index of `close` outside string literals.
size_t find_tag_end(std::string_view src, size_t pos, std::string_view close) {
  while (pos < src.size()) {
    const char c = src[pos];
    if (c == '\'' || c == '"') {
      pos = read_string(src, pos, nullptr);
      continue;
    }
    if (src.substr(pos, close.size()) == close) return pos;
    ++pos;
  }
  return std::string_view::npos;
}

// `{% raw %}` ... `{% endraw %}`: the index of the closing tag's `{%` and the index after it.
std::pair<size_t, size_t> find_endraw(std::string_view src, size_t pos) {
  while ((pos = src.find("{%", pos)) != std::string_view::npos) {
    size_t p = pos + 2;
    if (p < src.size() && (src[p] == '-' || src[p] == '+')) ++p;
    while (p < src.size() && is_space(src[p])) ++p;
    if (src.substr(p, 6) == "endraw") {
      size_t e = src.find("%}", p + 6);
      if (e == std::string_view::npos) break;
      return {pos, e + 2};
    }
    pos += 2;
  }
  syntax_error(src, pos, "{% raw %} without {% endraw %}");
}

void rstrip_space(std::string& s) {
  while (!s.empty() && is_space(s.back())) s.pop_back();
}

// lstrip_blocks: spaces and tabs between the start of a line and a block tag are dropped.
void lstrip_line(std::string& s, bool text_starts_line) {
  const size_t nl = s.rfind('\n');
  const size_t from = nl == std::string::npos ? 0 : nl + 1;
  if (nl == std::string::npos && !text_starts_line) return;
  for (size_t k = from; k < s.size(); ++k)
    if (s[k] != ' ' && s[k] != '\t') return;
  s.resize(from);
}

}  // namespace

std::vector<Piece> lex_template(std::string_view src) {
  // jinja2's keep_trailing_newline is off: one newline at the very end of the source is dropped.
  if (src.ends_with("\r\n")) src.remove_suffix(2);
  else if (src.ends_with('\n')) src.remove_suffix(1);
  std::vector<Piece> out;
  size_t pos = 0;
  while (pos <= src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open + 1 >= src.size()) open = std::string_view::npos;
    Piece text;
    text.line = line_of(src, pos);
    text.text = std::string(src.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    const bool text_starts_line = pos == 0 || src[pos - 1] == '\n';
    if (open == std::string_view::npos) {
      if (!text.text.empty()) out.push_back(std::move(text));
      break;
    }
    const char kind = src[open + 1];
    const char lmod = open + 2 < src.size() ? src[open + 2] : 0;
    const bool block_like = kind == '%' || kind == '#';
    if (lmod == '-') rstrip_space(text.text);
    else if (block_like && lmod != '+') lstrip_line(text.text, text_starts_line);
    if (!text.text.empty()) out.push_back(std::move(text));

    const size_t body = open + 2 + (lmod == '-' || lmod == '+' ? 1 : 0);
    const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t end = kind == '#' ? src.find(close, body) : find_tag_end(src, body, close);
    if (end == std::string_view::npos)
      syntax_error(src, open, kind == '#' ? "unclosed comment" : fmt::format("tag without its closing '{}'", close));
    const char rmod = end > body && (src[end - 1] == '-' || src[end - 1] == '+') ? src[end - 1] : 0;
    const size_t body_end = rmod ? end - 1 : end;
    size_t after = end + 2;

    if (kind != '#') {
      Piece tag;
      tag.kind = kind == '{' ? Piece::Kind::Expression : Piece::Kind::Statement;
      tag.line = line_of(src, open);
      tag.tokens = tokenize(src, body, body_end);
      const bool is_raw = tag.kind == Piece::Kind::Statement && tag.tokens.size() == 2 &&
                          tag.tokens[0].type == Token::Type::Name && tag.tokens[0].text == "raw";
      if (is_raw) {
        auto [raw_end, raw_after] = find_endraw(src, after);
        Piece raw;
        raw.line = line_of(src, after);
        size_t from = after;
        if (rmod == '-') while (from < raw_end && is_space(src[from])) ++from;
        else if (rmod != '+' && from < raw_end && src[from] == '\n') ++from;
        raw.text = std::string(src.substr(from, raw_end - from));
        const char emod = src[raw_end + 2];
        if (emod == '-') rstrip_space(raw.text);
        if (!raw.text.empty()) out.push_back(std::move(raw));
        const char erm = src[raw_after - 3];
        after = raw_after;
        if (erm == '-') while (after < src.size() && is_space(src[after])) ++after;
        else if (erm != '+' && after < src.size() && src[after] == '\n') ++after;
        pos = after;
        continue;
      }
      out.push_back(std::move(tag));
    }
    if (rmod == '-') {
      while (after < src.size() && is_space(src[after])) ++after;
    } else if (block_like && rmod != '+') {  // trim_blocks: the newline after a block tag goes
      if (src.substr(after, 2) == "\r\n") after += 2;
      else if (after < src.size() && src[after] == '\n') ++after;
    }
    pos = after;
  }
  return out;
}

}  // namespace rl::jinja
