#include "server/http_parse.h"

#include <algorithm>
#include <cctype>

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>

namespace rl::http {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;

namespace {

// "gzip, chunked" ends in chunked; "chunked, gzip" or "gzip" do not.
bool chunked_is_last_coding(std::string_view te) {
  while (!te.empty() && (te.back() == ' ' || te.back() == '\t')) te.remove_suffix(1);
  const size_t comma = te.rfind(',');
  std::string_view last = comma == std::string_view::npos ? te : te.substr(comma + 1);
  while (!last.empty() && (last.front() == ' ' || last.front() == '\t')) last.remove_prefix(1);
  return iequals(last, "chunked");
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower((unsigned char)x) == std::tolower((unsigned char)y);
         });
}

std::string header_value(const Headers& headers, std::string_view name) {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

bool has_header(const Headers& headers, std::string_view name) {
  return std::any_of(headers.begin(), headers.end(), [&](const auto& kv) { return iequals(kv.first, name); });
}

void configure(RequestParser& parser, const Limits& limits) {
  parser.header_limit((uint32_t)std::min<size_t>(limits.max_header_bytes, UINT32_MAX));
  parser.body_limit(limits.max_body_bytes);
}

int read_error_status(const boost::beast::error_code& ec, const RequestParser& parser) {
  if (ec == bhttp::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
      ec == net::error::operation_aborted || ec == net::error::bad_descriptor)
    return 0;
  if (ec == boost::beast::error::timeout) return 408;
  // A request line that never ended is told apart from a header flood: the parser has no target yet.
  if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow)
    return parser.get().target().empty() ? 414 : 431;
  if (ec == bhttp::error::body_limit) return 413;  // chunked past the limit, or a Content-Length seen in the header
  return 400;
}

Request request_head(const RequestParser& parser) {
  const auto& h = parser.get();
  Request req;
  req.method = std::string(h.method_string());
  req.target = std::string(h.target());
  req.path = req.target.substr(0, req.target.find('?'));
  for (const auto& f : h) req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  return req;
}

bool has_body(const RequestParser& parser) {
  return parser.chunked() || (parser.content_length() && *parser.content_length() > 0);
}

int framing_refusal(const Request& head, const RequestParser& parser, const Limits& limits) {
  const unsigned version = parser.get().version();
  if (head.method.size() + head.target.size() + 10 > limits.max_request_line) return 414;
  if (head.headers.size() > limits.max_header_count) return 431;
  if (version == 11 && !has_header(head.headers, "Host")) return 400;
  // RFC 9112 6.1: a Transfer-Encoding that does not end in chunked leaves the length unknown, and
  // one beside a Content-Length is a smuggling attempt. The parser must also have taken the body
  // as chunked: a coding list it could not read ("g:ip, chunked") leaves it reading by
  // Content-Length, or not at all (found by fuzz_http_request).
  if (has_header(head.headers, "Transfer-Encoding") &&
      (version < 11 || !parser.chunked() || has_header(head.headers, "Content-Length") ||
       !chunked_is_last_coding(header_value(head.headers, "Transfer-Encoding"))))
    return 400;
  if (parser.content_length() && *parser.content_length() > limits.max_body_bytes) return 413;
  return 0;
}

}  // namespace rl::http
