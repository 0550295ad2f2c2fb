// An HTTP/1.1 server (Boost.Beast over Boost.Asio) that a client cannot exhaust: every limit is
// enforced while the request is read, before the server holds more than the limit.
//
// - One I/O thread reads and writes every connection asynchronously, so a slow client costs a
//   socket and a buffer, never a thread. Complete requests go to a fixed pool of handler threads.
// - Limits: request line, header section (bytes and field count), body (Content-Length checked
//   before reading, chunked bodies counted as they arrive), a deadline for the whole header
//   section, one for the body, an idle timeout between requests, a timeout for each write, and a
//   bound on open connections. At the bound, the connection that has waited longest for its
//   request (header and body) to arrive is dropped to make room, so trickling clients cannot lock
//   others out.
// - Framing (RFC 9112): Content-Length with Transfer-Encoding, differing or invalid
//   Content-Length values, and a Transfer-Encoding that does not end in chunked are answered
//   400 and the connection closed; pipelined requests are answered one at a time, in order;
//   `Expect: 100-continue` gets 100 only when the request passed every check (413 otherwise).
// - Before the body is read, the request line and header go through the admission check (origin,
//   content type, API key) and the route table (404/405), so a refused client uploads no body.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "server/http_types.h"

namespace rl::http {

struct Limits {
  size_t max_request_line = 8 << 10;   // bytes of "METHOD TARGET HTTP/1.1"; past it: 414
  size_t max_header_bytes = 64 << 10;  // request line and fields together; past it: 431
  size_t max_header_count = 100;       // fields; past it: 431
  size_t max_body_bytes = 8 << 20;     // chunked or not; past it: 413
  double header_timeout_s = 10;        // from the first byte to the end of the header section
  double body_timeout_s = 60;          // for the whole body
  double idle_timeout_s = 5;           // between requests on a kept-alive connection
  double write_timeout_s = 30;         // for each write to the client
  int max_connections = 512;
  int handler_threads = 16;
};

// Called with the request line and header (the body is not read yet). Returning false sends
// `res` and closes the connection; returning true reads the body and runs the route's handler.
using Admission = std::function<bool(const Request&, Response&)>;

class HttpServer {
 public:
  explicit HttpServer(Limits limits);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void route(const std::string& method, const std::string& path, Handler handler);
  void set_admission(Admission admission);
  // Fills the body of the transport's own refusals (400, 404, 405, 408, 413, 414, 431): called
  // with the status (and Response::error_detail) set and the body empty.
  void set_error_handler(Handler handler);

  // Binds and listens (port 0: any free port); returns the bound port. Throws rl::Error naming
  // host:port when it cannot.
  int bind(const std::string& host, int port);
  // Starts the I/O and handler threads; returns at once.
  void start();
  // Closes the listener and every connection; waits for the threads. Handlers still running are
  // waited for: the caller makes them return (their writes fail once stopped).
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace rl::http
