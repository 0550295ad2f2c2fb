// What `redlite run`, `redlite chat` and `redlite generate -p` share: sampling flags, opening a
// model with its tokenizer and chat template (with a progress bar while the file is read), the
// SIGINT-to-cancel wiring, and the stats line on stderr.
#pragma once
#include <CLI/CLI.hpp>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "cli/common_options.h"
#include "generate/chat_choice.h"
#include "generate/chat_template.h"
#include "generate/generator.h"
#include "tokenizer/tokenizer.h"

namespace rl::cli {

// The chat-template flags as given: the template file's path, not yet read.
struct ChatTemplateFlags {
  ChatTemplateChoice choice;  // format (--chat-template), chatml_fallback; jinja unset
  std::string template_file;  // --chat-template-file
  // `choice` with the file's text (rl::Error naming the file when it cannot be read, or is larger
  // than any chat template: 1 MiB).
  ChatTemplateChoice resolve() const;
};

struct TextOptions {
  CommonOptions common;
  GenerationConfig gen;
  bool greedy = false;
  bool ignore_eos = false;
  ChatTemplateFlags chat_template;  // --chat-template, --chat-template-file, --chatml
  std::string system;               // --system
  bool no_think = false;            // --no-think: Qwen3 hybrid templates, enable_thinking = false
  std::string json_schema;          // --json-schema FILE: constrain the reply to its documents
  bool json_object = false;         // --json-object: constrain the reply to a JSON object

  // Applies --greedy/--ignore-eos/--json-schema/--json-object to `gen` and validates the
  // sampling values (and compiles the schema: rl::Error naming the file and the keyword).
  GenerationConfig config() const;
};

// -n, --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --presence-penalty,
// --frequency-penalty, --seed, --greedy, --stop, --ignore-eos, --json-schema, --json-object.
void add_sampling_options(CLI::App& app, TextOptions& o, int default_max_tokens);
// --system, --chatml, --chat-template, --chat-template-file, --no-think.
void add_chat_options(CLI::App& app, TextOptions& o);

// --chat-template and --chat-template-file (run, chat and serve; the fallback flag is named by each).
void add_chat_template_options(CLI::App& app, ChatTemplateFlags& flags);

struct TextModel {
  LoadedModel loaded;
  std::unique_ptr<Tokenizer> tokenizer;
  double load_seconds = 0;
};

// Reads the file through the page cache with a progress bar on stderr (when it fits in memory,
// so the first tokens do not wait on disk), then opens the model, backend and tokenizer.
TextModel open_text_model(const CommonOptions& opts);

// The chat template the flags choose for this model (generate/chat_choice.h; warnings on stderr).
ChatTemplate chat_template_of(const Tokenizer& tok, const TextOptions& o);

// Text -> prompt ids: control tokens in the text are parsed; BOS first when the model wants it.
std::vector<int32_t> tokenize_prompt(const Tokenizer& tok, const std::string& text, bool add_bos);

// SIGINT sets the flag instead of killing the process (without SA_RESTART, so a blocking read of
// the terminal returns). The flag is cleared by the caller before each reply.
std::atomic<bool>& interrupt_flag();
void install_interrupt_handler();

// "prefill: 12 tokens, 850.3 tok/s | generation: 64 tokens, 41.2 tok/s | finish: stop", and
// " | constraint: 0.050 ms/token computed, 0.010 ms/token waited" under --json-schema /
// --json-object.
std::string stats_line(const GenerationResult& r);

}  // namespace rl::cli
