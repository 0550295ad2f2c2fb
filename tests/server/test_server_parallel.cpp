// The scheduler (--parallel): concurrent streamed requests decoded together in one batched pass
// each give exactly the greedy text they give alone (the test server's CPU backend computes the
// exact tier), a client that goes away mid-stream does not disturb the others, a second turn
// reuses its cached prefix, the queue refuses with 503 beyond capacity, and a request larger than
// the sessions' budget gets 400.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "common/error.h"
#include "server/scheduler.h"
#include "server_test_util.h"

using nlohmann::json;
using namespace rl;
using namespace rl::test;

namespace {

class ServerParallelTest : public ServerModelTest {};

ServerConfig parallel_config(int parallel, int max_queue = 16) {
  ServerConfig cfg;
  cfg.parallel = parallel;
  cfg.max_queue = max_queue;
  return cfg;
}

// A streamed request on a raw connection, left open until closed (a client that can vanish).
class OpenStream {
 public:
  OpenStream(int port, const json& body) : conn_(port) {
    const std::string b = body.dump();
    conn_.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
               std::to_string(b.size()) + "\r\n\r\n" + b);
  }
  // Reads until a chunk of generated text has arrived (true) or 60 s pass. (The first chunk, the
  // role's, goes out when the request is queued.)
  bool wait_text() {
    std::string got;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
      got += conn_.read(1000);
      for (size_t p = got.find("\"content\":\""); p != std::string::npos; p = got.find("\"content\":\"", p + 1))
        if (p + 11 < got.size() && got[p + 11] != '"') return true;
      if (conn_.closed_by_server()) return false;
    }
    return false;
  }

 private:
  RawConnection conn_;
};

double wait_metric(const TestServer& s, const std::string& name, double at_least) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  double v = metric(s, name);
  while (v < at_least && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    v = metric(s, name);
  }
  return v;
}

TEST_F(ServerParallelTest, ConcurrentStreamsGiveTheirTextAloneAndACancelledOneDisturbsNone) {
  const std::vector<std::string> users = {"What is the capital of France?", "Name three colours.",
                                          "Count from one to five.", "Why is the sky blue?",
                                          "Tell me a story about a fox.", "What is two plus two?"};
  // Long enough that the streams overlap for most of their steps however fast a step is (at 24
  // tokens the faster CPU kernels left the batch's mean size near the bound, 1.39-1.49 in 3 of 4 runs).
  const int max_tokens = 64;
  TestServer s(parallel_config(4));
  // One more stream that its client drops after the first chunk, while the others run.
  auto dropped = std::make_unique<OpenStream>(s.port(), chat_body("Write a long poem about the sea.", 3000, true));
  std::vector<std::string> texts(users.size());
  std::vector<int> statuses(users.size(), 0);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < users.size(); i++)
    clients.emplace_back([&, i] {
      auto c = s.client();
      auto r = c.Post("/v1/chat/completions", chat_body(users[i], max_tokens, true).dump(), "application/json");
      if (!r) return;
      statuses[i] = r->status;
      SseStream sse = parse_sse(r->body);
      if (sse.done) texts[i] = stream_text(sse);
    });
  ASSERT_TRUE(dropped->wait_text());
  dropped.reset();
  for (auto& t : clients) t.join();

  SamplingParams greedy;
  greedy.temperature = 0;
  for (size_t i = 0; i < users.size(); i++) {
    ASSERT_EQ(statuses[i], 200) << users[i];
    EXPECT_EQ(texts[i], generator_text(chat_prompt_tokens(users[i]), greedy, max_tokens)) << users[i];
  }
  // The sequences did run together, and the dropped one was cancelled, not run to its end.
  EXPECT_GT(metric(s, "redlite_decode_batch_size_mean"), 1.5);
  EXPECT_EQ(wait_metric(s, "redlite_requests_cancelled_total", 1), 1);
  EXPECT_LT(metric(s, "redlite_generated_tokens_total"), users.size() * (max_tokens + 1) + 1000);
}

TEST_F(ServerParallelTest, SecondTurnReusesItsCachedPrefixWhileAnotherSequenceRuns) {
  TestServer s(parallel_config(4));
  OpenStream other(s.port(), chat_body("Write a long poem about the sea.", 400, true));
  ASSERT_TRUE(other.wait_text());
  auto c = s.client();
  json first = chat_body("Tell me about Paris.", 12);
  auto r1 = c.Post("/v1/chat/completions", first.dump(), "application/json");
  ASSERT_TRUE(r1);
  ASSERT_EQ(r1->status, 200) << r1->body;
  json j1 = json::parse(r1->body);
  json second = next_turn(first, j1, "And about Lyon?");
  second["stream"] = true;
  second["stream_options"] = {{"include_usage", true}};
  auto r2 = c.Post("/v1/chat/completions", second.dump(), "application/json");
  ASSERT_TRUE(r2);
  ASSERT_EQ(r2->status, 200);
  SseStream sse = parse_sse(r2->body);
  ASSERT_FALSE(sse.events.empty());
  const json usage = sse.events.back()["usage"];
  EXPECT_GE(usage["prompt_tokens_details"]["cached_tokens"].get<int>(), j1["usage"]["prompt_tokens"].get<int>());
  EXPECT_LT(usage["prompt_tokens_details"]["cached_tokens"].get<int>(), usage["prompt_tokens"].get<int>());
}

TEST_F(ServerParallelTest, WithTheCacheOffASecondTurnGoesToTheSlotHoldingItsConversation) {
  ServerConfig cfg = parallel_config(2);
  cfg.prompt_cache_bytes = 0;  // reuse can only come from a slot's own session
  TestServer s(cfg);
  // Slot 0 serves another conversation, the first turn goes to slot 1; when the second turn
  // arrives both are idle and the first in order holds the other conversation. The first turn
  // generates one token, which is never decoded: its slot's history is exactly the first prompt,
  // which the second prompt extends (a longer reply re-tokenised need not match what was decoded).
  auto other = std::make_unique<OpenStream>(s.port(), chat_body("Write a long poem about the sea.", 3000, true));
  ASSERT_TRUE(other->wait_text());
  auto c = s.client();
  json first = chat_body("Tell me about Paris.", 1);
  auto r1 = c.Post("/v1/chat/completions", first.dump(), "application/json");
  ASSERT_TRUE(r1);
  ASSERT_EQ(r1->status, 200) << r1->body;
  EXPECT_EQ(metric(s, "redlite_requests_running"), 1) << "the other conversation must still run here";
  other.reset();  // its client goes: it ends at its next step, and its slot is idle
  ASSERT_EQ(wait_metric(s, "redlite_requests_cancelled_total", 1), 1);
  json j1 = json::parse(r1->body);
  json second = next_turn(first, j1, "And about Lyon?");
  auto r2 = c.Post("/v1/chat/completions", second.dump(), "application/json");
  ASSERT_TRUE(r2);
  ASSERT_EQ(r2->status, 200);
  EXPECT_GE(json::parse(r2->body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
            j1["usage"]["prompt_tokens"].get<int>());
}

TEST_F(ServerParallelTest, BeyondTheSequencesAndTheQueueRequestsGet503) {
  TestServer s(parallel_config(2, /*max_queue=*/1));
  OpenStream a(s.port(), chat_body("Write a long poem about the sea.", 2000, true));
  OpenStream b(s.port(), chat_body("Write a long poem about the sky.", 2000, true));
  ASSERT_EQ(wait_metric(s, "redlite_requests_running", 2), 2);
  OpenStream queued(s.port(), chat_body("Hello", 4, true));
  ASSERT_EQ(wait_metric(s, "redlite_queue_depth", 1), 1);
  EXPECT_EQ(metric(s, "redlite_requests_running"), 2);
  auto c = s.client();
  auto r = c.Post("/v1/chat/completions", chat_body("One too many", 4).dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "queue_full");
}

TEST_F(ServerParallelTest, RequestLargerThanTheBudgetGets400AndOnesThatFitStillRun) {
  ServerConfig cfg = parallel_config(2);
  cfg.kv_mib = 1;  // model B: 1 KiB of KV per token and 0.2 MiB of DeltaNet state, about 800 tokens
  TestServer s(cfg);
  auto c = s.client();
  auto big = c.Post("/v1/chat/completions", chat_body("Hello", 3000).dump(), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 400) << big->body;
  const json err = json::parse(big->body)["error"];
  EXPECT_EQ(err["code"], "request_too_large");
  EXPECT_NE(err["message"].get<std::string>().find("--kv-mib"), std::string::npos) << err;
  // Two that fit the budget only one at a time: the second waits for the first, both succeed.
  std::vector<int> statuses(2, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; i++)
    clients.emplace_back([&, i] {
      auto r = s.client().Post("/v1/chat/completions", chat_body("Hello", 500).dump(), "application/json");
      if (r) statuses[i] = r->status;
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(statuses[0], 200);
  EXPECT_EQ(statuses[1], 200);
  EXPECT_LE(metric(s, "redlite_session_bytes"), 1.0 * 1048576);
}

TEST_F(ServerParallelTest, ParallelOutOfRangeIsRefused) {
  EXPECT_THROW(Server(parallel_config(0), fixture_loader(server_model())), Error);
  EXPECT_THROW(Server(parallel_config(17), fixture_loader(server_model())), Error);
}

// --step-prefill-tokens is checked when the server starts, before its model loads.
TEST_F(ServerParallelTest, StepPrefillTokensOutOfRangeIsRefusedAtStart) {
  for (int bad : {-1, SchedulerConfig::kMaxStepPrefillTokens + 1}) {
    ServerConfig cfg = parallel_config(2);
    cfg.step_prefill_tokens = bad;
    try {
      Server server(cfg, fixture_loader(server_model()));
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--step-prefill-tokens"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
