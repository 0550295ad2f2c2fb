#include "cli/text_generation.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "common/format.h"
#include "generate/json_schema_grammar.h"
#include "gguf/gguf.h"

namespace rl::cli {

GenerationConfig TextOptions::config() const {
  GenerationConfig c = gen;
  if (greedy) c.sampling.temperature = 0.0f;
  if (ignore_eos) c.stop_at_eog = false;
  c.sampling.validate();
  if (!json_schema.empty() && json_object) fail("--json-schema and --json-object: give one");
  if (json_object) c.constraint.grammar = std::make_shared<const Grammar>(json_object_grammar());
  if (!json_schema.empty()) {
    std::ifstream f(json_schema);
    if (!f) fail("--json-schema {}: cannot read the file", json_schema);
    const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(f, nullptr, false);
    if (schema.is_discarded()) fail("--json-schema {}: not valid JSON", json_schema);
    try {
      c.constraint.grammar = std::make_shared<const Grammar>(json_schema_grammar(schema));
    } catch (const Error& e) {
      fail("--json-schema {}: {}", json_schema, e.what());
    }
  }
  return c;
}

void add_sampling_options(CLI::App& app, TextOptions& o, int default_max_tokens) {
  o.gen.max_tokens = default_max_tokens;
  SamplingParams& s = o.gen.sampling;
  app.add_option("-n,--n-predict", o.gen.max_tokens, "tokens to generate at most")->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--temp", s.temperature, "temperature (<= 0: greedy)")->capture_default_str();
  app.add_option("--top-k", s.top_k, "keep the k most probable tokens (<= 0: off)")->capture_default_str();
  app.add_option("--top-p", s.top_p, "keep the smallest set with this much probability (1: off)")
      ->capture_default_str();
  app.add_option("--min-p", s.min_p, "drop tokens below min_p * p(most probable) (0: off)")->capture_default_str();
  app.add_option("--repeat-penalty", s.repeat_penalty, "penalty for recent tokens (1: off)")->capture_default_str();
  app.add_option("--repeat-last-n", s.repeat_last_n, "window of the penalties (-1: everything)")
      ->capture_default_str();
  app.add_option("--presence-penalty", s.presence_penalty, "subtracted once from every recent token")
      ->capture_default_str();
  app.add_option("--frequency-penalty", s.frequency_penalty, "subtracted per occurrence of a recent token")
      ->capture_default_str();
  app.add_option("--seed", s.seed, "sampling seed")->capture_default_str();
  app.add_flag("--greedy", o.greedy, "argmax decoding (same as --temp 0)");
  app.add_option("--stop", o.gen.stop_strings, "stop when the text contains this string (repeatable)");
  app.add_flag("--ignore-eos", o.ignore_eos, "keep generating past end-of-generation tokens");
  app.add_option("--json-schema", o.json_schema,
                 "constrain the reply to JSON documents of the JSON Schema in this file (docs/structured_outputs.md)");
  app.add_flag("--json-object", o.json_object, "constrain the reply to a JSON object");
}

void add_chat_template_options(CLI::App& app, ChatTemplateFlags& flags) {
  CLI::Option* name = app.add_option("--chat-template", flags.choice.format,
                                     "chat format to use instead of the file's template: " + chat_format_names())
                          ->check([](const std::string& v) {
                            return chat_format_from_name(v) ? std::string()
                                                            : "unknown chat format '" + v + "' (known: " +
                                                                  chat_format_names() + ")";
                          });
  app.add_option("--chat-template-file", flags.template_file,
                 "Jinja chat template (a model's chat_template.jinja) to render with instead of the file's; "
                 "its format is recognised from the text")
      ->check(CLI::ExistingFile)
      ->excludes(name);
}

void add_chat_options(CLI::App& app, TextOptions& o) {
  app.add_option("--system", o.system, "system message");
  app.add_flag("--chatml", o.chat_template.choice.chatml_fallback,
               "render as plain ChatML when the model's chat template is not recognised");
  add_chat_template_options(app, o.chat_template);
  app.add_flag("--no-think", o.no_think, "Qwen3 hybrid templates: answer without a thinking block");
}

// ---------------------------------------------------------------------------------------------

namespace {

uint64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

void draw_bar(uint64_t done, uint64_t total) {
  constexpr int kWidth = 40;
  const double frac = total ? (double)done / total : 1.0;
  const int filled = (int)(frac * kWidth);
  std::string bar(filled, '=');
  if (filled < kWidth) bar += '>' + std::string(kWidth - filled - 1, ' ');
  std::fprintf(stderr, "\rloading model [%s] %3d%% %s / %s ", bar.c_str(), (int)(frac * 100),
               human_bytes(done).c_str(), human_bytes(total).c_str());
  std::fflush(stderr);
}

// Reads the whole file once so its pages are in the page cache before the backend touches them.
// Skipped when the file would not fit in the memory that is free (it would only evict itself).
void warm_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;  // Model::open reports the error with the path
  struct stat st {};
  if (::fstat(fd, &st) != 0 || (uint64_t)st.st_size > available_memory_bytes() / 5 * 4) {
    ::close(fd);
    return;
  }
  const uint64_t total = (uint64_t)st.st_size;
  const bool tty = ::isatty(STDERR_FILENO);
  std::vector<char> buf(16u << 20);
  uint64_t done = 0;
  int last_percent = -1;
  while (done < total) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n <= 0) break;
    done += (uint64_t)n;
    int percent = (int)(100 * done / total);
    if (tty && percent != last_percent) {
      draw_bar(done, total);
      last_percent = percent;
    }
  }
  if (tty) std::fprintf(stderr, "\r%*s\r", 90, "");
  ::close(fd);
}

}  // namespace

TextModel open_text_model(const CommonOptions& opts) {
  if (opts.model_path.empty()) fail("-m/--model: no model file given");
  auto t0 = std::chrono::steady_clock::now();
  warm_file(opts.model_path);
  if (::isatty(STDERR_FILENO)) std::fprintf(stderr, "loading model: preparing the backend...\r");
  TextModel tm;
  tm.loaded = open_model(opts);
  tm.tokenizer = Tokenizer::from_gguf(tm.loaded.model->gguf());
  tm.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (::isatty(STDERR_FILENO)) std::fprintf(stderr, "%*s\r", 40, "");
  std::fprintf(stderr, "model loaded in %.2f s (%s, backend %s, ctx %d)\n", tm.load_seconds, opts.model_path.c_str(),
               tm.loaded.backend->name().c_str(), tm.loaded.n_ctx);
  return tm;
}

namespace {
std::string read_chat_template_file(const std::string& path) {
  constexpr std::uintmax_t kMaxBytes = 1u << 20;
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail("--chat-template-file {}: cannot read the file ({})", path, ec.message());
  if (size > kMaxBytes) fail("--chat-template-file {}: {} bytes; a chat template has at most {}", path, size, kMaxBytes);
  std::ifstream f(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (!f && !f.eof()) fail("--chat-template-file {}: cannot read the file", path);
  if (text.empty()) fail("--chat-template-file {}: the file is empty", path);
  return text;
}
}  // namespace

ChatTemplateChoice ChatTemplateFlags::resolve() const {
  ChatTemplateChoice c = choice;
  if (!template_file.empty()) c.jinja = read_chat_template_file(template_file);
  return c;
}

ChatTemplate chat_template_of(const Tokenizer& tok, const TextOptions& o) {
  return choose_chat_template(o.chat_template.resolve(), tok.chat_template());
}

std::vector<int32_t> tokenize_prompt(const Tokenizer& tok, const std::string& text, bool add_bos) {
  std::vector<int32_t> ids;
  if (add_bos && tok.add_bos() && tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  std::vector<int32_t> body = tok.encode(text, /*parse_special=*/true);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

// ---------------------------------------------------------------------------------------------

std::atomic<bool>& interrupt_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}

namespace {
void on_sigint(int) { interrupt_flag().store(true); }
}  // namespace

void install_interrupt_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a read of the terminal returns on Ctrl-C
  sigaction(SIGINT, &sa, nullptr);
}

std::string stats_line(const GenerationResult& r) {
  std::string line = fmt::format("prefill: {} tokens, {:.1f} tok/s | generation: {} tokens, {:.1f} tok/s | finish: {}",
                                 r.prefill_tokens, r.prefill_tok_s(), r.tokens.size(), r.decode_tok_s(),
                                 finish_reason_name(r.finish));
  if (r.constrained_steps > 0)
    line += fmt::format(" | constraint: {:.3f} ms/token computed, {:.3f} ms/token waited",
                        1e3 * r.constraint_compute_seconds / r.constrained_steps,
                        1e3 * r.constraint_seconds / r.constrained_steps);
  return line;
}

}  // namespace rl::cli
