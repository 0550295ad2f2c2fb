// The HTTP server on the tiny fixture model (CPU backend, loopback): protocol, greedy equality
// between streamed and whole answers and the Generator itself, state reuse, authentication,
// context limits, the queue under 32 concurrent clients, and a corpus of malformed requests.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "common/error.h"
#include "generate/chat_template.h"
#include "generate/generator.h"
#include "server_test_util.h"

using nlohmann::json;
using namespace rl;
using namespace rl::test;

namespace {

class ServerTest : public ServerModelTest {};

}  // namespace

TEST_F(ServerTest, HealthModelsAndMetrics) {
  TestServer s(ServerConfig{});
  ASSERT_TRUE(s.ready());
  auto c = s.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  json mj = json::parse(m->body);
  ASSERT_EQ(mj["data"].size(), 1u);
  EXPECT_EQ(mj["data"][0]["id"], "tiny-qwen3next-q4km.gguf");
  auto met = c.Get("/metrics");
  ASSERT_TRUE(met);
  EXPECT_EQ(met->status, 200);
  EXPECT_NE(met->body.find("redlite_queue_depth 0"), std::string::npos);
  EXPECT_NE(met->body.find("redlite_generated_tokens_total"), std::string::npos);
}

// /metrics in the Prometheus text format (version 0.0.4), checked by its rules rather than by the
// server's own strings: each family is a HELP line, a TYPE line (counter or gauge) and then only
// samples of that family's name, each a name, optional {labels} and a number; every family the
// server documents is there, once, after a request has been served.
TEST_F(ServerTest, MetricsFollowThePrometheusTextFormat) {
  TestServer s(ServerConfig{});
  auto c = s.client();
  auto r = c.Post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200);
  std::istringstream in(m->body);
  std::string line, family, help_of;
  std::set<std::string> families;
  int samples = 0;
  while (std::getline(in, line)) {
    SCOPED_TRACE(line);
    if (line.rfind("# HELP ", 0) == 0) {
      help_of = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_GT(line.size(), 8 + help_of.size()) << "a HELP line without text";
      family.clear();
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string type;
      t >> family >> type;
      EXPECT_EQ(family, help_of) << "TYPE after another family's HELP";
      EXPECT_TRUE(type == "counter" || type == "gauge") << type;
      EXPECT_TRUE(families.insert(family).second) << "family listed twice: " << family;
      continue;
    }
    ASSERT_FALSE(family.empty()) << "a sample before its family's TYPE";
    const size_t name_end = line.find_first_of("{ ");
    ASSERT_NE(name_end, std::string::npos);
    EXPECT_EQ(line.substr(0, name_end), family);
    size_t value_at = name_end;
    if (line[name_end] == '{') {
      value_at = line.find("} ", name_end);
      ASSERT_NE(value_at, std::string::npos) << "labels not closed";
      value_at += 1;
    }
    const std::string value = line.substr(value_at + 1);
    char* end = nullptr;
    std::strtod(value.c_str(), &end);
    EXPECT_TRUE(!value.empty() && end && *end == '\0') << "not a number: '" << value << "'";
    samples++;
  }
  for (const char* want :
       {"redlite_requests_total", "redlite_requests_rejected_busy_total", "redlite_requests_cancelled_total",
        "redlite_requests_timed_out_total", "redlite_prompt_tokens_total", "redlite_prompt_tokens_cached_total",
        "redlite_prefill_tokens_total", "redlite_generated_tokens_total", "redlite_prefill_seconds_total",
        "redlite_decode_seconds_total", "redlite_decode_tokens_per_second", "redlite_prefill_tokens_per_second",
        "redlite_queue_depth", "redlite_requests_running", "redlite_decode_batch_size_mean", "redlite_session_bytes",
        "redlite_session_budget_bytes", "redlite_prompt_cache_hit_rate", "redlite_prompt_cache_bytes"})
    EXPECT_EQ(families.count(want), 1u) << want;
  EXPECT_GE(samples, (int)families.size()) << "a family without a sample";
  EXPECT_NE(m->body.find("redlite_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1\n"), std::string::npos)
      << m->body;
  EXPECT_NE(m->body.find("redlite_generated_tokens_total 2\n"), std::string::npos) << m->body;
}

TEST_F(ServerTest, StreamedChatEqualsWholeChatEqualsGenerator) {
  TestServer s(ServerConfig{});
  auto c = s.client();
  const std::string user = "What is the capital of France?";
  auto whole = c.Post("/v1/chat/completions", chat_body(user, 20).dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  json wj = json::parse(whole->body);
  const std::string whole_text = wj["choices"][0]["message"]["content"];
  EXPECT_EQ(wj["object"], "chat.completion");
  EXPECT_TRUE(wj["choices"][0]["finish_reason"] == "length" || wj["choices"][0]["finish_reason"] == "stop");
  EXPECT_GT(wj["usage"]["prompt_tokens"].get<int>(), 10);

  json sb = chat_body(user, 20, true);
  sb["stream_options"] = {{"include_usage", true}};
  auto streamed = c.Post("/v1/chat/completions", sb.dump(), "application/json");
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200);
  EXPECT_NE(streamed->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  SseStream sse = parse_sse(streamed->body);
  EXPECT_TRUE(sse.done) << "the stream must end with data: [DONE]";
  std::string finish;
  EXPECT_EQ(stream_text(sse, &finish), whole_text);
  EXPECT_EQ(finish, wj["choices"][0]["finish_reason"]);
  ASSERT_FALSE(sse.events.empty());
  EXPECT_TRUE(sse.events.back().contains("usage")) << "include_usage adds a final usage chunk";
  EXPECT_EQ(sse.events.back()["usage"]["completion_tokens"], wj["usage"]["completion_tokens"]);

  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(generator_text(chat_prompt_tokens(user), greedy, 20), whole_text);
}

// With tools in the request, a reply streams as it is generated (only a <tool_call> block and the
// whitespace before it wait for the end), and the streamed content equals the whole reply's.
TEST_F(ServerTest, RepliesToRequestsWithToolsStreamAndEqualTheWholeReply) {
  ServerConfig cfg;
  cfg.chat_template.format = "qwen3-instruct";  // the fixture's own template (Qwen2) has no tools
  TestServer s(cfg);
  ASSERT_TRUE(s.ready());
  auto c = s.client();
  json body = chat_body("What is the weather in Paris?", 24);
  body["tools"] = json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"Weather",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])");
  auto whole = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  json wj = json::parse(whole->body);
  const json& msg = wj["choices"][0]["message"];
  body["stream"] = true;
  auto streamed = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200);
  SseStream sse = parse_sse(streamed->body);
  EXPECT_TRUE(sse.done);
  std::string finish;
  const std::string text = stream_text(sse, &finish);
  EXPECT_EQ(text, msg["content"].is_null() ? std::string() : msg["content"].get<std::string>());
  EXPECT_EQ(finish, wj["choices"][0]["finish_reason"]);
  int content_deltas = 0;
  for (const json& e : sse.events) {
    if (e.contains("choices") && !e["choices"].empty() && e["choices"][0]["delta"].contains("content") &&
        e["choices"][0]["delta"]["content"].is_string() && !e["choices"][0]["delta"]["content"].get<std::string>().empty())
      content_deltas++;
  }
  if (!msg.contains("tool_calls") && text.find("<tool_call") == std::string::npos) {
    EXPECT_GT(content_deltas, 3) << "the reply was not streamed: " << text;
  }

  // A named tool_choice shows the model only that function: the prompt is shorter than with both.
  body["stream"] = false;
  body["max_tokens"] = 1;
  body["tools"].push_back(json::parse(R"({"type":"function","function":{"name":"get_time","description":"Time",
      "parameters":{"type":"object","properties":{"zone":{"type":"string"}}}}})"));
  auto both = c.Post("/v1/chat/completions", body.dump(), "application/json");
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  auto one = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(both && one);
  ASSERT_EQ(both->status, 200) << both->body;
  ASSERT_EQ(one->status, 200) << one->body;
  EXPECT_LT(json::parse(one->body)["usage"]["prompt_tokens"].get<int>(),
            json::parse(both->body)["usage"]["prompt_tokens"].get<int>());

  // An unknown format name is refused when the server is made.
  ServerConfig bad;
  bad.chat_template.format = "qwen9";
  EXPECT_THROW(Server(bad, fixture_loader(server_model())), Error);
}

// tool_choice "none" hides the tools: the prompt and the greedy reply are those of the same request
// without tools (the tools' definitions make the prompt longer).
TEST_F(ServerTest, ToolChoiceNoneHidesTheTools) {
  ServerConfig cfg;
  cfg.chat_template.format = "qwen3-instruct";  // a format that renders tools
  TestServer s(cfg);
  ASSERT_TRUE(s.ready());
  auto c = s.client();
  auto post = [&](const json& body) {
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r && r->status == 200 ? json::parse(r->body) : json::object();
  };
  json body = chat_body("What is the weather in Paris?", 8);
  const json plain = post(body);
  body["tools"] = json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"Weather",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])");
  const json with_tools = post(body);
  body["tool_choice"] = "none";
  const json none = post(body);
  ASSERT_TRUE(plain.contains("usage") && with_tools.contains("usage") && none.contains("usage"));
  EXPECT_GT(with_tools["usage"]["prompt_tokens"].get<int>(), plain["usage"]["prompt_tokens"].get<int>());
  EXPECT_EQ(none["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"]);
  EXPECT_EQ(none["choices"][0]["message"], plain["choices"][0]["message"]);
}

TEST_F(ServerTest, CompletionsStreamAndWholeAgree) {
  TestServer s(ServerConfig{});
  auto c = s.client();
  json body = {{"prompt", "The quick brown fox"}, {"max_tokens", 16}, {"temperature", 0}};
  auto whole = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  json wj = json::parse(whole->body);
  body["stream"] = true;
  auto streamed = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(streamed);
  SseStream sse = parse_sse(streamed->body);
  EXPECT_TRUE(sse.done);
  EXPECT_EQ(stream_text(sse), wj["choices"][0]["text"].get<std::string>());
  // Token-id prompts give the same answer as the text they tokenize to.
  auto tok = c.Post("/tokenize", json{{"content", "The quick brown fox"}}.dump(), "application/json");
  ASSERT_TRUE(tok);
  json ids = json::parse(tok->body)["tokens"];
  json by_ids = {{"prompt", ids}, {"max_tokens", 16}, {"temperature", 0}};
  auto r = c.Post("/v1/completions", by_ids.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], wj["choices"][0]["text"]);
  auto detok = c.Post("/detokenize", json{{"tokens", ids}}.dump(), "application/json");
  ASSERT_TRUE(detok);
  EXPECT_EQ(json::parse(detok->body)["content"], "The quick brown fox");
}

TEST_F(ServerTest, SecondTurnReusesTheFirstTurnsState) {
  TestServer s(ServerConfig{});
  auto c = s.client();
  json first = chat_body("Tell me about Paris.", 12);
  auto r1 = c.Post("/v1/chat/completions", first.dump(), "application/json");
  ASSERT_TRUE(r1);
  ASSERT_EQ(r1->status, 200);
  json j1 = json::parse(r1->body);
  EXPECT_EQ(j1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  json second = next_turn(first, j1, "And about Lyon?");
  auto r2 = c.Post("/v1/chat/completions", second.dump(), "application/json");
  ASSERT_TRUE(r2);
  ASSERT_EQ(r2->status, 200);
  json j2 = json::parse(r2->body);
  const int prompt2 = j2["usage"]["prompt_tokens"];
  const int cached2 = j2["usage"]["prompt_tokens_details"]["cached_tokens"];
  const int prefilled2 = j2["timings"]["prompt_n"];
  // At least the whole first prompt is reused; only the rest is prefilled.
  EXPECT_GE(cached2, j1["usage"]["prompt_tokens"].get<int>());
  EXPECT_EQ(prefilled2, prompt2 - cached2);
  EXPECT_LT(prefilled2, prompt2);
}

TEST_F(ServerTest, ApiKeyIsRequiredWhenSet) {
  ServerConfig cfg;
  cfg.api_key = "sekret-key";
  TestServer s(cfg);
  auto c = s.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200) << "health needs no key";
  auto none = c.Get("/v1/models");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(json::parse(none->body)["error"]["type"], "authentication_error");
  httplib::Headers wrong = {{"Authorization", "Bearer sekret-kez"}};
  auto w = c.Post("/v1/completions", wrong, json{{"prompt", "x"}, {"max_tokens", 1}}.dump(), "application/json");
  ASSERT_TRUE(w);
  EXPECT_EQ(w->status, 401);
  httplib::Headers right = {{"Authorization", "Bearer sekret-key"}};
  auto ok = c.Post("/v1/completions", right, json{{"prompt", "x"}, {"max_tokens", 1}}.dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST_F(ServerTest, PromptLongerThanContextIs400) {
  ServerConfig cfg;
  cfg.n_ctx = 32;
  TestServer s(cfg);
  auto c = s.client();
  std::string long_text;
  for (int i = 0; i < 40; i++) long_text += "word" + std::to_string(i) + " ";
  auto r = c.Post("/v1/completions", json{{"prompt", long_text}, {"max_tokens", 4}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  json e = json::parse(r->body);
  EXPECT_EQ(e["error"]["code"], "context_length_exceeded");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("32"), std::string::npos);
  // max_tokens past the context is clipped, not refused.
  auto ok = c.Post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 1000}, {"temperature", 0}}.dump(),
                   "application/json");
  ASSERT_TRUE(ok);
  ASSERT_EQ(ok->status, 200) << ok->body;
  json oj = json::parse(ok->body);
  EXPECT_LE(oj["usage"]["total_tokens"].get<int>(), 32);
}

TEST_F(ServerTest, LogprobsAreNormalisedAndTopIsSorted) {
  TestServer s(ServerConfig{});
  auto c = s.client();
  json body = chat_body("Hi", 4);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json lp = json::parse(r->body)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 4u);
  for (const json& t : lp) {
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    // Greedy: the chosen token is the most probable one.
    EXPECT_EQ(t["top_logprobs"][0]["token"], t["token"]);
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(), t["top_logprobs"][1]["logprob"].get<double>());
  }
}

// 32 clients at once against a queue of 8: every request ends with its own complete answer (the
// same as when run alone) or a clean 503 with Retry-After. First with the worker held by a long
// stream, so exactly 8 wait and 24 are refused; then freely, where the 8 queued at the first
// refusal (and the one running) are still answered, so at least 9 of the 64 get 200.
TEST_F(ServerTest, ThirtyTwoConcurrentClients) {
  ServerConfig cfg;
  cfg.max_queue = 8;
  TestServer s(cfg);
  constexpr int kClients = 32, kPerClient = 2, kTokens = 6;
  // Expected answers, one request at a time.
  std::vector<std::string> expected(kClients);
  {
    auto c = s.client();
    for (int i = 0; i < kClients; i++) {
      json b = {{"prompt", "Client " + std::to_string(i) + " says"}, {"max_tokens", kTokens}, {"temperature", 0}};
      auto r = c.Post("/v1/completions", b.dump(), "application/json");
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200);
      expected[i] = json::parse(r->body)["choices"][0]["text"];
    }
  }
  const size_t rss_before = rss_kib();
  {
    BusyStream holder(s);
    ASSERT_TRUE(holder.start()) << "the long stream did not start";
    std::atomic<int> answered{0}, refused{0}, other{0};
    std::vector<std::jthread> clients;
    for (int i = 0; i < kClients; i++)
      clients.emplace_back([&, i] {
        json b = {{"prompt", "Client " + std::to_string(i) + " says"}, {"max_tokens", kTokens}, {"temperature", 0}};
        auto r = s.client().Post("/v1/completions", b.dump(), "application/json");
        if (r && r->status == 503 && !r->get_header_value("Retry-After").empty()) refused++;
        else if (r && r->status == 200 && json::parse(r->body)["choices"][0]["text"] == expected[i]) answered++;
        else other++;
      });
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (refused + other < kClients - cfg.max_queue && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(metric(s, "redlite_queue_depth"), cfg.max_queue);
    EXPECT_EQ(refused.load(), kClients - cfg.max_queue);
    holder.release();
    for (auto& t : clients) t.join();
    EXPECT_EQ(answered.load(), cfg.max_queue);
    EXPECT_EQ(refused.load(), kClients - cfg.max_queue);
    EXPECT_EQ(other.load(), 0);
  }
  std::atomic<int> ok{0}, busy{0}, bad{0};
  std::mutex why_m;
  std::vector<std::string> why;  // what went wrong, for the failure message
  auto note = [&](std::string w) {
    bad++;
    std::lock_guard<std::mutex> l(why_m);
    why.push_back(std::move(w));
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; i++) {
    threads.emplace_back([&, i] {
      auto c = s.client();
      for (int k = 0; k < kPerClient; k++) {
        const bool stream = (i + k) % 2 == 0;
        json b = {{"prompt", "Client " + std::to_string(i) + " says"},
                  {"max_tokens", kTokens}, {"temperature", 0}, {"stream", stream}};
        auto r = c.Post("/v1/completions", b.dump(), "application/json");
        if (!r) {
          note("client " + std::to_string(i) + ": no response: " + httplib::to_string(r.error()));
          continue;
        }
        if (r->status == 503) {
          if (r->get_header_value("Retry-After").empty()) note("503 without Retry-After");
          else busy++;
          continue;
        }
        if (r->status != 200) {
          note("client " + std::to_string(i) + ": status " + std::to_string(r->status) + " " + r->body);
          continue;
        }
        std::string text = stream ? stream_text(parse_sse(r->body)) : json::parse(r->body)["choices"][0]["text"].get<std::string>();
        if (text == expected[i]) ok++;
        else note("client " + std::to_string(i) + (stream ? " (stream)" : "") + ": got '" + text + "', expected '" + expected[i] + "'");
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0) << ::testing::PrintToString(why);
  EXPECT_EQ(ok + busy, kClients * kPerClient);
  EXPECT_GE(ok.load(), cfg.max_queue + 1);
  // Bounded memory: the queue and the prompt cache are bounded; 64 requests must not grow the
  // process by more than the prompt cache's budget (1 GiB default is far above; 256 MiB here).
  EXPECT_LT(rss_kib(), rss_before + 256 * 1024);
  auto h = s.client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

// A streaming client that disconnects after the first chunk cancels its generation.
TEST_F(ServerTest, DisconnectCancelsGeneration) {
  TestServer s(ServerConfig{});
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(s.port());
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(fd, (sockaddr*)&addr, sizeof addr), 0);
  const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 3000}, {"stream", true}}.dump();
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(write(fd, req.data(), req.size()), (ssize_t)req.size());
  char buf[512];
  ASSERT_GT(read(fd, buf, sizeof buf), 0);
  close(fd);
  // The worker notices at its next token; the next request is then served promptly.
  auto c = s.client(30);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = c.Post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("redlite_requests_cancelled_total 1"), std::string::npos) << m->body;
}

// Streamed logprobs: one entry per generated token, as in the whole answer, even when text is
// held back for a possible stop string.
TEST_F(ServerTest, StreamedLogprobsCoverEveryToken) {
  TestServer s(ServerConfig{});
  auto c = s.client();
  json body = {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}, {"logprobs", 0}};
  auto plain = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200) << plain->body;
  const std::string text = json::parse(plain->body)["choices"][0]["text"];
  ASSERT_GT(text.size(), 20u);
  // A stop string that matches the first 20 bytes and then fails: those bytes are held back.
  body["stop"] = text.substr(0, 20) + "\x01QQ";
  auto whole = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(whole);
  json wj = json::parse(whole->body);
  const size_t n_whole = wj["choices"][0]["logprobs"]["token_logprobs"].size();
  EXPECT_EQ(n_whole, (size_t)wj["usage"]["completion_tokens"].get<int>());
  body["stream"] = true;
  auto streamed = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(streamed);
  size_t n_stream = 0;
  for (const json& e : parse_sse(streamed->body).events)
    for (const json& ch : e["choices"])
      if (ch.contains("logprobs") && ch["logprobs"].is_object()) n_stream += ch["logprobs"]["token_logprobs"].size();
  EXPECT_EQ(n_stream, n_whole);
}

// With --max-queue 0 an idle server still serves one request at a time; absurd limits are refused.
TEST_F(ServerTest, QueueOfZeroAndConfigurationLimits) {
  ServerConfig cfg;
  cfg.max_queue = 0;
  TestServer s(cfg);
  auto r = s.client().Post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  ServerConfig bad_timeout;
  bad_timeout.request_timeout_s = 1e10;
  EXPECT_THROW(Server(bad_timeout, fixture_loader(server_model())), rl::Error);
  ServerConfig bad_queue;
  bad_queue.max_queue = 1 << 16;
  EXPECT_THROW(Server(bad_queue, fixture_loader(server_model())), rl::Error);
}
