// The Q4_K / Q5_K factorability test (quant.h) against the definition: a sub-block is factorable
// when every value d*sc*q - dmin*m is an fp32 value. The constant-time test may say no to a
// factorable sub-block, never yes to one that is not; and it must say yes to the blocks real
// quantisers write (the fixtures).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "common/fp16.h"
#include "gguf/gguf.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "test_util.h"

namespace rl {
namespace {

bool by_definition(float d, float dmin, int sc, int m, int q_max) {
  const float a = d * (float)sc, b = dmin * (float)m;
  for (int q = 0; q <= q_max; q++) {
    const double e = (double)a * q - (double)b;  // exact in double
    if ((double)(float)e != e) return false;
  }
  return true;
}

TEST(KQuantFactorable, NeverAcceptsASubBlockThatRounds) {
  std::mt19937 rng(7);
  int accepted = 0, factorable = 0, n = 0;
  for (int i = 0; i < 200000; i++) {
    // fp16 scales: random finite bit patterns (subnormals included), or two of similar size.
    uint16_t dh = (uint16_t)(rng() & 0x7BFF), mh = (uint16_t)(rng() & 0x7BFF);
    if (i % 2) mh = (uint16_t)((dh & 0x7C00) | (rng() & 0x03FF));  // same exponent as d
    const float d = fp16_to_f32(dh), dmin = fp16_to_f32(mh);
    const int sc = (int)(rng() % 64), m = (int)(rng() % 64), q_max = i % 3 ? 15 : 31;
    const bool def = by_definition(d, dmin, sc, m, q_max), fast = k_sub_block_factorable(d, dmin, sc, m, q_max);
    ASSERT_TRUE(def || !fast) << "d " << d << " dmin " << dmin << " sc " << sc << " m " << m << " q_max " << q_max;
    n++, accepted += fast, factorable += def;
  }
  // It is not a test that says no to everything: it accepts most of what the definition accepts.
  EXPECT_GT(accepted, factorable * 9 / 10) << accepted << " accepted of " << factorable << " factorable, " << n;
}

TEST(KQuantFactorable, HandCases) {
  // d = 2^-4 and dmin = 2^-5 (exact fp16): every value is a multiple of 2^-5 below 2^24 of them.
  EXPECT_TRUE(k_sub_block_factorable(0.0625f, 0.03125f, 63, 63, 15));
  // d = 1, dmin = 2^-20: 63*15 - 63*2^-20 spans 2^9 .. 2^-20, 30 bits: it rounds, and the test says so.
  ASSERT_FALSE(by_definition(1.0f, std::ldexp(1.0f, -20), 63, 63, 15));
  EXPECT_FALSE(k_sub_block_factorable(1.0f, std::ldexp(1.0f, -20), 63, 63, 15));
  // All zero (a dead sub-block) and a zero min.
  EXPECT_TRUE(k_sub_block_factorable(0.0f, 0.0f, 0, 0, 15));
  EXPECT_TRUE(k_sub_block_factorable(0.5f, 0.25f, 17, 0, 31));
  // Not finite: never.
  EXPECT_FALSE(k_sub_block_factorable(INFINITY, 1.0f, 1, 1, 15));
}

TEST(KQuantFactorable, WholeTensorsOfTheFixturesAndOtherTypes) {
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "fixture not found: " << path << " (set REDLITE_FIXTURES)";
  auto file = GgufFile::open(path);
  int k_tensors = 0;
  for (const GgufTensorInfo& t : file->tensors()) {
    if (t.type == GgmlType::Q4_K || t.type == GgmlType::Q5_K) {
      const size_t bytes = t.type == GgmlType::Q4_K ? sizeof(BlockQ4_K) : sizeof(BlockQ5_K);
      EXPECT_TRUE(k_quant_factorable(t.type, t.data, t.nbytes / bytes)) << t.name;
      k_tensors++;
    } else {
      EXPECT_FALSE(k_quant_factorable(t.type, t.data, 1)) << t.name << ": not a K-quant with a min";
    }
  }
  EXPECT_GT(k_tensors, 0);
  // One block made to round (d = 1, dmin = 2^-20, sub-block 0 with sc = m = 63) spoils its tensor.
  BlockQ4_K b{};
  b.d = f32_to_fp16(1.0f);
  b.dmin = f32_to_fp16(std::ldexp(1.0f, -20));
  b.scales[0] = 63;
  b.scales[4] = 63;
  std::vector<BlockQ4_K> blocks(3, BlockQ4_K{});
  EXPECT_TRUE(k_quant_factorable(GgmlType::Q4_K, blocks.data(), blocks.size()));
  blocks[1] = b;
  EXPECT_FALSE(k_quant_factorable(GgmlType::Q4_K, blocks.data(), blocks.size()));
}

}  // namespace
}  // namespace rl
