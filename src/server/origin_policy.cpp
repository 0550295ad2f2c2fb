#include "server/origin_policy.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "common/error.h"

namespace rl {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return (char)std::tolower(c); });
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// scheme://host[:port], nothing after it (an origin has no path).
bool is_origin(std::string_view o) {
  const size_t sep = o.find("://");
  if (sep == std::string_view::npos || sep == 0) return false;
  const std::string_view rest = o.substr(sep + 3);
  return !rest.empty() && rest.find_first_of("/?#@ ") == std::string_view::npos;
}

}  // namespace

OriginPolicy OriginPolicy::parse(std::string_view list) {
  OriginPolicy p;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view entry = trim(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (entry.empty()) continue;
    if (entry == "*") {
      p.any_ = true;
      continue;
    }
    if (!is_origin(entry))
      fail("--allowed-origins: '{}' is not an origin (scheme://host[:port], e.g. http://localhost:3000)", entry);
    p.origins_.push_back(lower(entry));
  }
  return p;
}

bool OriginPolicy::allows(std::string_view origin) const {
  if (origin.empty() || origin == "null") return false;  // "null": sandboxed pages and files
  if (any_) return true;
  const std::string o = lower(origin);
  return std::find(origins_.begin(), origins_.end(), o) != origins_.end();
}

std::optional<OriginPolicy::Refusal> OriginPolicy::check(const http::Request& req, http::Response& preflight) const {
  const bool has_origin = req.has_header("Origin");
  const std::string origin = req.get_header_value("Origin");
  if (has_origin && !allows(origin))
    return Refusal{403, fmt::format("requests from origin '{}' are not allowed; start the server with "
                                    "--allowed-origins to allow a web page to call it",
                                    origin)};
  if (req.method == "OPTIONS") {
    if (!has_origin) return Refusal{405, fmt::format("method OPTIONS is not allowed on {} without an Origin", req.path)};
    preflight.status = 204;
    add_cors_headers(req, preflight);
    preflight.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    preflight.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
    preflight.set_header("Access-Control-Max-Age", "600");
    return Refusal{204, ""};
  }
  // A form or text/plain POST is what a page may send without a preflight: never run it.
  if (req.method == "POST" && !is_json_content_type(req.get_header_value("Content-Type")))
    return Refusal{415, fmt::format("a POST body must be JSON: send 'Content-Type: application/json' (got '{}')",
                                    req.get_header_value("Content-Type"))};
  return std::nullopt;
}

void OriginPolicy::add_cors_headers(const http::Request& req, http::Response& res) const {
  const std::string origin = req.get_header_value("Origin");
  if (!allows(origin)) return;
  res.set_header("Access-Control-Allow-Origin", origin);
  res.set_header("Vary", "Origin");
}

bool is_json_content_type(std::string_view content_type) {
  std::string t = lower(trim(content_type.substr(0, content_type.find(';'))));
  if (t == "application/json") return true;
  return t.rfind("application/", 0) == 0 && t.size() > 17 && t.compare(t.size() - 5, 5, "+json") == 0;
}

}  // namespace rl
