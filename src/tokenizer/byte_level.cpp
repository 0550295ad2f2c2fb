#include "tokenizer/byte_level.h"

#include <vector>

#include "common/utf8.h"

namespace rl::byte_level {
namespace {

bool is_printable_latin1(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct ByteTables {
  std::array<uint32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8{};
  std::vector<int> from_cp;  // code point -> byte, -1 where unmapped

  ByteTables() {
    int next_substitute = 0;
    for (int b = 0; b < 256; ++b) {
      to_cp[b] = is_printable_latin1(b) ? (uint32_t)b : 0x100u + (uint32_t)next_substitute++;
    }
    from_cp.assign(0x100 + next_substitute, -1);
    for (int b = 0; b < 256; ++b) {
      from_cp[to_cp[b]] = b;
      append_utf8(to_utf8[b], to_cp[b]);
    }
  }
};

const ByteTables& tables() {
  static const ByteTables t;
  return t;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return tables().to_cp[b]; }

int codepoint_to_byte(uint32_t cp) {
  const auto& t = tables().from_cp;
  return cp < t.size() ? t[cp] : -1;
}

const std::string& byte_to_utf8(uint8_t b) { return tables().to_utf8[b]; }

bool decode_lenient(std::string_view s, size_t& pos, uint32_t& cp) {
  const auto at = [&](size_t i) { return (uint8_t)s[i]; };
  const uint8_t b0 = at(pos);
  const size_t left = s.size() - pos;
  const size_t n = (size_t)utf8_sequence_length(b0);
  if (n == 1) {
    if (b0 >= 0x80) return false;  // a continuation byte, or no sequence starts with it
    cp = b0;
    pos += 1;
    return true;
  }
  if (left < n) return false;
  for (size_t k = 1; k < n; ++k)
    if (!is_utf8_continuation(at(pos + k))) return false;
  cp = utf8_code_point(s.substr(pos, n));
  pos += n;
  return true;
}

bool is_strict_utf8(std::string_view s) {
  const auto* p = (const uint8_t*)s.data();
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // Eight ASCII bytes at a time: the common case for prose and code.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const uint8_t b0 = p[i];
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      if (i + 1 >= n || !is_utf8_continuation(p[i + 1])) return false;
      i += 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      if (i + 2 >= n || !is_utf8_continuation(p[i + 1]) || !is_utf8_continuation(p[i + 2])) return false;
      const uint32_t cp = utf8_code_point(s.substr(i, 3));
      if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
      i += 3;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      if (i + 3 >= n || !is_utf8_continuation(p[i + 1]) || !is_utf8_continuation(p[i + 2]) ||
          !is_utf8_continuation(p[i + 3]))
        return false;
      const uint32_t cp = utf8_code_point(s.substr(i, 4));
      if (cp < 0x10000 || cp > 0x10FFFF) return false;
      i += 4;
    } else {
      return false;
    }
  }
  return true;
}

std::string normalize_like_llama(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 16);
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t cp = 0;
    if (!decode_lenient(text, pos, cp)) {
      ++pos;
      cp = 0xFFFD;
    } else if (cp > 0x10FFFF) {
      cp = 0xFFFD;
    }
    append_utf8(out, cp);
  }
  return out;
}

}  // namespace rl::byte_level
