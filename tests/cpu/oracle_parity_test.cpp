// The CPU oracle against llama.cpp's references on the two fixture models.
//   *.ref-f32.json (llama.cpp on dequantised F32 weights): asserted. Last-position logits within
//   1e-4 relative RMS, the same top-1 at every prompt position, the same 32-token greedy
//   continuation (real greedy: each step feeds back its own token), for every prompt.
//   *.ref.json (llama.cpp's quantised-activation kernels): reported, not asserted; those numbers
//   differ from any fp32 computation by design (fixtures README, "Reference outputs").
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include "cpu/cpu_backend.h"
#include "model/model.h"
#include "model/parity.h"
#include "test_util.h"

namespace rl {
namespace {

struct FixtureModel {
  const char* stem;  // file name without .gguf
  const char* label;
};
void PrintTo(const FixtureModel& m, std::ostream* os) { *os << "model " << m.label; }
const FixtureModel kModels[] = {{"tiny-qwen3next-iq2xxs", "A"}, {"tiny-qwen3next-q4km", "B"}};

// The native-reference figures are printed as markdown table rows and, when REDLITE_ORACLE_REPORT
// names a file, appended to it (that is how docs/perf/oracle.md's table is made).
void report_native(const std::string& line) {
  std::printf("[oracle vs native] %s\n", line.c_str());
  if (const char* out = std::getenv("REDLITE_ORACLE_REPORT"); out && *out) std::ofstream(out, std::ios::app) << line << "\n";
}

class OracleParity : public ::testing::TestWithParam<FixtureModel> {};

TEST_P(OracleParity, MatchesF32ReferenceOnEveryPrompt) {
  const FixtureModel fm = GetParam();
  const std::string gguf = test::fixture(std::string(fm.stem) + ".gguf");
  const std::string ref_f32_path = test::fixture(std::string(fm.stem) + ".ref-f32.json");
  const std::string ref_native_path = test::fixture(std::string(fm.stem) + ".ref.json");
  RL_REQUIRE_FIXTURE(gguf);
  RL_REQUIRE_FIXTURE(ref_f32_path);
  RL_REQUIRE_FIXTURE(ref_native_path);
  const Reference ref = load_reference(ref_f32_path);
  ASSERT_TRUE(ref.is_f32);
  const Reference native = load_reference(ref_native_path);

  auto model = Model::open(gguf);
  ASSERT_EQ(model->config().n_vocab, ref.n_vocab);
  auto backend = cpu::make_cpu_backend(model, 0);
  auto session = backend->new_session(2048);

  for (const RefPrompt& p : ref.prompts) {
    SCOPED_TRACE(std::string(fm.label) + " " + p.name);
    const auto t0 = std::chrono::steady_clock::now();
    const PromptRun run = run_prompt(*session, p.token_ids, (int)p.greedy.size(), 256);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const PromptParity r = score_prompt(run, p, ref.n_vocab);
    std::printf("[oracle vs F32]    %s %-13s %5d tok  top1 %d/%d  last rel rms %.2e  max abs %.2e  greedy %d/%d  (%.1f s)\n",
                fm.label, p.name.c_str(), r.n_tokens, r.top1_agree, r.n_tokens, r.last_rel_rms,
                r.last_max_abs, r.greedy_common, r.greedy_len, secs);
    EXPECT_LE(r.last_rel_rms, kParityMaxRelRms);
    EXPECT_EQ(r.top1_agree, r.n_tokens) << "first differing position " << r.first_top1_mismatch;
    EXPECT_EQ(r.greedy_common, r.greedy_len) << "greedy continuation differs from step " << r.greedy_common;

    const RefPrompt* np = native.find_prompt(p.name);
    EXPECT_NE(np, nullptr) << "prompt " << p.name << " is missing from " << ref_native_path;
    if (np) {
      const PromptParity n = score_prompt(run, *np, native.n_vocab);
      const std::string line = fmt::format(
          "| {} | {} | {} | {:.4f} | {:.3f} | {}/{} ({:.0f} %) | {}/{} |", fm.label, p.name, n.n_tokens,
          n.last_rel_rms, n.last_max_abs, n.top1_agree, n.n_tokens, 100.0 * n.top1_agreement(),
          n.greedy_common, n.greedy_len);
      report_native(line);
    }
  }
}

// Hand-computed, k = 2: two passes of one and two tokens equal one pass of three; then one
// differing id, an id only one side recorded, a layer only one side recorded, and a swap.
TEST(ParityMetrics, CountsSelectionMismatchesLayerByLayer) {
  auto record = [](std::initializer_list<std::pair<const char*, std::vector<int32_t>>> passes) {
    SelectionRecorder r;
    r.tensor("ffn_moe_logits-0", 1, 1, nullptr);  // not a selection: ignored
    for (const auto& [name, ids] : passes) r.ids(name, (int)ids.size() / 2, 2, ids.data());
    return r;
  };
  const SelectionRecorder a = record({{"ffn_moe_topk-0", {1, 2}}, {"ffn_moe_topk-1", {3, 4}},
                                      {"ffn_moe_topk-0", {5, 6, 7, 8}}, {"ffn_moe_topk-1", {9, 10, 11, 12}}});
  const SelectionRecorder one_pass =
      record({{"ffn_moe_topk-0", {1, 2, 5, 6, 7, 8}}, {"ffn_moe_topk-1", {3, 4, 9, 10, 11, 12}}});
  EXPECT_EQ(count_selection_mismatches(a, one_pass), 0);
  EXPECT_EQ(count_selection_mismatches(
                a, record({{"ffn_moe_topk-0", {1, 2, 5, 6, 7, 9}}, {"ffn_moe_topk-1", {3, 4, 9, 10, 11, 12}}})),
            1);
  EXPECT_EQ(count_selection_mismatches(
                a, record({{"ffn_moe_topk-0", {1, 2, 5, 6}}, {"ffn_moe_topk-1", {3, 4, 9, 10, 11, 12}}})),
            2);
  EXPECT_EQ(count_selection_mismatches(a, record({{"ffn_moe_topk-0", {1, 2, 5, 6, 7, 8}}})), 6);
  EXPECT_EQ(count_selection_mismatches(
                a, record({{"ffn_moe_topk-0", {2, 1, 5, 6, 7, 8}}, {"ffn_moe_topk-1", {3, 4, 9, 10, 11, 12}}})),
            2);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OracleParity, ::testing::ValuesIn(kModels),
                         [](const auto& info) { return std::string("model_") + info.param.label; });

// Every intermediate tensor of the short_en pass against llama.cpp's F32 trace: this is what
// locates a mismatch (the first tensor off names the stage).
class OracleTrace : public ::testing::TestWithParam<FixtureModel> {};

TEST_P(OracleTrace, ShortEnTraceMatchesF32Reference) {
  const FixtureModel fm = GetParam();
  const std::string gguf = test::fixture(std::string(fm.stem) + ".gguf");
  const std::string ref_path = test::fixture(std::string(fm.stem) + ".ref-f32.json");
  RL_REQUIRE_FIXTURE(gguf);
  RL_REQUIRE_FIXTURE(ref_path);
  const Reference ref = load_reference(ref_path);
  const RefPrompt* p = ref.find_prompt(ref.trace_prompt);
  ASSERT_NE(p, nullptr);
  const auto want = ref.load_trace();
  ASSERT_FALSE(want.empty());

  auto model = Model::open(gguf);
  auto backend = cpu::make_cpu_backend(model, 0);
  auto session = backend->new_session(256);
  RecordingTrace rec;
  session->set_trace(&rec);
  session->prefill(p->token_ids);

  for (const std::string& name : ref.trace_names) {
    const TraceDiff d = compare_trace(rec.tensors, {{name, want.at(name)}}).at(0);
    SCOPED_TRACE(std::string(fm.label) + " " + name);
    ASSERT_FALSE(d.missing) << "the oracle did not emit " << name << " with the reference's shape";
    if (d.is_i32) {
      std::printf("[trace] %s %-20s rows differing %d\n", fm.label, name.c_str(), d.rows_differing);
      EXPECT_EQ(d.rows_differing, 0);
    } else {
      std::printf("[trace] %s %-20s rel rms %.2e\n", fm.label, name.c_str(), d.rel_rms);
      EXPECT_LE(d.rel_rms, kParityMaxRelRms);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OracleTrace, ::testing::ValuesIn(kModels),
                         [](const auto& info) { return std::string("model_") + info.param.label; });

}  // namespace
}  // namespace rl
