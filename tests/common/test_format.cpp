// The shared text helpers against hand-written values.
#include <gtest/gtest.h>

#include "common/format.h"

TEST(Format, HexOfBytes) {
  EXPECT_EQ(rl::to_hex(""), "");
  EXPECT_EQ(rl::to_hex(std::string("\x00\x01\xab\xff", 4)), "0001abff");
  EXPECT_EQ(rl::to_hex("Hi\n"), "48690a");
}

TEST(Format, HumanBytes) {
  EXPECT_EQ(rl::human_bytes(17), "17 B");
  EXPECT_EQ(rl::human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(rl::human_bytes(3ull << 30), "3.00 GiB");
}
