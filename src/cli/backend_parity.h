// `redlite parity --backend cuda` without --ref: a backend measured against the CPU oracle on the
// same model (DESIGN.md §6: top-1 per position, relative RMS error of the logits, greedy
// continuation, router mismatches). Called by parity.cpp.
#pragma once
#include <vector>

#include "cli/common_options.h"

namespace rl::cli {

struct BackendParityOptions {
  int repeat = 1;          // passes over the prompts on one backend (2: the second on a warm cache)
  int prompt_tokens = 32;  // length of the longest prompt
  int greedy = 24;         // greedy tokens compared after each prompt
  double max_rel_rms = 1e-3;
  // Expert-cache budgets to test, as fractions of all routed experts (1: all resident). Empty:
  // the one budget of --cache-mib. The oracle runs once for all of them.
  std::vector<double> budget_fractions;
};

// Returns the exit code: 0 when every bound holds.
int run_backend_parity(const CommonOptions& common, const BackendParityOptions& o);

}  // namespace rl::cli
