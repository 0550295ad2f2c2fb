#include "tokenizer/byte_level.h"

#include <vector>

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

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return tables().to_cp[b]; }

int codepoint_to_byte(uint32_t cp) {
  const auto& t = tables().from_cp;
  return cp < t.size() ? t[cp] : -1;
}

const std::string& byte_to_utf8(uint8_t b) { return tables().to_utf8[b]; }

void append_utf8(std::string& out, uint32_t cp) {
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

bool decode_lenient(std::string_view s, size_t& pos, uint32_t& cp) {
  const auto at = [&](size_t i) { return (uint8_t)s[i]; };
  const uint8_t b0 = at(pos);
  const size_t left = s.size() - pos;
  if (b0 < 0x80) {
    cp = b0;
    pos += 1;
    return true;
  }
  if (!(b0 & 0x40)) return false;  // a continuation byte cannot start a character
  if (!(b0 & 0x20)) {
    if (left < 2 || !is_continuation(at(pos + 1))) return false;
    cp = ((b0 & 0x1Fu) << 6) | (at(pos + 1) & 0x3Fu);
    pos += 2;
    return true;
  }
  if (!(b0 & 0x10)) {
    if (left < 3 || !is_continuation(at(pos + 1)) || !is_continuation(at(pos + 2))) return false;
    cp = ((b0 & 0x0Fu) << 12) | ((at(pos + 1) & 0x3Fu) << 6) | (at(pos + 2) & 0x3Fu);
    pos += 3;
    return true;
  }
  if (!(b0 & 0x08)) {
    if (left < 4 || !is_continuation(at(pos + 1)) || !is_continuation(at(pos + 2)) ||
        !is_continuation(at(pos + 3)))
      return false;
    cp = ((b0 & 0x07u) << 18) | ((at(pos + 1) & 0x3Fu) << 12) | ((at(pos + 2) & 0x3Fu) << 6) |
         (at(pos + 3) & 0x3Fu);
    pos += 4;
    return true;
  }
  return false;
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
      if (i + 1 >= n || !is_continuation(p[i + 1])) return false;
      i += 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      if (i + 2 >= n || !is_continuation(p[i + 1]) || !is_continuation(p[i + 2])) return false;
      const uint32_t cp = ((b0 & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu);
      if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
      i += 3;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      if (i + 3 >= n || !is_continuation(p[i + 1]) || !is_continuation(p[i + 2]) ||
          !is_continuation(p[i + 3]))
        return false;
      const uint32_t cp = ((b0 & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) |
                          ((p[i + 2] & 0x3Fu) << 6) | (p[i + 3] & 0x3Fu);
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
