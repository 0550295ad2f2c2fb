// What a constraint costs a generation per token on the real 151,936-token vocabulary (fixture
// model A's tokenizer), with a session whose decode only writes its logits, so the figure is the
// constraint's: the sampling thread's time in next_token() beyond the same run unconstrained.
// The next step's mask is computed while the session decodes (generation.h); this reports how
// much of it the sampling thread still waits for, and checks the constrained reply is the
// document the greedy logits and the budget make of it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "fakes.h"
#include "generate/generation.h"
#include "generate/json_schema_grammar.h"
#include "generate/token_trie.h"
#include "model/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace rl;

namespace {

struct StepTimes {
  double next_token_seconds = 0;  // on the sampling thread, summed over the steps
  int steps = 0;
  GenerationResult result;
};

// Runs one generation by its steps, timing next_token() alone.
StepTimes run_steps(Generator& gen, const std::vector<int32_t>& prompt, const GenerationConfig& cfg) {
  StepTimes t;
  Generation g(gen, prompt, cfg, nullptr);
  while (g.prefilling()) g.prefill_chunk();
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<int32_t> token = g.next_token();
    t.next_token_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++t.steps;
    if (!token) break;
    g.decoded(gen.session().decode(*token));
  }
  t.result = g.finish();
  return t;
}

}  // namespace

TEST(ConstrainedGeneration, PerTokenOverheadOnTheRealVocabulary) {
  const std::string path = test::fixture("tiny-qwen3next-iq2xxs.gguf");
  RL_REQUIRE_FIXTURE(path);
  const auto model = Model::open(path);
  const auto tok = Tokenizer::from_gguf(model->gguf());
  ASSERT_EQ(tok->n_vocab(), 151936);
  auto trie = std::make_shared<const TokenTrie>(*tok);
  const int32_t word = tok->encode(" word", false).at(0);
  const std::vector<int32_t> prompt = tok->encode("Say something.", false);

  constexpr int kTokens = 200, kRuns = 3;
  auto grammar = std::make_shared<const Grammar>(json_schema_grammar(nlohmann::ordered_json::parse(R"({"type":"string"})")));
  double free_seconds = 0, constrained_seconds = 0, waited = 0, computed = 0;
  int free_steps = 0, constrained_steps = 0;
  for (int run = 0; run < kRuns; ++run) {
    for (bool constrained : {false, true}) {
      // The logits always favour " word": inside the string the constraint lets it through.
      test::FakeSession session(tok->n_vocab(), [&](const std::vector<int32_t>&) { return word; }, 4096);
      Generator gen(session, *tok, trie);
      GenerationConfig cfg;
      cfg.max_tokens = kTokens;
      cfg.sampling.temperature = 0;
      if (constrained) cfg.constraint.grammar = grammar;
      const StepTimes t = run_steps(gen, prompt, cfg);
      if (!constrained) {
        EXPECT_EQ(t.result.finish, FinishReason::Length);
        EXPECT_EQ(t.result.tokens, std::vector<int32_t>(kTokens, word));
        free_seconds += t.next_token_seconds;
        free_steps += t.steps;
        continue;
      }
      // The opening quote, " word" while the budget lasts, the closing quote, the end.
      const std::string& text = t.result.text;
      ASSERT_EQ(t.result.finish, FinishReason::Stop) << text;
      ASSERT_GE(text.size(), 2u);
      EXPECT_EQ(text.front(), '"');
      EXPECT_EQ(text.back(), '"');
      EXPECT_NE(text.find(" word word word"), std::string::npos) << text;
      EXPECT_EQ(t.result.constrained_steps, (int)t.result.tokens.size());
      constrained_seconds += t.next_token_seconds;
      constrained_steps += t.steps;
      waited += t.result.constraint_seconds;
      computed += t.result.constraint_compute_seconds;
    }
  }
  const double free_us = 1e6 * free_seconds / free_steps, constrained_us = 1e6 * constrained_seconds / constrained_steps;
  std::printf("[ overhead ] next_token(): %.1f us a token unconstrained, %.1f us constrained (+%.1f us); "
              "masks %.1f us computed, %.1f us on the sampling thread (waiting and accepting)\n",
              free_us, constrained_us, constrained_us - free_us, 1e6 * computed / constrained_steps,
              1e6 * waited / constrained_steps);
}
