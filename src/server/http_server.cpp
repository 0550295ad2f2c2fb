#include "server/http_server.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <thread>

#include <fmt/format.h>

#include "common/error.h"
#include "server/http_connection.h"

namespace rl::http {

std::string response_head(const Response& res, std::optional<size_t> length, bool keep_alive, bool http10) {
  const auto reason = beast::http::obsolete_reason(beast::http::int_to_status((unsigned)res.status));
  std::string out = fmt::format("HTTP/1.1 {} {}\r\n", res.status, std::string_view(reason.data(), reason.size()));
  for (const auto& [k, v] : res.headers) out += k + ": " + v + "\r\n";
  if (!res.content_type.empty()) out += "Content-Type: " + res.content_type + "\r\n";
  const bool bodiless = res.status == 204 || res.status == 304;  // RFC 9110: no Content-Length
  if (length && !bodiless) out += fmt::format("Content-Length: {}\r\n", *length);
  else if (!http10) out += "Transfer-Encoding: chunked\r\n";
  if (!keep_alive) out += "Connection: close\r\n";
  else if (http10) out += "Connection: keep-alive\r\n";
  return out + "\r\n";
}

const Route* ServerCore::find_route(const std::string& method, const std::string& path, bool& path_known) const {
  path_known = false;
  for (const Route& r : routes) {
    if (r.path != path) continue;
    path_known = true;
    if (r.method == method) return &r;
  }
  return nullptr;
}

// A fixed pool of handler threads fed from one queue. Its length is bounded by the connection
// limit: a connection has at most one request in the pool.
class HandlerPool {
 public:
  void start(int n) {
    for (int i = 0; i < n; i++) threads_.emplace_back([this] { loop(); });
  }
  void post(std::function<void()> task) {
    std::lock_guard<std::mutex> l(m_);
    tasks_.push_back(std::move(task));
    cv_.notify_one();
  }
  void stop() {
    {
      std::lock_guard<std::mutex> l(m_);
      stopping_ = true;
      tasks_.clear();
      cv_.notify_all();
    }
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [&] { return stopping_ || !tasks_.empty(); });
        if (stopping_) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

struct HttpServer::Impl {
  ServerCore core;
  net::io_context io{1};
  tcp::acceptor acceptor{io};
  net::steady_timer retry_timer{io};
  std::thread io_thread;
  HandlerPool handlers;
  bool started = false;

  void accept() {
    acceptor.async_accept(net::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
      if (core.stopping) return;
      if (!ec) return admit(std::move(socket)), accept();
      // Out of descriptors (or another failure of this one accept): try again shortly rather
      // than spin on an error that repeats until a connection closes.
      retry_timer.expires_after(std::chrono::milliseconds(50));
      retry_timer.async_wait([this](beast::error_code e) {
        if (!e && !core.stopping) accept();
      });
    });
  }

  // Registers a new connection; at the bound, drops the one Connection::evictable ranks first
  // (closing, then the one waiting longest for its request to arrive), or refuses the new one
  // with 503 when every connection has a request in hand.
  void admit(tcp::socket socket) {
    std::shared_ptr<Connection> oldest;
    size_t live = 0;
    {
      std::lock_guard<std::mutex> l(core.connections_m);
      int oldest_rank = 2;
      Clock::time_point oldest_since = Clock::time_point::max();
      for (auto it = core.connections.begin(); it != core.connections.end();) {
        auto c = it->lock();
        if (!c) {
          it = core.connections.erase(it);
          continue;
        }
        live++;
        int rank;
        Clock::time_point since;
        if (c->evictable(rank, since) && (rank < oldest_rank || (rank == oldest_rank && since < oldest_since))) {
          oldest_rank = rank;
          oldest_since = since;
          oldest = c;
        }
        ++it;
      }
    }
    if ((int)live >= core.limits.max_connections) {
      if (!oldest) {
        static const std::string kBusy =
            "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        beast::error_code ec;
        socket.non_blocking(true, ec);
        socket.write_some(net::buffer(kBusy), ec);  // a fresh socket's buffer takes it at once
        socket.close(ec);
        return;
      }
      net::post(oldest->get_executor(), [oldest] { oldest->close(); });
    }
    auto conn = std::make_shared<Connection>(std::move(socket), core);
    {
      std::lock_guard<std::mutex> l(core.connections_m);
      core.connections.push_back(conn);
    }
    net::post(conn->get_executor(), [conn] { conn->start(); });
  }

  std::vector<std::shared_ptr<Connection>> live_connections() {
    std::vector<std::shared_ptr<Connection>> out;
    std::lock_guard<std::mutex> l(core.connections_m);
    for (auto& w : core.connections)
      if (auto c = w.lock()) out.push_back(std::move(c));
    return out;
  }
};

HttpServer::HttpServer(Limits limits) : impl_(std::make_unique<Impl>()) {
  if (limits.max_connections < 1) fail("the connection limit must be at least 1, got {}", limits.max_connections);
  if (limits.handler_threads < 1) fail("the handler thread count must be at least 1, got {}", limits.handler_threads);
  impl_->core.limits = limits;
  impl_->core.run_on_handler_thread = [this](std::function<void()> task) { impl_->handlers.post(std::move(task)); };
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::route(const std::string& method, const std::string& path, Handler handler) {
  impl_->core.routes.push_back({method, path, std::move(handler)});
}

void HttpServer::set_admission(Admission admission) { impl_->core.admission = std::move(admission); }
void HttpServer::set_error_handler(Handler handler) { impl_->core.error_handler = std::move(handler); }

int HttpServer::bind(const std::string& host, int port) {
  Impl& s = *impl_;
  beast::error_code ec;
  tcp::resolver resolver(s.io);
  const auto found = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || found.empty()) fail("cannot bind to {}:{}: the address does not resolve ({})", host, port, ec.message());
  const tcp::endpoint endpoint = found.begin()->endpoint();
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail("cannot bind to {}:{} ({})", host, port, ec.message());
  return s.acceptor.local_endpoint().port();
}

void HttpServer::start() {
  Impl& s = *impl_;
  s.started = true;
  s.handlers.start(s.core.limits.handler_threads);
  s.accept();
  s.io_thread = std::thread([&s] { s.io.run(); });
}

void HttpServer::stop() {
  Impl& s = *impl_;
  if (s.core.stopping.exchange(true)) return;
  // Close the listener and every connection on the I/O thread, then let it finish.
  net::post(s.io, [&s] {
    beast::error_code ec;
    s.acceptor.close(ec);
    s.retry_timer.cancel();
    for (auto& c : s.live_connections())
      if (!c->handling()) net::post(c->get_executor(), [c] { c->close(); });
  });
  if (s.started) {
    // Handlers see `stopping` in their writes and return; then nothing is left for the I/O thread.
    s.handlers.stop();
    for (auto& c : s.live_connections()) net::post(c->get_executor(), [c] { c->close(); });
    s.io.stop();
    if (s.io_thread.joinable()) s.io_thread.join();
  }
  std::lock_guard<std::mutex> l(s.core.connections_m);
  s.core.connections.clear();
}

}  // namespace rl::http
