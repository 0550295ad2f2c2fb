// Byte-level helpers of GPT-2 style BPE: the byte <-> code point mapping that lets every byte
// be written as a printable character, and UTF-8 decoding with llama.cpp's rules for bad input
// (encoding and sequence shapes: common/utf8.h).
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

}  // namespace rl::byte_level
