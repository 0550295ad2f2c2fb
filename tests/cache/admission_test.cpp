// AdaptiveAdmission (cache/admission.h): a given --miss-admit is used as it is; unset, the count is
// the low one until the recent hit rate (the first token's, then a moving average) reaches the
// threshold, the high one while it stays there, the low one again once it falls below. The
// averages and token counts are hand-computed (the recurrence r += (x - r) / 32).
#include <gtest/gtest.h>

#include "cache/admission.h"

namespace rl {
namespace {

// Tokens of `hits` of 480 selections observed until the count changes from what it was; -1 when it
// has not after 1,000.
int tokens_until_the_count_changes(AdaptiveAdmission& a, int hits) {
  const int before = a.limit();
  for (int n = 1; n <= 1000; n++) {
    a.observe(hits, 480);
    if (a.limit() != before) return n;
  }
  return -1;
}

TEST(AdaptiveAdmission, AGivenCountIsUsedWhateverTheHitRate) {
  for (const int given : {0, 16, 64, 512}) {
    AdaptiveAdmission a(given);
    EXPECT_EQ(a.limit(), given);
    for (int i = 0; i < 200; i++) a.observe(480, 480);
    EXPECT_EQ(a.limit(), given);
  }
}

TEST(AdaptiveAdmission, TheRateIsTheFirstTokensThenAMovingAverage) {
  AdaptiveAdmission a;
  EXPECT_EQ(a.recent_hit_rate(), 0.0);
  EXPECT_EQ(a.limit(), AdaptiveAdmission::kAdmitLow);
  a.observe(360, 480);
  EXPECT_DOUBLE_EQ(a.recent_hit_rate(), 0.75);
  EXPECT_EQ(a.limit(), AdaptiveAdmission::kAdmitHigh);
  a.observe(0, 480);  // 0.75 + (0 - 0.75) / 32
  EXPECT_DOUBLE_EQ(a.recent_hit_rate(), 0.75 - 0.75 / 32);
  a.observe(480, 480);
  const double r = 0.75 - 0.75 / 32;
  EXPECT_DOUBLE_EQ(a.recent_hit_rate(), r + (1 - r) / 32);
}

TEST(AdaptiveAdmission, TheCountFollowsTheRateAcrossTheThreshold) {
  // A uniform model's rate at 8 GiB (178 of 480 selections hit, 0.37): the low count.
  AdaptiveAdmission a;
  a.observe(178, 480);
  EXPECT_EQ(a.limit(), AdaptiveAdmission::kAdmitLow);
  // Then a skewed model's (408 of 480, 0.85): r_n = 0.85 - (0.85 - 0.37) (31/32)^n reaches 0.6 at
  // n = 21 ((31/32)^20 = 0.530 > 0.25 / 0.479 = 0.522 > (31/32)^21 = 0.513).
  const int n = tokens_until_the_count_changes(a, 408);
  ASSERT_EQ(n, 21);
  EXPECT_EQ(a.limit(), AdaptiveAdmission::kAdmitHigh);
  for (int i = n; i < 200; i++) a.observe(408, 480);
  EXPECT_EQ(a.limit(), AdaptiveAdmission::kAdmitHigh);
  EXPECT_NEAR(a.recent_hit_rate(), 0.85, 0.002);
  // Back to 0.37: r falls from about 0.85 under 0.6 after 24 tokens.
  EXPECT_EQ(tokens_until_the_count_changes(a, 178), 24);
  EXPECT_EQ(a.limit(), AdaptiveAdmission::kAdmitLow);
  EXPECT_LT(a.recent_hit_rate(), AdaptiveAdmission::kAdmitHitRate);
}

TEST(AdaptiveAdmission, ImpossibleCountsAreRefused) {
  AdaptiveAdmission a;
  EXPECT_THROW(a.observe(1, 0), Error);
  EXPECT_THROW(a.observe(-1, 10), Error);
  EXPECT_THROW(a.observe(11, 10), Error);
  EXPECT_EQ(a.recent_hit_rate(), 0.0);
  EXPECT_EQ(a.limit(), AdaptiveAdmission::kAdmitLow);
}

}  // namespace
}  // namespace rl
