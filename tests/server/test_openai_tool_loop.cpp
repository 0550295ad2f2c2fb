// A whole tool loop per chat format through the official `openai` npm client
// (openai_tool_loop.mjs): one `redlite serve` per format, rendering with the format's published
// template text (tests/generate/templates, --chat-template-file). Turn 1 streams a required call,
// which the client assembles from the deltas; turn 2 sends the call and its result back.
// Checked here: the call names a declared tool and its arguments validate against the tool's
// schema (Python's jsonschema); both prompts have exactly as many tokens as Python's jinja2
// renders from the same template and messages (so the tool result is in the second prompt, as
// the template puts it); the second turn reuses at least the whole first prompt
// (usage.prompt_tokens_details.cached_tokens).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "generate/jinja2_reference.h"
#include "generate/json_constraint_util.h"
#include "serve_process.h"
#include "server_test_util.h"

using nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace rl;
using namespace rl::test;

namespace {

// JSON calls (Instruct, Thinking, hybrid) and XML calls (both Coder texts: the older one prints
// non-string arguments in the history with Python's str(), Coder-Next's as JSON).
struct FormatUnderTest {
  const char* format;         // a label: the server recognises the format from the text
  const char* template_file;  // in tests/generate/templates
};
const FormatUnderTest kFormats[] = {
    {"qwen3-instruct", "qwen3-next-80b-a3b-instruct.jinja"},
    {"qwen3-thinking", "qwen3-next-80b-a3b-thinking.jinja"},
    {"qwen3-hybrid", "qwen3-hybrid.jinja"},
    {"qwen3-coder", "qwen3-coder.jinja"},
    {"qwen3-coder-next", "qwen3-coder-next.jinja"},
};

// The messages as the template sees them once the server has read the client's: content null
// is "", a call's arguments are the parsed object, empty reasoning is left out.
ojson template_messages(const ojson& sent) {
  ojson out = ojson::array();
  for (const ojson& m : sent) {
    ojson t = {{"role", m["role"]}, {"content", m["content"].is_string() ? m["content"] : ojson("")}};
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string() && m["reasoning_content"] != "")
      t["reasoning_content"] = m["reasoning_content"];
    if (m.contains("tool_calls") && !m["tool_calls"].empty()) {
      ojson calls = ojson::array();
      for (const ojson& c : m["tool_calls"])
        calls.push_back({{"id", c["id"]},
                         {"type", "function"},
                         {"function", {{"name", c["function"]["name"]},
                                       {"arguments", ojson::parse(c["function"]["arguments"].get<std::string>())}}}});
      t["tool_calls"] = std::move(calls);
    }
    if (m.contains("tool_call_id")) t["tool_call_id"] = m["tool_call_id"];
    out.push_back(std::move(t));
  }
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST(ServerOpenAIClient, ToolLoopPerFormat) {
  RL_REQUIRE_FIXTURE(server_model());
  if (const std::string why = node_client_missing(); !why.empty()) GTEST_SKIP() << why;
  const std::string key = "test-key-loop";
  std::vector<std::unique_ptr<ServeProcess>> servers;
  std::string endpoints;
  for (const FormatUnderTest& f : kFormats) {
    const std::string log = std::string(REDLITE_BINARY_DIR) + "/serve-tool-loop-" + f.format + ".log";
    servers.push_back(std::make_unique<ServeProcess>(
        server_model(), key, log, std::vector<std::string>{"--chat-template-file", template_fixture(f.template_file)}));
    ASSERT_TRUE(servers.back()->ok()) << "could not start " << redlite_bin();
    endpoints += std::string(" ") + f.format + "=" + servers.back()->base_url();
  }
  for (const auto& s : servers) ASSERT_TRUE(s->wait_healthy()) << "redlite serve did not become healthy; log: " << s->log();

  const std::string dir = std::string(REDLITE_SOURCE_DIR) + "/tests/server";
  const std::string out = run_shell("cd " + dir + " && node openai_tool_loop.mjs " + key + endpoints).out;
  const ojson r = ojson::parse(out, nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << "client output: " << out;

  auto owned = fixture_loader(server_model())([](float) {});
  const Tokenizer& tok = *owned.tokenizer;
  std::vector<SchemaCase> schema_cases;
  std::vector<Jinja2Case> prompts;  // per format: turn 1, turn 2
  for (size_t k = 0; k < std::size(kFormats); ++k) {
    const FormatUnderTest& f = kFormats[k];
    SCOPED_TRACE(f.format);
    // The interpreter ran the file's text: no fallback warning.
    EXPECT_EQ(read_text(servers[k]->log()).find("warning"), std::string::npos) << read_text(servers[k]->log());
    ASSERT_TRUE(r.contains(f.format)) << out;
    const ojson& loop = r[f.format];
    ASSERT_FALSE(loop.contains("error")) << loop["error"];
    const ojson& turn1 = loop["turn1"];
    EXPECT_EQ(turn1["finish"], "tool_calls");
    EXPECT_GE(turn1["tool_call_chunks"].get<int>(), 1) << "the call did not come as a tool_calls delta";
    const ojson& calls = turn1["message"]["tool_calls"];
    ASSERT_FALSE(calls.empty()) << turn1.dump();
    for (const ojson& call : calls) {
      EXPECT_FALSE(call["id"].get<std::string>().empty());
      const ojson* declared = nullptr;
      for (const ojson& t : loop["tools"])
        if (t["function"]["name"] == call["function"]["name"]) declared = &t;
      ASSERT_NE(declared, nullptr) << "the call names no declared tool: " << call.dump();
      schema_cases.push_back({(*declared)["function"]["parameters"], call["function"]["arguments"].get<std::string>()});
    }
    ASSERT_TRUE(loop.contains("turn2")) << loop.dump();
    const ojson& turn2 = loop["turn2"];
    const int prompt1 = turn1["usage"]["prompt_tokens"];
    const int cached2 = turn2["usage"]["prompt_tokens_details"]["cached_tokens"];
    // The session kept from turn 1 covers its whole prompt: the history the client sent back
    // renders to the same tokens.
    EXPECT_GT(cached2, 0);
    EXPECT_GE(cached2, prompt1) << "the second turn reused less than the first prompt";
    for (const ojson* turn : {&turn1, &turn2})
      prompts.push_back({template_fixture(f.template_file),
                         {{"messages", template_messages((*turn)["messages"])},
                          {"tools", loop["tools"]},
                          {"add_generation_prompt", true}}});
  }

  // Both prompts as jinja2 renders them, in tokens.
  const std::vector<Jinja2Result> rendered = render_with_jinja2(prompts);
  ASSERT_EQ(rendered.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const FormatUnderTest& f = kFormats[i / 2];
    SCOPED_TRACE(std::string(f.format) + (i % 2 ? " turn 2" : " turn 1"));
    ASSERT_TRUE(rendered[i].ok) << rendered[i].text;
    const ojson& usage = r[f.format][i % 2 ? "turn2" : "turn1"]["usage"];
    EXPECT_EQ(usage["prompt_tokens"].get<size_t>(), tok.encode(rendered[i].text, true).size()) << rendered[i].text;
  }

  bool missing = false;
  const std::string report = python_validate(schema_cases, missing);
  if (missing) GTEST_SKIP() << "python3-jsonschema is missing: " << report;
  EXPECT_EQ(report, "");
}
