// The IQ codebooks as data (quant/iq_grids.h) and the IQ block decoders (quant/quant_iq.cpp),
// checked without fixtures:
// - structural invariants of the format each table must satisfy (sizes, value sets, order,
//   the even parity of the sign table);
// - the four 2-bit/1-bit grids against a second encoding of the same points, ggml's quantiser
//   codes (iq_grid_codes.h, transcribed from a different ggml file);
// - hand-built blocks whose expected values follow from the layouts in quant/blocks_iq.h, to pin
//   the bit fields (index high bits, sign masks, scale nibbles, IQ1_M's spread fp16 scale).
// Bit-exactness against ggml on real quantised data is test_dequant.cpp's zoo test.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <iterator>
#include <set>
#include <vector>

#include "common/fp16.h"
#include "iq_grid_codes.h"
#include "quant/blocks_iq.h"
#include "quant/iq_grids.h"
#include "quant/quant.h"

namespace rl {
namespace {

uint8_t byte_of(uint64_t entry, int j) { return (uint8_t)(entry >> (8 * j)); }

// ---- tables: sizes and constants --------------------------------------------------------------

TEST(IqGrids, TableSizes) {
  EXPECT_EQ(std::size(kmask_iq2xs), 8u);
  EXPECT_EQ(std::size(ksigns_iq2xs), 128u);
  EXPECT_EQ(std::size(iq2xxs_grid), 256u);
  EXPECT_EQ(std::size(iq2xs_grid), 512u);
  EXPECT_EQ(std::size(iq2s_grid), 1024u);
  EXPECT_EQ(std::size(iq3xxs_grid), 256u);
  EXPECT_EQ(std::size(iq3s_grid), 512u);
  EXPECT_EQ(std::size(iq1s_grid), 2048u);
  EXPECT_EQ(IQ1S_DELTA, 0.125f);
  EXPECT_EQ(IQ1M_DELTA, 0.125f);
}

TEST(IqGrids, MaskSelectsOneBitPerValue) {
  for (int j = 0; j < 8; j++) EXPECT_EQ(kmask_iq2xs[j], 1u << j) << j;
}

// Entry i keeps the 7 stored sign bits i and adds bit 7 so that the count of negative values is
// even; the 128 entries are then exactly the even-parity bytes.
TEST(IqGrids, SignTableCompletesEvenParity) {
  std::set<int> seen;
  for (int i = 0; i < 128; i++) {
    const uint8_t s = ksigns_iq2xs[i];
    EXPECT_EQ(s & 127, i) << i;
    EXPECT_EQ(std::popcount(s) % 2, 0) << "entry " << i << " = " << (int)s;
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), 128u);
}

// ---- grids: value sets and order -----------------------------------------------------------

// Every byte of every entry is in allowed; the entries are distinct and strictly increasing in
// the order of `rank` (a slip that swaps or duplicates entries breaks it).
template <class Entry, size_t N>
void expect_grid_shape(const Entry (&grid)[N], int bytes_per_entry, const std::set<int>& allowed,
                       const char* name) {
  for (size_t i = 0; i < N; i++)
    for (int j = 0; j < bytes_per_entry; j++)
      ASSERT_TRUE(allowed.count(byte_of(grid[i], j)))
          << name << "[" << i << "] byte " << j << " = " << (int)byte_of(grid[i], j);
  for (size_t i = 1; i < N; i++) ASSERT_LT(grid[i - 1], grid[i]) << name << " at " << i;
}

TEST(IqGrids, TwoBitGridsUseThreeMagnitudesInOrder) {
  const std::set<int> levels = {0x08, 0x19, 0x2b};
  expect_grid_shape(iq2xxs_grid, 8, levels, "iq2xxs_grid");
  expect_grid_shape(iq2xs_grid, 8, levels, "iq2xs_grid");
  expect_grid_shape(iq2s_grid, 8, levels, "iq2s_grid");
}

TEST(IqGrids, ThreeBitGridsUseTheirLevelsInOrder) {
  expect_grid_shape(iq3xxs_grid, 4, {4, 12, 20, 28, 36, 44, 52, 62}, "iq3xxs_grid");
  expect_grid_shape(iq3s_grid, 4, {1, 3, 5, 7, 9, 11, 13, 15}, "iq3s_grid");
}

// IQ1 entries are signed bytes, so the plain integer order does not apply: rank each entry as a
// base-3 number of (value + 1), most significant value (byte 7) first.
TEST(IqGrids, OneBitGridIsTernaryInOrder) {
  auto rank = [](uint64_t entry) {
    int r = 0;
    for (int j = 7; j >= 0; j--) r = 3 * r + ((int8_t)byte_of(entry, j) + 1);
    return r;
  };
  for (size_t i = 0; i < std::size(iq1s_grid); i++)
    for (int j = 0; j < 8; j++) {
      const int v = (int8_t)byte_of(iq1s_grid[i], j);
      ASSERT_TRUE(v >= -1 && v <= 1) << "iq1s_grid[" << i << "] byte " << j << " = " << v;
    }
  for (size_t i = 1; i < std::size(iq1s_grid); i++)
    ASSERT_LT(rank(iq1s_grid[i - 1]), rank(iq1s_grid[i])) << "iq1s_grid at " << i;
}

// ---- grids: against ggml's quantiser codes ----------------------------------------------------

template <size_t N>
void expect_grid_matches_codes(const uint64_t (&grid)[N], const uint16_t (&codes)[N],
                               const uint8_t (&level_byte)[3], const char* name) {
  int mismatches = 0;
  for (size_t i = 0; i < N && mismatches < 5; i++) {
    uint64_t expected = 0;
    for (int j = 0; j < 8; j++) {
      const int level = (codes[i] >> (2 * j)) & 3;
      ASSERT_LT(level, 3) << name << " code " << i << " = " << codes[i];
      expected |= (uint64_t)level_byte[level] << (8 * j);
    }
    if (grid[i] != expected) {
      ADD_FAILURE() << name << "[" << i << "] = 0x" << std::hex << grid[i] << ", code " << std::dec
                    << codes[i] << " says 0x" << std::hex << expected;
      mismatches++;
    }
  }
}

TEST(IqGrids, TwoBitGridsMatchQuantiserCodes) {
  const uint8_t levels[3] = {0x08, 0x19, 0x2b};
  expect_grid_matches_codes(iq2xxs_grid, test::kIQ2XXSCodes, levels, "iq2xxs_grid");
  expect_grid_matches_codes(iq2xs_grid, test::kIQ2XSCodes, levels, "iq2xs_grid");
  expect_grid_matches_codes(iq2s_grid, test::kIQ2SCodes, levels, "iq2s_grid");
}

TEST(IqGrids, OneBitGridMatchesQuantiserCodes) {
  const uint8_t levels[3] = {0xff, 0x00, 0x01};  // -1, 0, +1
  expect_grid_matches_codes(iq1s_grid, test::kIQ1SCodes, levels, "iq1s_grid");
}

// ---- hand-built blocks -------------------------------------------------------------------------

std::vector<float> dequantize_block(GgmlType type, const void* block) {
  std::vector<float> y(256);
  dequantize_row(type, block, y.data(), 256);
  return y;
}

// Dot with each unit vector returns that value: blocks and x are paired index for index.
void expect_dot_picks_each_value(GgmlType type, const void* block, const std::vector<float>& y) {
  std::vector<float> x(256, 0.0f);
  for (int i = 0; i < 256; i += 37) {
    x[i] = 1.0f;
    EXPECT_EQ(dot_row(type, block, x.data(), 256), y[i]) << type_name(type) << " value " << i;
    x[i] = 0.0f;
  }
}

TEST(IqBlocks, IQ2_XXS) {
  BlockIQ2_XXS b{};
  b.d = f32_to_fp16(1.0f);
  uint8_t group_bytes[8] = {1, 0, 2, 255};  // grid indices of groups 0..3
  const uint32_t signs_and_scale = 1u | (0u << 7) | (127u << 14) | (0u << 21) | (3u << 28);
  std::memcpy(group_bytes + 4, &signs_and_scale, 4);
  std::memcpy(b.qs, group_bytes, 8);  // the first 32 values; the rest stay index 0, scale 0
  const auto y = dequantize_block(GgmlType::IQ2_XXS, &b);

  // scale nibble 3: 1 * (0.5 + 3) * 0.25 = 0.875. Entry 1 = 0x080808080808082b; sign index 1 =
  // 0b10000001 (values 0 and 7 negative). Entry 2 = 0x0808080808081919, all negative (index 127).
  // Entry 255 = 0x2b2b2b1908081908.
  const float expected[32] = {
      -37.625f, 7, 7, 7, 7, 7, 7, -7,  // group 0
      7, 7, 7, 7, 7, 7, 7, 7,          // group 1
      -21.875f, -21.875f, -7, -7, -7, -7, -7, -7,
      7, 21.875f, 7, 7, 21.875f, 37.625f, 37.625f, 37.625f};
  for (int i = 0; i < 32; i++) EXPECT_EQ(y[i], expected[i]) << i;
  // Scale nibble 0: 0.5 * 0.25 = 0.125, times 8.
  for (int i = 32; i < 256; i++) EXPECT_EQ(y[i], 1.0f) << i;
  expect_dot_picks_each_value(GgmlType::IQ2_XXS, &b, y);
}

TEST(IqBlocks, IQ2_XS) {
  BlockIQ2_XS b{};
  b.d = f32_to_fp16(2.0f);
  b.qs[0] = (uint16_t)(511 | (1 << 9));  // last grid entry, sign index 1
  b.qs[2] = (uint16_t)(3 | (127 << 9));  // groups 2-3 use the high scale nibble
  b.scales[0] = 0x51;                    // groups 0-1: 1 -> 2*1.5*0.25 = 0.75; 2-3: 5 -> 2.75
  const auto y = dequantize_block(GgmlType::IQ2_XS, &b);
  for (int j = 0; j < 8; j++) {
    const float sign0 = (j == 0 || j == 7) ? -1.f : 1.f;
    EXPECT_EQ(y[j], 0.75f * byte_of(iq2xs_grid[511], j) * sign0) << j;
    EXPECT_EQ(y[8 + j], 0.75f * 8) << j;
    EXPECT_EQ(y[16 + j], -2.75f * byte_of(iq2xs_grid[3], j)) << j;
    EXPECT_EQ(y[24 + j], 2.75f * 8) << j;
  }
  expect_dot_picks_each_value(GgmlType::IQ2_XS, &b, y);
}

TEST(IqBlocks, IQ2_S) {
  BlockIQ2_S b{};
  b.d = f32_to_fp16(1.0f);
  const uint8_t low[4] = {1, 2, 3, 4};
  std::memcpy(b.qs, low, 4);
  b.qh[0] = 0b11100100;  // high index bits per group: 0, 1, 2, 3
  const uint8_t signs[4] = {0x01, 0x02, 0x80, 0xff};  // stored in full, no parity rule
  std::memcpy(b.qs + 32, signs, 4);
  b.scales[0] = 0x52;  // groups 0-1: (2.5)*0.25 = 0.625; 2-3: (5.5)*0.25 = 1.375
  const auto y = dequantize_block(GgmlType::IQ2_S, &b);
  const int index[4] = {1, 256 + 2, 512 + 3, 768 + 4};
  const float scale[4] = {0.625f, 0.625f, 1.375f, 1.375f};
  for (int g = 0; g < 4; g++)
    for (int j = 0; j < 8; j++) {
      const float sign = (signs[g] >> j) & 1 ? -1.f : 1.f;
      EXPECT_EQ(y[8 * g + j], scale[g] * byte_of(iq2s_grid[index[g]], j) * sign) << g << "," << j;
    }
  expect_dot_picks_each_value(GgmlType::IQ2_S, &b, y);
}

TEST(IqBlocks, IQ3_XXS) {
  BlockIQ3_XXS b{};
  b.d = f32_to_fp16(0.5f);
  for (int k = 0; k < 8; k++) b.qs[k] = (uint8_t)(10 + k);  // grid indices of the first 8 fours
  const uint32_t signs_and_scale = 1u | (127u << 7) | (7u << 28);  // groups 0, 1 signed; scale 7
  std::memcpy(b.qs + 64, &signs_and_scale, 4);
  const auto y = dequantize_block(GgmlType::IQ3_XXS, &b);
  const float db = 0.5f * 7.5f * 0.5f;  // d * (0.5 + 7) * 0.5
  const uint8_t group_signs[4] = {ksigns_iq2xs[1], ksigns_iq2xs[127], 0, 0};
  for (int g = 0; g < 4; g++)
    for (int j = 0; j < 8; j++) {
      const uint32_t entry = iq3xxs_grid[10 + 2 * g + j / 4];
      const float sign = (group_signs[g] >> j) & 1 ? -1.f : 1.f;
      EXPECT_EQ(y[8 * g + j], db * byte_of(entry, j % 4) * sign) << g << "," << j;
    }
  EXPECT_EQ(y[32], 0.5f * 0.5f * 0.5f * 4);  // scale 0, index 0 = 0x04040404
  expect_dot_picks_each_value(GgmlType::IQ3_XXS, &b, y);
}

TEST(IqBlocks, IQ3_S) {
  BlockIQ3_S b{};
  b.d = f32_to_fp16(0.5f);
  b.scales[0] = (3 << 4) | 1;  // 32-value block 0: d*(1+2) = 1.5; block 1: d*(1+6) = 3.5
  for (int k = 0; k < 8; k++) b.qs[8 + k] = (uint8_t)(5 + k);  // block 1's eight grid indices
  b.qh[1] = 0b10000001;  // 9th index bit of block 1's fours 0 and 7
  const uint8_t signs[4] = {0x01, 0x80, 0xff, 0x00};
  std::memcpy(b.signs + 4, signs, 4);
  const auto y = dequantize_block(GgmlType::IQ3_S, &b);
  for (int i = 0; i < 32; i++) EXPECT_EQ(y[i], 1.5f) << i;  // index 0 = 0x01010101
  for (int g = 0; g < 4; g++)
    for (int j = 0; j < 8; j++) {
      const int four = 2 * g + j / 4;
      const int index = (5 + four) | ((four == 0 || four == 7) ? 256 : 0);
      const float sign = (signs[g] >> j) & 1 ? -1.f : 1.f;
      EXPECT_EQ(y[32 + 8 * g + j], 3.5f * byte_of(iq3s_grid[index], j % 4) * sign) << g << "," << j;
    }
  expect_dot_picks_each_value(GgmlType::IQ3_S, &b, y);
}

TEST(IqBlocks, IQ1_S) {
  BlockIQ1_S b{};
  b.d = f32_to_fp16(1.0f);
  const uint8_t low[4] = {1, 2, 3, 4};
  std::memcpy(b.qs, low, 4);
  // Scale 2 (-> 2*2+1 = 5), delta negative, high index bits 0, 3, 0, 7 for groups 0..3.
  b.qh[0] = (uint16_t)((2 << 12) | (1 << 15) | (3 << 3) | (7 << 9));
  const auto y = dequantize_block(GgmlType::IQ1_S, &b);
  const int index[4] = {1, (3 << 8) | 2, 3, (7 << 8) | 4};
  for (int g = 0; g < 4; g++)
    for (int j = 0; j < 8; j++)
      EXPECT_EQ(y[8 * g + j], 5.0f * ((float)(int8_t)byte_of(iq1s_grid[index[g]], j) - 0.125f))
          << g << "," << j;
  // qh = 0: scale 1, index 0 (all -1), delta +0.125.
  for (int i = 32; i < 256; i++) EXPECT_EQ(y[i], -0.875f) << i;
  expect_dot_picks_each_value(GgmlType::IQ1_S, &b, y);
}

TEST(IqBlocks, IQ1_M) {
  BlockIQ1_M b{};
  // Super-scale 0.5 = fp16 0x3800: nibbles 0, 0, 8, 3 go to the tops of scale words 0..3.
  // Word 0 also holds block 0's scales 1 and 2 (bits 0-2, 3-5) and block 1's 0 and 7 (6-8, 9-11).
  const uint16_t words[4] = {(uint16_t)(1 | (2 << 3) | (0 << 6) | (7 << 9)), 0x0000, 0x8000, 0x3000};
  std::memcpy(b.scales, words, 8);
  const uint8_t low[4] = {1, 0, 0, 5};
  std::memcpy(b.qs, low, 4);
  b.qh[0] = 0x80;  // group 0: high 0, delta +; group 1: high 0, delta -
  b.qh[1] = 0x91;  // group 2: high 1, delta +; group 3: high 1, delta -
  const auto y = dequantize_block(GgmlType::IQ1_M, &b);

  const int index[4] = {1, 0, 256, 256 + 5};
  const float delta[4] = {0.125f, -0.125f, 0.125f, -0.125f};
  const float scale[4] = {1.5f, 1.5f, 2.5f, 2.5f};  // 0.5 * (2*1+1), 0.5 * (2*2+1)
  for (int g = 0; g < 4; g++)
    for (int j = 0; j < 8; j++)
      EXPECT_EQ(y[8 * g + j], scale[g] * ((float)(int8_t)byte_of(iq1s_grid[index[g]], j) + delta[g]))
          << g << "," << j;
  // Block 1: first 16 values scale 0.5 * 1, last 16 0.5 * 15; index 0 (all -1), delta +.
  for (int i = 32; i < 48; i++) EXPECT_EQ(y[i], 0.5f * -0.875f) << i;
  for (int i = 48; i < 64; i++) EXPECT_EQ(y[i], 7.5f * -0.875f) << i;
  expect_dot_picks_each_value(GgmlType::IQ1_M, &b, y);
}

// Rows of several blocks decode block by block, and dot_row pairs block b with x[256b ...].
TEST(IqBlocks, RowsOfSeveralBlocks) {
  BlockIQ2_XXS blocks[3] = {};
  for (int k = 0; k < 3; k++) blocks[k].d = f32_to_fp16((float)(k + 1));
  std::vector<float> y(768);
  dequantize_row(GgmlType::IQ2_XXS, blocks, y.data(), 768);
  for (int i = 0; i < 768; i++) EXPECT_EQ(y[i], (float)(i / 256 + 1)) << i;  // (k+1) * 0.125 * 8
  std::vector<float> x(768);
  for (int i = 0; i < 768; i++) x[i] = (float)(i / 256 == 2);
  EXPECT_EQ(dot_row(GgmlType::IQ2_XXS, blocks, x.data(), 768), 3.0f * 256);
}

}  // namespace
}  // namespace rl
