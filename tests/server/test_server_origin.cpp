// Cross-origin browser requests (issue 24): a web page may not drive a loopback server unless its
// origin is allowed. POST bodies must be declared JSON, a foreign Origin gets 403 before its body
// is read, and a CORS preflight is answered only for an allowed origin.
#include <gtest/gtest.h>

#include "common/error.h"
#include "server/origin_policy.h"
#include "server_test_util.h"

using nlohmann::json;
using namespace rl;
using namespace rl::test;

namespace {

const std::string kCompletion = json{{"prompt", "hi"}, {"max_tokens", 2}, {"temperature", 0}}.dump();

uint64_t generated_tokens(const TestServer& s) {
  auto m = s.client().Get("/metrics");
  const std::string key = "\nredlite_generated_tokens_total ";
  const size_t p = m ? m->body.find(key) : std::string::npos;
  return p == std::string::npos ? ~0ull : std::stoull(m->body.substr(p + key.size()));
}

}  // namespace

TEST(OriginPolicy, ParsesOriginsAndRefusesWhatIsNotOne) {
  OriginPolicy none;
  EXPECT_FALSE(none.allows("http://localhost:3000"));
  OriginPolicy some = OriginPolicy::parse("http://localhost:3000, https://App.Example");
  EXPECT_TRUE(some.allows("http://localhost:3000"));
  EXPECT_TRUE(some.allows("https://app.example"));
  EXPECT_FALSE(some.allows("https://app.example.evil"));
  EXPECT_FALSE(some.allows("http://localhost:3001"));
  OriginPolicy any = OriginPolicy::parse("*");
  EXPECT_TRUE(any.allows("https://anything.example"));
  EXPECT_FALSE(any.allows("null"));  // sandboxed frames and local files
  for (const char* bad : {"localhost:3000", "http://", "https://a.example/path", "evil"})
    EXPECT_THROW(OriginPolicy::parse(bad), Error) << bad;
  EXPECT_TRUE(is_json_content_type("application/json"));
  EXPECT_TRUE(is_json_content_type("Application/JSON; charset=utf-8"));
  EXPECT_TRUE(is_json_content_type("application/merge-patch+json"));
  EXPECT_FALSE(is_json_content_type("text/plain"));
  EXPECT_FALSE(is_json_content_type("application/x-www-form-urlencoded"));
  EXPECT_FALSE(is_json_content_type(""));
}

// The requests a page on another site can make without a preflight, and the preflight itself:
// none runs a generation by default.
TEST(ServerOrigin, CrossSiteRequestsAreRefusedByDefault) {
  RL_REQUIRE_FIXTURE(server_model());
  TestServer s(ServerConfig{});
  ASSERT_TRUE(s.ready());
  auto c = s.client(30);
  auto before = c.Post("/v1/completions", kCompletion, "application/json");
  ASSERT_TRUE(before);
  ASSERT_EQ(before->status, 200) << before->body;
  const std::string greedy = json::parse(before->body)["choices"][0]["text"];
  const uint64_t tokens0 = generated_tokens(s);
  auto plain = c.Post("/v1/completions", kCompletion, "text/plain");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 415) << plain->body;
  auto form = c.Post("/v1/completions", kCompletion, "application/x-www-form-urlencoded");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 415) << form->body;
  httplib::Headers evil = {{"Origin", "https://evil.example"}};
  auto cross = c.Post("/v1/completions", evil, kCompletion, "application/json");
  ASSERT_TRUE(cross);
  EXPECT_EQ(cross->status, 403) << cross->body;
  EXPECT_NE(cross->body.find("--allowed-origins"), std::string::npos) << cross->body;
  auto null_origin = c.Post("/v1/completions", {{"Origin", "null"}}, kCompletion, "application/json");
  ASSERT_TRUE(null_origin);
  EXPECT_EQ(null_origin->status, 403);
  auto preflight = c.Options("/v1/completions", {{"Origin", "https://evil.example"},
                                                 {"Access-Control-Request-Method", "POST"},
                                                 {"Access-Control-Request-Headers", "content-type"}});
  ASSERT_TRUE(preflight);
  EXPECT_EQ(preflight->status, 403);
  EXPECT_FALSE(preflight->has_header("Access-Control-Allow-Origin"));
  EXPECT_EQ(generated_tokens(s), tokens0) << "a refused request generated tokens";
  // A client that is not a browser (no Origin) with a JSON body is served, as before.
  auto ok = c.Post("/v1/completions", kCompletion, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(json::parse(ok->body)["choices"][0]["text"], greedy);
  EXPECT_FALSE(ok->has_header("Access-Control-Allow-Origin"));
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(ServerOrigin, AllowedOriginsGetPreflightAndCorsHeaders) {
  RL_REQUIRE_FIXTURE(server_model());
  ServerConfig cfg;
  cfg.allowed_origins = "http://localhost:5173";
  TestServer s(cfg);
  ASSERT_TRUE(s.ready());
  auto c = s.client(30);
  auto preflight = c.Options("/v1/chat/completions", {{"Origin", "http://localhost:5173"},
                                                      {"Access-Control-Request-Method", "POST"},
                                                      {"Access-Control-Request-Headers", "authorization, content-type"}});
  ASSERT_TRUE(preflight);
  EXPECT_EQ(preflight->status, 204);
  EXPECT_EQ(preflight->body, "");
  EXPECT_FALSE(preflight->has_header("Content-Length"));  // RFC 9110: none on a 204
  EXPECT_EQ(preflight->get_header_value("Access-Control-Allow-Origin"), "http://localhost:5173");
  EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_NE(preflight->get_header_value("Access-Control-Allow-Headers").find("Content-Type"), std::string::npos);
  // The 204 has no body: a request pipelined after it is answered right after its header.
  {
    RawConnection raw(s.port());
    raw.send("OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://localhost:5173\r\n"
             "Access-Control-Request-Method: POST\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    const std::string answer = raw.read(5000);
    const size_t end_of_204 = answer.find("\r\n\r\n");
    ASSERT_EQ(answer.rfind("HTTP/1.1 204 ", 0), 0u) << answer;
    ASSERT_NE(end_of_204, std::string::npos) << answer;
    EXPECT_EQ(answer.compare(end_of_204 + 4, 15, "HTTP/1.1 200 OK"), 0) << answer;
  }
  auto r = c.Post("/v1/completions", {{"Origin", "http://localhost:5173"}}, kCompletion, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://localhost:5173");
  EXPECT_EQ(r->get_header_value("Vary"), "Origin");
  auto other = c.Post("/v1/completions", {{"Origin", "http://localhost:5174"}}, kCompletion, "application/json");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 403);
  // A list entry that is not an origin is refused at construction.
  ServerConfig bad;
  bad.allowed_origins = "localhost:5173";
  EXPECT_THROW(Server(bad, fixture_loader(server_model())), Error);
}
