// The fast tier through the redlite binary: --numerics on the CPU backend (default fast), its
// parity verdict against llama.cpp's native bar, bench's JSON naming the tier, and the CUDA
// backend's refusal of the tier it does not have.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "model_b_test.h"
#include "test_util.h"

namespace rl {
namespace {

using test::run_redlite;

class FastCli : public test::ModelBCliTest {};

TEST_F(FastCli, ParityPrintsTheFiguresAgainstTheNativeBar) {
  const std::string ref = test::fixture("tiny-qwen3next-q4km.ref-f32.json");
  const auto r = run_redlite("parity -m " + model_ + " --backend cpu --numerics fast --threads 2 --ref " + ref);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("fast numerics"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("top-1 agreement"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(bar >= 0.8913)  PASS"), std::string::npos) << r.out;  // ANCHORS.md: 0.891
  EXPECT_NE(r.out.find("(bar <= 0.0754)  PASS"), std::string::npos) << r.out;  // ANCHORS.md: 0.0754
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
}

TEST_F(FastCli, BenchJsonNamesTheTier) {
  const std::string common = "bench -m " + model_ + " --backend cpu --threads 2 --reps 1 --decode-tokens 2 "
                             "--prefill-tokens 8 --json";
  auto r = run_redlite(common, true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("numerics"), "fast");  // the CPU backend's default
  r = run_redlite(common + " --numerics exact", true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("numerics"), "exact");
}

TEST_F(FastCli, BadTierIsRefused) {
  auto r = run_redlite("logits -m " + model_ + " --backend cpu --numerics fastest --tokens 1 --out /dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--numerics"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace rl
