// The request queue and the request timeout, made deterministic: a long stream holds the model's
// worker, so which requests wait and which are refused is known, and the timeout is far shorter
// than the generation it cuts (fixture model B, CPU backend).
#include <gtest/gtest.h>

#include <thread>

#include "server_test_util.h"

using nlohmann::json;
using namespace rl;
using namespace rl::test;

namespace {

class ServerQueue : public ServerModelTest {};

const json kShort = {{"prompt", "Hi there"}, {"max_tokens", 3}, {"temperature", 0}};

}  // namespace

// --max-queue 1 with one stream running: the first request waits (and then gets its answer), every
// further one is refused at once with 503, Retry-After and code queue_full, and counted.
TEST_F(ServerQueue, QueueOfOneWithAStreamRunning) {
  ServerConfig cfg;
  cfg.max_queue = 1;
  TestServer s(cfg);
  ASSERT_TRUE(s.ready());
  auto idle = s.client().Post("/v1/completions", kShort.dump(), "application/json");
  ASSERT_TRUE(idle);
  ASSERT_EQ(idle->status, 200) << idle->body;
  const std::string expected = json::parse(idle->body)["choices"][0]["text"];

  int waited_status = 0;
  std::string waited_text;
  std::jthread waiting;  // declared before the stream: joined after the stream is released
  BusyStream busy(s);
  ASSERT_TRUE(busy.start()) << "the long stream did not start";
  waiting = std::jthread([&] {
    auto r = s.client().Post("/v1/completions", kShort.dump(), "application/json");
    if (!r) return;
    waited_status = r->status;
    if (r->status == 200) waited_text = json::parse(r->body)["choices"][0]["text"];
  });
  ASSERT_TRUE(wait_for_metric(s, "redlite_queue_depth", 1)) << "the second request was not queued";
  for (int i = 0; i < 3; i++) {
    SCOPED_TRACE("refused request " + std::to_string(i));
    auto r = s.client(5).Post("/v1/completions", kShort.dump(), "application/json");
    ASSERT_TRUE(r) << "no answer within 5 s: the request was queued, not refused";
    EXPECT_EQ(r->status, 503) << r->body;
    EXPECT_EQ(r->get_header_value("Retry-After"), "1");
    const json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r->body;
    EXPECT_EQ(e["error"]["code"], "queue_full") << r->body;
  }
  EXPECT_EQ(metric(s, "redlite_queue_depth"), 1);
  EXPECT_EQ(metric(s, "redlite_requests_running"), 1);
  EXPECT_EQ(metric(s, "redlite_requests_rejected_busy_total"), 3);
  busy.release();
  waiting.join();
  EXPECT_EQ(waited_status, 200);
  EXPECT_EQ(waited_text, expected) << "the queued request's answer differs from the same request run alone";
  EXPECT_TRUE(wait_for_metric(s, "redlite_requests_running", 0));
  EXPECT_EQ(metric(s, "redlite_requests_cancelled_total"), 1) << "the released stream was not cancelled";
}

// A request that runs past --timeout: 504 with type timeout_error for a whole answer; a stream
// ends with an error event of that type and [DONE]; each counts in redlite_requests_timed_out_total;
// the server then answers a short request.
TEST_F(ServerQueue, TimeoutGives504OrAnErrorEventAndCounts) {
  ServerConfig cfg;
  cfg.request_timeout_s = 0.5;  // 3000 tokens take tens of seconds on the CPU
  TestServer s(cfg);
  ASSERT_TRUE(s.ready());
  EXPECT_EQ(metric(s, "redlite_requests_timed_out_total"), 0);
  json body = {{"prompt", "Once upon a time"}, {"max_tokens", 3000}, {"temperature", 0}};
  const auto t0 = std::chrono::steady_clock::now();
  auto whole = s.client(30).Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(whole);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(whole->status, 504) << whole->body;
  const json we = json::parse(whole->body, nullptr, false);
  ASSERT_TRUE(we.is_object()) << whole->body;
  EXPECT_EQ(we["error"]["type"], "timeout_error") << whole->body;
  EXPECT_EQ(metric(s, "redlite_requests_timed_out_total"), 1);

  body["stream"] = true;
  auto streamed = s.client(30).Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 200) << "a stream has started when the timeout strikes";
  const SseStream sse = parse_sse(streamed->body);
  EXPECT_TRUE(sse.done) << "the stream must end with data: [DONE]";
  ASSERT_FALSE(sse.events.empty());
  const json& last = sse.events.back();
  ASSERT_TRUE(last.contains("error")) << "the last event is not an error: " << last.dump();
  EXPECT_EQ(last["error"]["type"], "timeout_error") << last.dump();
  EXPECT_EQ(metric(s, "redlite_requests_timed_out_total"), 2);

  auto after = s.client(30).Post("/v1/completions", kShort.dump(), "application/json");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200) << after->body;
}
