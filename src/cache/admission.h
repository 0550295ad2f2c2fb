// How many of a decode token's misses a bounded cache takes in after the token (--miss-reads host,
// docs/cuda.md "Misses read in place"). Each admission costs the link time of one expert before the
// next token, and pays only if the expert is selected again before it is evicted: under uniform
// routing (every expert as likely; the hit rate stays near the cache's share of the experts) few
// admissions pay, under skewed routing (real routers: some experts far more often) many do. On one
// H100 host (2026-12-06, d9f9889's A/B, docs/PERF.md), decode tok/s admitting 16 / 64: uniform
// routers at 8 GiB (hit rate 0.37 admitting 16) 92.8, 92.3 / 89.8, 90.0, at 2 GiB 73.1, 73.4 / 69.0,
// 69.1; the skewed model (`--router-skew 1.0`, 0.85 admitting 64) 153.1, 152.9 / 155.1, 154.4.
//
// With no count given (--miss-admit unset), the count follows the recent decode hit rate: kAdmitLow
// while it is under kAdmitHitRate, kAdmitHigh from there on. The threshold lies between the rates
// measured (0.11, 0.37 uniform; 0.85 skewed); it was not tuned further. The rate is the first token's, then an
// exponential moving average over the tokens (weight 1 / kAdmitWindow for the newest). Pure CPU,
// unit-tested.
#pragma once
#include "common/error.h"

namespace rl {

class AdaptiveAdmission {
 public:
  static constexpr int kAdmitLow = 16, kAdmitHigh = 64;
  static constexpr double kAdmitHitRate = 0.6;
  static constexpr int kAdmitWindow = 32;

  // given: the --miss-admit count, or a negative value for the adaptive one.
  explicit AdaptiveAdmission(int given = -1) : given_(given) {}

  // A decode token's selections: of `selections`, `hits` were resident.
  void observe(int hits, int selections) {
    if (selections <= 0 || hits < 0 || hits > selections)
      fail("AdaptiveAdmission: {} hits of {} selections", hits, selections);
    const double r = (double)hits / selections;
    rate_ = observed_ ? rate_ + (r - rate_) / kAdmitWindow : r;
    observed_ = true;
  }
  // The misses of the token just observed to take in.
  int limit() const {
    if (given_ >= 0) return given_;
    return rate_ < kAdmitHitRate ? kAdmitLow : kAdmitHigh;
  }
  double recent_hit_rate() const { return rate_; }

 private:
  int given_;
  double rate_ = 0;  // 0 until a token is observed
  bool observed_ = false;
};

}  // namespace rl
