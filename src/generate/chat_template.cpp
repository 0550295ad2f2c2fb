#include "generate/chat_template.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "common/error.h"
#include "generate/jinja_strings.h"
#include "generate/json_depth.h"
#include "generate/python_text.h"

namespace rl {

using ojson = nlohmann::ordered_json;

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::ChatML: return "chatml";
    case ChatFormat::Qwen2: return "qwen2";
    case ChatFormat::Qwen3Instruct: return "qwen3-instruct";
    case ChatFormat::Qwen3Thinking: return "qwen3-thinking";
    case ChatFormat::Qwen3Hybrid: return "qwen3-hybrid";
    case ChatFormat::Qwen3Coder: return "qwen3-coder";
  }
  return "?";
}

namespace {
constexpr ChatFormat kAllFormats[] = {ChatFormat::ChatML,        ChatFormat::Qwen2,        ChatFormat::Qwen3Instruct,
                                      ChatFormat::Qwen3Thinking, ChatFormat::Qwen3Hybrid, ChatFormat::Qwen3Coder};
}  // namespace

std::optional<ChatFormat> chat_format_from_name(std::string_view name) {
  for (ChatFormat f : kAllFormats)
    if (name == chat_format_name(f)) return f;
  return std::nullopt;
}

std::string chat_format_names() {
  std::string out;
  for (ChatFormat f : kAllFormats) out += std::string(out.empty() ? "" : ", ") + chat_format_name(f);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Python-compatible text helpers: the templates call str.strip() (Python's whitespace, Unicode
// included: jinja_strings.h) and strip('\n'); str() and json.dumps are in python_text.h.

namespace {

using jinja::py_strip;

// s.strip('\n') (or lstrip / rstrip).
std::string strip_newlines(std::string_view s, bool left, bool right) {
  static const std::string kNewline = "\n";
  return py_strip(s, &kNewline, left, right);
}

ojson parse_arguments(const ToolCall& call, size_t message_index) {
  ojson args;
  try {
    args = call.arguments.empty() ? ojson::object() : parse_json_bounded<ojson>(call.arguments);
  } catch (const TooDeepJson&) {
    fail("messages[{}].tool_calls ({}): arguments nest deeper than {} levels", message_index, call.name,
         kMaxJsonDepth);
  } catch (const std::exception& e) {
    fail("messages[{}].tool_calls ({}): arguments are not valid JSON: {}", message_index, call.name, e.what());
  }
  if (!args.is_object())
    fail("messages[{}].tool_calls ({}): arguments must be a JSON object", message_index, call.name);
  return args;
}

void check_roles(std::span<const ChatMessage> messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      fail("messages[{}]: role '{}' is not one of system, user, assistant, tool", i, r);
    if (!messages[i].tool_calls.empty() && r != "assistant")
      fail("messages[{}]: only assistant messages carry tool_calls", i);
  }
}

// The instructions the Qwen3 (JSON) templates put after the tool list.
constexpr std::string_view kQwen3ToolsHead =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr std::string_view kQwen3ToolsTail =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

// The Qwen3-Coder template's system text and tool-use instructions.
constexpr std::string_view kCoderDefaultSystem =
    "You are Qwen, a helpful AI assistant that can interact with a computer to solve tasks.";
constexpr std::string_view kCoderToolsHead = "\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
constexpr std::string_view kCoderToolsTail =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is no "
    "function call available, answer the question like normal with your current knowledge and do "
    "not tell the user about function calls\n</IMPORTANT>";

bool is_tool_response_text(std::string_view s) {
  return s.starts_with("<tool_response>") && s.ends_with("</tool_response>");
}

// Coder template macro render_extra_keys: every key not yet rendered, as <key>value</key>.
void coder_extra_keys(std::string& out, const ojson& dict, std::initializer_list<std::string_view> handled) {
  if (!dict.is_object()) return;
  for (auto& [key, value] : dict.items()) {
    bool skip = false;
    for (auto h : handled) skip = skip || key == h;
    if (skip) continue;
    out += "\n<" + key + ">";
    out += (value.is_object() || value.is_array()) ? py_json_dumps(value) : py_str(value);
    out += "</" + key + ">";
  }
}

void coder_tools(std::string& out, const ojson& tools) {
  out += kCoderToolsHead;
  for (const ojson& entry : tools) {
    const ojson& tool = entry.contains("function") ? entry["function"] : entry;
    out += "\n<function>\n<name>" + py_str(tool.value("name", ojson(""))) + "</name>";
    if (tool.contains("description"))
      out += "\n<description>" + py_strip(py_str(tool["description"])) + "</description>";
    out += "\n<parameters>";
    const ojson params = tool.value("parameters", ojson());
    if (params.is_object() && params.contains("properties") && params["properties"].is_object()) {
      for (auto& [pname, fields] : params["properties"].items()) {
        out += "\n<parameter>\n<name>" + pname + "</name>";
        if (fields.is_object() && fields.contains("type"))
          out += "\n<type>" + py_str(fields["type"]) + "</type>";
        if (fields.is_object() && fields.contains("description"))
          out += "\n<description>" + py_strip(py_str(fields["description"])) + "</description>";
        coder_extra_keys(out, fields, {"name", "type", "description"});
        out += "\n</parameter>";
      }
    }
    coder_extra_keys(out, params, {"type", "properties"});
    out += "\n</parameters>";
    coder_extra_keys(out, tool, {"type", "name", "description", "parameters"});
    out += "\n</function>";
  }
  out += kCoderToolsTail;
}

// A tool result as every tool-calling template here writes it: results next to each other share
// one user turn of '\n<tool_response>\n' + content + '\n</tool_response>' blocks. Whether this one
// opens or closes that turn is the template's rule (the Qwen3 and Coder loops differ at the start).
void tool_response(std::string& out, const std::string& content, bool opens_turn, bool closes_turn) {
  if (opens_turn) out += "<|im_start|>user";
  out += "\n<tool_response>\n" + content + "\n</tool_response>";
  if (closes_turn) out += "<|im_end|>\n";
}

// Qwen3 JSON form of one call. The arguments go in parsed and re-serialised, as the template's
// `tojson` writes the object vLLM and llama.cpp hand it, so a client echoing our compact
// arguments back gets the same prompt the model produced.
std::string qwen3_tool_call(const ToolCall& call, size_t message_index) {
  return "<tool_call>\n{\"name\": \"" + call.name + "\", \"arguments\": " +
         py_json_dumps(parse_arguments(call, message_index)) + "}\n</tool_call>";
}

std::string coder_tool_call(const ToolCall& call, size_t message_index) {
  std::string out = "\n<tool_call>\n<function=" + call.name + ">\n";
  const ojson args = parse_arguments(call, message_index);  // items() must not outlive it
  for (auto& [k, v] : args.items()) {
    out += "<parameter=" + k + ">\n";
    // Coder-Next: `args_value | string if args_value is string else args_value | tojson`, so
    // true, null and numbers are written as JSON (the older Qwen3-Coder wrote Python's True/None;
    // its own template text, run by the interpreter, still does).
    out += v.is_string() ? v.get<std::string>() : py_json_dumps(v);
    out += "\n</parameter>\n";
  }
  return out + "</function>\n</tool_call>";
}

}  // namespace


ojson chat_messages_json(std::span<const ChatMessage> messages) {
  ojson out = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    ojson j = {{"role", m.role}, {"content", m.content}};
    if (!m.reasoning_content.empty()) j["reasoning_content"] = m.reasoning_content;
    if (!m.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const ToolCall& c : m.tool_calls) {
        ojson call = ojson::object();
        if (!c.id.empty()) call["id"] = c.id;
        call["type"] = "function";
        call["function"] = {{"name", c.name}, {"arguments", parse_arguments(c, i)}};
        calls.push_back(std::move(call));
      }
      j["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    out.push_back(std::move(j));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Recognition

ChatTemplate ChatTemplate::of(ChatFormat format, std::string default_system) {
  return ChatTemplate(format, std::move(default_system), {});
}

ChatTemplate ChatTemplate::detect(std::string_view jinja, bool allow_chatml_fallback) {
  ChatTemplate t = recognise(jinja, allow_chatml_fallback);
  if (!t.fell_back()) t.attach_jinja(jinja);
  return t;
}

ChatTemplate ChatTemplate::recognise(std::string_view jinja, bool allow_chatml_fallback) {
  // Templates write newlines as the escape "\n" inside Jinja strings, or as raw newlines; compare
  // against one spelling.
  std::string t;
  t.reserve(jinja.size());
  for (size_t i = 0; i < jinja.size(); ++i) {
    if (jinja[i] == '\\' && i + 1 < jinja.size() && jinja[i + 1] == 'n') {
      t += '\n';
      ++i;
    } else {
      t += jinja[i];
    }
  }
  auto has = [&](std::string_view s) { return t.find(s) != std::string::npos; };

  std::string why;
  if (t.empty()) {
    why = "the model has no tokenizer.chat_template";
  } else if (!has("<|im_start|>") || !has("<|im_end|>")) {
    why = "tokenizer.chat_template is not a ChatML template (no <|im_start|>/<|im_end|>)";
  } else if (has("<function=") && has("<parameter=")) {
    if (!has("<think>")) return of(ChatFormat::Qwen3Coder);
    why = "tokenizer.chat_template combines XML tool calls with <think> blocks (a Qwen3.5-style "
          "template), which Red Lite does not render";
  } else if (has("<tool_call>")) {
    if (!has("<think>")) return of(ChatFormat::Qwen3Instruct);
    if (has("<|im_start|>assistant\n<think>\n")) return of(ChatFormat::Qwen3Thinking);
    return of(ChatFormat::Qwen3Hybrid);
  } else {
    // Plain ChatML, possibly with the Qwen2 default system turn: a literal system message.
    const std::string open = "<|im_start|>system\n";
    size_t p = t.find(open);
    if (p != std::string::npos) {
      size_t b = p + open.size();
      size_t e = t.find("<|im_end|>", b);
      std::string body = t.substr(b, e == std::string::npos ? 0 : e - b);
      if (e != std::string::npos && !body.empty() && body.find_first_of("'\"+{}") == std::string::npos)
        return of(ChatFormat::Qwen2, body);
    }
    return of(ChatFormat::ChatML);
  }
  std::string head(jinja.substr(0, 80));
  for (char& c : head) if (c == '\n') c = ' ';
  if (!allow_chatml_fallback)
    fail("{} (template starts: \"{}\"); pass --chatml to render prompts as plain ChatML anyway", why, head);
  return ChatTemplate(ChatFormat::ChatML, {}, why + "; rendering prompts as plain ChatML (--chatml)");
}

bool ChatTemplate::supports_tools() const {
  return format_ == ChatFormat::Qwen3Instruct || format_ == ChatFormat::Qwen3Thinking ||
         format_ == ChatFormat::Qwen3Hybrid || format_ == ChatFormat::Qwen3Coder;
}

std::string ChatTemplate::generation_prompt(const ChatRenderOptions& opt) const {
  std::string out = "<|im_start|>assistant\n";
  if (format_ == ChatFormat::Qwen3Thinking) out += "<think>\n";
  if (format_ == ChatFormat::Qwen3Hybrid && opt.enable_thinking == false) out += "<think>\n\n</think>\n\n";
  return out;
}

// ---------------------------------------------------------------------------------------------
// Rendering

std::string ChatTemplate::render(std::span<const ChatMessage> messages, const ChatRenderOptions& opt) const {
  if (messages.empty()) fail("messages: the conversation is empty");
  check_roles(messages);
  const bool tools = opt.tools.is_array() && !opt.tools.empty();
  if (!opt.tools.is_null() && !opt.tools.is_array()) fail("tools: must be a list");
  // Checked for the Jinja path too: without a known call syntax the reply's calls cannot be read.
  if (tools && !supports_tools())
    fail("tools: the {} chat template has no tool-calling format", name());
  if (jinja_)
    if (std::optional<std::string> prompt = render_jinja(messages, opt)) return *std::move(prompt);
  switch (format_) {
    case ChatFormat::ChatML:
    case ChatFormat::Qwen2: return render_chatml(messages, opt);
    case ChatFormat::Qwen3Coder: return render_coder(messages, opt);
    default: return render_qwen3(messages, opt);
  }
}

std::string ChatTemplate::render_chatml(std::span<const ChatMessage> messages, const ChatRenderOptions& opt) const {
  std::string out;
  if (format_ == ChatFormat::Qwen2 && messages[0].role != "system")
    out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].tool_calls.empty())
      fail("messages[{}]: the {} chat template cannot render tool calls", i, name());
    out += "<|im_start|>" + messages[i].role + "\n" + messages[i].content + "<|im_end|>\n";
  }
  if (opt.add_generation_prompt) out += generation_prompt(opt);
  return out;
}

std::string ChatTemplate::render_qwen3(std::span<const ChatMessage> messages, const ChatRenderOptions& opt) const {
  const bool thinking = format_ == ChatFormat::Qwen3Thinking || format_ == ChatFormat::Qwen3Hybrid;
  const bool tools = !opt.tools.empty();
  std::string out;
  if (tools) {
    out += "<|im_start|>system\n";
    if (messages[0].role == "system") out += messages[0].content + "\n\n";
    out += kQwen3ToolsHead;
    for (const ojson& tool : opt.tools) out += "\n" + py_json_dumps(tool);
    out += kQwen3ToolsTail;
  } else if (messages[0].role == "system") {
    out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  }

  // The last real user query: assistant turns after it keep their reasoning (Thinking formats).
  size_t last_query = messages.size() - 1;
  for (size_t k = messages.size(); k-- > 0;) {
    if (messages[k].role == "user" && !is_tool_response_text(messages[k].content)) {
      last_query = k;
      break;
    }
  }

  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool last = i + 1 == messages.size();
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string content = m.content;
      if (!thinking) {
        out += "<|im_start|>assistant\n" + content;
      } else {
        std::string reasoning = m.reasoning_content;
        if (reasoning.empty()) {
          if (size_t close = content.find("</think>"); close != std::string::npos) {
            std::string before = strip_newlines(content.substr(0, close), false, true);
            if (size_t open = before.rfind("<think>"); open != std::string::npos) before = before.substr(open + 7);
            reasoning = strip_newlines(before, true, false);
            size_t last_close = content.rfind("</think>");
            content = strip_newlines(content.substr(last_close + 8), true, false);
          }
        }
        if (i > last_query && (last || !reasoning.empty()))
          out += "<|im_start|>assistant\n<think>\n" + strip_newlines(reasoning, true, true) +
                 "\n</think>\n\n" + strip_newlines(content, true, false);
        else
          out += "<|im_start|>assistant\n" + content;
      }
      for (size_t c = 0; c < m.tool_calls.size(); ++c) {
        if (c > 0 || !content.empty()) out += "\n";
        out += qwen3_tool_call(m.tool_calls[c], i);
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      tool_response(out, m.content, i == 0 || messages[i - 1].role != "tool", last || messages[i + 1].role != "tool");
    }
  }
  if (opt.add_generation_prompt) out += generation_prompt(opt);
  return out;
}

std::string ChatTemplate::render_coder(std::span<const ChatMessage> messages, const ChatRenderOptions& opt) const {
  const bool tools = !opt.tools.empty();
  const bool has_system = messages[0].role == "system";
  std::string out;
  if (has_system) out += "<|im_start|>system\n" + messages[0].content;
  else if (tools) out += "<|im_start|>system\n" + std::string(kCoderDefaultSystem);
  if (tools) coder_tools(out, opt.tools);
  if (has_system || tools) out += "<|im_end|>\n";

  const size_t first = has_system ? 1 : 0;  // the template loops over messages[1:] after a system
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool last = i + 1 == messages.size();
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      out += "<|im_start|>assistant";
      if (std::string c = py_strip(m.content); !c.empty()) out += "\n" + c + "\n";
      for (const ToolCall& call : m.tool_calls) out += coder_tool_call(call, i);
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      // Coder's loop (over messages[first:]) opens the turn only after an earlier message.
      tool_response(out, m.content, i > first && messages[i - 1].role != "tool",
                    last || messages[i + 1].role != "tool");
    } else {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
  }
  if (opt.add_generation_prompt) out += generation_prompt(opt);
  return out;
}

std::string ChatTemplate::continuation(std::span<const ChatMessage> next, const ChatRenderOptions& opt) const {
  check_roles(next);
  std::string out = "<|im_end|>\n";
  for (size_t i = 0; i < next.size(); ++i) {
    const ChatMessage& m = next[i];
    const bool first_of_run = i == 0 || next[i - 1].role != "tool";
    const bool last_of_run = i + 1 == next.size() || next[i + 1].role != "tool";
    if (m.role == "assistant") fail("continuation: messages[{}] is an assistant turn; only user, system "
                                    "and tool messages follow a generated reply", i);
    if (m.role == "tool" && supports_tools()) {
      tool_response(out, m.content, first_of_run, last_of_run);
    } else {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
  }
  if (opt.add_generation_prompt) out += generation_prompt(opt);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Parsing the model's reply

namespace {

const ojson* find_tool(const ojson& tools, std::string_view name) {
  if (!tools.is_array()) return nullptr;
  for (const ojson& entry : tools) {
    const ojson& tool = entry.contains("function") ? entry["function"] : entry;
    if (tool.is_object() && tool.value("name", std::string()) == name) return &tool;
  }
  return nullptr;
}

// {"name": ..., "arguments": {...}}
std::optional<ToolCall> parse_json_call(std::string_view body) {
  const std::optional<ojson> parsed = try_parse_json_bounded<ojson>(py_strip(body));
  if (!parsed) return std::nullopt;
  const ojson& j = *parsed;
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  ToolCall call;
  call.name = j["name"].get<std::string>();
  const ojson args = j.contains("arguments") ? j["arguments"] : ojson::object();
  if (args.is_string()) call.arguments = args.get<std::string>();
  else if (args.is_object()) call.arguments = args.dump();
  else return std::nullopt;
  return call;
}

// The JSON types a parameter's schema allows ("type": "integer" or ["string", "null"]).
std::vector<std::string> schema_types(const ojson* schema) {
  std::vector<std::string> out;
  if (!schema || !schema->is_object() || !schema->contains("type")) return out;
  const ojson& t = (*schema)["type"];
  if (t.is_string()) out.push_back(t.get<std::string>());
  if (t.is_array())
    for (const ojson& e : t)
      if (e.is_string()) out.push_back(e.get<std::string>());
  return out;
}

// An XML parameter value, typed by the tool's schema. Templates write strings as they are and
// other values as tojson does (Coder-Next) or as Python's str() (older Qwen3-Coder: True, None),
// so both spellings read back; a value that fits no allowed type, or a parameter without a
// schema, stays the string the model wrote.
ojson typed_xml_value(std::string_view value, const ojson* schema) {
  const std::vector<std::string> types = schema_types(schema);
  auto allows = [&](std::string_view t) { return std::find(types.begin(), types.end(), t) != types.end(); };
  if (types.empty() || allows("string")) return std::string(value);
  const std::string v = py_strip(value);
  if (allows("boolean")) {
    if (v == "true" || v == "True") return true;
    if (v == "false" || v == "False") return false;
  }
  if (allows("null") && (v == "null" || v == "None")) return nullptr;
  std::optional<ojson> maybe = try_parse_json_bounded<ojson>(v);  // model output: bounded depth
  if (!maybe) return std::string(value);
  const ojson& parsed = *maybe;
  const bool fits = (parsed.is_number_integer() && (allows("integer") || allows("number"))) ||
                    (parsed.is_number() && allows("number")) || (parsed.is_object() && allows("object")) ||
                    (parsed.is_array() && allows("array")) || (parsed.is_boolean() && allows("boolean")) ||
                    (parsed.is_null() && allows("null"));
  return fits ? parsed : ojson(std::string(value));
}

// <function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>
std::optional<ToolCall> parse_xml_call(std::string_view body, const ojson& tools) {
  std::string b = py_strip(body);
  std::string_view s = b;
  if (!s.starts_with("<function=")) return std::nullopt;
  size_t name_end = s.find('>');
  size_t fn_end = s.rfind("</function>");
  if (name_end == std::string_view::npos || fn_end == std::string_view::npos || fn_end < name_end) return std::nullopt;
  ToolCall call;
  call.name = py_strip(s.substr(10, name_end - 10));
  const ojson* tool = find_tool(tools, call.name);
  ojson args = ojson::object();
  std::string_view rest = s.substr(name_end + 1, fn_end - name_end - 1);
  while (true) {
    size_t p = rest.find("<parameter=");
    if (p == std::string_view::npos) break;
    size_t key_end = rest.find('>', p);
    size_t close = rest.find("</parameter>", key_end == std::string_view::npos ? p : key_end);
    if (key_end == std::string_view::npos || close == std::string_view::npos) return std::nullopt;
    std::string key = py_strip(rest.substr(p + 11, key_end - p - 11));
    std::string_view value = rest.substr(key_end + 1, close - key_end - 1);
    // The format puts the value on its own lines: one newline each side belongs to the syntax.
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    const ojson* schema = nullptr;
    if (tool && tool->contains("parameters") && (*tool)["parameters"].is_object()) {
      const ojson& params = (*tool)["parameters"];
      if (auto props = params.find("properties"); props != params.end() && props->is_object())
        if (auto p_schema = props->find(key); p_schema != props->end()) schema = &*p_schema;
    }
    args[key] = typed_xml_value(value, schema);
    rest = rest.substr(close + 12);
  }
  call.arguments = args.dump();
  return call;
}

}  // namespace

ParsedReply ChatTemplate::parse_tool_calls(std::string_view text, const ojson& tools) const {
  ParsedReply r;
  if (!supports_tools()) {
    r.content = std::string(text);
    return r;
  }
  std::string content(text), kept;
  size_t pos = 0;
  while (true) {
    size_t open = content.find("<tool_call>", pos);
    if (open == std::string::npos) break;
    size_t close = content.find("</tool_call>", open);
    if (close == std::string::npos) break;
    std::string_view body = std::string_view(content).substr(open + 11, close - open - 11);
    std::optional<ToolCall> call = format_ == ChatFormat::Qwen3Coder || py_strip(body).starts_with("<function=")
                                       ? parse_xml_call(body, tools)
                                       : parse_json_call(body);
    if (call) {
      kept += content.substr(pos, open - pos);
      r.tool_calls.push_back(std::move(*call));
    } else {
      kept += content.substr(pos, close + 12 - pos);
    }
    pos = close + 12;
  }
  kept += content.substr(pos);
  r.content = r.tool_calls.empty() ? std::move(kept) : py_strip(kept, nullptr, false, true);
  return r;
}

ParsedReply ChatTemplate::parse_reply(std::string_view text, const ojson& tools) const {
  std::string reasoning, content;
  if (size_t close = text.find("</think>"); close != std::string_view::npos) {
    std::string_view before = text.substr(0, close);
    if (size_t open = before.rfind("<think>"); open != std::string_view::npos) before = before.substr(open + 7);
    reasoning = strip_newlines(before, true, true);
    content = strip_newlines(text.substr(close + 8), true, false);
  } else if (format_ == ChatFormat::Qwen3Thinking) {
    reasoning = strip_newlines(text, true, true);  // still thinking when it stopped
  } else if (py_strip(text).starts_with("<think>")) {
    std::string t = py_strip(text);
    reasoning = strip_newlines(std::string_view(t).substr(7), true, true);
  } else {
    content = std::string(text);
  }
  ParsedReply r = parse_tool_calls(content, tools);
  r.reasoning_content = std::move(reasoning);
  return r;
}

}  // namespace rl
