// Request bodies as the chat template needs them: the client's key order kept in `tools` and in
// tool-call arguments (tojson writes them in that order), and arguments sent as a string or as
// an object reaching the prompt as the same tojson text.
#include <gtest/gtest.h>

#include "generate/chat_template.h"
#include "server/api.h"

namespace rl {
namespace {

const char* kBody = R"({"model": "m",
  "messages": [{"role": "user", "content": "hi"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"zeta": 1, "alpha": {"y": 2, "b": 3}}}},
      {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{\"zeta\":true,\"alpha\":null}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
  "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
    "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "object"}}}}}]})";

TEST(RequestParsing, KeepsTheClientsKeyOrder) {
  const api::ChatRequest r = api::parse_chat_request(api::parse_body(kBody), SamplingParams{});
  EXPECT_EQ(r.tools.dump(),
            R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",)"
            R"("properties":{"zeta":{"type":"integer"},"alpha":{"type":"object"}}}}}])");
  ASSERT_EQ(r.messages.size(), 3u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 2u);
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, R"({"zeta":1,"alpha":{"y":2,"b":3}})");
  EXPECT_EQ(r.messages[1].tool_calls[1].arguments, R"({"zeta":true,"alpha":null})");
}

// The Qwen3 JSON call form, written by hand from the template: tools as tojson lines, each call
// as {"name": ..., "arguments": tojson(arguments)} whatever form the client sent them in.
TEST(RequestParsing, ArgumentsReachThePromptAsTojsonWritesThem) {
  const api::ChatRequest r = api::parse_chat_request(api::parse_body(kBody), SamplingParams{});
  ChatRenderOptions opt;
  opt.tools = r.tools;
  const std::string prompt = ChatTemplate::of(ChatFormat::Qwen3Instruct).render(r.messages, opt);
  EXPECT_NE(prompt.find(R"({"type": "function", "function": {"name": "f", "parameters": {"type": "object", )"
                        R"("properties": {"zeta": {"type": "integer"}, "alpha": {"type": "object"}}}}})"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
                        "{\"zeta\": 1, \"alpha\": {\"y\": 2, \"b\": 3}}}\n</tool_call>\n<tool_call>\n"
                        "{\"name\": \"f\", \"arguments\": {\"zeta\": true, \"alpha\": null}}\n</tool_call><|im_end|>\n"),
            std::string::npos)
      << prompt;
}

}  // namespace
}  // namespace rl
