// `redlite tokenize`: ids, JSON, `--` before a text that looks like a flag, and clear errors.
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "test_util.h"

namespace rl {
namespace {

using RunResult = test::ShellRun;  // out: stdout and stderr together

// Runs redlite with `args` (already shell-quoted) and captures its output.
RunResult run_redlite(const std::string& args) {
  return test::run_shell("'" + test::redlite_bin() + "' " + args + " 2>&1");
}

#define RL_REQUIRE_REDLITE()                                                                  \
  do {                                                                                        \
    if (!std::filesystem::exists(test::redlite_bin()))                                        \
      GTEST_SKIP() << "redlite binary not found: " << test::redlite_bin() << " (set REDLITE_BIN)"; \
  } while (0)

const std::string kModelA = "tiny-qwen3next-iq2xxs.gguf";

TEST(TokenizeCli, PrintsIds) {
  RL_REQUIRE_REDLITE();
  RL_REQUIRE_FIXTURE(test::fixture(kModelA));
  const std::string m = "-m '" + test::fixture(kModelA) + "' ";
  RunResult r = run_redlite("tokenize " + m + "'Hello world'");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "9707 1879\n");
  // Without --special the control token is text; with it, one token.
  r = run_redlite("tokenize " + m + "--special -- '<|im_start|>user'");
  EXPECT_EQ(r.out, "151644 872\n");
  r = run_redlite("tokenize " + m + "-- '<|im_start|>user'");
  EXPECT_EQ(r.out, "27 91 318 4906 91 29 872\n");
}

TEST(TokenizeCli, JsonWithPiecesAndDashText) {
  RL_REQUIRE_REDLITE();
  RL_REQUIRE_FIXTURE(test::fixture(kModelA));
  const RunResult r = run_redlite("tokenize -m '" + test::fixture(kModelA) + "' --json -- '--json 中'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["ids"].size(), j["pieces"].size());
  std::string joined;
  for (const auto& p : j["pieces"]) joined += p.get<std::string>();
  EXPECT_EQ(joined, "--json 中");
  EXPECT_EQ(j["n_tokens"].get<size_t>(), j["ids"].size());
}

TEST(TokenizeCli, MissingOrInvalidModelIsAClearError) {
  RL_REQUIRE_REDLITE();
  RunResult r = run_redlite("tokenize -m /nonexistent/model.gguf hello");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("/nonexistent/model.gguf"), std::string::npos) << r.out;
  r = run_redlite("tokenize hello");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--model"), std::string::npos) << r.out;
  // A file that is not GGUF (written here, so the case needs no fixture).
  const std::string not_gguf = test::temp_path("tokenize-cli", "not-a-model.gguf");
  std::ofstream(not_gguf) << "hello, this is text and not a GGUF file\n";
  r = run_redlite("tokenize -m '" + not_gguf + "' hello");
  test::remove_temp(not_gguf);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("not-a-model.gguf"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace rl
