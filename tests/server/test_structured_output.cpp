// Structured outputs through the HTTP API (fixture model B, random weights, CPU backend):
// response_format json_object / json_schema, tool_choice "required" and a named function, in the
// JSON (Qwen3) and XML (Qwen3-Coder) call syntaxes, after a Thinking block; every document is
// checked by Python's json + jsonschema (tests/generate/validate_json.py), not by the engine.
#include <gtest/gtest.h>

#include <thread>

#include "generate/json_constraint_util.h"
#include "server_test_util.h"

using nlohmann::json;
using namespace rl;
using namespace rl::test;

namespace {

const json kPerson = json::parse(R"({"type":"object","properties":{
    "name":{"type":"string","maxLength":8},"age":{"type":"integer"},
    "tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},"required":["name","age","tags"]})");

const json kTools = json::parse(R"([
  {"type":"function","function":{"name":"get_weather","description":"Weather",
   "parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city","days"]}}},
  {"type":"function","function":{"name":"get_time","description":"Time",
   "parameters":{"type":"object","properties":{"utc":{"type":"boolean"}},"required":["utc"]}}}])");

json chat(const std::string& user, int max_tokens) {
  return {{"messages", json::array({{{"role", "user"}, {"content", user}}})}, {"max_tokens", max_tokens},
          {"temperature", 0}};
}

json json_schema_format(const json& schema) {
  return {{"type", "json_schema"}, {"json_schema", {{"name", "out"}, {"strict", true}, {"schema", schema}}}};
}

json post(httplib::Client& c, const json& body, int expect_status = 200) {
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  EXPECT_TRUE(r);
  if (!r) return json();
  EXPECT_EQ(r->status, expect_status) << r->body;
  return json::parse(r->body);
}

// The tool calls of a reply, each checked against its tool's parameters by Python.
std::vector<SchemaCase> call_cases(const json& message, const json& tools) {
  std::vector<SchemaCase> cases;
  for (const json& call : message.value("tool_calls", json::array())) {
    const std::string name = call["function"]["name"];
    bool known = false;
    for (const json& t : tools)
      if (t["function"]["name"] == name) {
        known = true;
        cases.push_back({nlohmann::ordered_json::parse(t["function"]["parameters"].dump()),
                         call["function"]["arguments"].get<std::string>()});
      }
    EXPECT_TRUE(known) << name;
  }
  return cases;
}

#define EXPECT_VALID(cases)                                                    \
  do {                                                                         \
    bool missing = false;                                                      \
    const std::string report = python_validate(cases, missing);               \
    if (missing) GTEST_SKIP() << "python3-jsonschema is missing: " << report; \
    EXPECT_EQ(report, "");                                                     \
  } while (0)

}  // namespace

class StructuredOutputTest : public ::testing::Test {
 protected:
  void SetUp() override { RL_REQUIRE_FIXTURE(server_model()); }
};

TEST_F(StructuredOutputTest, ResponseFormatDocumentsValidateWholeStreamedAndSampled) {
  TestServer s(ServerConfig{});
  ASSERT_TRUE(s.ready());
  auto c = s.client();
  json body = chat("Describe a person.", 48);
  body["response_format"] = json_schema_format(kPerson);
  const json whole = post(c, body);
  const std::string content = whole["choices"][0]["message"]["content"];
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  body["stream"] = true;
  auto streamed = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(streamed);
  std::string text;
  for (const json& e : parse_sse(streamed->body).events)
    if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content"))
      text += e["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(text, content) << "streaming is unchanged by the constraint";

  std::vector<SchemaCase> cases{{nlohmann::ordered_json::parse(kPerson.dump()), content}};
  body["stream"] = false;
  body["temperature"] = 1.0;
  for (int seed = 1; seed <= 3; ++seed) {
    body["seed"] = seed;
    cases.push_back({nlohmann::ordered_json::parse(kPerson.dump()), post(c, body)["choices"][0]["message"]["content"]});
  }
  body["response_format"] = {{"type", "json_object"}};
  cases.push_back({nlohmann::ordered_json::parse(R"({"type":"object"})"), post(c, body)["choices"][0]["message"]["content"]});
  EXPECT_VALID(cases);
}

TEST_F(StructuredOutputTest, SchemaErrorsAndTheLengthLimit) {
  TestServer s(ServerConfig{});
  ASSERT_TRUE(s.ready());
  auto c = s.client();
  json body = chat("x", 8);
  body["response_format"] = json_schema_format({{"type", "integer"}, {"minimum", 0}});
  json e = post(c, body, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("'minimum'"), std::string::npos) << e.dump();
  EXPECT_EQ(e["error"]["param"], "response_format");
  body["response_format"] = json_schema_format({{"type", "string"}, {"enum", {1, 2}}});
  e = post(c, body, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("admits no value"), std::string::npos) << e.dump();
  body["response_format"] = {{"type", "xml"}};
  post(c, body, 400);

  // Three tokens cannot hold this document: "length", and the text is where it stopped.
  body["max_tokens"] = 3;
  body["response_format"] = json_schema_format(kPerson);
  const json r = post(c, body);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 3);
}

TEST_F(StructuredOutputTest, RequiredAndNamedToolCallsInJsonAndCoderSyntax) {
  for (const char* format : {"qwen3-instruct", "qwen3-coder"}) {
    ServerConfig cfg;
    cfg.chat_template.format = format;
    TestServer s(cfg);
    ASSERT_TRUE(s.ready());
    auto c = s.client();
    json body = chat("What is the weather in Paris?", 128);  // the budget counts the call in bytes
    body["tools"] = kTools;
    body["tool_choice"] = "required";
    std::vector<SchemaCase> cases;
    for (double temperature : {0.0, 1.0}) {
      body["temperature"] = temperature;
      body["seed"] = 5;
      const json r = post(c, body);
      const json& msg = r["choices"][0]["message"];
      ASSERT_TRUE(msg.contains("tool_calls")) << format << ": " << r.dump();
      EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
      auto more = call_cases(msg, kTools);
      cases.insert(cases.end(), more.begin(), more.end());
    }
    body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
    const json r = post(c, body);
    const json& msg = r["choices"][0]["message"];
    ASSERT_TRUE(msg.contains("tool_calls")) << format << ": " << r.dump();
    for (const json& call : msg["tool_calls"]) EXPECT_EQ(call["function"]["name"], "get_time");
    auto more = call_cases(msg, kTools);
    cases.insert(cases.end(), more.begin(), more.end());
    EXPECT_VALID(cases);
  }
}

// A Thinking reply: the reasoning is free (closed in time by the budget), the content validates.
TEST_F(StructuredOutputTest, ThinkingReplyReasonsFreelyThenWritesTheDocument) {
  ServerConfig cfg;
  cfg.chat_template.format = "qwen3-thinking";
  TestServer s(cfg);
  ASSERT_TRUE(s.ready());
  auto c = s.client();
  json body = chat("Describe a person.", 64);
  body["response_format"] = json_schema_format(kPerson);
  const json r = post(c, body);
  const json& msg = r["choices"][0]["message"];
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(msg.contains("reasoning_content")) << r.dump();
  std::vector<SchemaCase> cases{{nlohmann::ordered_json::parse(kPerson.dump()), msg["content"]}};
  EXPECT_VALID(cases);
}

// With --parallel 3, a schema-constrained, an object-constrained and a free request decoded
// together each keep their own grammar mask: each equals its answer alone (greedy, exact tier)
// and the documents validate.
TEST_F(StructuredOutputTest, ConcurrentRequestsEachKeepTheirOwnConstraint) {
  ServerConfig cfg;
  cfg.parallel = 3;
  TestServer s(cfg);
  ASSERT_TRUE(s.ready());
  std::vector<json> bodies(3, chat("Describe a person.", 40));
  bodies[0]["response_format"] = json_schema_format(kPerson);
  bodies[1]["response_format"] = {{"type", "json_object"}};
  std::vector<std::string> alone, together(3);
  auto c = s.client();
  for (const json& b : bodies) alone.push_back(post(c, b)["choices"][0]["message"]["content"]);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < bodies.size(); i++)
    clients.emplace_back([&, i] {
      auto ci = s.client();
      auto r = ci.Post("/v1/chat/completions", bodies[i].dump(), "application/json");
      if (r && r->status == 200) together[i] = json::parse(r->body)["choices"][0]["message"]["content"];
    });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < bodies.size(); i++) EXPECT_EQ(together[i], alone[i]) << "request " << i;
  EXPECT_GT(metric(s, "redlite_decode_batch_size_mean"), 1.0);
  EXPECT_VALID((std::vector<SchemaCase>{{nlohmann::ordered_json::parse(kPerson.dump()), together[0]},
                                        {nlohmann::ordered_json::parse(R"({"type":"object"})"), together[1]}}));
}
