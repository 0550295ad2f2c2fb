// Which browser pages may call the server. A web page the user opens can send requests to a
// loopback server; the browser marks them with `Origin`, and only "simple" requests (a form or
// text/plain body) skip the CORS preflight. So: POST bodies must be declared JSON (which forces a
// preflight), a request with an Origin not in --allowed-origins is refused before its body is
// read, and a preflight is answered only for an allowed origin.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/http_types.h"

namespace rl {

class OriginPolicy {
 public:
  OriginPolicy() = default;  // no origin allowed
  // A comma-separated list of origins ("https://app.example", "http://localhost:3000") or "*".
  // Throws rl::Error naming an entry that is not scheme://host[:port].
  static OriginPolicy parse(std::string_view list);

  bool allows(std::string_view origin) const;

  struct Refusal {
    int status;
    std::string message;
  };
  // The decision for a request's line and header: nullopt lets it through; a refusal names why.
  // A preflight (OPTIONS with an allowed Origin) is answered in `preflight` (status 204 and the
  // CORS headers) and also stops the request here.
  std::optional<Refusal> check(const http::Request& req, http::Response& preflight) const;

  // CORS headers for the answer to an admitted request that carried an allowed Origin.
  void add_cors_headers(const http::Request& req, http::Response& res) const;

 private:
  bool any_ = false;
  std::vector<std::string> origins_;
};

// application/json or application/*+json, with any parameters (charset).
bool is_json_content_type(std::string_view content_type);

}  // namespace rl
