// `redlite bench --batch N`: N sequences decoded together in decode-tokens − 1 batched steps; the
// JSON's counts follow from the flags, its two speeds agree (N tokens a step) and the step's parts
// lie within it (as a decode token's pick lies within the token's time in the one-sequence
// protocol); a batch outside 2..16 and the other protocols' flags are refused by name.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "test_util.h"

namespace {

using rl::test::run_redlite;

// `redlite bench --json` of model B on the CPU, one thread and one rep, with `flags`: its JSON (a
// null one, the failure recorded, when it exits non-zero).
nlohmann::json bench_json(const std::string& model, const std::string& flags) {
  const auto r = run_redlite("bench -m '" + model + "' --backend cpu --threads 1 --reps 1 --json " + flags);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  if (r.exit_code != 0) return {};
  return nlohmann::json::parse(r.out.substr(r.out.find('{')));
}

TEST(BenchBatch, CountsAndSpeedsFollowTheSteps) {
  const std::string model = rl::test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  const auto j = bench_json(model, "--batch 3 --decode-tokens 5 --prompt-tokens 6");
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["batch"], 3);
  EXPECT_EQ(j["steps"], 4);
  EXPECT_EQ(j["tokens"], 12);
  EXPECT_EQ(j["prompt_tokens"], 6);
  const double tok_s = j["decode_tok_s"], step_ms = j["step_ms"];
  ASSERT_GT(tok_s, 0.0);
  ASSERT_GT(step_ms, 0.0);
  // One rep: both come from the same time, so a step holds the batch's 3 tokens.
  EXPECT_NEAR(tok_s * step_ms / 1000.0, 3.0, 1e-6);
  // The step's parts (the first step, the later steps' calls, the greedy picks after each) lie
  // within the steps' wall time.
  const double first = j["first_step_ms"], later = j["later_step_call_ms"], argmax = j["argmax_ms"];
  EXPECT_GT(first, 0.0);
  EXPECT_GT(later, 0.0);
  EXPECT_GE(argmax, 0.0);
  EXPECT_LE(first + 3 * later + 4 * argmax, 4 * step_ms * (1 + 1e-9));
}

// --batch-prefill: the prompts in one prefill_batch_into call, timed as prefill_ms (as the prompts
// one after another are without it); alone, without --batch, it is refused by name.
TEST(BenchBatch, PromptsPrefilledInOneCallAreTimed) {
  const std::string model = rl::test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  for (const bool one_call : {false, true}) {
    const auto j = bench_json(model, std::string("--batch 3 --decode-tokens 3 --prompt-tokens 7") +
                                         (one_call ? " --batch-prefill" : ""));
    ASSERT_FALSE(j.is_null());
    EXPECT_EQ(j["batch_prefill"], one_call);
    EXPECT_GT(j["prefill_ms"].get<double>(), 0.0);
    EXPECT_EQ(j["tokens"], 6);
  }
  const auto r = run_redlite("bench -m '" + model + "' --backend cpu --batch-prefill");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("--batch-prefill goes with --batch"), std::string::npos) << r.out;
}

// The one-sequence protocol's greedy picks: a part of a decode token's time.
TEST(BenchBatch, TheDecodeTokensPickIsPartOfItsTime) {
  const std::string model = rl::test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  const auto j = bench_json(model, "--decode-tokens 9 --prefill-tokens 8 --prompt-tokens 4");
  ASSERT_FALSE(j.is_null());
  const double tok_s = j["decode_tok_s"], pick_ms = j["decode_argmax_ms"];
  ASSERT_GT(tok_s, 0.0);
  EXPECT_GE(pick_ms, 0.0);
  EXPECT_LT(pick_ms, 1000.0 / tok_s);
}

TEST(BenchBatch, RefusesWhatItCannotRun) {
  const std::string model = rl::test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  for (const char* n : {"1", "17"}) {
    const auto r = run_redlite("bench -m '" + model + "' --backend cpu --batch " + n);
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("--batch"), std::string::npos) << r.out;
  }
  for (const char* other : {"--depths 0", "--record-routing x.bin"}) {
    const auto r = run_redlite("bench -m '" + model + "' --backend cpu --batch 2 " + other);
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("does not combine with --depths or --record-routing"), std::string::npos) << r.out;
  }
}

}  // namespace
