// Random valid blocks: dequantised with the reference dequantisation (quant module, checked
// bit-exact against ggml's own output by the quant tests), every generated type must give finite,
// zero-mean values with the requested standard deviation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "quant/quant.h"
#include "synth/random_blocks.h"

namespace rl::synth {
namespace {

struct Moments {
  double mean = 0, std = 0;
  bool finite = true;
};

Moments dequantised_moments(GgmlType type, float target_std, uint64_t seed, int64_t n_rows, int64_t row_len) {
  const size_t row_bytes = row_size(type, row_len);
  std::vector<uint8_t> bytes(row_bytes * n_rows);
  std::vector<float> values((size_t)(row_len * n_rows));
  for (int64_t r = 0; r < n_rows; r++) {
    Rng rng(mix_seed(seed, 7, (uint64_t)r));
    fill_normal_row(type, bytes.data() + r * row_bytes, row_len, target_std, rng);
    dequantize_row(type, bytes.data() + r * row_bytes, values.data() + r * row_len, row_len);
  }
  Moments m;
  double s = 0, ss = 0;
  for (float v : values) {
    m.finite = m.finite && std::isfinite(v);
    s += v;
    ss += (double)v * v;
  }
  const double n = (double)values.size();
  m.mean = s / n;
  m.std = std::sqrt(ss / n - m.mean * m.mean);
  return m;
}

// Every ggml type with a float view.
const GgmlType kTypes[] = {
    GgmlType::F32,  GgmlType::F16,     GgmlType::BF16,   GgmlType::Q4_0,    GgmlType::Q4_1,  GgmlType::Q5_0,
    GgmlType::Q5_1, GgmlType::Q8_0,    GgmlType::IQ4_NL, GgmlType::MXFP4,   GgmlType::Q2_K,  GgmlType::Q3_K,
    GgmlType::Q4_K, GgmlType::Q5_K,    GgmlType::Q6_K,   GgmlType::IQ4_XS,  GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
    GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ1_S,   GgmlType::IQ1_M};

TEST(RandomBlocks, DequantisedSpreadMatchesTarget) {
  // Spreads the recipes use: 1/sqrt(2048) (projections of the 80B) up to 1 (token embeddings).
  for (GgmlType type : kTypes) {
    for (float target : {0.0221f, 0.0884f, 1.0f}) {
      // A seed different from the calibration's: the check is on fresh blocks.
      const Moments m = dequantised_moments(type, target, 12345, 64, 2048);
      SCOPED_TRACE(std::string(type_name(type)) + " target " + std::to_string(target));
      EXPECT_TRUE(m.finite);
      EXPECT_NEAR(m.std, target, 0.05 * target);       // issue asks for 20 %; we hold 5 %
      EXPECT_LT(std::fabs(m.mean), 0.03 * target);     // no systematic offset
    }
  }
}

TEST(RandomBlocks, UnitRmsIsWithinTheFormatsRange) {
  // Independent sanity bounds from the formats themselves (scale 1, sub-scales in our ranges):
  // Q8_0 uniform int8 -> ~73.9; IQ2 grids hold magnitudes 8..43 times (0.5+ls)/4 with ls 4..11;
  // IQ1_M grid values -1..1 (+-1/8) times 2s+1 with s 2..7.
  EXPECT_NEAR(unit_rms(GgmlType::Q8_0), 73.9, 1.0);
  EXPECT_NEAR(unit_rms(GgmlType::Q4_0), std::sqrt(21.25 + 0.25), 0.1);
  EXPECT_GT(unit_rms(GgmlType::IQ2_XXS), 8 * 1.125);
  EXPECT_LT(unit_rms(GgmlType::IQ2_XXS), 43 * 2.875);
  EXPECT_GT(unit_rms(GgmlType::IQ2_XS), 8 * 1.125);
  EXPECT_LT(unit_rms(GgmlType::IQ2_XS), 43 * 2.875);
  // Q4_1 / Q5_1: q uniform in 0..15 (0..31) less its mean, variance (n^2 - 1) / 12; MXFP4 at
  // scale 1 (d = 1): the 16 doubled E2M1 values, mean square 274 / 8.
  EXPECT_NEAR(unit_rms(GgmlType::Q4_1), std::sqrt(21.25), 0.1);
  EXPECT_NEAR(unit_rms(GgmlType::Q5_1), std::sqrt(85.25), 0.2);
  EXPECT_NEAR(unit_rms(GgmlType::MXFP4), std::sqrt(274.0 / 8), 0.1);
  EXPECT_GT(unit_rms(GgmlType::IQ1_M), 0.125 * 5);
  EXPECT_LT(unit_rms(GgmlType::IQ1_M), 1.125 * 15);
}

TEST(RandomBlocks, RowsDependOnlyOnTheSeed) {
  const size_t row_bytes = row_size(GgmlType::IQ2_XS, 512);
  std::vector<uint8_t> a(row_bytes), b(row_bytes), c(row_bytes);
  Rng r1(mix_seed(1, 2, 3)), r2(mix_seed(1, 2, 3)), r3(mix_seed(1, 2, 4));
  fill_normal_row(GgmlType::IQ2_XS, a.data(), 512, 0.05f, r1);
  fill_normal_row(GgmlType::IQ2_XS, b.data(), 512, 0.05f, r2);
  fill_normal_row(GgmlType::IQ2_XS, c.data(), 512, 0.05f, r3);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(RandomBlocks, UnsupportedTypeIsAClearError) {
  std::vector<uint8_t> buf(1024);
  Rng rng(1);
  try {
    fill_normal_row(GgmlType::TQ1_0, buf.data(), 256, 0.1f, rng);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("tq1_0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rl::synth
