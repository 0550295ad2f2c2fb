// UTF-8 encoding and the shape of a sequence, for every module that handles text bytes (the
// tokenizer, the Jinja interpreter, the grammar compiler, the synthetic vocabulary). Validation
// with llama.cpp's rules for bad input is the tokenizer's (tokenizer/byte_level.h).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace rl {

// Appends the UTF-8 encoding of `cp` (no validation beyond the 4-byte limit of 0x1FFFFF).
inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp <= 0x7F) {
    out.push_back((char)cp);
  } else if (cp <= 0x7FF) {
    out.push_back((char)(0xC0 | (cp >> 6)));
    out.push_back((char)(0x80 | (cp & 0x3F)));
  } else if (cp <= 0xFFFF) {
    out.push_back((char)(0xE0 | (cp >> 12)));
    out.push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back((char)(0x80 | (cp & 0x3F)));
  } else {
    out.push_back((char)(0xF0 | ((cp >> 18) & 0x07)));
    out.push_back((char)(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back((char)(0x80 | (cp & 0x3F)));
  }
}

// Whether `b` continues a sequence (10xxxxxx) rather than starting one.
inline bool is_utf8_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Length of the UTF-8 sequence announced by lead byte `b` (1 for ASCII and stray bytes).
inline int utf8_sequence_length(uint8_t b) {
  if (b < 0xC0) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  if (b < 0xF8) return 4;
  return 1;
}

// The code point of one whole sequence (`ch` as utf8_sequence_length cut it), from its bits
// alone: the caller has validated the text, or takes what a malformed sequence gives.
inline uint32_t utf8_code_point(std::string_view ch) {
  if (ch.empty()) return 0;
  const uint8_t lead = (uint8_t)ch[0];
  if (ch.size() == 1) return lead;
  uint32_t v = ch.size() == 2 ? lead & 0x1Fu : ch.size() == 3 ? lead & 0x0Fu : lead & 0x07u;
  for (size_t k = 1; k < ch.size(); ++k) v = (v << 6) | ((uint8_t)ch[k] & 0x3Fu);
  return v;
}

}  // namespace rl
