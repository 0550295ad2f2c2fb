// The shared text helpers against hand-written values.
#include <gtest/gtest.h>

#include "common/format.h"

TEST(Format, HexOfBytes) {
  EXPECT_EQ(rl::to_hex(""), "");
  EXPECT_EQ(rl::to_hex(std::string("\x00\x01\xab\xff", 4)), "0001abff");
  EXPECT_EQ(rl::to_hex("Hi\n"), "48690a");
}

TEST(Format, MarkerPrefixTail) {
  EXPECT_EQ(rl::marker_prefix_tail("ab<th", "</think>"), 0u);  // "<th" does not start "</think>"
  EXPECT_EQ(rl::marker_prefix_tail("ab</th", "</think>"), 4u);
  EXPECT_EQ(rl::marker_prefix_tail("ab<", "<tool_call>"), 1u);
  EXPECT_EQ(rl::marker_prefix_tail("x</think", "</think>"), 7u);  // proper prefixes only
  EXPECT_EQ(rl::marker_prefix_tail("</think>", "</think>"), 0u);  // a whole marker is found, not held
  EXPECT_EQ(rl::marker_prefix_tail("", "</think>"), 0u);
  EXPECT_EQ(rl::marker_prefix_tail("abc", ""), 0u);
  EXPECT_EQ(rl::marker_prefix_tail("aaa", "aab"), 2u);             // the longest, not the first found
}

TEST(Format, HumanBytes) {
  EXPECT_EQ(rl::human_bytes(17), "17 B");
  EXPECT_EQ(rl::human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(rl::human_bytes(3ull << 30), "3.00 GiB");
}
