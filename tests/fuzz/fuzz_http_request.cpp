// libFuzzer target over the HTTP layer's request reading (src/server/http_parse.h): the input is
// one client's byte stream, delivered a few bytes at a time (the first input byte sets how many),
// read as pipelined requests with Beast's reader and the server's limits and framing checks, as
// the connection does. Every outcome must be a refusal with one of the layer's statuses or a
// request within every limit; a broken limit, any other exception or a sanitizer report is a
// finding.
#include <cstdio>
#include <cstdlib>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>

#include "server/http_parse.h"

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;

// A SyncReadStream over the input that hands out at most `step` bytes a read.
struct TrickleStream {
  std::string_view data;
  size_t step;
  template <class Buffers>
  size_t read_some(const Buffers& buffers, beast::error_code& ec) {
    if (data.empty()) {
      ec = net::error::eof;
      return 0;
    }
    const size_t n = net::buffer_copy(buffers, net::buffer(data.data(), std::min(step, data.size())));
    data.remove_prefix(n);
    ec = {};
    return n;
  }
  template <class Buffers>
  size_t read_some(const Buffers& buffers) {
    beast::error_code ec;
    const size_t n = read_some(buffers, ec);
    if (ec) throw beast::system_error(ec);
    return n;
  }
};

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "HTTP request reading broke a promise: %s\n", what);
  std::abort();
}

void expect_status(int status, std::initializer_list<int> allowed) {
  for (int s : allowed)
    if (s == status) return;
  std::fprintf(stderr, "unexpected status %d\n", status);
  finding("a refusal with a status the layer does not give");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  rl::http::Limits limits;  // small, so the fuzzer reaches every limit
  limits.max_request_line = 256;
  limits.max_header_bytes = 1024;
  limits.max_header_count = 16;
  limits.max_body_bytes = 1024;
  TrickleStream stream{std::string_view((const char*)data + 1, size - 1), 1 + (size_t)data[0] % 64};
  beast::flat_buffer buffer(2 * limits.max_header_bytes + 4096);  // as the connection sizes it
  for (int request = 0; request < 16; request++) {
    rl::http::RequestParser parser;
    rl::http::configure(parser, limits);
    beast::error_code ec;
    beast::http::read_header(stream, buffer, parser, ec);
    if (ec) {
      expect_status(rl::http::read_error_status(ec, parser), {0, 400, 413, 414, 431});
      return 0;
    }
    const rl::http::Request head = rl::http::request_head(parser);
    if (const int status = rl::http::framing_refusal(head, parser, limits)) {
      expect_status(status, {400, 413, 414, 431});
      return 0;
    }
    if (head.headers.size() > limits.max_header_count) finding("too many header fields admitted");
    if (head.method.size() + head.target.size() + 10 > limits.max_request_line) finding("request line past its limit");
    if (parser.content_length() && *parser.content_length() > limits.max_body_bytes) finding("Content-Length past the limit");
    if (rl::http::has_header(head.headers, "Transfer-Encoding") && rl::http::has_header(head.headers, "Content-Length"))
      finding("Content-Length with Transfer-Encoding admitted");
    if (parser.get().version() == 11 && !rl::http::has_header(head.headers, "Host")) finding("HTTP/1.1 without Host");
    beast::http::read(stream, buffer, parser, ec);
    if (ec) {
      expect_status(rl::http::read_error_status(ec, parser), {0, 400, 413});
      return 0;
    }
    if (parser.get().body().size() > limits.max_body_bytes) finding("a body past the limit");
    if (buffer.size() > buffer.max_size()) finding("the read buffer past its bound");
    if (!parser.keep_alive()) return 0;
  }
  return 0;
}
