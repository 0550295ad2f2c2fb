// ChatTemplate's use of the Jinja interpreter: the file's template is tried once on a sample
// conversation when the model loads, then renders every prompt; what it cannot run falls back to
// the native renderer of the recognised format, with a warning that names the construct.
#include <fmt/format.h>

#include "common/error.h"
#include "generate/chat_template.h"
#include "generate/jinja_template.h"

namespace rl {

using ojson = nlohmann::ordered_json;

namespace {

ojson render_context(const ojson& messages, const ChatRenderOptions& opt) {
  // As transformers' apply_chat_template: tools is None when there are none, enable_thinking
  // is passed only when the request sets it.
  ojson ctx = {{"messages", messages},
               {"tools", opt.tools.is_array() && !opt.tools.empty() ? opt.tools : ojson(nullptr)},
               {"add_generation_prompt", opt.add_generation_prompt}};
  if (opt.enable_thinking) ctx["enable_thinking"] = *opt.enable_thinking;
  return ctx;
}

// Every kind of turn a request can carry, so a construct the interpreter lacks shows up at load
// time rather than in the middle of serving.
std::vector<ChatMessage> sample_conversation() {
  std::vector<ChatMessage> m(6);
  m[0].role = "system";
  m[0].content = "You are helpful.";
  m[1].role = "user";
  m[1].content = "Weather in Paris?";
  m[2].role = "assistant";
  m[2].reasoning_content = "A tool gives it.";
  m[2].tool_calls.push_back(ToolCall{"call_0", "get_weather", R"({"city": "Paris", "days": 2, "metric": true})"});
  m[3].role = "tool";
  m[3].content = "18C";
  m[3].tool_call_id = "call_0";
  m[4].role = "assistant";
  m[4].content = "18C.";
  m[5].role = "user";
  m[5].content = "Thanks";
  return m;
}

ojson sample_tools() {
  return ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City"},
    "days": {"type": "integer"}, "metric": {"type": "boolean"}}, "required": ["city"]}}}])");
}

}  // namespace

void ChatTemplate::attach_jinja(std::string_view source) {
  try {
    auto parsed = std::make_shared<const jinja::JinjaTemplate>(jinja::JinjaTemplate::parse(source));
    ChatRenderOptions opt;
    opt.tools = supports_tools() ? sample_tools() : ojson::array();
    try {
      parsed->render(render_context(chat_messages_json(sample_conversation()), opt));
    } catch (const jinja::JinjaError& e) {
      if (e.unsupported) throw;
      // The template's own refusal of the sample (a raise_exception) says nothing about requests.
    }
    jinja_ = std::move(parsed);
  } catch (const jinja::JinjaError& e) {
    jinja_warning_ = fmt::format("{}; rendering the recognised {} format natively", e.what(), name());
  }
}

std::optional<std::string> ChatTemplate::render_jinja(std::span<const ChatMessage> messages,
                                                      const ChatRenderOptions& opt) const {
  const ojson ctx = render_context(chat_messages_json(messages), opt);
  try {
    return jinja_->render(ctx);
  } catch (const jinja::JinjaError& e) {
    if (!e.unsupported) throw Error(e.what());
    fmt::print(stderr, "warning: {}; rendering the recognised {} format natively\n", e.what(), name());
    return std::nullopt;
  }
}

}  // namespace rl
