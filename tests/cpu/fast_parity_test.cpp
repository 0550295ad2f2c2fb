// The fast tier against llama.cpp's F32 reference, teacher-forced on every prompt of both fixture
// models: its top-1 agreement over all prompt positions must be at least, and its last-position
// relative RMS error (mean over the prompts) at most, what llama.cpp's own native path (quantised
// activations, `.ref.json`) scores against the same reference. The bar is computed from the two
// reference files; its figures are checked against ../shared/ANCHORS.md. Every KV cache type
// (--kv-type) must meet it: the fast tier's default is f16.
#include <gtest/gtest.h>

#include <cstdio>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/cpu_backend.h"
#include "model/parity.h"
#include "test_util.h"

namespace rl {

// So a failing parameterised test prints the KV type's name, not its bytes.
void PrintTo(KvType t, std::ostream* os) { *os << kv_type_name(t); }

namespace {

struct FixtureModel {
  const char* label;
  const char* stem;
  double anchor_top1, anchor_rel_rms;  // ANCHORS.md, "The fast numeric tier's accuracy bar"
};

const FixtureModel kModels[] = {
    {"A", "tiny-qwen3next-iq2xxs", 0.859, 0.0872},
    {"B", "tiny-qwen3next-q4km", 0.891, 0.0754},
};

// So a failing parameterised test prints "A", not the struct's bytes.
void PrintTo(const FixtureModel& m, std::ostream* os) { *os << m.label; }

class FastTierParity : public ::testing::TestWithParam<std::tuple<FixtureModel, KvType>> {};

TEST_P(FastTierParity, MeetsLlamaCppNativeBar) {
  const auto& [fm, kv] = GetParam();
  const std::string stem = test::fixture(fm.stem);
  RL_REQUIRE_FIXTURE(stem + ".gguf");
  RL_REQUIRE_FIXTURE(stem + ".ref-f32.json");
  RL_REQUIRE_FIXTURE(stem + ".ref.json");
  const Reference f32 = load_reference(stem + ".ref-f32.json");
  const Reference native = load_reference(stem + ".ref.json");
  std::vector<std::string> names;
  for (const RefPrompt& p : f32.prompts) names.push_back(p.name);
  ASSERT_EQ(names.size(), 7u);

  const TierAccuracy bar = native_accuracy(f32, native, names);
  EXPECT_NEAR(bar.top1_agreement(), fm.anchor_top1, 5e-4);
  EXPECT_NEAR(bar.mean_last_rel_rms, fm.anchor_rel_rms, 5e-5);

  auto backend = cpu::make_cpu_backend(Model::open(stem + ".gguf"), 2, Numerics::kFast, kv);
  auto session = backend->new_session(2048);
  std::vector<PromptParity> scored;
  for (const RefPrompt& p : f32.prompts)
    scored.push_back(score_prompt(run_prompt(*session, p.token_ids, 0), p, f32.n_vocab));
  const TierAccuracy got = tier_accuracy(scored);
  std::printf("[fast tier] model %s, KV %s: top-1 %.4f (bar %.4f), mean last rel rms %.4f (bar %.4f)\n", fm.label,
              kv_type_name(kv), got.top1_agreement(), bar.top1_agreement(), got.mean_last_rel_rms, bar.mean_last_rel_rms);
  EXPECT_EQ(got.n_positions, bar.n_positions);
  EXPECT_GE(got.top1_agreement(), bar.top1_agreement());
  EXPECT_LE(got.mean_last_rel_rms, bar.mean_last_rel_rms);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FastTierParity,
                         ::testing::Combine(::testing::ValuesIn(kModels),
                                            ::testing::Values(KvType::kF32, KvType::kF16, KvType::kBF16,
                                                              KvType::kQ8_0)),
                         [](const auto& info) {
                           return std::string("model_") + std::get<0>(info.param).label + "_kv_" +
                                  kv_type_name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace rl
