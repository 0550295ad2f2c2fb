// A corpus of malformed requests: bad JSON, wrong types, out-of-range and huge values, huge
// bodies, garbage on the socket, slow clients and early disconnects. Every one gets a 4xx with an
// OpenAI-style error object (or, below HTTP, a closed connection) and the server still answers.
#include <gtest/gtest.h>

#include <chrono>

#include "server_test_util.h"

using nlohmann::json;
using namespace rl;
using namespace rl::test;

namespace {

struct Case {
  std::string path;
  std::string body;
  std::string why;
};

json valid_chat() {
  return json{{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 1}};
}
json valid_completion() { return json{{"prompt", "hi"}, {"max_tokens", 1}}; }

std::vector<Case> corpus() {
  std::vector<Case> cases;
  // Not JSON, or not an object.
  const char* broken[] = {"", "{", "}", "{\"messages\": [", "{'a': 1}", "{\"a\":}", "{\"a\" 1}", "nul",
                          "{\"a\": tru}", "{\"a\": 01}", "{\"a\": .5}", "{\"a\": 1,}", "[1, 2,]", "\"\\x\"",
                          "{\"a\": \"\\ud800\"}", "{\"a\": NaN}", "{\"a\": Infinity}", "{\"a\": 1e99999}",
                          "\xff\xfe{}", "{\"a\": \"\xc3\x28\"}", "{\"messages\": \"\xe2\x82\"}", "<xml/>",
                          "[]", "1", "\"text\"", "null", "true", "{}{}", "{\"a\":1} trailing"};
  for (const char* b : broken) {
    cases.push_back({"/v1/chat/completions", b, std::string("broken body: ") + b});
    cases.push_back({"/v1/completions", b, std::string("broken body: ") + b});
  }
  // Deep nesting, at the top and inside fields that are serialised again (tools, arguments).
  cases.push_back({"/v1/chat/completions", std::string(20000, '[') + std::string(20000, ']'), "deep array"});
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  cases.push_back({"/v1/chat/completions",
                   R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"tools":)" + deep + "}",
                   "deeply nested tools"});
  cases.push_back({"/v1/chat/completions",
                   R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":)" + deep +
                       "}}]}]}",
                   "deeply nested tool-call arguments"});
  cases.push_back({"/v1/chat/completions",
                   R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":5}}]})",
                   "tool parameters not an object"});
  // Wrong types and out-of-range values for every field.
  const json wrong_values[] = {"text", json::object(), json::array({1}), true, -1, 1e308, -1e308, 3.5};
  const char* numeric_fields[] = {"max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                  "frequency_penalty", "seed", "n", "repeat_penalty", "max_completion_tokens"};
  for (const char* f : numeric_fields) {
    for (const json& v : wrong_values) {
      // Values that are in range for the field are not malformed.
      if (v.is_number()) {
        const double d = v.get<double>();
        const std::string name = f;
        if (name == "seed" && d == -1) continue;
        if ((name == "presence_penalty" || name == "frequency_penalty") && d == -1) continue;
        if (name == "repeat_penalty" && d == 3.5) continue;
      }
      json c = valid_chat();
      c[f] = v;
      cases.push_back({"/v1/chat/completions", c.dump(), std::string(f) + "=" + v.dump()});
      json p = valid_completion();
      p[f] = v;
      cases.push_back({"/v1/completions", p.dump(), std::string(f) + "=" + v.dump()});
    }
  }
  const char* bool_fields[] = {"stream", "logprobs"};
  for (const char* f : bool_fields)
    for (const json& v : {json("yes"), json(1), json::array(), json::object()}) {
      json c = valid_chat();
      c[f] = v;
      cases.push_back({"/v1/chat/completions", c.dump(), std::string(f) + "=" + v.dump()});
    }
  // Messages.
  const json bad_messages[] = {
      json::array(), json::object(), "hi", 5, json::array({1}), json::array({json::object()}),
      json::array({{{"role", "wizard"}, {"content", "x"}}}), json::array({{{"role", 1}, {"content", "x"}}}),
      json::array({{{"content", "x"}}}), json::array({{{"role", "user"}, {"content", 5}}}),
      json::array({{{"role", "user"}, {"content", json::object()}}}),
      json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}, {"image_url", "x"}}})}}}),
      json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}}})}}}),
      json::array({{{"role", "user"}, {"content", json::array({5})}}}),
      json::array({{{"role", "assistant"}, {"content", "x"}, {"tool_calls", 5}}}),
      json::array({{{"role", "assistant"}, {"tool_calls", json::array({{{"function", {{"name", 5}}}}})}}}),
      json::array({{{"role", "assistant"}, {"tool_calls", json::array({{{"function", {{"name", "f"}, {"arguments", "{not json"}}}}})}}}),
      json::array({{{"role", "assistant"}, {"tool_calls", json::array({{{"function", {{"name", "f"}, {"arguments", "[1]"}}}}})}}}),
      json::array({{{"role", "assistant"}, {"tool_calls", json::array({"x"})}}})};
  for (const json& m : bad_messages) {
    json c = valid_chat();
    c["messages"] = m;
    cases.push_back({"/v1/chat/completions", c.dump(), "messages=" + m.dump()});
  }
  {
    json c = valid_chat();
    c.erase("messages");
    cases.push_back({"/v1/chat/completions", c.dump(), "no messages"});
  }
  // Stop strings, tools, formats, logprobs.
  const json bad_other[][2] = {{"stop", 5},
                               {"stop", json::array({1})},
                               {"stop", ""},
                               {"stop", json::array({"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q"})},
                               {"stop", std::string(1000, 'x')},
                               {"tools", "x"},
                               {"tools", json::array({5})},
                               {"tools", json::array({{{"type", "function"}}})},
                               {"tools", json::array({{{"type", "function"}, {"function", {{"name", 3}}}}})},
                               {"tools", json::array({{{"type", "retrieval"}, {"function", {{"name", "f"}}}}})},
                               {"tool_choice", "sometimes"},
                               {"tool_choice", 5},
                               {"tool_choice", "required"},  // without tools
                               {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}},  // without tools
                               {"tool_choice", {{"type", "function"}, {"function", 5}}},
                               {"tool_choice", {{"type", "retrieval"}, {"function", {{"name", "f"}}}}},
                               {"response_format", "json"},
                               {"response_format", {{"type", "json_schema"}}},
                               {"response_format", {{"type", 5}}},
                               {"stream_options", "x"},
                               {"stream_options", {{"include_usage", "yes"}}},
                               {"top_logprobs", 3},
                               {"top_logprobs", 50},
                               {"model", 5}};
  for (const auto& kv : bad_other) {
    json c = valid_chat();
    c[kv[0].get<std::string>()] = kv[1];
    if (kv[0] == "top_logprobs" && kv[1] == 50) c["logprobs"] = true;
    cases.push_back({"/v1/chat/completions", c.dump(), kv[0].get<std::string>() + "=" + kv[1].dump()});
  }
  {  // a named function that is not among the tools
    json c = valid_chat();
    c["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
    c["tool_choice"] = {{"type", "function"}, {"function", {{"name", "g"}}}};
    cases.push_back({"/v1/chat/completions", c.dump(), "tool_choice names a missing function"});
  }
  // Completion prompts.
  const json bad_prompts[] = {nullptr, 5, json::object(), json::array(), json::array({-1}), json::array({1.5}),
                              json::array({"a", "b"}), json::array({json::array({1}), json::array({2})}),
                              json::array({99999999}), json::array({1e12}), json::array({true})};
  for (const json& p : bad_prompts) {
    json c = valid_completion();
    c["prompt"] = p;
    cases.push_back({"/v1/completions", c.dump(), "prompt=" + p.dump()});
  }
  {
    json c = valid_completion();
    c["echo"] = true;
    cases.push_back({"/v1/completions", c.dump(), "echo"});
    c = valid_completion();
    c["logprobs"] = 9;
    cases.push_back({"/v1/completions", c.dump(), "logprobs=9"});
  }
  // Tokenizer endpoints.
  for (const json& b : {json::object(), json{{"content", 5}}, json{{"content", "x"}, {"parse_special", "y"}}})
    cases.push_back({"/tokenize", b.dump(), "tokenize " + b.dump()});
  for (const json& b : {json::object(), json{{"tokens", "x"}}, json{{"tokens", json::array({-5})}},
                        json{{"tokens", json::array({1 << 30})}}, json{{"tokens", json::array({"a"})}}})
    cases.push_back({"/detokenize", b.dump(), "detokenize " + b.dump()});
  // Paths that do not exist.
  cases.push_back({"/v1/embeddings", valid_completion().dump(), "unknown endpoint"});
  cases.push_back({"/v2/chat/completions", valid_chat().dump(), "unknown endpoint"});
  return cases;
}

// A raw reply must be an HTTP response with `status` and an OpenAI-style error object as its body.
void expect_raw_error(const std::string& reply, int status, const std::string& why) {
  SCOPED_TRACE(why);
  ASSERT_EQ(reply.rfind("HTTP/1.1 " + std::to_string(status) + " ", 0), 0u) << "reply: '" << reply << "'";
  const size_t body = reply.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos) << reply;
  const json e = json::parse(reply.substr(body + 4), nullptr, false);
  ASSERT_TRUE(e.is_object()) << reply;
  EXPECT_TRUE(e.contains("error") && e["error"]["message"].is_string()) << reply;
}

}  // namespace

TEST(ServerAbuse, MalformedRequestsGet4xxAndTheServerSurvives) {
  RL_REQUIRE_FIXTURE(server_model());
  ServerConfig cfg;
  cfg.max_body_bytes = 1 << 20;
  cfg.read_timeout_s = 1;
  TestServer s(cfg);
  ASSERT_TRUE(s.ready());
  auto c = s.client(30);
  auto cases = corpus();
  ASSERT_GE(cases.size(), 200u);
  for (const Case& k : cases) {
    auto r = c.Post(k.path, k.body, "application/json");
    ASSERT_TRUE(r) << k.why << ": no response";
    EXPECT_GE(r->status, 400) << k.why << " -> " << r->status << " " << r->body;
    EXPECT_LT(r->status, 500) << k.why << " -> " << r->status << " " << r->body;
    json e = json::parse(r->body, nullptr, false);
    ASSERT_FALSE(e.is_discarded()) << k.why << ": error body is not JSON: " << r->body;
    EXPECT_TRUE(e.contains("error") && e["error"].contains("message") && e["error"]["message"].is_string())
        << k.why << ": " << r->body;
  }
  // A body over the limit.
  auto big = c.Post("/v1/chat/completions", std::string(2 << 20, ' '), "application/json");
  if (big) EXPECT_EQ(big->status, 413);
  // A huge content-length that never arrives, garbage request lines, slow and vanishing clients.
  const int port = s.port();
  expect_raw_error(raw_exchange(port, "POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n{"), 413,
                   "a Content-Length past the body limit");
  expect_raw_error(raw_exchange(port, "HELLO WORLD\r\n\r\n"), 400, "a request line that is not HTTP");
  // A request whose headers never end is dropped when the header deadline (1 s here) passes: the
  // connection closes without an answer, well before the client's own 5 s read timeout.
  {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string reply = raw_exchange(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len");
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(reply.empty() || reply.rfind("HTTP/1.1 408 ", 0) == 0) << "headers that never end: '" << reply << "'";
    EXPECT_LT(waited, 4.0) << "headers that never end: the connection was held past the header deadline";
  }
  raw_exchange(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prom", true);
  raw_exchange(port, "GET /health HTTP/1.1\r\n", true);
  // GET on a POST endpoint, POST on a GET one.
  auto wrong_method = c.Get("/v1/chat/completions");
  ASSERT_TRUE(wrong_method);
  EXPECT_GE(wrong_method->status, 400);
  EXPECT_LT(wrong_method->status, 500);

  auto h = s.client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto ok = c.Post("/v1/completions", valid_completion().dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}
