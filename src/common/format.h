// Small text helpers shared by the front ends.
#pragma once
#include <cstdint>
#include <string>

namespace rl {

// "1.50 GiB", "812.0 KiB", "17 B".
std::string human_bytes(uint64_t bytes);

}  // namespace rl
