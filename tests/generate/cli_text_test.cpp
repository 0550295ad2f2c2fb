// `redlite run` and `redlite generate -p` on the tiny fixture model, against llama.cpp's reference
// (tiny-qwen3next-q4km.ref-f32.json: prompt token ids and the greedy continuation of each prompt,
// computed on the F32 weights, which is what the CPU oracle computes).
#include <unistd.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "generate/chat_template.h"
#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace rl {
namespace {

struct Output {
  int rc = -1;
  std::string out, err;
};

Output run_redlite(const std::string& args) {
  // One file per process and call: CTest runs these tests as parallel processes.
  static int calls = 0;
  const std::string err_path = ::testing::TempDir() + "redlite_cli_text_stderr." + std::to_string(::getpid()) +
                               "." + std::to_string(calls++) + ".txt";
  Output o;
  FILE* p = ::popen((test::redlite_bin() + " " + args + " 2> " + err_path).c_str(), "r");
  if (!p) return o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) o.out.append(buf, n);
  o.rc = ::pclose(p);
  std::ifstream f(err_path);
  std::stringstream s;
  s << f.rdbuf();
  o.err = s.str();
  std::remove(err_path.c_str());
  return o;
}

nlohmann::json reference_prompt(const std::string& name) {
  std::ifstream f(test::fixture("tiny-qwen3next-q4km.ref-f32.json"));
  nlohmann::json ref = nlohmann::json::parse(f);
  for (auto& p : ref["prompts"])
    if (p["name"] == name) return p;
  return {};
}

const char* kModel = "tiny-qwen3next-q4km.gguf";

TEST(CliText, GenerateFromTextMatchesLlamaCppGreedy) {
  const std::string model = test::fixture(kModel);
  RL_REQUIRE_FIXTURE(model);
  nlohmann::json ref = reference_prompt("short_en");
  ASSERT_FALSE(ref.is_null());
  Output o = run_redlite("generate -m " + model + " --backend cpu --numerics exact --threads 2 --greedy -n 32 --json -p '" +
                         ref["text"].get<std::string>() + "'");
  ASSERT_EQ(o.rc, 0) << o.err;
  nlohmann::json j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j["prompt_tokens"], ref["token_ids"]);
  EXPECT_EQ(j["tokens"], ref["greedy"]["tokens"]);
}

TEST(CliText, RunStreamsTheGreedyTextAndReportsSpeeds) {
  const std::string model = test::fixture(kModel);
  RL_REQUIRE_FIXTURE(model);
  nlohmann::json ref = reference_prompt("short_en");
  ASSERT_FALSE(ref.is_null());
  Output o = run_redlite("run -m " + model + " --backend cpu --numerics exact --threads 2 --greedy --ignore-eos --repeat-penalty 1 -n 32 -p '" +
                         ref["text"].get<std::string>() + "'");
  ASSERT_EQ(o.rc, 0) << o.err;
  auto file = GgufFile::open(model);
  auto tok = Tokenizer::from_gguf(*file);
  std::vector<int32_t> greedy = ref["greedy"]["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(o.out, tok->decode(greedy, /*render_special=*/false) + "\n");
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(load: [0-9.]+ s)"))) << o.err;
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(prefill: 19 tokens, [0-9.]+ tok/s)"))) << o.err;
  EXPECT_TRUE(std::regex_search(o.err, std::regex(R"(generation: 32 tokens, [0-9.]+ tok/s \| finish: length)"))) << o.err;
}

TEST(CliText, RunChatRendersTheTemplateAndStopStringsCut) {
  const std::string model = test::fixture(kModel);
  RL_REQUIRE_FIXTURE(model);
  auto file = GgufFile::open(model);
  auto tok = Tokenizer::from_gguf(*file);
  ChatTemplate tmpl = ChatTemplate::detect(tok->chat_template(), false);
  std::vector<ChatMessage> m = {ChatMessage{"system", "Be brief.", {}, {}, {}}, ChatMessage{"user", "Hi", {}, {}, {}}};
  const size_t expected = tok->encode(tmpl.render(m), true).size();
  Output o = run_redlite("run -m " + model + " --backend cpu --threads 2 --greedy --ignore-eos -n 16 --chat "
                         "--system 'Be brief.' -p Hi");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_NE(o.err.find("prefill: " + std::to_string(expected) + " tokens"), std::string::npos) << o.err;
  // Stop at a string taken from the middle of the greedy reply: the output ends right before it.
  std::string reply = o.out.substr(0, o.out.size() - 1);
  ASSERT_GT(reply.size(), 6u);
  size_t at = reply.size() / 2;
  while (at + 3 < reply.size() && reply.substr(at, 3).find_first_of("'\n") != std::string::npos) ++at;
  std::string stop = reply.substr(at, 3);
  Output cut = run_redlite("run -m " + model + " --backend cpu --threads 2 --greedy --ignore-eos -n 16 --chat "
                           "--system 'Be brief.' -p Hi --stop '" + stop + "'");
  ASSERT_EQ(cut.rc, 0) << cut.err;
  EXPECT_EQ(cut.out, reply.substr(0, reply.find(stop)) + "\n");
  EXPECT_NE(cut.err.find("finish: stop"), std::string::npos) << cut.err;
}

TEST(CliText, UnknownTemplateFlagIsExplicit) {
  // The fixture's template is recognised, so --chatml changes nothing and no warning is printed.
  const std::string model = test::fixture(kModel);
  RL_REQUIRE_FIXTURE(model);
  Output o = run_redlite("run -m " + model + " --backend cpu --threads 2 --greedy -n 2 --chat --chatml -p Hi");
  ASSERT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(o.err.find("warning"), std::string::npos) << o.err;
}

// The prompt tokens `redlite run` reports on stderr ("prefill: N tokens"); -1 when absent.
int prefill_tokens(const std::string& err) {
  const size_t p = err.find("prefill: ");
  return p == std::string::npos ? -1 : std::stoi(err.substr(p + 9));
}

TEST(CliText, ChatTemplateFlagChoosesTheFormat) {
  // Qwen2 (the fixture's) adds a default system message; Qwen3 Instruct does not: fewer tokens.
  const std::string model = test::fixture(kModel);
  RL_REQUIRE_FIXTURE(model);
  Output q2 = run_redlite("run -m " + model + " --backend cpu --threads 2 --greedy -n 1 --chat -p Hi");
  Output q3 = run_redlite("run -m " + model + " --backend cpu --threads 2 --greedy -n 1 --chat -p Hi "
                          "--chat-template qwen3-instruct");
  ASSERT_EQ(q2.rc, 0) << q2.err;
  ASSERT_EQ(q3.rc, 0) << q3.err;
  EXPECT_GT(prefill_tokens(q3.err), 0) << q3.err;
  EXPECT_LT(prefill_tokens(q3.err), prefill_tokens(q2.err)) << q2.err << q3.err;
  Output bad = run_redlite("run -m " + model + " --chat -p Hi --chat-template qwen9");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("unknown chat format 'qwen9'"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("qwen3-coder"), std::string::npos) << bad.err;
}

TEST(CliText, ChatTemplateFileRendersWithThatTemplate) {
  // The published Thinking template, run by the interpreter, gives the prompt of the native
  // qwen3-thinking renderer (both equal jinja2's: real_templates_test.cpp), not the fixture's own.
  const std::string model = test::fixture(kModel);
  RL_REQUIRE_FIXTURE(model);
  const std::string file = std::string(REDLITE_SOURCE_DIR) + "/tests/generate/templates/qwen3-next-80b-a3b-thinking.jinja";
  const std::string run = "run -m " + model + " --backend cpu --threads 2 --greedy -n 1 --chat -p Hi ";
  Output own = run_redlite(run);
  Output native = run_redlite(run + "--chat-template qwen3-thinking");
  Output from_file = run_redlite(run + "--chat-template-file " + file);
  ASSERT_EQ(from_file.rc, 0) << from_file.err;
  EXPECT_EQ(from_file.err.find("warning"), std::string::npos) << from_file.err;
  EXPECT_EQ(prefill_tokens(from_file.err), prefill_tokens(native.err)) << native.err << from_file.err;
  EXPECT_NE(prefill_tokens(from_file.err), prefill_tokens(own.err)) << own.err;
  // A missing file is refused before the model is read; both flags at once are refused.
  Output missing = run_redlite(run + "--chat-template-file /nonexistent/t.jinja");
  EXPECT_NE(missing.rc, 0);
  EXPECT_NE(missing.err.find("/nonexistent/t.jinja"), std::string::npos) << missing.err;
  EXPECT_EQ(missing.err.find("model loaded"), std::string::npos) << missing.err;
  Output both = run_redlite(run + "--chat-template qwen3-thinking --chat-template-file " + file);
  EXPECT_NE(both.rc, 0);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
}

// --json-object with --chat: a prompt that opens <think> (Thinking) leaves the reasoning free and
// the document follows </think>; a prompt that does not (Instruct) is the document from the start.
TEST(CliText, RunChatConstraintStartsWhereThePromptLeavesTheReply) {
  const std::string model = test::fixture(kModel);
  RL_REQUIRE_FIXTURE(model);
  const std::string run = "run -m " + model + " --backend cpu --threads 2 --greedy -n 40 --chat -p Hi --json-object ";
  auto is_object = [](const std::string& text) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    return j.is_object();
  };
  Output thinking = run_redlite(run + "--chat-template qwen3-thinking");
  ASSERT_EQ(thinking.rc, 0) << thinking.err;
  const size_t close = thinking.out.find("</think>");
  ASSERT_NE(close, std::string::npos) << thinking.out;
  EXPECT_GT(close, 0u) << thinking.out;  // some free reasoning first
  EXPECT_TRUE(is_object(thinking.out.substr(close + 8))) << thinking.out;
  Output instruct = run_redlite(run + "--chat-template qwen3-instruct");
  ASSERT_EQ(instruct.rc, 0) << instruct.err;
  EXPECT_TRUE(is_object(instruct.out)) << instruct.out;
}

}  // namespace
}  // namespace rl
