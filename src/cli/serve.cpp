// `redlite serve -m MODEL [--host] [--port] [--api-key] [--ctx] [--parallel] [--max-queue]`: the
// OpenAI-compatible HTTP server (src/server). Ctrl-C (SIGINT/SIGTERM) stops it cleanly.
#include <csignal>
#include <filesystem>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "cli/command.h"
#include "cli/common_options.h"
#include "cli/text_generation.h"
#include "common/error.h"
#include "generate/chat_template.h"
#include "server/scheduler.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

namespace rl::cli {
namespace {

struct ServeArgs {
  CommonOptions common;
  ServerConfig server;
  double cache_mib_prompt = 1024;
  ChatTemplateFlags chat_template;  // --chatml-fallback, --chat-template, --chat-template-file
  int step_prefill_tokens = -1;     // -1: not given, the backend's default below
};

// --step-prefill-tokens when not given. On the cuda backend a step's prompt pieces run as one pass
// (prefill_batch_into), so a burst of prompts costs about one prompt's time: 16 streams of 128
// tokens, H100, 2026-12-06, aggregate 908.6 tok/s and median time to first token 185 ms against
// 652.0 and 563 ms with 0 (docs/PERF.md). The cpu backend gained nothing from it (docs/server.md).
constexpr int kCudaStepPrefillTokens = 2048;
int default_step_prefill_tokens(const std::string& backend) { return backend == "cuda" ? kCudaStepPrefillTokens : 0; }

// The signal handler only flips this; a watcher thread calls Server::stop().
volatile std::sig_atomic_t g_stop_requested = 0;
void on_signal(int) { g_stop_requested = 1; }

int run_serve(ServeArgs& a) {
  const CommonOptions common = a.common;
  ServerConfig cfg = a.server;
  if (common.ctx > 0) cfg.n_ctx = common.ctx;
  const std::string backend = common.backend.empty() ? default_backend_name() : common.backend;
  cfg.step_prefill_tokens =
      a.step_prefill_tokens >= 0 ? a.step_prefill_tokens : default_step_prefill_tokens(backend);
  cfg.prompt_cache_bytes = (size_t)(a.cache_mib_prompt * 1024 * 1024);
  if (!std::filesystem::exists(common.model_path)) fail("{}: no such model file", common.model_path);
  resolve_kv_type(common);  // a --kv-type the tier refuses fails at start, not in the background loader
  cfg.chat_template = a.chat_template.resolve();

  struct Owned {
    LoadedModel loaded;
    std::unique_ptr<Tokenizer> tokenizer;
  };
  Server server(cfg, [common](const std::function<void(float)>& progress) {
    auto owned = std::make_shared<Owned>();
    progress(0.05f);
    owned->loaded = open_model(common);
    progress(0.9f);
    owned->tokenizer = Tokenizer::from_gguf(owned->loaded.model->gguf());
    ServedModel m;
    m.id = std::filesystem::path(common.model_path).filename().string();
    m.backend = owned->loaded.backend.get();
    m.tokenizer = owned->tokenizer.get();
    m.n_ctx_train = owned->loaded.n_ctx;
    m.numerics = numerics_name(owned->loaded.numerics);
    m.owner = owned;
    return m;
  });
  server.start();
  fmt::print(stderr, "redlite serve: listening on http://{}:{} (model {}, backend {}, step prefill {} tokens)\n",
             cfg.host, server.port(), common.model_path, backend, cfg.step_prefill_tokens);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::thread watcher([&server] {
    while (!g_stop_requested) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server.stop();
  });
  server.wait();
  g_stop_requested = 1;
  watcher.join();
  fmt::print(stderr, "redlite serve: stopped\n");
  return 0;
}

Registrar reg("serve", "OpenAI-compatible HTTP server (chat, completions, SSE streaming)", [](CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  add_common_options(app, a->common);
  app.add_option("--host", a->server.host, "address to bind (default: loopback only)");
  app.add_option("--port", a->server.port, "port (0: any free port)")->check(CLI::Range(0, 65535));
  app.add_option("--api-key", a->server.api_key, "require 'Authorization: Bearer KEY' on API calls");
  app.add_option("--parallel", a->server.parallel,
                 "sequences generated together, decoded in one batched pass per token (1-16)")
      ->check(CLI::Range(1, SchedulerConfig::kMaxParallel));
  app.add_option("--kv-mib", a->server.kv_mib,
                 "memory for the sequences' KV caches and states, allocated as requests are admitted; a "
                 "request that does not fit waits, one larger than it all gets 400 (default: --parallel full "
                 "contexts)")
      ->check(CLI::Range((size_t)1, (size_t)1 << 30));
  app.add_option("--step-prefill-tokens", a->step_prefill_tokens,
                 "prompt tokens a step may prefill across waiting requests, a chunk of each in turn (a burst of "
                 "short prompts starts in one step); 0: one chunk of one request a step (default: " +
                     std::to_string(kCudaStepPrefillTokens) + " on the cuda backend, 0 on cpu)")
      ->check(CLI::Range(0, SchedulerConfig::kMaxStepPrefillTokens));
  app.add_option("--max-queue", a->server.max_queue,
                 "requests that may wait for a free sequence; more get 503")
      ->check(CLI::Range(0, ServerConfig::kMaxQueue));
  app.add_option("--timeout", a->server.request_timeout_s, "seconds a request may run")
      ->check(CLI::Range(1e-3, ServerConfig::kMaxTimeoutSeconds));
  app.add_option("--max-body", a->server.max_body_bytes, "largest request body in bytes (chunked or not)");
  app.add_option("--max-connections", a->server.max_connections,
                 "open connections at most; at the limit the one waiting longest for its header is dropped")
      ->check(CLI::Range(1, ServerConfig::kMaxConnections));
  app.add_option("--allowed-origins", a->server.allowed_origins,
                 "comma-separated origins (scheme://host[:port]) or '*' whose web pages may call the API "
                 "(default: none; requests with another Origin get 403)");
  app.add_option("--prompt-cache-mib", a->cache_mib_prompt, "memory for kept session states (state reuse)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--chatml-fallback", a->chat_template.choice.chatml_fallback,
               "serve a file whose chat template is not recognised with plain ChatML");
  add_chat_template_options(app, a->chat_template);
  app.add_flag("-v,--verbose", a->server.verbose, "log every request on stderr");
  return [a] { return run_serve(*a); };
});

}  // namespace
}  // namespace rl::cli
