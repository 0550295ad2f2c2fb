// The oracle's commands end to end through the redlite binary: logits, generate, parity, and the
// errors a user can cause (exit code and a message naming the argument). The oracle is the exact
// tier (--numerics exact); the CPU backend's default, the fast tier, has tests/cpu/fast_cli_test.cpp.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include "model/parity.h"
#include "test_util.h"

namespace rl {
namespace {

using CliRun = test::ShellRun;
using test::run_redlite;

const std::string kStem = "tiny-qwen3next-q4km";

class OracleCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(test::redlite_bin())) GTEST_SKIP() << "redlite binary not built: " << test::redlite_bin();
    model_ = test::fixture(kStem + ".gguf");
    ref_path_ = test::fixture(kStem + ".ref-f32.json");
    RL_REQUIRE_FIXTURE(model_);
    RL_REQUIRE_FIXTURE(ref_path_);
    ref_ = load_reference(ref_path_);
  }
  std::string ids(const std::vector<int32_t>& v) const {
    std::string s;
    for (size_t i = 0; i < v.size(); i++) {
      if (i) s += ',';
      s += std::to_string(v[i]);
    }
    return s;
  }
  std::string model_, ref_path_;
  Reference ref_;
};

TEST_F(OracleCli, LogitsMatchReferenceFile) {
  const RefPrompt* p = ref_.find_prompt("short_en");
  const std::string out = (std::filesystem::temp_directory_path() / ("redlite-logits-" + std::to_string(getpid()) + ".f32")).string();
  const CliRun r = run_redlite("logits -m " + model_ + " --backend cpu --numerics exact --threads 2 --tokens " + ids(p->token_ids) + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::vector<float> got = read_f32_file(out, (size_t)ref_.n_vocab);
  const std::vector<float> want = read_f32_file(p->last_logits_path, (size_t)ref_.n_vocab);
  EXPECT_LE(relative_rms(got, want), kParityMaxRelRms);

  const CliRun all = run_redlite("logits -m " + model_ + " --numerics exact --tokens " + ids(p->token_ids) + " --all-positions --out " + out);
  ASSERT_EQ(all.exit_code, 0) << all.out;
  const std::vector<float> every = read_f32_file(out, p->token_ids.size() * (size_t)ref_.n_vocab);
  for (size_t i = 0; i < p->token_ids.size(); i++)
    EXPECT_EQ(argmax(std::span(every).subspan(i * ref_.n_vocab, ref_.n_vocab)), p->top1[i]) << i;
  std::filesystem::remove(out);
}

TEST_F(OracleCli, GreedyGenerateJsonMatchesReference) {
  const RefPrompt* p = ref_.find_prompt("chat");
  const CliRun r = run_redlite("generate -m " + model_ + " --numerics exact --tokens " + ids(p->token_ids) + " -n 32 --greedy --json", true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto line = r.out.substr(0, r.out.find('\n'));
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j.at("tokens").get<std::vector<int32_t>>(), p->greedy);
  EXPECT_EQ(j.at("backend"), "cpu");
}

TEST_F(OracleCli, ParityPassesOnF32ReferenceAndReportsNative) {
  const CliRun r = run_redlite("parity -m " + model_ + " --numerics exact --ref " + ref_path_ + " --prompts short_en,single_token --trace");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("short_en"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;

  const CliRun n = run_redlite("parity -m " + model_ + " --ref " + test::fixture(kStem + ".ref.json") + " --prompts short_en");
  EXPECT_EQ(n.exit_code, 0) << n.out;  // native: report only
  EXPECT_NE(n.out.find("report only"), std::string::npos) << n.out;
}

TEST_F(OracleCli, ParityFailsAgainstAnotherModelsReference) {
  // Model A's weights scored against model B's reference must FAIL (vocabularies differ: error).
  const CliRun r = run_redlite("parity -m " + test::fixture("tiny-qwen3next-iq2xxs.gguf") + " --ref " + ref_path_);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("n_vocab"), std::string::npos) << r.out;
}

TEST_F(OracleCli, UserErrorsExitNonZeroWithTheArgumentNamed) {
  CliRun r = run_redlite("logits -m " + model_ + " --tokens 1,x,3 --out /dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--tokens"), std::string::npos) << r.out;

  r = run_redlite("logits -m " + model_ + " --tokens 1,99999 --out /dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("99999"), std::string::npos) << r.out;

  r = run_redlite("generate -m " + model_ + " --tokens 1,2,3 -n 8 --greedy --ctx 4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("context"), std::string::npos) << r.out;

  r = run_redlite("generate -m /nonexistent/model.gguf --tokens 1 -n 1 --greedy");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("/nonexistent/model.gguf"), std::string::npos) << r.out;

  r = run_redlite("logits -m " + model_ + " --backend tpu --tokens 1 --out /dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("tpu"), std::string::npos) << r.out;

  // A thread count far past the machine's is refused before any thread starts, by every command.
  for (const std::string cmd : {"generate -m " + model_ + " --tokens 1 -n 1 --greedy", "serve -m " + model_ + " --port 0"}) {
    r = run_redlite(cmd + " --backend cpu --threads 10000");
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(r.out.find("--threads"), std::string::npos) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find("10000 is more than"), std::string::npos) << cmd << ": " << r.out;
  }
}


// The bench protocol at depth on the CPU backend: one row per depth with the prompt it prefilled
// and the decode tokens after it, and the KV bytes per token of the file: model B has one attention
// layer of 2 KV heads of dim 64, so K and V in f32 take 2 * 2 * 64 * 4 = 1,024 bytes a token.
TEST_F(OracleCli, BenchAtDepthReportsEachDepth) {
  CliRun r = run_redlite("bench -m " + model_ + " --backend cpu --reps 1 --depths 0,300 --depth-decode-tokens 4 --json "
                         "--kv-type f32",
                         true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kv_bytes_per_token"], 1024);
  EXPECT_EQ(j["kv_type"], "f32");
  ASSERT_EQ(j["depths"].size(), 2u);
  EXPECT_EQ(j["depths"][0]["depth"], 0);
  EXPECT_EQ(j["depths"][0]["prompt_tokens"], 16);  // depth 0: the main protocol's prompt
  EXPECT_EQ(j["depths"][1]["depth"], 300);
  EXPECT_EQ(j["depths"][1]["prompt_tokens"], 300);
  for (const auto& row : j["depths"]) {
    EXPECT_EQ(row["decode_tokens"], 4);
    EXPECT_GT(row["prefill_tok_s"].get<double>(), 0.0);
    EXPECT_GT(row["decode_tok_s"].get<double>(), 0.0);
  }
  EXPECT_EQ(j["context"], 304);
}

// A context past the file's context_length (262,144 for the fixtures) is refused before anything
// runs, naming the flag and the limit.
TEST_F(OracleCli, ContextPastTheModelsLimitIsRefused) {
  CliRun r = run_redlite("generate -m " + model_ + " --tokens 1,2 -n 1 --greedy --ctx 262145");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--ctx 262145"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("262144"), std::string::npos) << r.out;
  r = run_redlite("bench -m " + model_ + " --backend cpu --reps 1 --depths 262100");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("context_length of 262144"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace rl
