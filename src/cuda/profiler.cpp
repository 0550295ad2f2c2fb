#include "cuda/profiler.h"

#include <fmt/format.h>

namespace rl::cuda {

namespace {
const char* const kStageNames[kStageCount] = {"norms",   "projections", "deltanet",  "attention",
                                              "router",  "shared_exp",  "experts",   "lm_head",
                                              "backups", "copy_wait",   "prediction", "other",
                                              "copies"};
}  // namespace

std::string Profiler::report() const {
  if (!on) return "";
  double total = 0;
  for (int s = 0; s < kStageCount; s++) total += s == kCopies ? 0 : total_ms[s];
  std::string out = fmt::format("{:<12} {:>10} {:>7}\n", "stage", "GPU ms", "share");
  for (int s = 0; s < kStageCount; s++)
    out += fmt::format("{:<12} {:>10.3f} {:>6.1f}%{}\n", kStageNames[s], total_ms[s],
                       total > 0 ? 100.0 * total_ms[s] / total : 0.0,
                       s == kCopies ? " (copy stream, not in the total; expert kernels wait for it)" : "");
  out += fmt::format("{:<12} {:>10.3f}\n", "total", total);
  return out;
}

}  // namespace rl::cuda
