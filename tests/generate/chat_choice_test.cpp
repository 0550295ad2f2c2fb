// choose_chat_template (the one choice the CLI and the server make): a format name wins, then a
// template text given instead of the file's, then the file's own; bad choices are refused with
// the flag named. The expected formats are those of the published templates in templates/.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/error.h"
#include "generate/chat_choice.h"

namespace rl {
namespace {

std::string published_template(const std::string& name) {
  std::ifstream f(std::string(REDLITE_SOURCE_DIR) + "/tests/generate/templates/" + name);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

ChatTemplateChoice choice(std::string format, std::string jinja = {}, bool chatml_fallback = false) {
  ChatTemplateChoice c;
  c.format = std::move(format);
  c.jinja = std::move(jinja);
  c.chatml_fallback = chatml_fallback;
  return c;
}

std::string choice_error(const ChatTemplateChoice& c, std::string_view file_template) {
  try {
    choose_chat_template(c, file_template);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

TEST(ChatTemplateChoice, TheNamedFormatThenTheGivenTemplateThenTheFilesOwn) {
  const std::string thinking = published_template("qwen3-next-80b-a3b-thinking.jinja");
  const std::string instruct = published_template("qwen3-next-80b-a3b-instruct.jinja");
  ASSERT_FALSE(thinking.empty());
  ASSERT_FALSE(instruct.empty());

  const ChatTemplate named = choose_chat_template(choice("qwen3-coder"), thinking);
  EXPECT_EQ(named.format(), ChatFormat::Qwen3Coder);
  EXPECT_FALSE(named.uses_jinja());  // a native renderer

  const ChatTemplate given = choose_chat_template(choice("", instruct), thinking);
  EXPECT_EQ(given.format(), ChatFormat::Qwen3Instruct);
  EXPECT_TRUE(given.uses_jinja());  // rendered from the given text

  const ChatTemplate own = choose_chat_template({}, thinking);
  EXPECT_EQ(own.format(), ChatFormat::Qwen3Thinking);
  EXPECT_TRUE(own.uses_jinja());
}

TEST(ChatTemplateChoice, BadChoicesAreRefusedWithTheFlagNamed) {
  const std::string instruct = published_template("qwen3-next-80b-a3b-instruct.jinja");
  const std::string unknown = choice_error(choice("qwen9"), instruct);
  EXPECT_NE(unknown.find("--chat-template: unknown format 'qwen9'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("qwen3-coder"), std::string::npos) << unknown;  // the known names
  const std::string both = choice_error(choice("qwen3-instruct", instruct), "");
  EXPECT_NE(both.find("--chat-template and --chat-template-file"), std::string::npos) << both;

  // A template nobody recognises: refused, or plain ChatML when the fallback is asked for.
  EXPECT_NE(choice_error({}, "{{ messages }}"), "");
  const ChatTemplate fallback = choose_chat_template(choice("", "", true), "{{ messages }}");
  EXPECT_EQ(fallback.format(), ChatFormat::ChatML);
  EXPECT_TRUE(fallback.fell_back());
}

// The reply starts where the rendered prompt leaves it (the CLI's constraint and the server's
// reasoning split both follow this).
TEST(ReplyStart, FollowsThePrompt) {
  // Qwen3-Thinking opens the block whatever enable_thinking says.
  EXPECT_EQ(reply_start("<|im_start|>assistant\n<think>\n", ChatFormat::Qwen3Thinking), ReplyStart::Reasoning);
  EXPECT_EQ(reply_start("<|im_start|>assistant\n<think>\n", ChatFormat::Qwen3Instruct), ReplyStart::Reasoning);
  // Hybrid with enable_thinking false closes an empty block: the reply is content, or a block
  // the model opens anyway.
  EXPECT_EQ(reply_start("<|im_start|>assistant\n<think>\n\n</think>\n\n", ChatFormat::Qwen3Hybrid), ReplyStart::Either);
  EXPECT_EQ(reply_start("<|im_start|>assistant\n", ChatFormat::Qwen3Hybrid), ReplyStart::Either);
  EXPECT_EQ(reply_start("<|im_start|>assistant\n", ChatFormat::Qwen3Thinking), ReplyStart::Either);
  EXPECT_EQ(reply_start("<|im_start|>assistant\n", ChatFormat::Qwen3Instruct), ReplyStart::Content);
  EXPECT_EQ(reply_start("<|im_start|>assistant\n", ChatFormat::Qwen2), ReplyStart::Content);
  // An earlier, closed block in the history does not count.
  EXPECT_EQ(reply_start("<think>\nx\n</think>\n\ny<|im_end|>\n<|im_start|>assistant\n", ChatFormat::Qwen3Coder),
            ReplyStart::Content);
}

}  // namespace
}  // namespace rl
