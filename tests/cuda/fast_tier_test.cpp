// The CUDA backend's fast tier against llama.cpp's F32 reference, teacher-forced on every prompt of
// the fixture models present: its top-1 agreement over all prompt positions must be at least, and
// its last-position relative RMS error (mean over the prompts) at most, what llama.cpp's own native
// path (`.ref.json`) scores against the same reference — the bar the CPU fast tier meets
// (tests/cpu/fast_parity_test.cpp), with every KV cache type (--kv-type; f16 is the tier's
// default). Needs a GPU and the fixtures.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "model/parity.h"
#include "test_util.h"

namespace rl {
namespace {

const char* const kStems[] = {"tiny-qwen3next-iq2xxs", "tiny-qwen3next-q4km"};

TEST(CudaFastTier, MeetsLlamaCppNativeBarOnTheFixtures) {
  if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped";
  std::string missing;
  int ran = 0;
  for (const char* name : kStems) {
    const std::string stem = test::fixture(name);
    if (!std::filesystem::exists(stem + ".gguf") || !std::filesystem::exists(stem + ".ref-f32.json") ||
        !std::filesystem::exists(stem + ".ref.json")) {
      missing += (missing.empty() ? "" : ", ") + stem;
      continue;
    }
    SCOPED_TRACE(name);
    const Reference f32 = load_reference(stem + ".ref-f32.json");
    const Reference native = load_reference(stem + ".ref.json");
    std::vector<std::string> names;
    for (const RefPrompt& p : f32.prompts) names.push_back(p.name);
    const TierAccuracy bar = native_accuracy(f32, native, names);

    for (KvType kv : {KvType::kF32, KvType::kF16, KvType::kBF16, KvType::kQ8_0}) {
      SCOPED_TRACE(kv_type_name(kv));
      cuda::CudaOptions opts;
      opts.numerics = Numerics::kFast;
      opts.kv_type = kv;
      auto backend = cuda::make_cuda_backend(Model::open(stem + ".gguf"), opts);
      auto session = backend->new_session(2048);
      std::vector<PromptParity> scored;
      for (const RefPrompt& p : f32.prompts)
        scored.push_back(score_prompt(run_prompt(*session, p.token_ids, 0), p, f32.n_vocab));
      const TierAccuracy got = tier_accuracy(scored);
      std::printf("[cuda fast tier] %s, KV %s: top-1 %.4f (bar %.4f), mean last rel rms %.4f (bar %.4f)\n", name,
                  kv_type_name(kv), got.top1_agreement(), bar.top1_agreement(), got.mean_last_rel_rms,
                  bar.mean_last_rel_rms);
      EXPECT_EQ(got.n_positions, bar.n_positions);
      EXPECT_GE(got.top1_agreement(), bar.top1_agreement());
      EXPECT_LE(got.mean_last_rel_rms, bar.mean_last_rel_rms);
    }
    ran++;
  }
  if (!missing.empty())
    GTEST_SKIP() << "fixture model or references not found: " << missing << " (set REDLITE_FIXTURES; ran " << ran
                 << ")";
}

}  // namespace
}  // namespace rl
