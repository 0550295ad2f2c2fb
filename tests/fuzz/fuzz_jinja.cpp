// libFuzzer target over the Jinja interpreter (src/generate/jinja_*): the input is a template
// source, as a GGUF file's tokenizer.chat_template carries it. It is parsed and, when it parses,
// rendered with a chat context (a system prompt, a user turn, an assistant tool call and its
// result, two tools, add_generation_prompt) under a short time budget and output limit. A
// JinjaError (any rl::Error) is a refusal; any other exception, a crash (deep recursion
// included), a hang past the budget or a sanitizer report is a finding.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "generate/jinja_template.h"

namespace {

const nlohmann::ordered_json& chat_context() {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Weather in Paris and Rome?"},
      {"role": "assistant", "content": "", "reasoning_content": "Two calls.",
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
      {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}
    ],
    "tools": [
      {"type": "function", "function": {"name": "get_weather", "description": "Weather",
       "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                      "days": {"type": "array", "items": {"type": "integer"}}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}
    ],
    "add_generation_prompt": true,
    "enable_thinking": false,
    "bos_token": "",
    "eos_token": "<|im_end|>"
  })");
  return context;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source((const char*)data, size);
  rl::jinja::RenderLimits limits;
  limits.time_budget = std::chrono::milliseconds(500);
  limits.max_output_bytes = size_t(1) << 20;
  try {
    const rl::jinja::JinjaTemplate t = rl::jinja::JinjaTemplate::parse(source);
    const std::string out = t.render(chat_context(), limits);
    if (out.size() > limits.max_output_bytes) {
      std::fprintf(stderr, "a render of %zu bytes past its limit of %zu\n", out.size(), limits.max_output_bytes);
      std::abort();
    }
  } catch (const rl::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}
