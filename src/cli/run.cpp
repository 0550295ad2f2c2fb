// redlite run: one prompt, the reply streamed to stdout as it is generated; load time and
// prompt / generation speed on stderr. --chat wraps the prompt in the model's chat template.
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "cli/text_generation.h"
#include "common/error.h"

namespace rl::cli {
namespace {

struct RunOptions {
  TextOptions text;
  std::string prompt;
  bool chat = false;
};

int run_run(const RunOptions& o) {
  GenerationConfig config = o.text.config();
  TextModel tm = open_text_model(o.text.common);
  const Tokenizer& tok = *tm.tokenizer;

  std::vector<int32_t> prompt;
  if (o.chat) {
    ChatTemplate tmpl = chat_template_of(tok, o.text);
    std::vector<ChatMessage> messages;
    if (!o.text.system.empty()) messages.push_back(ChatMessage{"system", o.text.system, {}, {}, {}});
    messages.push_back(ChatMessage{"user", o.prompt, {}, {}, {}});
    ChatRenderOptions ropt;
    if (o.text.no_think) ropt.enable_thinking = false;
    const std::string text = tmpl.render(messages, ropt);
    prompt = tokenize_prompt(tok, text, /*add_bos=*/true);
    // A prompt that opens <think> (a Thinking template): the constrained document starts after it.
    config.constraint.after_reasoning = reply_start(text, tmpl.format()) == ReplyStart::Reasoning;
  } else {
    if (!o.text.system.empty()) fail("--system: needs --chat (a raw prompt has no system turn)");
    prompt = tokenize_prompt(tok, o.prompt, /*add_bos=*/true);
  }

  auto session = tm.loaded.new_session();
  Generator gen(*session, tok);
  install_interrupt_handler();
  GenerationResult r = gen.generate(
      prompt, config,
      [](std::string_view piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      },
      &interrupt_flag());
  std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "load: %.2f s | %s\n", tm.load_seconds, stats_line(r).c_str());
  return r.finish == FinishReason::Cancelled ? 130 : 0;
}

const Registrar registrar("run", "generate text from a prompt, streamed to stdout", [](CLI::App& sub) {
  auto o = std::make_shared<RunOptions>();
  add_common_options(sub, o->text.common);
  sub.add_option("-p,--prompt", o->prompt, "prompt text")->required();
  sub.add_flag("--chat", o->chat, "wrap the prompt in the model's chat template as a user turn");
  add_chat_options(sub, o->text);
  add_sampling_options(sub, o->text, 256);
  return [o] { return run_run(*o); };
});

}  // namespace
}  // namespace rl::cli
