// Chat templates: recognition from tokenizer.chat_template, and rendering of known conversations
// to the exact text the Jinja templates produce. The expected strings below are written by hand
// from the templates' specification (quoted in each test), not copied from this renderer's output.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "common/error.h"
#include "generate/chat_template.h"
#include "generate/python_text.h"

namespace rl {
namespace {

using ojson = nlohmann::ordered_json;

// tokenizer.chat_template of the test fixtures (the Qwen2 ChatML template, raw newlines).
const char* kFixtureTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
    "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// Distinctive lines of the Qwen3-Next templates (Jinja escapes, as stored in the GGUF files).
const char* kQwen3InstructTemplate = R"({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- endif %}
{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %})";

const char* kQwen3ThinkingTemplate = R"({{- '<tool_call>\n{"name": "' }}
{%- if '</think>' in content %}
{{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
{%- endif %}
{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n<think>\n' }}
{%- endif %})";

const char* kQwen3CoderTemplate = R"({{- "\n\n# Tools\n\nYou have access to the following functions:\n\n" }}
{{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
{{- '<parameter=' + args_name + '>\n' }}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %})";

ojson weather_tools() {
  return ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Weather now", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "description": " City name "}, "days": {"type": "integer"}},
    "required": ["city"]}}}])");
}

ChatMessage msg(std::string role, std::string content) {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

ChatMessage call(std::string content, std::string name, std::string arguments, std::string reasoning = {}) {
  ChatMessage m = msg("assistant", std::move(content));
  m.reasoning_content = std::move(reasoning);
  m.tool_calls.push_back(ToolCall{"call_0", std::move(name), std::move(arguments)});
  return m;
}

TEST(ChatTemplate, RecognisesTheFormats) {
  EXPECT_EQ(ChatTemplate::detect(kFixtureTemplate, false).format(), ChatFormat::Qwen2);
  EXPECT_EQ(ChatTemplate::detect(kFixtureTemplate, false).default_system(), "You are a helpful assistant");
  EXPECT_EQ(ChatTemplate::detect(kQwen3InstructTemplate, false).format(), ChatFormat::Qwen3Instruct);
  EXPECT_EQ(ChatTemplate::detect(kQwen3ThinkingTemplate, false).format(), ChatFormat::Qwen3Thinking);
  EXPECT_EQ(ChatTemplate::detect(kQwen3CoderTemplate, false).format(), ChatFormat::Qwen3Coder);
  EXPECT_FALSE(ChatTemplate::detect(kQwen3CoderTemplate, false).fell_back());
}

TEST(ChatTemplate, UnrecognisedTemplateNeedsTheExplicitFallback) {
  const char* llama2 = "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}";
  try {
    ChatTemplate::detect(llama2, false);
    FAIL() << "an unrecognised template must not be accepted silently";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chatml"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a ChatML template"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ChatTemplate::detect("", false), Error);
  ChatTemplate t = ChatTemplate::detect(llama2, true);
  EXPECT_EQ(t.format(), ChatFormat::ChatML);
  EXPECT_TRUE(t.fell_back());
  EXPECT_NE(t.warning().find("--chatml"), std::string::npos);
  std::vector<ChatMessage> m = {msg("user", "Hi")};
  EXPECT_EQ(t.render(m), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

// {% if loop.first and messages[0]['role'] != 'system' %} default system {% endif %}
// '<|im_start|>' + role + '\n' + content + '<|im_end|>\n' per message; '<|im_start|>assistant\n'.
TEST(ChatTemplate, Qwen2FixtureTemplate) {
  ChatTemplate t = ChatTemplate::detect(kFixtureTemplate, false);
  std::vector<ChatMessage> m = {msg("user", "Hello"), msg("assistant", "Hi there"), msg("user", "Bye")};
  EXPECT_EQ(t.render(m),
            "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
            "<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\nHi there<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
  std::vector<ChatMessage> s = {msg("system", "Be brief."), msg("user", "Hello")};
  ChatRenderOptions no_gen;
  no_gen.add_generation_prompt = false;
  EXPECT_EQ(t.render(s, no_gen), "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n");
  ChatRenderOptions with_tools;
  with_tools.tools = weather_tools();
  EXPECT_THROW(t.render(s, with_tools), Error);
}

// Qwen3-Next Instruct without tools: a system turn only when given; no think handling.
TEST(ChatTemplate, Qwen3InstructConversation) {
  ChatTemplate t = ChatTemplate::of(ChatFormat::Qwen3Instruct);
  std::vector<ChatMessage> m = {msg("system", "You are terse."), msg("user", "Hi"), msg("assistant", "Hello!"),
                                msg("user", "Bye")};
  EXPECT_EQ(t.render(m),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
  std::vector<ChatMessage> no_system = {msg("user", "Hi")};
  EXPECT_EQ(t.render(no_system), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

// Tools: the system turn is system content + "\n\n" + "# Tools..." + one `tool | tojson` per line
// + the call instructions; a call is '<tool_call>\n{"name": "' + name + '", "arguments": ' + args
// + '}\n</tool_call>', preceded by '\n' when content is non-empty; consecutive tool results share
// one user turn of '\n<tool_response>\n' + content + '\n</tool_response>' blocks.
TEST(ChatTemplate, Qwen3InstructTools) {
  ChatTemplate t = ChatTemplate::of(ChatFormat::Qwen3Instruct);
  ChatRenderOptions opt;
  opt.tools = weather_tools();
  std::vector<ChatMessage> m = {msg("system", "Be brief."), msg("user", "Weather in Paris?"),
                                call("", "get_weather", "{\"city\": \"Paris\"}"), msg("tool", "18C"),
                                msg("tool", "sunny"), msg("assistant", "18C and sunny."), msg("user", "And Rome?"),
                                call("Let me check.", "get_weather", "{\"city\": \"Rome\"}")};
  EXPECT_EQ(t.render(m, opt),
            "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with "
            "the user query.\n\nYou are provided with function signatures within <tools></tools> XML "
            "tags:\n<tools>\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather "
            "now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", "
            "\"description\": \" City name \"}, \"days\": {\"type\": \"integer\"}}, \"required\": "
            "[\"city\"]}}}\n"
            "</tools>\n\nFor each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
            "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
            "\"Paris\"}}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\nsunny\n"
            "</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n18C and sunny.<|im_end|>\n"
            "<|im_start|>user\nAnd Rome?<|im_end|>\n"
            "<|im_start|>assistant\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
            "{\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n"
            "<|im_start|>assistant\n");
  // No system message: the tools block opens the system turn directly.
  std::vector<ChatMessage> u = {msg("user", "Hi")};
  std::string r = t.render(u, opt);
  EXPECT_EQ(r.substr(0, 30), "<|im_start|>system\n# Tools\n\nYo");
}

// Thinking: the generation prompt is '<|im_start|>assistant\n<think>\n'; an assistant turn after the
// last user query renders '<think>\n' + reasoning + '\n</think>\n\n' + content when it is the last
// message or has reasoning; turns before the last query render content only; reasoning written
// inline as '<think>..</think>' in content is split out.
TEST(ChatTemplate, Qwen3ThinkingConversation) {
  ChatTemplate t = ChatTemplate::of(ChatFormat::Qwen3Thinking);
  ChatMessage a1 = msg("assistant", "4");
  a1.reasoning_content = "simple sum";
  std::vector<ChatMessage> m = {msg("user", "2+2?"), a1, msg("user", "3+3?")};
  EXPECT_EQ(t.render(m),
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\n3+3?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n");

  std::vector<ChatMessage> tool_loop = {msg("user", "Weather?"),
                                        call("", "get_weather", "{\"city\": \"Paris\"}", "need weather"),
                                        msg("tool", "18C")};
  ChatRenderOptions opt;
  opt.tools = ojson::array({ojson::parse(R"({"type": "function", "function": {"name": "get_weather"}})")});
  std::string r = t.render(tool_loop, opt);
  const std::string tail =
      "<|im_start|>user\nWeather?<|im_end|>\n"
      "<|im_start|>assistant\n<think>\nneed weather\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n<think>\n";
  ASSERT_GE(r.size(), tail.size());
  EXPECT_EQ(r.substr(r.size() - tail.size()), tail);

  std::vector<ChatMessage> inline_think = {msg("user", "Hi"), msg("assistant", "<think>\nhmm\n</think>\n\nHello")};
  ChatRenderOptions no_gen;
  no_gen.add_generation_prompt = false;
  EXPECT_EQ(t.render(inline_think, no_gen),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello<|im_end|>\n");
}

TEST(ChatTemplate, Qwen3HybridEnableThinking) {
  ChatTemplate t = ChatTemplate::of(ChatFormat::Qwen3Hybrid);
  std::vector<ChatMessage> m = {msg("user", "Hi")};
  EXPECT_EQ(t.render(m), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  ChatRenderOptions off;
  off.enable_thinking = false;
  EXPECT_EQ(t.render(m, off), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

// Qwen3-Coder: the system turn is the system message (or, with tools, the default "You are Qwen, a
// helpful AI assistant...") + "\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>"
// + per tool "\n<function>\n<name>N</name>\n<description>D|trim</description>\n<parameters>" + per
// parameter "\n<parameter>\n<name>P</name>\n<type>T</type>\n<description>D|trim</description>
// \n</parameter>" + remaining keys as "\n<key>value</key>" + "\n</parameters>\n</function>", then
// "\n</tools>" and the format instructions. Calls: '\n<tool_call>\n<function=N>\n' +
// '<parameter=K>\n' + value (a string as it is, anything else as tojson: Coder-Next's
// `args_value | string if args_value is string else args_value | tojson`) + '\n</parameter>\n' +
// '</function>\n</tool_call>'; content (trimmed) goes first as '\n' + content + '\n'. Tool results
// as Coder-Next writes them: one user turn of '\n<tool_response>\n' + content + '\n</tool_response>'.
TEST(ChatTemplate, Qwen3CoderTools) {
  ChatTemplate t = ChatTemplate::of(ChatFormat::Qwen3Coder);
  ChatRenderOptions opt;
  opt.tools = weather_tools();
  std::vector<ChatMessage> m = {msg("user", "Weather in Paris?"),
                                call("I will check. ", "get_weather",
                                     R"({"city": "Paris", "days": 2, "metric": true, "hours": [1, 2]})"),
                                msg("tool", "18C"), msg("tool", "sunny")};
  EXPECT_EQ(t.render(m, opt),
            "<|im_start|>system\nYou are Qwen, a helpful AI assistant that can interact with a computer to "
            "solve tasks.\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
            "<function>\n<name>get_weather</name>\n<description>Weather now</description>\n<parameters>\n"
            "<parameter>\n<name>city</name>\n<type>string</type>\n<description>City name</description>\n"
            "</parameter>\n<parameter>\n<name>days</name>\n<type>integer</type>\n</parameter>\n"
            "<required>[\"city\"]</required>\n</parameters>\n</function>\n</tools>\n\n"
            "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
            "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
            "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
            "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
            "Reminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> "
            "block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be "
            "specified\n- You may provide optional reasoning for your function call in natural language "
            "BEFORE the function call, but NOT after\n- If there is no function call available, answer the "
            "question like normal with your current knowledge and do not tell the user about function "
            "calls\n</IMPORTANT><|im_end|>\n"
            "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
            "<|im_start|>assistant\nI will check.\n\n<tool_call>\n<function=get_weather>\n"
            "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
            "<parameter=metric>\ntrue\n</parameter>\n<parameter=hours>\n[1, 2]\n</parameter>\n"
            "</function>\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\nsunny\n"
            "</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
  // Without tools and with a system message: plain ChatML turns.
  std::vector<ChatMessage> s = {msg("system", "Code only."), msg("user", "Sort a list")};
  EXPECT_EQ(t.render(s), "<|im_start|>system\nCode only.<|im_end|>\n<|im_start|>user\nSort a list<|im_end|>\n"
                         "<|im_start|>assistant\n");
  // Arguments must be a JSON object for the XML form.
  std::vector<ChatMessage> bad = {msg("user", "x"), call("", "get_weather", "[1]")};
  EXPECT_THROW(t.render(bad, opt), Error);
}

// Tool-call arguments are a JSON string that the XML form parses and walks recursively: nesting
// past the one limit (kMaxJsonDepth) is an error, not a stack overflow; model output nested that
// deep is not taken as a call's typed value.
TEST(ChatTemplate, DeeplyNestedToolArgumentsAreRefusedNotRecursedInto) {
  ChatTemplate t = ChatTemplate::of(ChatFormat::Qwen3Coder);
  ChatRenderOptions opt;
  opt.tools = weather_tools();
  auto nested = [](int depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); };
  std::vector<ChatMessage> deep = {msg("user", "x"), call("", "get_weather", "{\"a\": " + nested(100000) + "}")};
  try {
    t.render(deep, opt);
    ADD_FAILURE() << "arguments nested 100000 deep were rendered";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nest deeper than 64"), std::string::npos) << e.what();
  }
  std::vector<ChatMessage> shallow = {msg("user", "x"), call("", "get_weather", "{\"a\": " + nested(32) + "}")};
  EXPECT_NE(t.render(shallow, opt).find("<parameter=a>\n" + nested(32) + "\n</parameter>"), std::string::npos);
  // The model's own output: a typed parameter nested too deep stays text; the call still parses.
  ParsedReply r = t.parse_reply("<tool_call>\n<function=get_weather>\n<parameter=days>\n" + nested(100000) +
                                    "\n</parameter>\n</function>\n</tool_call>",
                                weather_tools());
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(ojson::parse(r.tool_calls[0].arguments)["days"], nested(100000));
  ChatTemplate q = ChatTemplate::of(ChatFormat::Qwen3Instruct);
  ParsedReply j = q.parse_reply("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": " + nested(100000) +
                                "}}\n</tool_call>");
  EXPECT_TRUE(j.tool_calls.empty());
}

TEST(ChatTemplate, RejectsUnknownRoles) {
  ChatTemplate t = ChatTemplate::of(ChatFormat::Qwen3Instruct);
  std::vector<ChatMessage> m = {msg("developer", "x")};
  EXPECT_THROW(t.render(m), Error);
  EXPECT_THROW(t.render(std::vector<ChatMessage>{}), Error);
}

// A chat that keeps its session appends continuation() to what the session holds (the rendered
// prompt plus the reply); for formats whose history rendering is stable, that is exactly the
// full render of the longer conversation.
TEST(ChatTemplate, ContinuationExtendsTheRenderedConversation) {
  for (ChatTemplate t : {ChatTemplate::of(ChatFormat::Qwen2, "Default."), ChatTemplate::of(ChatFormat::ChatML),
                         ChatTemplate::of(ChatFormat::Qwen3Instruct), ChatTemplate::of(ChatFormat::Qwen3Coder)}) {
    std::vector<ChatMessage> first = {msg("system", "S"), msg("user", "One")};
    std::vector<ChatMessage> next = {msg("user", "Two")};
    std::vector<ChatMessage> all = {msg("system", "S"), msg("user", "One"), msg("assistant", "Reply"), msg("user", "Two")};
    EXPECT_EQ(t.render(first) + "Reply" + t.continuation(next), t.render(all)) << t.name();
  }
  ChatTemplate q = ChatTemplate::of(ChatFormat::Qwen3Instruct);
  std::vector<ChatMessage> tools = {msg("tool", "a"), msg("tool", "b")};
  EXPECT_EQ(q.continuation(tools),
            "<|im_end|>\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n");
  ChatTemplate th = ChatTemplate::of(ChatFormat::Qwen3Thinking);
  std::vector<ChatMessage> u = {msg("user", "Two")};
  EXPECT_EQ(th.continuation(u), "<|im_end|>\n<|im_start|>user\nTwo<|im_end|>\n<|im_start|>assistant\n<think>\n");
}

TEST(ChatTemplate, ParsesJsonToolCalls) {
  ChatTemplate t = ChatTemplate::of(ChatFormat::Qwen3Instruct);
  ParsedReply r = t.parse_reply(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(ojson::parse(r.tool_calls[0].arguments), ojson::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(r.tool_calls[1].name, "get_time");
  // A malformed call stays visible as text.
  ParsedReply bad = t.parse_reply("<tool_call>\n{not json}\n</tool_call>");
  EXPECT_TRUE(bad.tool_calls.empty());
  EXPECT_EQ(bad.content, "<tool_call>\n{not json}\n</tool_call>");
  // Plain text is all content.
  EXPECT_EQ(t.parse_reply("Hello").content, "Hello");
}

TEST(ChatTemplate, ParsesXmlToolCallsWithDeclaredTypes) {
  ChatTemplate t = ChatTemplate::of(ChatFormat::Qwen3Coder);
  ParsedReply r = t.parse_reply(
      "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n"
      "<parameter=days>\n2\n</parameter>\n<parameter=note>\nline one\nline two\n</parameter>\n"
      "</function>\n</tool_call>",
      weather_tools());
  EXPECT_EQ(r.content, "I will check.");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  // city is declared a string, days an integer, note is undeclared (kept as text).
  EXPECT_EQ(ojson::parse(r.tool_calls[0].arguments),
            ojson::parse(R"({"city": "42", "days": 2, "note": "line one\nline two"})"));
}

TEST(ChatTemplate, SplitsThinking) {
  ChatTemplate t = ChatTemplate::of(ChatFormat::Qwen3Thinking);
  ParsedReply r = t.parse_reply("reasoning here\n</think>\n\nAnswer");
  EXPECT_EQ(r.reasoning_content, "reasoning here");
  EXPECT_EQ(r.content, "Answer");
  ParsedReply unfinished = t.parse_reply("still thinking");
  EXPECT_EQ(unfinished.reasoning_content, "still thinking");
  EXPECT_EQ(unfinished.content, "");
  ChatTemplate h = ChatTemplate::of(ChatFormat::Qwen3Hybrid);
  ParsedReply hr = h.parse_reply("<think>\nhmm\n</think>\n\nHi");
  EXPECT_EQ(hr.reasoning_content, "hmm");
  EXPECT_EQ(hr.content, "Hi");
}

// Python: json.dumps({"b": 1, "a": [1.5, True, None, "é\n\"x\""], "c": {}}, ensure_ascii=False)
TEST(ChatTemplate, PythonJsonDumps) {
  ojson v = ojson::parse("{\"b\": 1, \"a\": [1.5, true, null, \"\xC3\xA9\\n\\\"x\\\"\", 2.0, -3], \"c\": {}}");
  EXPECT_EQ(py_json_dumps(v), "{\"b\": 1, \"a\": [1.5, true, null, \"\xC3\xA9\\n\\\"x\\\"\", 2.0, -3], \"c\": {}}");
}

}  // namespace
}  // namespace rl

namespace rl {
namespace {

// Values written by hand as the two Coder templates print them (tojson, or Python str() in the
// older one), read back with the JSON type the tool's schema declares.
TEST(ChatTemplate, XmlValuesAreTypedByTheSchema) {
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"flag": {"type": "boolean"}, "old_flag": {"type": "boolean"},
    "limit": {"type": ["integer", "null"]}, "ids": {"type": "array"}, "opts": {"type": "object"},
    "code": {"type": "string"}, "ratio": {"type": "number"}, "count": {"type": "integer"}}}}}])");
  ChatTemplate t = ChatTemplate::of(ChatFormat::Qwen3Coder);
  auto param = [](const char* k, const char* v) { return fmt::format("<parameter={}>\n{}\n</parameter>\n", k, v); };
  const std::string reply = "<tool_call>\n<function=f>\n" + param("flag", "true") + param("old_flag", "True") +
                            param("limit", "None") + param("ids", "[1, 2]") + param("opts", "{\"a\": false}") +
                            param("code", "42") + param("ratio", "0.5") + param("count", "many") + param("extra", "7") +
                            "</function>\n</tool_call>";
  ParsedReply r = t.parse_reply(reply, tools);
  ASSERT_EQ(r.tool_calls.size(), 1u) << r.content;
  EXPECT_EQ(ojson::parse(r.tool_calls[0].arguments),
            ojson::parse(R"({"flag": true, "old_flag": true, "limit": null, "ids": [1, 2], "opts": {"a": false},
              "code": "42", "ratio": 0.5, "count": "many", "extra": "7"})"));
}

TEST(ChatTemplate, HybridReplySplitsItsOwnThinkBlock) {
  ChatTemplate t = ChatTemplate::of(ChatFormat::Qwen3Hybrid);
  ParsedReply r = t.parse_reply("<think>\nThe user greets.\n</think>\n\nHello!");
  EXPECT_EQ(r.reasoning_content, "The user greets.");
  EXPECT_EQ(r.content, "Hello!");
  ParsedReply plain = t.parse_reply("Hello!");
  EXPECT_EQ(plain.reasoning_content, "");
  EXPECT_EQ(plain.content, "Hello!");
}

}  // namespace
}  // namespace rl
