// The one nesting limit for JSON that comes from outside (request bodies, strings in them that
// are parsed as JSON later such as tool-call arguments, and tool calls parsed from model output).
// nlohmann's parser is iterative, but serialising (dump, tojson) and the chat templates recurse:
// a value parsed within this limit is safe to walk recursively.
#pragma once
#include <optional>
#include <stdexcept>
#include <string_view>

#include <nlohmann/json.hpp>

namespace rl {

constexpr int kMaxJsonDepth = 64;

// Parses `text` as JSON no deeper than kMaxJsonDepth. Throws Json::parse_error for invalid JSON
// and TooDeepJson for a value nested deeper than the limit.
struct TooDeepJson : std::runtime_error {
  TooDeepJson() : std::runtime_error("JSON nests deeper than the limit") {}
};

template <class Json>
Json parse_json_bounded(std::string_view text) {
  return Json::parse(text, [](int depth, typename Json::parse_event_t, Json&) {
    if (depth > kMaxJsonDepth) throw TooDeepJson();
    return true;
  });
}

// The same, for text that may be anything (model output): nullopt when it is not JSON or too deep.
template <class Json>
std::optional<Json> try_parse_json_bounded(std::string_view text) {
  try {
    return parse_json_bounded<Json>(text);
  } catch (const TooDeepJson&) {
    return std::nullopt;
  } catch (const typename Json::exception&) {
    return std::nullopt;
  }
}

}  // namespace rl
