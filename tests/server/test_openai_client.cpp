// server.stream_greedy: the official `openai` npm client drives a real `redlite serve` process
// (CPU backend, loopback). Streamed text equals whole text equals `redlite generate --greedy`
// for the same prompt tokens.
#include <gtest/gtest.h>

#include <cstdio>

#include "generate/chat_template.h"
#include "generate/json_constraint_util.h"
#include "serve_process.h"
#include "server_test_util.h"

using nlohmann::json;
using namespace rl;
using namespace rl::test;

namespace {

std::string run_capture(const std::string& cmd) { return run_shell(cmd).out; }

// Greedy continuation of `prompt` by `redlite generate`, as text up to the first end token.
std::string cli_greedy_text(const std::vector<int32_t>& prompt, int n, const Tokenizer& tok) {
  std::string ids;
  for (size_t i = 0; i < prompt.size(); i++) ids += (i ? "," : "") + std::to_string(prompt[i]);
  const std::string out = run_capture(redlite_bin() + " generate -m " + server_model() +
                                      " --backend cpu --threads 2 --greedy --json -n " + std::to_string(n) +
                                      " --tokens " + ids + " 2>/dev/null");
  json j = json::parse(out, nullptr, false);
  if (j.is_discarded() || !j.contains("tokens")) return "<redlite generate failed: " + out + ">";
  std::vector<int32_t> gen;
  for (int32_t t : j["tokens"]) {
    if (tok.is_eog(t)) break;
    gen.push_back(t);
  }
  // JSON carries UTF-8 only: a random-weight model's invalid byte sequences reach the client as
  // U+FFFD, as the server's serialiser writes them.
  return wire_text(tok.decode(gen, /*render_special=*/false));
}

}  // namespace

TEST(ServerOpenAIClient, StreamGreedy) {
  RL_REQUIRE_FIXTURE(server_model());
  if (const std::string why = node_client_missing(); !why.empty()) GTEST_SKIP() << why;
  const std::string dir = std::string(REDLITE_SOURCE_DIR) + "/tests/server";
  const std::string key = "test-key-123";
  const std::string log = std::string(REDLITE_BINARY_DIR) + "/serve-openai-test.log";
  ServeProcess server(server_model(), key, log);
  ASSERT_TRUE(server.ok()) << "could not start " << redlite_bin();
  // A second server in a chat format with tools, for tool_choice "required".
  ServeProcess tools_server(server_model(), key, log + ".tools", {"--chat-template", "qwen3-instruct"});
  ASSERT_TRUE(tools_server.ok()) << "could not start " << redlite_bin();
  for (const ServeProcess* p : {&server, &tools_server})
    ASSERT_TRUE(p->wait_healthy()) << "redlite serve did not become healthy; log: " << p->log();

  const std::string out = run_capture("cd " + dir + " && node openai_client.mjs " + server.base_url() + " " + key +
                                      " " + tools_server.base_url());
  json r = json::parse(out, nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << "client output: " << out;

  EXPECT_EQ(r["chat"]["text"], r["chat_stream"]["text"]);
  EXPECT_EQ(r["chat"]["finish"], r["chat_stream"]["finish"]);
  EXPECT_EQ(r["chat"]["usage"]["completion_tokens"], r["chat_stream"]["usage"]["completion_tokens"]);
  EXPECT_EQ(r["completion"]["text"], r["completion_stream"]["text"]);
  EXPECT_EQ(r["models"], json::array({"tiny-qwen3next-q4km.gguf"}));
  EXPECT_EQ(r["bad_key"], 401);

  // Against the command line, on the same prompt tokens.
  auto owned = fixture_loader(server_model())([](float) {});
  const Tokenizer& tok = *owned.tokenizer;
  ChatTemplate t = ChatTemplate::detect(tok.chat_template(), false);
  std::vector<ChatMessage> msgs(2);
  msgs[0].role = "system";
  msgs[0].content = "You are a helpful assistant.";
  msgs[1].role = "user";
  msgs[1].content = "What is the capital of France? Answer briefly.";
  const auto chat_ids = tok.encode(t.render(msgs), true);
  EXPECT_EQ(r["chat"]["text"].get<std::string>(), cli_greedy_text(chat_ids, 24, tok));
  const auto text_ids = tok.encode("The quick brown fox jumps over the lazy dog.", true);
  EXPECT_EQ(r["completion"]["text"].get<std::string>(), cli_greedy_text(text_ids, 24, tok));
  EXPECT_FALSE(r["completion"]["text"].get<std::string>().empty());

  // Structured outputs, validated by Python's jsonschema: the json_schema reply (whole and
  // streamed alike) and the arguments of the required tool call.
  EXPECT_EQ(r["json_schema"]["finish"], "stop");
  EXPECT_EQ(r["json_schema"]["text"], r["json_schema"]["streamed"]);
  std::vector<SchemaCase> cases{{nlohmann::ordered_json::parse(r["json_schema"]["schema"].dump()),
                                 r["json_schema"]["text"].get<std::string>()}};
  EXPECT_EQ(r["tool_required"]["finish"], "tool_calls");
  ASSERT_FALSE(r["tool_required"]["calls"].empty()) << out;
  for (const json& call : r["tool_required"]["calls"]) {
    EXPECT_EQ(call["function"]["name"], "get_population");
    cases.push_back({nlohmann::ordered_json::parse(r["tool_required"]["tools"][0]["function"]["parameters"].dump()),
                     call["function"]["arguments"].get<std::string>()});
  }
  bool missing = false;
  const std::string report = python_validate(cases, missing);
  if (missing) GTEST_SKIP() << "python3-jsonschema is missing: " << report;
  EXPECT_EQ(report, "");
}
