// redlite chat: an interactive multi-turn chat in the terminal. The session keeps its state
// between turns, so each turn prefills only its new tokens (the closing of the last reply, the
// user's message and the generation prompt); stderr shows how many after every reply.
// Ctrl-C stops a reply and returns to the prompt; Ctrl-C at the prompt, Ctrl-D or /exit leaves.
// /reset starts a new conversation.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "cli/command.h"
#include "cli/text_generation.h"
#include "common/error.h"

namespace rl::cli {
namespace {

// Reads one line from the terminal; false at end of input or on Ctrl-C.
bool read_user_line(std::string& line) {
  std::fputs("> ", stdout);
  std::fflush(stdout);
  if (!std::getline(std::cin, line)) return false;
  return !interrupt_flag().load();
}

int run_chat(const TextOptions& o) {
  GenerationConfig config = o.config();
  TextModel tm = open_text_model(o.common);
  const Tokenizer& tok = *tm.tokenizer;
  ChatTemplate tmpl = chat_template_of(tok, o);
  ChatRenderOptions ropt;
  if (o.no_think) ropt.enable_thinking = false;
  std::fprintf(stderr, "chat template: %s. Ctrl-C stops a reply; /reset, /exit (or Ctrl-D).\n", tmpl.name());

  auto session = tm.loaded.new_session();
  Generator gen(*session, tok);
  install_interrupt_handler();

  // What follows the session's history: nothing before the first turn; after a reply, the
  // sampled token the session has not processed (unless it ended the turn: the continuation
  // closes the turn with its own <|im_end|>).
  int32_t pending = -1;  // -1: none
  bool first_turn = true;
  std::string line;
  while (true) {
    interrupt_flag().store(false);
    if (!read_user_line(line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      gen.reset();
      first_turn = true;
      pending = -1;
      std::fprintf(stderr, "(new conversation)\n");
      continue;
    }
    if (line.empty()) continue;

    std::vector<int32_t> prompt;
    std::string turn_text;  // what this turn adds, ending with the generation prompt
    ChatMessage user{"user", line, {}, {}, {}};
    if (first_turn) {
      std::vector<ChatMessage> messages;
      if (!o.system.empty()) messages.push_back(ChatMessage{"system", o.system, {}, {}, {}});
      messages.push_back(user);
      turn_text = tmpl.render(messages, ropt);
      prompt = tokenize_prompt(tok, turn_text, /*add_bos=*/true);
    } else {
      prompt = gen.history();
      if (pending >= 0 && !tok.is_eog(pending)) prompt.push_back(pending);
      turn_text = tmpl.continuation(std::span(&user, 1), ropt);
      std::vector<int32_t> next = tok.encode(turn_text, /*parse_special=*/true);
      prompt.insert(prompt.end(), next.begin(), next.end());
    }
    // A turn that opens <think> (a Thinking template): a constrained document starts after it.
    config.constraint.after_reasoning = reply_start(turn_text, tmpl.format()) == ReplyStart::Reasoning;

    GenerationResult r;
    try {
      r = gen.generate(
          prompt, config,
          [](std::string_view piece) {
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
          },
          &interrupt_flag());
    } catch (const Error& e) {
      // A turn that does not fit the context: say so and let the user /reset.
      std::fprintf(stderr, "\nerror: %s (use /reset to start over)\n", e.what());
      continue;
    }
    if (r.finish == FinishReason::Cancelled && gen.history().size() < prompt.size()) {
      // Stopped while reading the user's turn: the session holds half of it, which no
      // continuation could close cleanly.
      gen.reset();
      first_turn = true;
      pending = -1;
      std::fputs("\n[stopped before the reply; the conversation starts over]\n", stdout);
      continue;
    }
    first_turn = false;
    pending = r.pending_token.value_or(-1);
    std::fputc('\n', stdout);
    if (r.finish == FinishReason::Cancelled) std::fputs("[reply stopped]\n", stdout);
    std::fflush(stdout);
    std::fprintf(stderr, "[%s]\n", stats_line(r).c_str());
  }
  std::fputc('\n', stdout);
  return 0;
}

const Registrar registrar("chat", "interactive multi-turn chat in the terminal", [](CLI::App& sub) {
  auto o = std::make_shared<TextOptions>();
  add_common_options(sub, o->common);
  add_chat_options(sub, *o);
  add_sampling_options(sub, *o, 1024);
  return [o] { return run_chat(*o); };
});

}  // namespace
}  // namespace rl::cli
