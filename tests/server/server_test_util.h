// Starts an in-process rl::Server on a fixture model (CPU backend, loopback, any free port).
#pragma once
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cpu/cpu_backend.h"
#include "generate/chat_template.h"
#include "generate/generator.h"
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
    // A client writing to a connection the server closed gets EPIPE, not a dead test binary.
    std::signal(SIGPIPE, SIG_IGN);
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

// The process's resident memory now, in KiB.
inline size_t rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoul(line.substr(6));
  return 0;
}

// A raw TCP connection to the server, for requests a well-behaved client does not send.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    connected_ = connect(fd_, (sockaddr*)&addr, sizeof addr) == 0;
  }
  ~RawConnection() { close(fd_); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;
  bool connected() const { return connected_; }
  // False once the server has closed (or reset) the connection.
  bool send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += (size_t)n;
    }
    return true;
  }
  // Reads until the server closes the connection, `until` has arrived, or timeout_ms passes.
  std::string read(int timeout_ms = 5000, const std::string& until = {}) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::string out;
    while (!closed_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, (int)left.count()) <= 0) break;
      char buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      out.append(buf, (size_t)n);
      if (!until.empty() && out.find(until) != std::string::npos) break;
    }
    return out;
  }
  bool closed_by_server() const { return closed_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
};

// Writes raw bytes, then reads until the server closes or 5 s pass; returns the answer (may be "").
inline std::string raw_exchange(int port, const std::string& bytes, bool close_early = false, int linger_ms = 0) {
  RawConnection c(port);
  if (!c.connected()) return "connect failed";
  if (!bytes.empty()) c.send(bytes);
  if (linger_ms) usleep(linger_ms * 1000);
  return close_early ? std::string() : c.read();
}

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

// A chat request of two messages (a terse system prompt, then `user`), greedy.
inline nlohmann::json chat_body(const std::string& user, int max_tokens, bool stream = false) {
  return nlohmann::json{{"model", "any"},
                        {"messages", nlohmann::json::array({{{"role", "system"}, {"content", "You are terse."}},
                                                            {{"role", "user"}, {"content", user}}})},
                        {"max_tokens", max_tokens},
                        {"temperature", 0},
                        {"stream", stream}};
}

// The next turn of a chat request: its messages, the reply a whole answer `answer` gave, then `user`.
inline nlohmann::json next_turn(const nlohmann::json& request, const nlohmann::json& answer, const std::string& user) {
  nlohmann::json next = request;
  next["messages"].push_back({{"role", "assistant"}, {"content", answer["choices"][0]["message"]["content"]}});
  next["messages"].push_back({{"role", "user"}, {"content", user}});
  return next;
}

// Tests that need the server's fixture model skip, naming it, without it.
class ServerModelTest : public ::testing::Test {
 protected:
  void SetUp() override { RL_REQUIRE_FIXTURE(server_model()); }
};

// The reference a reply must equal: the Generator on a fresh CPU session of the server's model
// with `params`, from `prompt`.
inline std::string generator_text(const std::vector<int32_t>& prompt, const SamplingParams& params, int max_tokens) {
  auto owned = fixture_loader(server_model())([](float) {});
  auto session = owned.backend->new_session(4096);
  Generator gen(*session, *owned.tokenizer);
  GenerationConfig cfg;
  cfg.sampling = params;
  cfg.max_tokens = max_tokens;
  return wire_text(gen.generate(prompt, cfg, nullptr).text);
}

// The prompt tokens of chat_body(user, ...) as the server renders them: the file's chat template.
inline std::vector<int32_t> chat_prompt_tokens(const std::string& user) {
  auto owned = fixture_loader(server_model())([](float) {});
  ChatTemplate t = ChatTemplate::detect(owned.tokenizer->chat_template(), false);
  std::vector<ChatMessage> msgs(2);
  msgs[0].role = "system";
  msgs[0].content = "You are terse.";
  msgs[1].role = "user";
  msgs[1].content = user;
  return owned.tokenizer->encode(t.render(msgs), true);
}

// The text of a stream's chunks (chat deltas or completion texts), and its last finish_reason.
inline std::string stream_text(const SseStream& s, std::string* finish = nullptr) {
  std::string text;
  for (const nlohmann::json& e : s.events) {
    if (!e.contains("choices")) continue;
    for (const nlohmann::json& c : e["choices"]) {
      if (c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string())
        text += c["delta"]["content"].get<std::string>();
      if (c.contains("text")) text += c["text"].get<std::string>();
      if (finish && c.contains("finish_reason") && c["finish_reason"].is_string()) *finish = c["finish_reason"];
    }
  }
  return text;
}

// The value of an unlabelled metric in the /metrics text; -1 when the server does not report it.
inline double metric(const TestServer& s, const std::string& name) {
  auto r = s.client().Get("/metrics");
  if (!r || r->status != 200) return -1;
  const std::string key = "\n" + name + " ";
  const size_t at = ("\n" + r->body).find(key);
  if (at == std::string::npos) return -1;
  return std::stod(r->body.substr(at + key.size() - 1));
}

// Polls a metric until it equals `want` (true) or `timeout` passes (false).
inline bool wait_for_metric(const TestServer& s, const std::string& name, double want,
                            std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (metric(s, name) != want) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// A streaming completion long enough to keep the model's worker busy, on a raw socket: it runs
// from start() (which returns once its first event arrived) until release() hangs up, which
// cancels it at its next token.
class BusyStream {
 public:
  explicit BusyStream(const TestServer& s) : server_(s) {}
  ~BusyStream() { release(); }
  // False when the connection or the request failed, or the generation never started.
  bool start() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(server_.port());
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (::connect(fd_, (sockaddr*)&addr, sizeof addr) != 0) return false;
    const std::string body =
        nlohmann::json{{"prompt", "Once upon a time"}, {"max_tokens", 3000}, {"temperature", 0}, {"stream", true}}
            .dump();
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    if (::write(fd_, req.data(), req.size()) != (ssize_t)req.size()) return false;
    // The first event proves the generation runs (the gauge alone may still show the previous
    // request, which the worker has finished but not yet let go).
    timeval tv{30, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string seen;
    char buf[1024];
    while (seen.find("data: ") == std::string::npos) {
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) return false;
      seen.append(buf, (size_t)n);
    }
    return metric(server_, "redlite_requests_running") == 1 && metric(server_, "redlite_queue_depth") == 0;
  }
  void release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  const TestServer& server_;
  int fd_ = -1;
};

}  // namespace rl::test
