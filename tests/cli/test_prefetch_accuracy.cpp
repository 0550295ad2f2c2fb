// bench/prefetch_accuracy on a fixture model: its self-check (each layer predicted from its own MoE
// input with this tool's norm, router and top-k) gives back the oracle's selections, so the early
// and late figures it prints are predictions made as the backend makes them; and bad input is
// refused with a message.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>

#include "test_util.h"

namespace {

rl::test::ShellRun run_tool(const std::string& args) {
  return rl::test::run_shell("'" + std::string(PREFETCH_ACCURACY_BIN) + "' " + args + " 2>&1");
}

// The accuracy on the line whose label starts with `label`, or -1.
double accuracy_of(const std::string& out, const std::string& label) {
  std::smatch m;
  const std::regex re(label + "[^\\n]*accuracy ([0-9.]+)");
  return std::regex_search(out, m, re) ? std::atof(m[1].str().c_str()) : -1.0;
}

TEST(PrefetchAccuracy, SelfCheckReproducesTheOraclesSelections) {
  const std::string model = rl::test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  const auto r = run_tool("-m '" + model + "' --prompt-tokens 8 --decode-tokens 8 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("chance 0.1562"), std::string::npos) << r.out;  // 10 of 64 experts
  // Near-ties of the 10th and 11th logits, summed in another order than the oracle's, may flip a
  // selection; none did on this model (1.0000), and a wrong norm or router would lose many.
  EXPECT_GE(accuracy_of(r.out, "self-check"), 0.99) << r.out;
  // The predictions from the previous layer's residual beat chance by far (early 0.66, late 0.80
  // on this model, dev 2026-12-01): at least twice chance, so a prediction that read the wrong
  // layer's router or residual (near chance) fails.
  for (const char* label : {"early", "late"}) {
    const double a = accuracy_of(r.out, label);
    EXPECT_GT(a, 2 * 0.1562) << label << ":\n" << r.out;
    EXPECT_LE(a, 1.0) << label;
  }
}

TEST(PrefetchAccuracy, RefusesAMissingModel) {
  const auto r = run_tool("-m /nonexistent/model.gguf");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("/nonexistent/model.gguf"), std::string::npos) << r.out;
}

}  // namespace
