#include "common/argmax.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"

namespace rl {
namespace {

// The rule written out: the first index whose value no other value exceeds, NaNs left out.
int32_t first_largest(const std::vector<float>& v) {
  int32_t best = -1;
  for (size_t i = 0; i < v.size(); i++)
    if (!std::isnan(v[i]) && (best < 0 || v[i] > v[best])) best = (int32_t)i;
  return best < 0 ? 0 : best;
}

TEST(Argmax, MatchesTheRuleOnRowsOfEveryLengthAndPlace) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (size_t n : {1, 2, 3, 4, 5, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 4099, 151936}) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    EXPECT_EQ(argmax(v), first_largest(v)) << n;
    // The largest value placed at each end and in the middle (the last block, shorter than 16, too).
    for (size_t at : {size_t(0), n / 2, n - 1}) {
      std::vector<float> w = v;
      w[at] = 100.0f;
      EXPECT_EQ(argmax(w), (int32_t)at) << n << " at " << at;
    }
  }
}

TEST(Argmax, TiesGoToTheLowerIndex) {
  std::vector<float> v(151936, -1.0f);
  v[70001] = 3.0f, v[70000 + 16] = 3.0f, v[151935] = 3.0f;
  EXPECT_EQ(argmax(v), 70001);
  v[5] = 3.0f;
  EXPECT_EQ(argmax(v), 5);
  // +0 and -0 are equal: the first of them.
  std::vector<float> z = {-1.0f, -0.0f, 0.0f, -2.0f};
  EXPECT_EQ(argmax(z), 1);
  z = {-1.0f, 0.0f, -0.0f};
  EXPECT_EQ(argmax(z), 1);
}

TEST(Argmax, NaNsAreNeverTheLargest) {
  std::vector<float> v(40, 1.0f);
  v[0] = NAN, v[3] = NAN, v[17] = 2.0f, v[39] = NAN;
  EXPECT_EQ(argmax(v), 17);
  std::vector<float> nans(33, NAN);
  EXPECT_EQ(argmax(nans), 0);
  nans[32] = -INFINITY;
  EXPECT_EQ(argmax(nans), 32);
  std::vector<float> inf(20, -INFINITY);
  inf[19] = INFINITY;
  EXPECT_EQ(argmax(inf), 19);
}

TEST(Argmax, FirstAboveFindsTheFirstLargerValueFromWhereItStarts) {
  std::vector<float> v(100, 0.0f);
  v[3] = 1.0f, v[40] = 2.0f, v[47] = NAN, v[99] = 0.5f;
  EXPECT_EQ(first_above(v, 0, 0.0f), 3u);
  EXPECT_EQ(first_above(v, 4, 0.0f), 40u);
  EXPECT_EQ(first_above(v, 4, 1.5f), 40u);
  EXPECT_EQ(first_above(v, 41, 0.0f), 99u);  // the NaN at 47 is not larger; 99 is in the last, short block
  EXPECT_EQ(first_above(v, 41, 0.5f), 100u);
  EXPECT_EQ(first_above(v, 100, -1.0f), 100u);
  EXPECT_EQ(first_above(v, 0, 2.0f), 100u);  // equal is not larger
  for (size_t from = 0; from < 100; from++) {
    size_t want = from;
    while (want < v.size() && !(v[want] > 0.25f)) want++;
    EXPECT_EQ(first_above(v, from, 0.25f), want) << from;
  }
}

TEST(Argmax, AnEmptyRowIsAnError) {
  EXPECT_THROW(argmax(std::vector<float>{}), Error);
}

}  // namespace
}  // namespace rl
