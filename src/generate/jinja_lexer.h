// Splits a Jinja template into text and tags with the whitespace rules of the Hugging Face chat
// environment (trim_blocks, lstrip_blocks, and the `-` / `+` markers), and a tag into tokens.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rl::jinja {

struct Token {
  enum class Type { Name, Int, Float, String, Op, End };
  Type type = Type::End;
  std::string text;  // Name, String (unescaped), Op
  int64_t i = 0;
  double f = 0;
};

struct Piece {
  enum class Kind { Text, Expression, Statement };
  Kind kind = Kind::Text;
  int line = 1;
  std::string text;           // Text
  std::vector<Token> tokens;  // Expression / Statement, ending with an End token
};

// Throws JinjaError naming the line for an unclosed tag, comment or string.
std::vector<Piece> lex_template(std::string_view source);

}  // namespace rl::jinja
