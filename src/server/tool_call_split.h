// Streams the content of a reply to a request that carries tools. The reply may contain
// <tool_call> blocks, which become tool_calls only once parsed at the end; the text before the
// first block streams as it is generated. What is held back: from the first "<tool_call>" on, a
// tail that may be the start of that marker, and trailing whitespace (which parse_tool_calls trims
// when a call follows). So the streamed text plus the parsed held tail is exactly the content of
// the whole reply parsed at once: concat(push(...)) + parse_tool_calls(finish()).content ==
// parse_tool_calls(everything).content, and the calls are the same.
#pragma once
#include <string>
#include <string_view>
#include <utility>

#include "common/format.h"

namespace rl {

class ToolCallSplitter {
 public:
  // active: the request has tools. Inactive, every piece is final, unchanged.
  explicit ToolCallSplitter(bool active) : active_(active) {}

  // Appends content; returns the text that became final.
  std::string push(std::string_view text) {
    if (!active_) return std::string(text);
    held_ += text;
    if (in_call_) return {};
    size_t end = held_.size();
    if (size_t p = held_.find(kOpen); p != std::string::npos) {
      in_call_ = true;
      end = p;
    } else {
      end -= marker_prefix_tail(held_, kOpen);  // a tail that may be the start of the marker
    }
    while (end > 0 && is_space(held_[end - 1])) --end;
    std::string out = held_.substr(0, end);
    held_.erase(0, end);
    return out;
  }

  // At the end of generation: the held tail, for parse_tool_calls.
  std::string finish() { return std::exchange(held_, std::string()); }

 private:
  static constexpr std::string_view kOpen = "<tool_call>";
  // The whitespace parse_tool_calls trims (Python's str.isspace on ASCII).
  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

  bool active_;
  bool in_call_ = false;
  std::string held_;
};

}  // namespace rl
