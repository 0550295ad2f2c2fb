// How many of a decode token's misses a bounded cache takes in after the token (--miss-reads host,
// docs/cuda.md "Misses read in place"). Each admission costs the link time of one expert before the
// next token, and pays only if the expert is selected again before it is evicted: under uniform
// routing (every expert as likely; the hit rate stays near the cache's share of the experts) few
// admissions pay, under skewed routing (real routers: some experts far more often) many do. On the
// H100 (2026-12-06, docs/PERF.md): uniform routers at 8 GiB (hit rate 0.37) decoded 110.2 tok/s
// admitting 16 a token against 103.4 admitting 64; the skewed model (`--router-skew 1.0`, hit rate
// 0.85) 164.7 admitting 64, and before the staged reads 152.6 against 136.6 admitting 16.
//
// With no count given (--miss-admit unset), the count follows the recent decode hit rate: kAdmitLow
// while it is under kAdmitHitRate, kAdmitHigh from there on. The rate is the first token's, then an
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
  bool adaptive() const { return given_ < 0; }

 private:
  int given_;
  double rate_ = 0;  // 0 until a token is observed
  bool observed_ = false;
};

}  // namespace rl
