#include "generate/chat_choice.h"

#include <fmt/format.h>

#include <cstdio>

#include "common/error.h"

namespace rl {

void ChatTemplateChoice::validate() const {
  if (!format.empty() && !chat_format_from_name(format))
    fail("--chat-template: unknown format '{}' (known: {})", format, chat_format_names());
  if (!format.empty() && !jinja.empty()) fail("--chat-template and --chat-template-file: give one");
}

ChatTemplate choose_chat_template(const ChatTemplateChoice& choice, std::string_view file_template) {
  choice.validate();
  if (!choice.format.empty()) return ChatTemplate::of(*chat_format_from_name(choice.format));
  ChatTemplate t = ChatTemplate::detect(choice.jinja.empty() ? file_template : choice.jinja, choice.chatml_fallback);
  if (t.fell_back()) fmt::print(stderr, "warning: {}\n", t.warning());
  if (!t.jinja_warning().empty()) fmt::print(stderr, "warning: {}\n", t.jinja_warning());
  return t;
}

ReplyStart reply_start(std::string_view prompt, ChatFormat format) {
  constexpr std::string_view kOpen = "<think>", kEnd = "</think>";
  const size_t open = prompt.rfind(kOpen);
  if (open != std::string_view::npos && prompt.find(kEnd, open) == std::string_view::npos &&
      prompt.find_first_not_of(" \t\r\n", open + kOpen.size()) == std::string_view::npos)
    return ReplyStart::Reasoning;
  const bool may_think = format == ChatFormat::Qwen3Thinking || format == ChatFormat::Qwen3Hybrid;
  return may_think ? ReplyStart::Either : ReplyStart::Content;
}

}  // namespace rl
