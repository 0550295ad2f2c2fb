// server.stream_greedy: the official `openai` npm client drives a real `redlite serve` process
// (CPU backend, loopback). Streamed text equals whole text equals `redlite generate --greedy`
// for the same prompt tokens.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "generate/chat_template.h"
#include "generate/json_constraint_util.h"
#include "server_test_util.h"

using nlohmann::json;
using namespace rl;
using namespace rl::test;

extern char** environ;

namespace {

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, (sockaddr*)&a, sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, (sockaddr*)&a, &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::string run_capture(const std::string& cmd) { return run_shell(cmd).out; }

// A `redlite serve` child process, stopped with SIGTERM.
class ServeProcess {
 public:
  ServeProcess(const std::string& model, int port, const std::string& key, const std::string& log,
               const std::vector<std::string>& extra_args = {}) {
    std::vector<std::string> args = {redlite_bin(), "serve", "-m", model, "--port", std::to_string(port),
                                     "--api-key", key, "--backend", "cpu", "--threads", "2"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    ok_ = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) == 0;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~ServeProcess() {
    if (!ok_) return;
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 100 && waitpid(pid_, &status, WNOHANG) == 0; i++) usleep(50000);
    if (waitpid(pid_, &status, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
  }
  bool ok() const { return ok_; }

 private:
  pid_t pid_ = -1;
  bool ok_ = false;
};

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
  const std::string dir = std::string(REDLITE_SOURCE_DIR) + "/tests/server";
  if (!std::filesystem::exists(dir + "/node_modules/openai"))
    GTEST_SKIP() << "the openai npm client is not installed: run `npm ci` in tests/server (scripts/test.sh does)";
  if (run_capture("node --version 2>/dev/null").empty()) GTEST_SKIP() << "node is not installed";

  const int port = free_port();
  const std::string key = "test-key-123";
  const std::string log = std::string(REDLITE_BINARY_DIR) + "/serve-openai-test.log";
  ServeProcess server(server_model(), port, key, log);
  ASSERT_TRUE(server.ok()) << "could not start " << redlite_bin();
  // A second server in a chat format with tools, for tool_choice "required".
  const int tools_port = free_port();
  ServeProcess tools_server(server_model(), tools_port, key, log + ".tools", {"--chat-template", "qwen3-instruct"});
  ASSERT_TRUE(tools_server.ok()) << "could not start " << redlite_bin();
  for (int p : {port, tools_port}) {
    httplib::Client c("127.0.0.1", p);
    bool up = false;
    for (int i = 0; i < 600 && !up; i++) {
      auto h = c.Get("/health");
      up = h && h->status == 200;
      if (!up) usleep(100000);
    }
    ASSERT_TRUE(up) << "redlite serve did not become healthy; log: " << log;
  }

  const std::string out = run_capture("cd " + dir + " && node openai_client.mjs http://127.0.0.1:" +
                                      std::to_string(port) + "/v1 " + key + " http://127.0.0.1:" +
                                      std::to_string(tools_port) + "/v1");
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
