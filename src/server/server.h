// `redlite serve`: an OpenAI-compatible HTTP server (http_server.h, on Boost.Beast, + nlohmann-json).
//
// Threads: the HTTP layer reads and writes every connection on one I/O thread and hands complete
// requests to a pool of handler threads (http_server.h has its limits); one worker thread owns the
// model's sessions and runs up to --parallel generations together, decoding them in one batched
// pass per token (scheduler.h). A request waits in a bounded queue; past --max-queue it is refused
// with 503 and Retry-After. A client that goes away cancels its generation (a streaming one at the
// next token, one waiting for a whole answer within 0.1 s); every request has a deadline. Browser
// pages are refused unless their origin is allowed (origin_policy.h).
//
// State reuse: every slot keeps its session and history, and the worker a PromptCache of snapshots
// taken at prompt boundaries, so a request whose prompt extends an earlier conversation prefills
// only its new tokens (usage.prompt_tokens_details.cached_tokens says how many were reused).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "generate/chat_choice.h"

namespace rl {

class Backend;
class Tokenizer;

// What the server serves. `owner` keeps the model, its GGUF mapping and the backend alive.
struct ServedModel {
  std::string id;  // /v1/models name (the file's base name)
  std::shared_ptr<void> owner;
  Backend* backend = nullptr;
  const Tokenizer* tokenizer = nullptr;
  int n_ctx_train = 0;
  std::string numerics = "exact";  // the backend's numeric tier (--numerics), shown by /v1/models
};

// Loads the model; `progress` takes 0..1. Throws rl::Error on failure (the server then reports
// the error on /health with 500 and refuses generation requests).
using ModelLoader = std::function<ServedModel(const std::function<void(float)>& progress)>;

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port (see Server::port())
  std::string api_key;             // empty: no authentication
  int n_ctx = 4096;                // context of the served session (prompt + generation)
  // Limits that keep a configuration from overflowing the clock or spawning thousands of threads.
  static constexpr int kMaxQueue = 4096;
  static constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600.0;
  static constexpr int kMaxConnections = 65536;

  int parallel = 1;                // sequences generating together (scheduler.h; 1..16)
  size_t kv_mib = 0;               // the sequences' KV caches and states, MiB; 0: `parallel` full contexts
  int max_queue = 16;              // requests waiting for the model beyond those running (<= kMaxQueue)
  double request_timeout_s = 600;  // a generation that runs longer ends with an error (<= kMaxTimeoutSeconds)
  size_t max_body_bytes = 8u << 20;
  size_t prompt_cache_bytes = 1024u << 20;  // snapshots kept for state reuse
  int step_prefill_tokens = 0;     // prompt tokens a scheduler step may prefill across sequences (scheduler.h)
  // --chat-template, --chat-template-file's text, --chatml-fallback (generate/chat_choice.h).
  ChatTemplateChoice chat_template;
  int http_threads = 0;            // handler threads; 0: max(16, max_queue + parallel + 8)
  // Seconds a client may take to send a request line and header, counted from its first byte (a
  // connection that sends nothing is dropped after as long), and to send the body.
  double read_timeout_s = 10;
  double body_timeout_s = 60;
  double idle_timeout_s = 5;       // a kept-alive connection waits this long for its next request
  int max_connections = 512;       // open connections; at the limit the longest-waiting header is dropped
  std::string allowed_origins;     // comma-separated origins (or "*") whose web pages may call the API
  bool verbose = false;            // one log line per request on stderr
};

class Server {
 public:
  Server(ServerConfig config, ModelLoader loader);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds (throws rl::Error naming host:port when it cannot), then serves on background threads
  // and starts loading the model. /health answers 503 until the model is ready.
  void start();
  // Blocks until stop() is called (from a signal handler thread or another thread).
  void wait();
  void stop();

  int port() const;  // the bound port (useful with port 0)
  bool ready() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rl
