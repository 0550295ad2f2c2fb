// The fast tier's fp32 SiLU (cpu/fast_simd.h: exp8, silu8, swiglu_fast, mul_silu_fast) against
// the same functions in double, over a sweep of every 1e-4 of their range.
//
// Bounds: exp8 measured 1.18e-7 relative at most over the sweep (dev, 2026-12-06), bounded here by
// 1.5·2^-23 (1.8e-7); silu8 2.12e-7, bounded by 2^-22 (2.4e-7). They catch a lost ln 2 low part, a
// floor or truncation for the rounding, a dropped first coefficient (2.6e-7 and more), not a
// coefficient off in its third digit (the polynomial's own error hides that); a lost tail element
// or a swapped operand is off by far more.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cpu/fast_simd.h"

namespace rl::cpu::simd {
namespace {

float lane0(__m256 v) {
  float o[8];
  _mm256_storeu_ps(o, v);
  return o[0];
}

double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }

TEST(FastSilu, ExpIsWithinItsBound) {
  double worst = 0;
  for (double xd = -87.0; xd <= 88.0; xd += 1e-4) {
    const float x = (float)xd;
    const double ref = std::exp((double)x);
    worst = std::max(worst, std::fabs(lane0(exp8(_mm256_set1_ps(x))) - ref) / ref);
  }
  std::printf("exp8: largest relative error %.3g\n", worst);
  EXPECT_LE(worst, 1.5 * 0x1p-23);
  // Past the clamp: exp(-87) and exp(88), finite and positive.
  EXPECT_FLOAT_EQ(lane0(exp8(_mm256_set1_ps(-200.0f))), std::exp(-87.0f));
  EXPECT_FLOAT_EQ(lane0(exp8(_mm256_set1_ps(200.0f))), std::exp(88.0f));
}

TEST(FastSilu, SiluIsWithinItsBoundAndKeepsItsLimits) {
  double worst = 0;
  for (double xd = -80.0; xd <= 80.0; xd += 1e-4) {
    const float x = (float)xd;
    const double ref = silu_ref(x);
    if (ref == 0.0) continue;
    worst = std::max(worst, std::fabs(lane0(silu8(_mm256_set1_ps(x))) - ref) / std::fabs(ref));
  }
  std::printf("silu8: largest relative error %.3g\n", worst);
  EXPECT_LE(worst, 0x1p-22);
  EXPECT_EQ(lane0(silu8(_mm256_set1_ps(0.0f))), 0.0f);
  // Below −88 the limit, 0, however large |x| (exp8's clamp alone would leave x / exp(88)).
  for (float x : {-88.5f, -500.0f, -1e38f, -std::numeric_limits<float>::max(), -std::numeric_limits<float>::infinity()})
    EXPECT_EQ(lane0(silu8(_mm256_set1_ps(x))), 0.0f) << x;
  EXPECT_EQ(lane0(silu8(_mm256_set1_ps(500.0f))), 500.0f);
  EXPECT_EQ(lane0(silu8(_mm256_set1_ps(std::numeric_limits<float>::infinity()))), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(lane0(silu8(_mm256_set1_ps(std::numeric_limits<float>::quiet_NaN())))));
}

// The two loops over a width with a tail (not a multiple of 8): every element, each lane its own
// value, and each value's bits independent of its place in the array.
TEST(FastSilu, SwigluAndGateCoverEveryElement) {
  for (size_t n : {1, 8, 13, 64, 71}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<float> g(n), u(n), o(n), z(n);
    for (size_t i = 0; i < n; i++) {
      g[i] = -6.0f + 0.37f * (float)i, u[i] = 0.5f - 0.11f * (float)i;
      o[i] = 1.0f + 0.05f * (float)i, z[i] = 3.0f - 0.29f * (float)i;
    }
    std::vector<float> g_out = g, o_out = o;
    swiglu_fast(g_out.data(), u.data(), n);
    mul_silu_fast(o_out.data(), z.data(), n);
    for (size_t i = 0; i < n; i++) {
      const double want_g = silu_ref(g[i]) * u[i], want_o = (double)o[i] * silu_ref(z[i]);
      EXPECT_NEAR(g_out[i], want_g, 5e-7 * std::fabs(want_g) + 1e-30) << "element " << i;
      EXPECT_NEAR(o_out[i], want_o, 5e-7 * std::fabs(want_o) + 1e-30) << "element " << i;
      // The same bits as the value computed alone (a tail takes the lanes' arithmetic too).
      float g1 = g[i], o1 = o[i];
      swiglu_fast(&g1, &u[i], 1);
      mul_silu_fast(&o1, &z[i], 1);
      EXPECT_EQ(g_out[i], g1) << "element " << i;
      EXPECT_EQ(o_out[i], o1) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace rl::cpu::simd
