// Byte-level helpers of GPT-2 style BPE: the byte <-> code point mapping that lets every byte
// be written as a printable character, and UTF-8 decoding with llama.cpp's rules for bad input.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace rl::byte_level {

// GPT-2's byte-to-unicode table: bytes that are printable Latin-1 ('!'..'~', U+00A1..U+00AC,
// U+00AE..U+00FF) map to themselves, the other 68 bytes to U+0100, U+0101, ... in byte order.
uint32_t byte_to_codepoint(uint8_t b);
// Inverse of byte_to_codepoint; -1 for a code point that no byte maps to.
int codepoint_to_byte(uint32_t cp);
// UTF-8 bytes of byte_to_codepoint(b) (one or two bytes).
const std::string& byte_to_utf8(uint8_t b);

// Appends the UTF-8 encoding of `cp` (no validation beyond the 4-byte limit of 0x1FFFFF).
void append_utf8(std::string& out, uint32_t cp);

// Decodes one code point at text[pos] the way llama.cpp does (lenient: overlong forms and
// surrogates are accepted, only the bit patterns are checked). Returns false for a malformed
// sequence, in which case the caller substitutes U+FFFD for ONE byte.
bool decode_lenient(std::string_view text, size_t& pos, uint32_t& cp);

// True when `text` is well-formed UTF-8 (no overlong forms, no surrogates, <= U+10FFFF).
bool is_strict_utf8(std::string_view text);

// Rewrites `text` as llama.cpp sees it: malformed bytes become U+FFFD one byte at a time,
// overlong forms are re-encoded in their shortest form, code points above U+10FFFF (which
// llama.cpp cannot encode and fails on) become U+FFFD. Surrogates are kept as 3-byte sequences.
std::string normalize_like_llama(std::string_view text);

// Length of the UTF-8 sequence announced by lead byte `b` (1 for ASCII and stray bytes).
inline int utf8_sequence_length(uint8_t b) {
  if (b < 0xC0) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  if (b < 0xF8) return 4;
  return 1;
}

}  // namespace rl::byte_level
