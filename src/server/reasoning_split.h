// Splits a Thinking model's reply into reasoning (the text before </think>) and content, piece by
// piece, so that streamed deltas and the whole message are cut at exactly the same place.
#pragma once
#include <string>
#include <string_view>
#include <utility>

#include "common/format.h"

namespace rl {

class ReasoningSplitter {
 public:
  // active: the generation prompt opened a <think> block, so the reply starts as reasoning.
  // Inactive, every piece is content, unchanged.
  explicit ReasoningSplitter(bool active) : in_reasoning_(active) {}

  // Appends generated text; returns the (reasoning, content) that became final.
  std::pair<std::string, std::string> push(std::string_view text) {
    if (!in_reasoning_) return {std::string(), strip_leading(std::string(text))};
    held_ += text;
    if (size_t p = held_.find(kEnd); p != std::string::npos) {
      std::string reasoning = held_.substr(0, p);
      std::string rest = held_.substr(p + kEnd.size());
      held_.clear();
      in_reasoning_ = false;
      strip_pending_ = true;
      return {std::move(reasoning), strip_leading(std::move(rest))};
    }
    // Hold back a tail that may be the start of </think>.
    const size_t keep = marker_prefix_tail(held_, kEnd);
    std::string reasoning = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return {std::move(reasoning), std::string()};
  }

  // At the end of generation: reasoning held back as a possible </think> prefix.
  std::string flush_reasoning() {
    std::string r;
    r.swap(held_);
    return r;
  }

 private:
  static constexpr std::string_view kEnd = "</think>";

  // The template separates </think> from the answer with blank lines: drop them, once, right after
  // the reasoning ends (never in a reply that had no reasoning).
  std::string strip_leading(std::string s) {
    if (!strip_pending_) return s;
    size_t i = s.find_first_not_of('\n');
    if (i == std::string::npos) return {};
    strip_pending_ = false;
    return s.substr(i);
  }

  bool in_reasoning_;
  bool strip_pending_ = false;
  std::string held_;
};

}  // namespace rl
