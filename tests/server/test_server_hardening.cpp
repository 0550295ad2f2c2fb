// Attacks below the JSON API, one case per class the adversarial run found (issue 24): framing
// (RFC 9112), header and body floods, slow and vanishing clients, deep nesting inside strings,
// auth before the body, a model file truncated while served. Each asserts the clean answer (a 4xx, a closed connection), and that
// afterwards /health answers and a greedy answer is what it was before the attack.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "gguf/gguf.h"
#include "server_test_util.h"

using nlohmann::json;
using namespace rl;
using namespace rl::test;

namespace {

constexpr size_t kMaxBody = 64 << 10;

ServerConfig hardened_config() {
  ServerConfig cfg;
  cfg.max_body_bytes = kMaxBody;
  cfg.read_timeout_s = 1;
  return cfg;
}

std::string greedy_text(const TestServer& s) {
  auto r = s.client(60).Post("/v1/completions",
                             json{{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0}}.dump(),
                             "application/json");
  if (!r || r->status != 200) return "<no answer>";
  return json::parse(r->body)["choices"][0]["text"];
}

// /health answers and the greedy answer is unchanged after an attack.
void expect_still_serving(const TestServer& s, const std::string& greedy_before, const std::string& after) {
  auto h = s.client(10).Get("/health");
  ASSERT_TRUE(h) << "no /health after " << after;
  EXPECT_EQ(h->status, 200) << after;
  EXPECT_EQ(greedy_text(s), greedy_before) << after;
}

std::string status_line(const std::string& response) { return response.substr(0, response.find("\r\n")); }

// A request whose answer must be `status` followed by the server closing the connection.
struct Refused {
  std::string why;
  std::string bytes;
  std::string status;  // "400", "413", ...
};

void expect_refused_and_closed(int port, const Refused& k) {
  RawConnection c(port);
  ASSERT_TRUE(c.connected());
  c.send(k.bytes);  // may fail part-way: the server is allowed to stop reading
  const auto t0 = std::chrono::steady_clock::now();
  const std::string answer = c.read(5000);
  EXPECT_EQ(status_line(answer).rfind("HTTP/1.1 " + k.status + " ", 0), 0u) << k.why << ": " << answer.substr(0, 200);
  EXPECT_TRUE(c.closed_by_server()) << k.why << ": the connection stays open";
  // One answer: nothing after the refused header was taken for another request.
  size_t answers = 0;
  for (size_t p = answer.find("HTTP/1.1 "); p != std::string::npos; p = answer.find("HTTP/1.1 ", p + 1)) answers++;
  EXPECT_EQ(answers, 1u) << k.why << ": " << answer;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3)) << k.why << ": answered late";
  if (answer.find("\r\n\r\n") != std::string::npos) {
    json e = json::parse(answer.substr(answer.find("\r\n\r\n") + 4), nullptr, false);
    EXPECT_TRUE(!e.is_discarded() && e.contains("error")) << k.why << ": " << answer;
  }
}

const std::string kPost = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";

}  // namespace

class ServerHardening : public ::testing::Test {
 protected:
  void SetUp() override { RL_REQUIRE_FIXTURE(server_model()); }
  // Starts the server and takes its greedy answer, which still_serving() compares against.
  TestServer& start(ServerConfig cfg = hardened_config(), const std::string& model = server_model()) {
    server_ = std::make_unique<TestServer>(cfg, model);
    EXPECT_TRUE(server_->ready());
    greedy_ = greedy_text(*server_);
    EXPECT_NE(greedy_, "<no answer>");
    return *server_;
  }
  void still_serving(const std::string& after) const { expect_still_serving(*server_, greedy_, after); }

  std::unique_ptr<TestServer> server_;
  std::string greedy_;
};

TEST_F(ServerHardening, FramingErrorsAre400AndCloseTheConnection) {
  TestServer& s = start();
  const std::string body = R"({"prompt":"hi","max_tokens":1})";
  const std::string cl = "Content-Length: " + std::to_string(body.size()) + "\r\n";
  const Refused cases[] = {
      {"Content-Length with Transfer-Encoding", kPost + cl + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "400"},
      {"Transfer-Encoding then Content-Length", kPost + "Transfer-Encoding: chunked\r\n" + cl + "\r\n0\r\n\r\n", "400"},
      {"two different Content-Lengths", kPost + cl + "Content-Length: 3\r\n\r\n" + body, "400"},
      {"Content-Length -1", kPost + "Content-Length: -1\r\n\r\n" + body, "400"},
      {"Content-Length 2^70", kPost + "Content-Length: 1180591620717411303424\r\n\r\n" + body, "400"},
      {"Content-Length not a number", kPost + "Content-Length: 12abc\r\n\r\n" + body, "400"},
      {"space before the colon", kPost + "Content-Length : " + std::to_string(body.size()) + "\r\n\r\n" + body, "400"},
      {"Transfer-Encoding not ending in chunked", kPost + "Transfer-Encoding: gzip\r\n\r\n" + body, "400"},
      {"chunked then gzip", kPost + "Transfer-Encoding: chunked, gzip\r\n\r\n" + body, "400"},
      // Found by fuzz_http_request: a coding list the parser cannot read, then a Content-Length.
      {"unreadable codings ending in chunked, then Content-Length",
       kPost + "Transfer-Encoding: g:ip, chunked\r\n" + cl + "\r\n" + body, "400"},
      {"bad chunk size", kPost + "Transfer-Encoding: chunked\r\n\r\nzz\r\n" + body + "\r\n0\r\n\r\n", "400"},
      {"HTTP/1.1 without Host", "GET /health HTTP/1.1\r\n\r\n", "400"},
      {"HTTP/2.0 as text", "GET /health HTTP/2.0\r\nHost: x\r\n\r\n", "400"},
      {"malformed HTTP version", "GET /health HTTP/3.77\r\nHost: x\r\n\r\n", "400"},
      {"garbage request line", "HELLO WORLD\r\n\r\n", "400"},
  };
  for (const Refused& k : cases) expect_refused_and_closed(s.port(), k);
  still_serving("framing errors");
}

TEST_F(ServerHardening, HeaderFloodsAreRefusedWithinTheLimit) {
  TestServer& s = start();
  std::string many_fields;
  for (int i = 0; i < 5000; i++) many_fields += "X-F" + std::to_string(i) + ": 1\r\n";
  std::string a_few_too_many;
  for (int i = 0; i < 150; i++) a_few_too_many += "X-F" + std::to_string(i) + ": 1\r\n";
  const Refused cases[] = {
      {"16 MiB header line", "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(16 << 20, 'a') + "\r\n\r\n", "431"},
      {"16 MiB request line", "GET /" + std::string(16 << 20, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n", "414"},
      {"request line past 8 KiB", "GET /" + std::string(9000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n", "414"},
      {"5000 header fields", "GET /health HTTP/1.1\r\nHost: x\r\n" + many_fields + "\r\n", "431"},
      {"150 header fields (small ones)", "GET /health HTTP/1.1\r\nHost: x\r\n" + a_few_too_many + "\r\n", "431"},
  };
  for (const Refused& k : cases) expect_refused_and_closed(s.port(), k);
  still_serving("header floods");
}

TEST_F(ServerHardening, BodiesPastTheLimitAre413ChunkedOrNot) {
  TestServer& s = start();
  // Content-Length past the limit: refused from the header, before any body byte.
  expect_refused_and_closed(s.port(), {"Content-Length past the limit", kPost + "Content-Length: 10000000\r\n\r\n", "413"});
  // Chunked: counted as it arrives; the server stops reading at the limit.
  std::string chunked = kPost + "Transfer-Encoding: chunked\r\n\r\n";
  const std::string chunk(16 << 10, ' ');
  for (int i = 0; i < 64; i++) chunked += fmt::format("{:x}\r\n", chunk.size()) + chunk + "\r\n";
  chunked += "0\r\n\r\n";
  expect_refused_and_closed(s.port(), {"chunked body of 1 MiB", chunked, "413"});
  // Expect: 100-continue with an oversized body: 413 at once, never 100.
  {
    RawConnection c(s.port());
    c.send(kPost + "Content-Length: 1000000\r\nExpect: 100-continue\r\n\r\n");
    const std::string answer = c.read(3000);
    EXPECT_EQ(answer.find("100 Continue"), std::string::npos) << answer;
    EXPECT_EQ(status_line(answer).rfind("HTTP/1.1 413 ", 0), 0u) << answer;
  }
  // ... and with a body within the limit: 100, then the answer once the body is sent.
  {
    const std::string body = R"({"prompt":"hi","max_tokens":1})";
    RawConnection c(s.port());
    c.send(kPost + "Content-Length: " + std::to_string(body.size()) + "\r\nExpect: 100-continue\r\n\r\n");
    EXPECT_EQ(c.read(3000, "\r\n\r\n"), "HTTP/1.1 100 Continue\r\n\r\n");
    c.send(body);
    EXPECT_EQ(status_line(c.read(30000, "}")), "HTTP/1.1 200 OK");
  }
  still_serving("oversized bodies");
}

// Pipelined requests are answered, all of them, in the order sent.
TEST_F(ServerHardening, PipelinedRequestsAreAnsweredInOrder) {
  TestServer& s = start();
  const std::string body = R"({"content":"hello"})";
  RawConnection c(s.port());
  c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
         "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body +
         "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string answer = c.read(10000);
  EXPECT_TRUE(c.closed_by_server());
  const size_t first = answer.find("\"status\""), second = answer.find("\"tokens\""), third = answer.find("\"list\"");
  ASSERT_NE(first, std::string::npos) << answer;
  ASSERT_NE(second, std::string::npos) << answer;
  ASSERT_NE(third, std::string::npos) << answer;
  EXPECT_LT(first, second);
  EXPECT_LT(second, third);
  size_t n = 0;
  for (size_t p = answer.find("HTTP/1.1 200 OK"); p != std::string::npos; p = answer.find("HTTP/1.1 200 OK", p + 1)) n++;
  EXPECT_EQ(n, 3u) << answer;
}

// With an API key set, a client without it is refused from its header: it need not (and does
// not get to) upload the body.
TEST_F(ServerHardening, AuthIsCheckedBeforeTheBody) {
  ServerConfig cfg = hardened_config();
  cfg.api_key = "sekret";
  TestServer s(cfg);
  ASSERT_TRUE(s.ready());
  for (const std::string framing : {"Transfer-Encoding: chunked\r\n", "Content-Length: 60000\r\n"}) {
    RawConnection c(s.port());
    c.send(kPost + framing + "\r\n");  // the header only
    const std::string answer = c.read(3000);
    EXPECT_EQ(status_line(answer).rfind("HTTP/1.1 401 ", 0), 0u) << framing << answer;
    EXPECT_TRUE(c.closed_by_server()) << framing;
  }
}

// A connection that sends nothing, and one that trickles its header, are dropped at the header
// deadline (read_timeout_s = 1), however often bytes arrive.
TEST_F(ServerHardening, SlowAndSilentClientsAreDropped) {
  TestServer& s = start();
  const auto t0 = std::chrono::steady_clock::now();
  RawConnection silent(s.port());
  silent.read(4000);
  EXPECT_TRUE(silent.closed_by_server());
  RawConnection trickle(s.port());
  const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + std::string(100, 'a');
  bool dropped = false;
  for (size_t i = 0; i < request.size() && !dropped; i++) {
    dropped = !trickle.send(request.substr(i, 1));
    const std::string got = trickle.read(100);
    if (!got.empty()) EXPECT_EQ(status_line(got).rfind("HTTP/1.1 408 ", 0), 0u) << got;
    dropped = dropped || trickle.closed_by_server();
  }
  EXPECT_TRUE(dropped) << "a header trickled over 10 s was still being read";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8));
  still_serving("slow clients");
}

// A kept-alive connection is closed when no next request comes within the idle timeout; one
// that sends its next request in time is served on the same connection.
TEST_F(ServerHardening, IdleKeptAliveConnectionsAreClosed) {
  ServerConfig cfg = hardened_config();
  cfg.idle_timeout_s = 0.5;
  TestServer& s = start(cfg);
  RawConnection c(s.port());
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  c.send(health);
  EXPECT_EQ(status_line(c.read(2000, "}")), "HTTP/1.1 200 OK");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  c.send(health);
  EXPECT_EQ(status_line(c.read(2000, "}")), "HTTP/1.1 200 OK");
  const auto t0 = std::chrono::steady_clock::now();
  c.read(3000);
  EXPECT_TRUE(c.closed_by_server());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
  still_serving("idle connections");
}

// Tool-call arguments are a JSON string: under the qwen3-coder format the renderer parses and
// walks them. Nested far past the limit they are a 400, not a stack overflow.
TEST_F(ServerHardening, DeeplyNestedToolArgumentsAre400UnderTheCoderFormat) {
  ServerConfig cfg = hardened_config();
  cfg.max_body_bytes = 1 << 20;
  cfg.chat_template.format = "qwen3-coder";
  TestServer& s = start(cfg);
  const std::string args = "{\"a\": " + std::string(30000, '[') + std::string(30000, ']') + "}";
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}},
                                         {{"role", "assistant"},
                                          {"tool_calls", json::array({{{"type", "function"},
                                                                       {"function", {{"name", "f"}, {"arguments", args}}}}})}},
                                         {{"role", "user"}, {"content", "again"}}})},
               {"max_tokens", 1}};
  auto r = s.client(30).Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r) << "no answer: the server died?";
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("nests deeper than 64"), std::string::npos) << r->body;
  still_serving("deep tool arguments");
}

// A client waiting for a whole (non-streamed) answer that disconnects cancels its generation.
TEST_F(ServerHardening, DisconnectCancelsAWholeAnswer) {
  TestServer& s = start();
  {
    const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 3000}}.dump();
    RawConnection c(s.port());
    c.send(kPost + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }  // closed before the answer
  const auto t0 = std::chrono::steady_clock::now();
  still_serving("a vanished client");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  auto m = s.client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("redlite_requests_cancelled_total 1"), std::string::npos) << m->body;
}

// The served model file truncated under the CPU backend: the next generation ends with a 500
// naming the file (not SIGBUS), and /health still answers.
TEST_F(ServerHardening, TruncatedModelFileEndsTheRequestWithAnErrorNamingIt) {
  const std::string copy =
      (std::filesystem::temp_directory_path() / ("redlite-served-" + std::to_string(::getpid()) + ".gguf")).string();
  std::filesystem::copy_file(server_model(), copy, std::filesystem::copy_options::overwrite_existing);
  const uint64_t data_offset = GgufFile::open(copy)->data_offset();
  TestServer& s = start(hardened_config(), copy);
  ASSERT_EQ(::truncate(copy.c_str(), (off_t)data_offset), 0);
  std::filesystem::remove(copy);  // the mapping keeps the (truncated) file alive
  auto r = s.client(60).Post("/v1/completions", json{{"prompt", "Another prompt"}, {"max_tokens", 2}}.dump(),
                             "application/json");
  ASSERT_TRUE(r) << "no answer: the server died?";
  EXPECT_EQ(r->status, 500) << r->body;
  EXPECT_NE(r->body.find(copy + ": the file was truncated"), std::string::npos) << r->body;
  auto h = s.client(10).Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}
