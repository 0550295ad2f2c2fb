// Small text helpers shared by the front ends.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace rl {

// "1.50 GiB", "812.0 KiB", "17 B".
std::string human_bytes(uint64_t bytes);

// Lowercase hex of the bytes: "\x01\xab" -> "01ab".
std::string to_hex(std::string_view bytes);

// Length of the longest tail of `text` that is a proper prefix of `marker` ("ab</th", "</think>" ->
// 4): what a streaming filter must hold back because the next piece may complete the marker.
size_t marker_prefix_tail(std::string_view text, std::string_view marker);

}  // namespace rl
