// common/utf8.h against hand-encoded characters (the bytes from the Unicode code charts).
#include <gtest/gtest.h>

#include "common/utf8.h"

using namespace rl;

namespace {
struct Char {
  uint32_t cp;
  const char* bytes;
};
// One of each length, and each length's first and last code point.
const Char kChars[] = {{0x41, "A"},
                       {0x7F, "\x7F"},
                       {0x80, "\xC2\x80"},
                       {0xE9, "\xC3\xA9"},          // é
                       {0x7FF, "\xDF\xBF"},
                       {0x800, "\xE0\xA0\x80"},
                       {0x4E2D, "\xE4\xB8\xAD"},    // 中
                       {0xFFFD, "\xEF\xBF\xBD"},
                       {0xFFFF, "\xEF\xBF\xBF"},
                       {0x10000, "\xF0\x90\x80\x80"},
                       {0x1F642, "\xF0\x9F\x99\x82"},  // 🙂
                       {0x10FFFF, "\xF4\x8F\xBF\xBF"}};
}  // namespace

TEST(Utf8, EncodesDecodesAndMeasuresEachLength) {
  for (const Char& c : kChars) {
    std::string out;
    append_utf8(out, c.cp);
    EXPECT_EQ(out, c.bytes) << std::hex << c.cp;
    EXPECT_EQ(utf8_sequence_length((uint8_t)out[0]), (int)out.size()) << std::hex << c.cp;
    for (size_t i = 1; i < out.size(); ++i) EXPECT_TRUE(is_utf8_continuation((uint8_t)out[i]));
    EXPECT_FALSE(is_utf8_continuation((uint8_t)out[0]));
    EXPECT_EQ(utf8_code_point(out), c.cp);
  }
}

TEST(Utf8, StrayBytesAreOneByteLong) {
  EXPECT_EQ(utf8_sequence_length(0x80), 1);  // a continuation byte alone
  EXPECT_EQ(utf8_sequence_length(0xBF), 1);
  EXPECT_EQ(utf8_sequence_length(0xF8), 1);  // no 5-byte forms
  EXPECT_EQ(utf8_sequence_length(0xFF), 1);
}
