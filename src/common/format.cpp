#include "common/format.h"

#include <algorithm>

#include <fmt/format.h>

namespace rl {

std::string human_bytes(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  if (u == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.2f} {}", v, units[u]);
}

std::string to_hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * bytes.size());
  for (unsigned char c : bytes) {
    s.push_back(digits[c >> 4]);
    s.push_back(digits[c & 15]);
  }
  return s;
}

size_t marker_prefix_tail(std::string_view text, std::string_view marker) {
  if (marker.empty()) return 0;
  for (size_t k = std::min(marker.size() - 1, text.size()); k > 0; k--)
    if (text.substr(text.size() - k) == marker.substr(0, k)) return k;
  return 0;
}

}  // namespace rl
