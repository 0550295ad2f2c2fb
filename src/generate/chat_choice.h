// What a front end (redlite run --chat, redlite chat, the server) decides about a chat in one
// place: which chat template renders it, from the flags and the model file, and where the
// model's reply to a rendered prompt starts (inside a <think> block or not).
#pragma once
#include <string>
#include <string_view>

#include "generate/chat_template.h"

namespace rl {

// The flags that pick the chat template.
struct ChatTemplateChoice {
  std::string format;            // --chat-template NAME: a native renderer; wins over the rest
  std::string jinja;             // --chat-template-file's text: rendered instead of the file's template
  bool chatml_fallback = false;  // an unrecognised template renders as plain ChatML (else rl::Error)

  // rl::Error for an unknown format name, or a name and a template text given together.
  void validate() const;
};

// The template `choice` picks, `file_template` being the model file's (tokenizer.chat_template).
// Prints its fallback and Jinja warnings on stderr. Throws rl::Error as validate() and
// ChatTemplate::detect do.
ChatTemplate choose_chat_template(const ChatTemplateChoice& choice, std::string_view file_template);

// Where the reply to a rendered prompt starts.
enum class ReplyStart {
  Content,    // no reasoning block
  Reasoning,  // the prompt opened <think> (Qwen3-Thinking's generation prompt, whatever
              // enable_thinking says): the reply starts as reasoning
  Either,     // the model may open <think> itself as the first thing it writes (hybrid)
};
// Reasoning when `prompt` ends inside an open <think> block; otherwise Either for the formats
// whose model may think on its own (Thinking, Hybrid), else Content.
ReplyStart reply_start(std::string_view prompt, ChatFormat format);

}  // namespace rl
