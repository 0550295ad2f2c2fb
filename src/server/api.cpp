#include "server/api.h"

#include <chrono>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "common/error.h"
#include "generate/json_depth.h"
#include "generate/json_schema_grammar.h"

namespace rl::api {

// Request bodies keep the client's key order (tools and tool-call arguments reach the chat
// template, whose tojson writes them in that order).
using json = nlohmann::ordered_json;

namespace {

// Requests may name at most this many stop strings, each at most this long (OpenAI allows 4;
// llama-server more). Bounds the work of the stop matcher per token.
constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopLength = 256;
constexpr int kMaxTopLogprobs = 20;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, "invalid_request_error", param);
}

const char* json_kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::binary: return "binary";
    default: return "a number";
  }
}

// A number field in [lo, hi]; null or absent: nullopt.
std::optional<double> number(const json& body, const char* key, double lo, double hi) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) bad(key, fmt::format("'{}' must be a number, got {}", key, json_kind(*it)));
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    bad(key, fmt::format("'{}' must be between {} and {}, got {}", key, lo, hi, it->dump()));
  return v;
}

std::optional<int64_t> integer(const json& body, const char* key, int64_t lo, int64_t hi) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() && !it->is_number_unsigned()) {
    // 3.0 is accepted as 3, as JSON makes no difference; 3.5 is not an integer.
    if (it->is_number_float()) {
      const double d = it->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && d >= (double)lo && d <= (double)hi) return (int64_t)d;
    }
    bad(key, fmt::format("'{}' must be an integer, got {}", key, it->is_number() ? it->dump() : json_kind(*it)));
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > (uint64_t)std::numeric_limits<int64_t>::max())
    bad(key, fmt::format("'{}' must be between {} and {}, got {}", key, lo, hi, it->dump()));
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) bad(key, fmt::format("'{}' must be between {} and {}, got {}", key, lo, hi, v));
  return v;
}

std::optional<bool> boolean(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) bad(key, fmt::format("'{}' must be a boolean, got {}", key, json_kind(*it)));
  return it->get<bool>();
}

std::optional<std::string> string(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) bad(key, fmt::format("'{}' must be a string, got {}", key, json_kind(*it)));
  return it->get<std::string>();
}

std::vector<std::string> stop_strings(const json& body) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return {};
  std::vector<std::string> out;
  if (it->is_string()) {
    out.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    if (it->size() > kMaxStopStrings)
      bad("stop", fmt::format("'stop' may hold at most {} strings, got {}", kMaxStopStrings, it->size()));
    for (const json& s : *it) {
      if (!s.is_string()) bad("stop", fmt::format("'stop' items must be strings, got {}", json_kind(s)));
      out.push_back(s.get<std::string>());
    }
  } else {
    bad("stop", fmt::format("'stop' must be a string or an array of strings, got {}", json_kind(*it)));
  }
  for (const std::string& s : out) {
    if (s.empty()) bad("stop", "'stop' strings must not be empty");
    if (s.size() > kMaxStopLength)
      bad("stop", fmt::format("'stop' strings may be at most {} bytes long", kMaxStopLength));
  }
  return out;
}

// response_format: "text" (nothing), "json_object" (any object) or "json_schema" (its
// json_schema.schema; absent: any JSON value), compiled here so a bad schema is a 400 that names
// the keyword.
std::shared_ptr<const Grammar> response_format_grammar(const json& body) {
  auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return nullptr;
  if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
    bad("response_format", "'response_format' must be an object with a string 'type'");
  const std::string type = (*it)["type"].get<std::string>();
  if (type == "text") return nullptr;
  try {
    if (type == "json_object") return std::make_shared<const Grammar>(json_object_grammar());
    if (type == "json_schema") {
      auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object())
        bad("response_format", "'response_format' of type 'json_schema' needs a 'json_schema' object");
      auto schema = js->find("schema");
      const nlohmann::ordered_json s =
          schema == js->end() ? nlohmann::ordered_json(true) : nlohmann::ordered_json::parse(schema->dump());
      return std::make_shared<const Grammar>(json_schema_grammar(s));
    }
  } catch (const Error& e) {
    bad("response_format", fmt::format("response_format: {}", e.what()));
  }
  throw ApiError(400, fmt::format("response_format type '{}' is not supported (text, json_object, json_schema)", type),
                 "invalid_request_error", "response_format", "unsupported_parameter");
}

CommonRequest parse_common(const json& body, const SamplingParams& defaults, bool chat) {
  CommonRequest r;
  r.gen.sampling = defaults;
  if (auto m = string(body, "model")) r.model = *m;
  // max_completion_tokens is the newer name of max_tokens in the chat API.
  auto max_tokens = integer(body, "max_tokens", 0, std::numeric_limits<int32_t>::max());
  if (auto m = integer(body, "max_completion_tokens", 0, std::numeric_limits<int32_t>::max())) max_tokens = m;
  if (max_tokens) {
    r.gen.max_tokens = (int)*max_tokens;
    r.max_tokens_given = true;
  }
  SamplingParams& s = r.gen.sampling;
  if (auto v = number(body, "temperature", 0.0, 2.0)) s.temperature = (float)*v;
  if (auto v = number(body, "top_p", 0.0, 1.0)) {
    if (*v <= 0.0) bad("top_p", "'top_p' must be greater than 0");
    s.top_p = (float)*v;
  }
  if (auto v = integer(body, "top_k", 0, 1 << 20)) s.top_k = (int)*v;
  if (auto v = number(body, "min_p", 0.0, 1.0)) s.min_p = (float)*v;
  if (auto v = number(body, "presence_penalty", -2.0, 2.0)) s.presence_penalty = (float)*v;
  if (auto v = number(body, "frequency_penalty", -2.0, 2.0)) s.frequency_penalty = (float)*v;
  if (auto v = number(body, "repeat_penalty", 0.0, 10.0)) {
    if (*v <= 0.0) bad("repeat_penalty", "'repeat_penalty' must be greater than 0");
    s.repeat_penalty = (float)*v;
  }
  if (auto v = integer(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    s.seed = (uint64_t)*v;
  else
    s.seed = (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count();
  r.gen.stop_strings = stop_strings(body);
  if (auto v = boolean(body, "stream")) r.stream = *v;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) bad("stream_options", "'stream_options' must be an object");
    if (auto v = boolean(*it, "include_usage")) r.include_usage = *v;
  }
  if (auto v = integer(body, "n", 1, 1 << 20); v && *v != 1)
    bad("n", "'n' must be 1: one choice per request is supported");
  if (chat) {
    const bool want = boolean(body, "logprobs").value_or(false);
    auto top = integer(body, "top_logprobs", 0, kMaxTopLogprobs);
    if (top && !want) bad("top_logprobs", "'top_logprobs' requires 'logprobs': true");
    if (want) r.top_logprobs = (int)top.value_or(0);
  } else {
    // Completions: logprobs is the number of alternatives (0..5 in OpenAI's API).
    if (auto v = integer(body, "logprobs", 0, 5)) r.top_logprobs = (int)*v;
  }
  r.gen.constraint.grammar = response_format_grammar(body);
  return r;
}

// OpenAI content: a string, null, or an array of parts of which only text parts are supported.
std::string message_content(const json& m, size_t index) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  const std::string param = fmt::format("messages[{}].content", index);
  if (!it->is_array()) bad(param, fmt::format("'{}' must be a string or an array of parts", param));
  std::string text;
  for (const json& part : *it) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad(param, fmt::format("'{}' parts must be objects with a 'type'", param));
    if (part["type"] != "text")
      bad(param, fmt::format("'{}': content parts of type '{}' are not supported (text only)", param,
                             part["type"].get<std::string>()));
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) bad(param, fmt::format("'{}': a text part needs a string 'text'", param));
    text += t->get<std::string>();
  }
  return text;
}

std::vector<ToolCall> message_tool_calls(const json& m, size_t index) {
  std::vector<ToolCall> calls;
  auto it = m.find("tool_calls");
  if (it == m.end() || it->is_null()) return calls;
  const std::string param = fmt::format("messages[{}].tool_calls", index);
  if (!it->is_array()) bad(param, fmt::format("'{}' must be an array", param));
  for (const json& c : *it) {
    if (!c.is_object()) bad(param, fmt::format("'{}' items must be objects", param));
    auto f = c.find("function");
    if (f == c.end() || !f->is_object()) bad(param, fmt::format("'{}' items need a 'function' object", param));
    ToolCall call;
    if (auto id = c.find("id"); id != c.end() && id->is_string()) call.id = id->get<std::string>();
    auto name = f->find("name");
    if (name == f->end() || !name->is_string() || name->get<std::string>().empty())
      bad(param, fmt::format("'{}': every function needs a 'name' string", param));
    call.name = name->get<std::string>();
    auto args = f->find("arguments");
    if (args == f->end() || args->is_null()) {
      call.arguments = "{}";
    } else if (args->is_string()) {
      call.arguments = args->get<std::string>();
      std::optional<json> parsed;
      try {
        parsed = parse_json_bounded<json>(call.arguments);
      } catch (const TooDeepJson&) {
        bad(param, fmt::format("'{}': 'arguments' of '{}' nests deeper than {} levels", param, call.name, kMaxJsonDepth));
      } catch (const json::exception&) {
      }
      if (!parsed || !parsed->is_object())
        bad(param, fmt::format("'{}': 'arguments' of '{}' must be a JSON object text", param, call.name));
    } else if (args->is_object()) {
      call.arguments = args->dump();
    } else {
      bad(param, fmt::format("'{}': 'arguments' must be a string", param));
    }
    calls.push_back(std::move(call));
  }
  return calls;
}

}  // namespace

nlohmann::json error_body(const ApiError& e) {
  using plain = nlohmann::json;
  plain err = {{"message", e.what()}, {"type", e.type}};
  err["param"] = e.param.empty() ? plain(nullptr) : plain(e.param);
  err["code"] = e.code.empty() ? plain(nullptr) : plain(e.code);
  return plain{{"error", err}};
}

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }
std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

json parse_body(const std::string& body) {
  if (body.empty()) throw ApiError(400, "the request body is empty; a JSON object is expected");
  json j;
  try {
    // Nesting is bounded: serialising a deeply nested value again (tools are re-rendered) recurses.
    j = json::parse(body, [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth)
        throw ApiError(400, fmt::format("the request body nests deeper than {} levels", kMaxJsonDepth));
      return true;
    });
  } catch (const json::exception& e) {  // parse errors, and numbers too large for a double
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, got {}", json_kind(j)));
  return j;
}

ChatRequest parse_chat_request(const json& body, const SamplingParams& defaults) {
  ChatRequest r;
  r.common = parse_common(body, defaults, /*chat=*/true);
  auto msgs = body.find("messages");
  if (msgs == body.end()) bad("messages", "'messages' is required");
  if (!msgs->is_array()) bad("messages", fmt::format("'messages' must be an array, got {}", json_kind(*msgs)));
  if (msgs->empty()) bad("messages", "'messages' must not be empty");
  for (size_t i = 0; i < msgs->size(); i++) {
    const json& m = (*msgs)[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(param, fmt::format("'{}' must be an object", param));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) bad(param + ".role", fmt::format("'{}.role' must be a string", param));
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for system
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      bad(param + ".role", fmt::format("'{}.role' must be system, user, assistant or tool, got '{}'", param, msg.role));
    msg.content = message_content(m, i);
    if (msg.role == "assistant") {
      msg.tool_calls = message_tool_calls(m, i);
      if (auto rc = m.find("reasoning_content"); rc != m.end() && rc->is_string())
        msg.reasoning_content = rc->get<std::string>();
    }
    if (msg.role == "tool") {
      if (auto id = m.find("tool_call_id"); id != m.end() && id->is_string()) msg.tool_call_id = id->get<std::string>();
    }
    r.messages.push_back(std::move(msg));
  }
  // tool_choice "none" hides the tools; a named function ({"type": "function", "function": {"name":
  // N}}) shows only that one (it must be among the tools); "auto" and "required" show them all.
  // "required" and a named function also make the reply a tool call (require_tool_call: the
  // server constrains the output with the chat format's call grammar).
  bool use_tools = true;
  std::string only_tool;
  bool choice_needs_tools = false;
  if (auto tc = body.find("tool_choice"); tc != body.end() && !tc->is_null()) {
    if (tc->is_string()) {
      const std::string v = tc->get<std::string>();
      if (v != "none" && v != "auto" && v != "required")
        bad("tool_choice", fmt::format("'tool_choice' must be none, auto, required or an object, got '{}'", v));
      use_tools = v != "none";
      choice_needs_tools = v == "required";
    } else if (tc->is_object()) {
      const json* fn = tc->contains("function") ? &(*tc)["function"] : nullptr;
      if ((tc->contains("type") && (*tc)["type"] != "function") || !fn || !fn->is_object() || !fn->contains("name") ||
          !(*fn)["name"].is_string())
        bad("tool_choice", "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
      only_tool = (*fn)["name"].get<std::string>();
      choice_needs_tools = true;
    } else {
      bad("tool_choice", "'tool_choice' must be a string or an object");
    }
  }
  const auto tools_it = body.find("tools");
  if (choice_needs_tools && (tools_it == body.end() || !tools_it->is_array() || tools_it->empty()))
    bad("tool_choice", "'tool_choice' requires a non-empty 'tools' list");
  if (auto tools = tools_it; tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) bad("tools", "'tools' must be an array");
    nlohmann::ordered_json ordered = *tools;
    for (size_t i = 0; i < ordered.size(); i++) {
      const auto& t = ordered[i];
      const std::string param = fmt::format("tools[{}]", i);
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object())
        bad(param, fmt::format("'{}' must be an object with a 'function' object", param));
      if (t.contains("type") && t["type"] != "function")
        bad(param, fmt::format("'{}.type' must be 'function'", param));
      if (!t["function"].contains("name") || !t["function"]["name"].is_string())
        bad(param, fmt::format("'{}.function.name' must be a string", param));
      if (t["function"].contains("parameters") && !t["function"]["parameters"].is_object() &&
          !t["function"]["parameters"].is_null())
        bad(param, fmt::format("'{}.function.parameters' must be a JSON schema object", param));
    }
    if (!only_tool.empty()) {
      nlohmann::ordered_json chosen = nlohmann::ordered_json::array();
      for (const auto& t : ordered)
        if (t["function"]["name"] == only_tool) chosen.push_back(t);
      if (chosen.empty())
        bad("tool_choice", fmt::format("'tool_choice' names function '{}', which is not in 'tools'", only_tool));
      ordered = std::move(chosen);
    }
    if (use_tools) r.tools = std::move(ordered);
  }
  r.require_tool_call = choice_needs_tools && use_tools;
  if (auto v = boolean(body, "enable_thinking")) r.enable_thinking = v;
  if (auto kw = body.find("chat_template_kwargs"); kw != body.end() && kw->is_object())
    if (auto v = boolean(*kw, "enable_thinking")) r.enable_thinking = v;
  return r;
}

CompletionRequest parse_completion_request(const json& body, const SamplingParams& defaults) {
  CompletionRequest r;
  r.common = parse_common(body, defaults, /*chat=*/false);
  auto p = body.find("prompt");
  if (p == body.end() || p->is_null()) bad("prompt", "'prompt' is required");
  auto token_list = [&](const json& arr) {
    std::vector<int32_t> ids;
    for (const json& t : arr) {
      if (!t.is_number_integer() && !t.is_number_unsigned())
        bad("prompt", "'prompt' token arrays must hold integers");
      const int64_t v = t.get<int64_t>();
      if (v < 0 || v > std::numeric_limits<int32_t>::max()) bad("prompt", fmt::format("token id {} is out of range", v));
      ids.push_back((int32_t)v);
    }
    return ids;
  };
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) bad("prompt", "'prompt' must not be empty");
    if ((*p)[0].is_string() || (*p)[0].is_array()) {
      if (p->size() != 1) bad("prompt", "a batch of several prompts is not supported; send one prompt per request");
      if ((*p)[0].is_string()) r.prompt_text = (*p)[0].get<std::string>();
      else r.prompt_tokens = token_list((*p)[0]);
    } else {
      r.prompt_tokens = token_list(*p);
    }
  } else {
    bad("prompt", fmt::format("'prompt' must be a string or an array of token ids, got {}", json_kind(*p)));
  }
  if (auto echo = boolean(body, "echo"); echo && *echo)
    throw ApiError(400, "'echo' is not supported", "invalid_request_error", "echo", "unsupported_parameter");
  number(body, "best_of", 1, 1);  // only 1 is meaningful with one choice per request
  return r;
}

}  // namespace rl::api
