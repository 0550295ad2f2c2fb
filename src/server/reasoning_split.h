// Splits a model's reply into reasoning (the text of its <think> block) and content, piece by
// piece, so that streamed deltas and the whole message are cut at exactly the same place.
// The reply starts inside the block when the prompt opened it (Qwen3-Thinking's generation
// prompt ends with "<think>\n", whatever enable_thinking says); with a hybrid template the model
// may open the block itself as the first thing it writes. Newlines that only frame the block
// (after <think>, before </think>, before the answer) belong to neither part, as the templates
// strip them when the reasoning goes back into the history.
#pragma once
#include <string>
#include <string_view>
#include <utility>

#include "common/format.h"
#include "generate/chat_choice.h"

namespace rl {

class ReasoningSplitter {
 public:
  // `start`: reply_start() of the prompt (generate/chat_choice.h). Content splits nothing off;
  // Either is reasoning if it opens with <think> (leading whitespace allowed).
  explicit ReasoningSplitter(ReplyStart start) : state_(start) {}

  // Appends generated text; returns the (reasoning, content) that became final.
  std::pair<std::string, std::string> push(std::string_view text) {
    std::string reasoning, content;
    held_ += text;
    for (;;) {
      if (state_ == ReplyStart::Content) {
        content += strip_leading(std::move(held_));
        held_.clear();
        break;
      }
      if (state_ == ReplyStart::Either) {
        const size_t i = held_.find_first_not_of(" \t\r\n");
        if (i == std::string::npos) break;  // only whitespace so far: undecided
        const std::string_view rest = std::string_view(held_).substr(i);
        if (rest.substr(0, kOpen.size()) == kOpen) {
          held_.erase(0, i + kOpen.size());
          state_ = ReplyStart::Reasoning;
          continue;
        }
        if (kOpen.substr(0, rest.size()) == rest) break;  // may still become <think>
        state_ = ReplyStart::Content;
        continue;
      }
      // Reasoning.
      if (at_reasoning_start_) {
        const size_t i = held_.find_first_not_of('\n');
        if (i == std::string::npos) {
          held_.clear();
          break;
        }
        held_.erase(0, i);
        at_reasoning_start_ = false;
      }
      if (size_t p = held_.find(kEnd); p != std::string::npos) {
        reasoning += without_trailing_newlines(held_.substr(0, p));
        held_.erase(0, p + kEnd.size());
        state_ = ReplyStart::Content;
        strip_pending_ = true;
        continue;
      }
      // Hold back a tail that may be the start of </think>, and the newlines before it.
      size_t keep = marker_prefix_tail(held_, kEnd);
      while (keep < held_.size() && held_[held_.size() - keep - 1] == '\n') ++keep;
      reasoning += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      break;
    }
    return {std::move(reasoning), std::move(content)};
  }

  // At the end of generation: the (reasoning, content) still held back. Reasoning that never saw
  // </think> ends there; text held while deciding whether it opens <think> is content.
  std::pair<std::string, std::string> finish() {
    std::string held;
    held.swap(held_);
    if (state_ == ReplyStart::Reasoning) return {without_trailing_newlines(std::move(held)), std::string()};
    return {std::string(), std::move(held)};
  }

 private:
  static constexpr std::string_view kOpen = "<think>";
  static constexpr std::string_view kEnd = "</think>";

  static std::string without_trailing_newlines(std::string s) {
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }

  // The template separates </think> from the answer with blank lines: drop them, once, right after
  // the reasoning ends (never in a reply that had no reasoning).
  std::string strip_leading(std::string s) {
    if (!strip_pending_) return s;
    size_t i = s.find_first_not_of('\n');
    if (i == std::string::npos) return {};
    strip_pending_ = false;
    return s.substr(i);
  }

  ReplyStart state_;  // Either until the reply shows whether it opens a block
  bool at_reasoning_start_ = true;
  bool strip_pending_ = false;
  std::string held_;
};

}  // namespace rl
