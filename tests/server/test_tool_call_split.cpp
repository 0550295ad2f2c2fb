// ToolCallSplitter: for replies with and without tool calls, cut into pieces at every pair of
// points, the streamed text plus the parsed held tail equals the whole reply parsed at once
// (content and calls), no streamed piece holds any of a <tool_call> block, and text before a call
// streams before the reply ends.
#include <gtest/gtest.h>

#include "generate/chat_template.h"
#include "server/tool_call_split.h"

namespace rl {
namespace {

const nlohmann::ordered_json kTools = nlohmann::ordered_json::parse(
    R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
        "properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])");

struct Split {
  std::string streamed;  // what push() released
  ParsedReply tail;      // the held tail, parsed
  size_t released_before_end = 0;
};

Split run(const ChatTemplate& t, const std::vector<std::string>& pieces) {
  ToolCallSplitter s(true);
  Split r;
  for (const std::string& p : pieces) {
    std::string out = s.push(p);
    EXPECT_EQ(out.find("<tool_call"), std::string::npos) << "a call's text was streamed";
    r.streamed += out;
  }
  r.released_before_end = r.streamed.size();
  r.tail = t.parse_tool_calls(s.finish(), kTools);
  return r;
}

void expect_same_as_whole(const ChatTemplate& t, const std::string& text) {
  const ParsedReply whole = t.parse_tool_calls(text, kTools);
  for (size_t a = 0; a <= text.size(); a++)
    for (size_t b = a; b <= text.size(); b++) {
      Split r = run(t, {text.substr(0, a), text.substr(a, b - a), text.substr(b)});
      ASSERT_EQ(r.streamed + r.tail.content, whole.content) << "cut at " << a << ", " << b << " of: " << text;
      ASSERT_EQ(r.tail.tool_calls.size(), whole.tool_calls.size()) << a << ", " << b;
      for (size_t i = 0; i < whole.tool_calls.size(); i++) {
        EXPECT_EQ(r.tail.tool_calls[i].name, whole.tool_calls[i].name);
        EXPECT_EQ(r.tail.tool_calls[i].arguments, whole.tool_calls[i].arguments);
      }
    }
}

const char* const kJsonCall =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
const char* const kXmlCall =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n"
    "</parameter>\n</function>\n</tool_call>";

TEST(ToolCallSplit, StreamedPlusTailEqualsWholeForEveryCut) {
  const ChatTemplate json_t = ChatTemplate::of(ChatFormat::Qwen3Instruct);
  for (const std::string& text :
       {std::string("Plain answer, no call at all. <tool"), std::string("Let me check.\n\n") + kJsonCall,
        std::string(kJsonCall) + "\n" + kJsonCall, std::string("a < b and <tool_ca> is not a marker\n"),
        std::string("Before ") + kJsonCall + " after\n\n", std::string("x <tool_call>{not json}</tool_call> y"),
        std::string("unfinished <tool_call>\n{\"name\": \"get_weather\""), std::string("  \n\t ")})
    expect_same_as_whole(json_t, text);
  const ChatTemplate coder = ChatTemplate::of(ChatFormat::Qwen3Coder);
  expect_same_as_whole(coder, std::string("I'll look it up.\n") + kXmlCall);
}

TEST(ToolCallSplit, TextBeforeACallStreamsBeforeTheEnd) {
  const ChatTemplate t = ChatTemplate::of(ChatFormat::Qwen3Instruct);
  Split r = run(t, {"Let me ", "check the weather.", "\n\n", "<tool", "_call>\n{\"name\": \"get_weather\", ",
                    "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"});
  EXPECT_EQ(r.streamed, "Let me check the weather.");
  EXPECT_EQ(r.tail.content, "");
  ASSERT_EQ(r.tail.tool_calls.size(), 1u);
  EXPECT_EQ(r.tail.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tail.tool_calls[0].arguments, R"({"city":"Paris"})");
}

TEST(ToolCallSplit, HoldsOnlyAPossibleMarkerAndTrailingSpace) {
  ToolCallSplitter s(true);
  EXPECT_EQ(s.push("Hello <to"), "Hello");  // " <to" may start <tool_call>
  EXPECT_EQ(s.push("day> is fine  "), " <today> is fine");
  EXPECT_EQ(s.push("ok"), "  ok");
  EXPECT_EQ(s.finish(), "");
  ToolCallSplitter off(false);
  EXPECT_EQ(off.push("text <tool_call> "), "text <tool_call> ");
  EXPECT_EQ(off.finish(), "");
}

}  // namespace
}  // namespace rl
