// The HTTP request and response the server's endpoints see, independent of the transport that
// parses and writes them (src/server/http_server.h). A response is either a whole body or a
// content provider that streams chunks (server-sent events) through a DataSink.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rl::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

// The first value of header `name` (case-insensitive), or "" when it is absent.
std::string header_value(const Headers& headers, std::string_view name);
bool has_header(const Headers& headers, std::string_view name);

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent, with the query
  std::string path;    // the target without its query
  Headers headers;
  std::string body;
  // Says, without reading its data, whether the client has closed the connection; set by the
  // transport while the request is being handled.
  std::function<bool()> client_gone_check;

  std::string get_header_value(std::string_view name) const { return header_value(headers, name); }
  bool has_header(std::string_view name) const { return http::has_header(headers, name); }
  bool client_gone() const { return client_gone_check && client_gone_check(); }
};

// Where a streaming response writes its chunks. write() blocks until the bytes are handed to the
// socket and returns false once the client is gone (or too slow to take them); done() ends the body.
class DataSink {
 public:
  virtual ~DataSink() = default;
  virtual bool write(const char* data, size_t size) = 0;
  virtual void done() = 0;
};

// Called until it calls sink.done() or returns false (which drops the connection).
using ContentProvider = std::function<bool(size_t offset, DataSink& sink)>;

struct Response {
  int status = 200;
  Headers headers;
  std::string body;
  std::string content_type;
  ContentProvider provider;  // set: the body is streamed with chunked transfer coding
  std::string error_detail;  // for the transport's own refusals: what it found wrong

  void set_header(std::string name, std::string value) { headers.emplace_back(std::move(name), std::move(value)); }
  std::string get_header_value(std::string_view name) const { return header_value(headers, name); }
  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
  void set_chunked_content_provider(std::string type, ContentProvider p) {
    content_type = std::move(type);
    provider = std::move(p);
  }
};

using Handler = std::function<void(const Request&, Response&)>;

}  // namespace rl::http
