// --kv-type through the redlite binary: the bytes per token inspect and bench report (worked out
// from model B's shapes in the fixtures README), the types a tier refuses, and a run in each type.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "model_b_test.h"
#include "test_util.h"

namespace rl {
namespace {

// Bounded: a serve that did not refuse a flag would listen until killed.
test::ShellRun run_redlite(const std::string& args, bool stdout_only = false) {
  return test::run_redlite(args, stdout_only, true);
}

// Model B: one attention layer (3) of 2 KV heads of 64 values; a token adds a K and a V row of
// 128 values: f32 2·128·4 = 1024 bytes, f16 and bf16 512, q8_0 2·(128 + 4 blocks · 2) = 272.
const std::pair<const char*, size_t> kBytesPerToken[] = {{"f32", 1024}, {"f16", 512}, {"bf16", 512}, {"q8_0", 272}};

class KvCli : public test::ModelBCliTest {};

TEST_F(KvCli, InspectReportsTheBytesOfEachType) {
  for (auto [type, bytes] : kBytesPerToken) {
    const auto r = run_redlite("inspect " + model_ + " --json --ctx 1000 --kv-type " + type, true);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const nlohmann::json kv = nlohmann::json::parse(r.out).at("kv_cache");
    EXPECT_EQ(kv.at("type"), type);
    EXPECT_EQ(kv.at("bytes_per_token"), bytes) << type;
    EXPECT_EQ(kv.at("context"), 1000);
    EXPECT_EQ(kv.at("bytes"), 1000 * bytes) << type;
  }
  // Defaults: the fast tier's f16; the exact tier's f32; the model's context_length (fixtures README: 262,144).
  auto kv = nlohmann::json::parse(run_redlite("inspect " + model_ + " --json", true).out).at("kv_cache");
  EXPECT_EQ(kv.at("type"), "f16");
  EXPECT_EQ(kv.at("context"), 262144);
  kv = nlohmann::json::parse(run_redlite("inspect " + model_ + " --json --numerics exact", true).out).at("kv_cache");
  EXPECT_EQ(kv.at("type"), "f32");
  const auto text = run_redlite("inspect " + model_ + " --kv-type q8_0 --ctx 10");
  EXPECT_NE(text.out.find("KV cache: q8_0, 272 bytes per token; 2720 bytes"), std::string::npos) << text.out;
}

TEST_F(KvCli, BenchJsonNamesTheTypeAndItsBytes) {
  const std::string common = "bench -m " + model_ + " --backend cpu --threads 2 --reps 1 --decode-tokens 2 "
                             "--prefill-tokens 8 --json";
  for (auto [type, bytes] : kBytesPerToken) {
    const auto r = run_redlite(common + " --kv-type " + type, true);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("kv_type"), type);
    EXPECT_EQ(j.at("kv_bytes_per_token"), bytes) << type;
  }
  nlohmann::json j = nlohmann::json::parse(run_redlite(common, true).out);
  EXPECT_EQ(j.at("kv_type"), "f16");  // the fast tier's default
  j = nlohmann::json::parse(run_redlite(common + " --numerics exact", true).out);
  EXPECT_EQ(j.at("kv_type"), "f32");
  const auto depth = run_redlite("bench -m " + model_ + " --backend cpu --threads 2 --reps 1 --depths 0 --json "
                                 "--kv-type bf16", true);
  ASSERT_EQ(depth.exit_code, 0) << depth.out;
  EXPECT_EQ(nlohmann::json::parse(depth.out).at("kv_bytes_per_token"), 512);
}

TEST_F(KvCli, ExactTierRefusesEveryTypeButF32NamingBothFlags) {
  const std::string m = " -m " + model_ + " --backend cpu --numerics exact --kv-type ";
  for (const char* type : {"f16", "bf16", "q8_0"}) {
    for (const std::string& cmd : {"run" + m + type + " -p hi -n 1", "bench" + m + type + " --reps 1",
                                   "parity" + m + type, "serve" + m + type + " --port 0 --host 127.0.0.1",
                                   "generate" + m + type + " --tokens 1 -n 1",
                                   "inspect " + model_ + " --numerics exact --kv-type " + type}) {
      const auto r = run_redlite(cmd);
      EXPECT_NE(r.exit_code, 0) << cmd << "\n" << r.out;
      EXPECT_NE(r.exit_code, 124) << cmd << ": refused only by the timeout (serve: at start, not by its loader)";
      EXPECT_NE(r.out.find("--kv-type " + std::string(type) + " with --numerics exact"), std::string::npos)
          << cmd << "\n" << r.out;
    }
  }
  const auto ok = run_redlite("generate" + m + "f32 --tokens 1,2 -n 2 --greedy");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
}

TEST_F(KvCli, UnknownTypeIsRefusedNamingTheFlag) {
  const auto r = run_redlite("run -m " + model_ + " --backend cpu --kv-type q4_0 -p hi -n 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--kv-type"), std::string::npos) << r.out;
  const auto help = run_redlite("run --help");
  EXPECT_NE(help.out.find("--kv-type"), std::string::npos) << help.out;
}

}  // namespace
}  // namespace rl
