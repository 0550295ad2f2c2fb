// Internal to the HTTP layer: reading a request's line and header with the layer's limits and
// the checks made on them before the body is read. The connection (http_connection.cpp) and the
// fuzz target (tests/fuzz/fuzz_http_request.cpp) both go through these.
#pragma once
#include <string>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio/error.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "server/http_server.h"

namespace rl::http {

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// ASCII case-insensitive equality (header names and tokens).
bool iequals(std::string_view a, std::string_view b);

// Sets the header and body limits of a fresh parser.
void configure(RequestParser& parser, const Limits& limits);

// The status that answers a read error of the request line, header or body (0: the client is
// gone or the server stops; close without an answer).
int read_error_status(const boost::beast::error_code& ec, const RequestParser& parser);

// The request line and header as the endpoints see them.
Request request_head(const RequestParser& parser);

bool has_body(const RequestParser& parser);

// The limit and framing checks on a complete header (RFC 9112), before admission: 0 when the
// request may go on, else the status that refuses it (the connection is then closed).
int framing_refusal(const Request& head, const RequestParser& parser, const Limits& limits);

}  // namespace rl::http
