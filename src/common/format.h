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

}  // namespace rl
