// Starts an in-process rl::Server on a fixture model (CPU backend, loopback, any free port).
#pragma once
#include <httplib.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cpu/cpu_backend.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "server/server.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace rl::test {

// Model B: small vocabulary, so a token costs little on two cores.
inline std::string server_model() { return fixture("tiny-qwen3next-q4km.gguf"); }

struct LoadedForServer {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Tokenizer> tokenizer;
};

inline ModelLoader fixture_loader(const std::string& path, int threads = 2) {
  return [path, threads](const std::function<void(float)>& progress) {
    auto owned = std::make_shared<LoadedForServer>();
    owned->model = Model::open(path);
    owned->backend = cpu::make_cpu_backend(owned->model, threads);
    owned->tokenizer = Tokenizer::from_gguf(owned->model->gguf());
    progress(1.0f);
    ServedModel m;
    m.id = "tiny-qwen3next-q4km.gguf";
    m.backend = owned->backend.get();
    m.tokenizer = owned->tokenizer.get();
    m.n_ctx_train = owned->model->config().n_ctx_train;
    m.owner = owned;
    return m;
  };
}

class TestServer {
 public:
  explicit TestServer(ServerConfig cfg, const std::string& model = server_model()) {
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    server_ = std::make_unique<Server>(cfg, fixture_loader(model));
    server_->start();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!server_->ready() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ~TestServer() { server_->stop(); }
  int port() const { return server_->port(); }
  bool ready() const { return server_->ready(); }
  httplib::Client client(int timeout_s = 120) const {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(timeout_s, 0);
    c.set_connection_timeout(5, 0);
    return c;
  }

 private:
  std::unique_ptr<Server> server_;
};

// What a string looks like after a trip through JSON: invalid UTF-8 (random-weight models emit
// it) becomes U+FFFD, as the server's serialiser writes it.
inline std::string wire_text(const std::string& s) {
  return nlohmann::json::parse(nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
      .get<std::string>();
}

// The data: lines of an SSE body, parsed; "[DONE]" ends it (and is required).
struct SseStream {
  std::vector<nlohmann::json> events;
  bool done = false;
};
inline SseStream parse_sse(const std::string& body) {
  SseStream s;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind("data: ", 0) != 0) continue;
    std::string data = ev.substr(6);
    if (data == "[DONE]") {
      s.done = true;
      continue;
    }
    s.events.push_back(nlohmann::json::parse(data));
  }
  return s;
}

}  // namespace rl::test
