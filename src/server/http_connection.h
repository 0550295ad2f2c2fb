// Internal to the HTTP layer (http_server.cpp, http_connection.cpp): one client connection and
// what all connections share. See http_server.h for the behaviour.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "server/http_parse.h"
#include "server/http_server.h"

namespace rl::http {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

class Connection;


struct Route {
  std::string method;
  std::string path;
  Handler handler;
};

// What every connection shares: limits, routes, checks, the handler pool and the registry that
// bounds the number of connections.
struct ServerCore {
  Limits limits;
  std::vector<Route> routes;
  Admission admission;
  Handler error_handler;
  std::function<void(std::function<void()>)> run_on_handler_thread;
  std::atomic<bool> stopping{false};

  std::mutex connections_m;
  std::list<std::weak_ptr<Connection>> connections;  // pruned of dead entries on every accept

  // The route for method and path; nullptr with `path_known` telling 404 from 405.
  const Route* find_route(const std::string& method, const std::string& path, bool& path_known) const;
};

// "HTTP/1.1 STATUS REASON" and the header fields of `res` (with Content-Length when `length` is
// given, chunked transfer coding otherwise), ending with the blank line.
std::string response_head(const Response& res, std::optional<size_t> length, bool keep_alive, bool http10);

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, ServerCore& core);

  void start();
  // Closes the socket; pending operations end with an error. Call on the I/O thread.
  void close();
  // Whether the connection may be dropped to make room for a new one, and in which order: a
  // closing one first (rank 0), then one that waits for its next request or reads its header or
  // body (1), within a rank the one that has waited longest for its request (`since`: a fresh
  // connection is the last to go). One whose request is being handled or answered is never dropped.
  bool evictable(int& rank, Clock::time_point& since) const;
  bool handling() const { return state_ == State::Handling || state_ == State::Writing; }
  net::any_io_executor get_executor() { return stream_.get_executor(); }

 private:
  enum class State { Idle, Header, Body, Handling, Writing, Closing, Closed };

  void wait_for_request(double timeout_s);
  void read_header();
  bool read_succeeded(const beast::error_code& ec);
  void on_header(beast::error_code ec);
  bool check_header(Request& req);
  void read_body();
  void on_body(beast::error_code ec);
  void handle(std::shared_ptr<Request> req);  // on a handler thread
  void stream(const Response& res);           // on a handler thread
  // A refusal by the transport or the admission check; the connection is kept only when no body
  // is left unread.
  void refuse(Response res, bool keep_alive);
  void refuse(int status, bool keep_alive, std::string detail = {});
  void write_then_continue(std::string bytes, bool keep_alive);  // on the I/O thread
  bool write_blocking(std::string bytes);                       // from a handler thread
  void after_response(bool keep_alive);
  void linger();
  bool peer_closed() const;

  tcp::socket& socket() { return stream_.socket(); }

  ServerCore& core_;
  beast::tcp_stream stream_;
  int fd_;
  beast::flat_buffer buffer_;
  std::optional<RequestParser> parser_;
  Request head_;  // the request line and header of the request being read
  bool http10_ = false;
  std::atomic<State> state_{State::Idle};
  std::atomic<int64_t> waiting_since_ns_{0};
};

}  // namespace rl::http
