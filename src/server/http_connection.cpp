#include "server/http_connection.h"

#include <sys/socket.h>

#include <cerrno>
#include <future>

#include <fmt/format.h>

namespace rl::http {

namespace bhttp = beast::http;

namespace {

auto seconds(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }

int64_t now_ns() { return Clock::now().time_since_epoch().count(); }

// How often a handler thread waiting for a write checks whether the server is stopping.
constexpr auto kStopPoll = std::chrono::milliseconds(100);
// What a connection closed after an answer still reads and drops, at most (see linger()).
constexpr double kLingerSeconds = 1.0;
constexpr size_t kLingerBytes = 1 << 20;

}  // namespace

Connection::Connection(tcp::socket socket, ServerCore& core)
    : core_(core), stream_(std::move(socket)), fd_(stream_.socket().native_handle()),
      // The buffer holds one header section (and what a pipelining client sent after it).
      buffer_(2 * core.limits.max_header_bytes + 4096) {}

void Connection::start() { wait_for_request(core_.limits.header_timeout_s); }

void Connection::close() {
  state_ = State::Closed;
  beast::error_code ec;
  socket().shutdown(tcp::socket::shutdown_both, ec);
  socket().close(ec);
}

bool Connection::evictable(int& rank, Clock::time_point& since) const {
  const State s = state_;
  if (s == State::Closing) rank = 0;
  else if (s == State::Idle || s == State::Header || s == State::Body) rank = 1;
  else return false;
  since = Clock::time_point(Clock::duration(waiting_since_ns_.load()));
  return true;
}

// Waits for the first byte of the next request, so that the header deadline starts with it and an
// idle kept-alive connection has its own (shorter) timeout.
void Connection::wait_for_request(double timeout_s) {
  state_ = State::Idle;
  waiting_since_ns_ = now_ns();
  if (buffer_.size() > 0) return read_header();
  stream_.expires_after(seconds(timeout_s));
  auto self = shared_from_this();
  stream_.async_read_some(buffer_.prepare(4096), [self](beast::error_code ec, size_t n) {
    if (ec || self->core_.stopping) return self->close();
    self->buffer_.commit(n);
    self->read_header();
  });
}

void Connection::read_header() {
  state_ = State::Header;
  head_ = Request{};
  parser_.emplace();
  configure(*parser_, core_.limits);
  stream_.expires_after(seconds(core_.limits.header_timeout_s));
  auto self = shared_from_this();
  bhttp::async_read_header(stream_, buffer_, *parser_, [self](beast::error_code ec, size_t) { self->on_header(ec); });
}

// After a read of the header or the body: true when it succeeded; else the connection is closed
// or the error answered (and then closed).
bool Connection::read_succeeded(const beast::error_code& ec) {
  if (core_.stopping) return close(), false;
  if (!ec) return true;
  const int status = read_error_status(ec, *parser_);
  if (status == 0) close();
  else refuse(status, false, ec.message());
  return false;
}

void Connection::on_header(beast::error_code ec) {
  if (!read_succeeded(ec)) return;
  http10_ = parser_->get().version() < 11;
  head_ = request_head(*parser_);
  if (check_header(head_)) read_body();
}

// The checks made before the body is read; false when the request was refused.
bool Connection::check_header(Request& req) {
  const bool body = has_body(*parser_);
  if (const int status = framing_refusal(req, *parser_, core_.limits)) return refuse(status, false), false;
  Response res;
  if (core_.admission && !core_.admission(req, res)) return refuse(std::move(res), !body), false;
  bool path_known = false;
  if (!core_.find_route(req.method, req.path, path_known)) return refuse(path_known ? 405 : 404, !body), false;
  if (iequals(header_value(req.headers, "Expect"), "100-continue") && body) {
    // Sent only now: a client that waits for it uploads nothing the server would refuse.
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    beast::error_code ec;
    net::write(socket(), net::buffer(kContinue), ec);
    if (ec) return close(), false;
  }
  return true;
}

void Connection::read_body() {
  state_ = State::Body;
  stream_.expires_after(seconds(core_.limits.body_timeout_s));
  auto self = shared_from_this();
  bhttp::async_read(stream_, buffer_, *parser_, [self](beast::error_code ec, size_t) { self->on_body(ec); });
}

void Connection::on_body(beast::error_code ec) {
  if (!read_succeeded(ec)) return;
  auto req = std::make_shared<Request>(std::move(head_));
  req->body = std::move(parser_->get().body());
  const bool keep_alive = parser_->keep_alive();
  parser_.reset();
  state_ = State::Handling;
  auto self = shared_from_this();
  req->client_gone_check = [self] { return self->peer_closed(); };
  core_.run_on_handler_thread([self, req, keep_alive] {
    Response res;
    try {
      bool path_known = false;
      const Route* route = self->core_.find_route(req->method, req->path, path_known);  // found before the body
      route->handler(*req, res);
    } catch (const std::exception&) {
      res = Response{};
      res.status = 500;
    }
    if (res.status >= 400 && res.body.empty() && !res.provider && self->core_.error_handler)
      self->core_.error_handler(*req, res);
    req->client_gone_check = nullptr;  // the request must not keep its connection alive
    if (res.provider) return self->stream(res), void();
    std::string bytes = response_head(res, res.body.size(), keep_alive, self->http10_) + res.body;
    net::post(self->stream_.get_executor(),
              [self, bytes = std::move(bytes), keep_alive]() mutable { self->write_then_continue(std::move(bytes), keep_alive); });
  });
}

// Streams a response through chunks written from the handler thread; HTTP/1.0 clients get the
// bytes as they are and the connection closed at the end.
void Connection::stream(const Response& res) {
  struct ChunkSink : DataSink {
    Connection& c;
    bool ok = true, finished = false;
    size_t written = 0;
    explicit ChunkSink(Connection& conn) : c(conn) {}
    bool write(const char* data, size_t size) override {
      if (!ok || finished) return false;
      if (size == 0) return true;  // an empty chunk would end the body
      std::string frame = c.http10_ ? std::string(data, size) : fmt::format("{:x}\r\n", size) + std::string(data, size) + "\r\n";
      ok = c.write_blocking(std::move(frame));
      written += size;
      return ok;
    }
    void done() override {
      if (!ok || finished) return;
      finished = true;
      if (!c.http10_) ok = c.write_blocking("0\r\n\r\n");
    }
  };
  state_ = State::Writing;
  const bool keep_alive = !http10_;
  ChunkSink sink(*this);
  if (write_blocking(response_head(res, std::nullopt, keep_alive, http10_))) {
    try {
      while (sink.ok && !sink.finished && res.provider(sink.written, sink)) {
      }
    } catch (const std::exception&) {
      sink.ok = false;  // the body is cut short: the connection cannot be reused
    }
  } else {
    sink.ok = false;
  }
  const bool reuse = keep_alive && sink.ok && sink.finished;
  auto self = shared_from_this();
  net::post(stream_.get_executor(), [self, reuse] { self->after_response(reuse); });
}

void Connection::refuse(int status, bool keep_alive, std::string detail) {
  Response res;
  res.status = status;
  res.error_detail = std::move(detail);
  refuse(std::move(res), keep_alive);
}

void Connection::refuse(Response res, bool keep_alive) {
  if (res.status >= 400 && res.body.empty() && core_.error_handler) core_.error_handler(head_, res);
  parser_.reset();
  if (!keep_alive) buffer_.consume(buffer_.size());  // what follows a refused header is not read
  write_then_continue(response_head(res, res.body.size(), keep_alive, http10_) + res.body, keep_alive);
}

void Connection::write_then_continue(std::string bytes, bool keep_alive) {
  state_ = State::Writing;
  auto data = std::make_shared<std::string>(std::move(bytes));
  stream_.expires_after(seconds(core_.limits.write_timeout_s));
  auto self = shared_from_this();
  net::async_write(stream_, net::buffer(*data), [self, data, keep_alive](beast::error_code ec, size_t) {
    self->after_response(keep_alive && !ec);
  });
}

bool Connection::write_blocking(std::string bytes) {
  auto data = std::make_shared<std::string>(std::move(bytes));
  auto result = std::make_shared<std::promise<bool>>();
  std::future<bool> written = result->get_future();
  auto self = shared_from_this();
  net::post(stream_.get_executor(), [self, data, result] {
    self->stream_.expires_after(seconds(self->core_.limits.write_timeout_s));
    net::async_write(self->stream_, net::buffer(*data),
                     [self, data, result](beast::error_code ec, size_t) { result->set_value(!ec); });
  });
  while (written.wait_for(kStopPoll) != std::future_status::ready)
    if (core_.stopping) return false;
  try {
    return written.get();
  } catch (const std::future_error&) {  // the I/O thread stopped before writing
    return false;
  }
}

void Connection::after_response(bool keep_alive) {
  if (core_.stopping) return close();
  if (!keep_alive) return linger();
  wait_for_request(core_.limits.idle_timeout_s);
}

// Closing a socket with unread data resets the connection, and the client may lose the answer
// before reading it. So: end the sending side, then read and drop what the client still sends,
// for at most kLingerSeconds and kLingerBytes, then close.
void Connection::linger() {
  state_ = State::Closing;
  waiting_since_ns_ = now_ns();
  beast::error_code ec;
  socket().shutdown(tcp::socket::shutdown_send, ec);
  if (ec) return close();
  buffer_.consume(buffer_.size());
  stream_.expires_after(seconds(kLingerSeconds));
  auto self = shared_from_this();
  auto drained = std::make_shared<size_t>(0);
  auto drain = std::make_shared<std::function<void()>>();
  *drain = [self, drained, drain] {
    self->stream_.async_read_some(self->buffer_.prepare(16384), [self, drained, drain](beast::error_code e, size_t n) {
      *drained += n;
      if (e || *drained > kLingerBytes || self->core_.stopping) {
        *drain = nullptr;  // breaks the cycle through the closure
        return self->close();
      }
      self->buffer_.consume(self->buffer_.size());
      (*drain)();
    });
  };
  (*drain)();
}

// A client that closed its end reads as end of file; one that reset the connection as an error.
// Pipelined bytes waiting in the socket read as data: the client is still there.
bool Connection::peer_closed() const {
  char c;
  const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  return false;
}

}  // namespace rl::http
