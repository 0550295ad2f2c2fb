#include "generate/generator.h"

#include <algorithm>

#include "common/error.h"
#include "common/format.h"
#include "generate/generation.h"
#include "model/session.h"
#include "tokenizer/tokenizer.h"

namespace rl {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------

StopMatcher::StopMatcher(std::vector<std::string> stop_strings) {
  for (auto& s : stop_strings)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view text) {
  if (matched_) return {};
  held_ += text;
  size_t best = std::string::npos;
  for (const std::string& s : stops_) {
    size_t p = held_.find(s);
    if (p < best) {
      best = p;
      matched_ = s;
    }
  }
  if (matched_) {
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold the longest tail of the text that a stop string starts with.
  size_t keep = 0;
  for (const std::string& s : stops_) keep = std::max(keep, marker_prefix_tail(held_, s));
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!matched_) out.swap(held_);
  return out;
}

// ---------------------------------------------------------------------------------------------

Generator::Generator(Session& session, const Tokenizer& tokenizer, std::shared_ptr<const TokenTrie> trie)
    : session_(session), tokenizer_(tokenizer), trie_(std::move(trie)) {}

void Generator::reset() {
  session_.reset();
  history_.clear();
  last_logits_.clear();
}

int Generator::reuse_prefix(std::span<const int32_t> prompt, PromptCache* cache) {
  const size_t h = history_.size();
  const bool extends = h <= prompt.size() && std::equal(history_.begin(), history_.end(), prompt.begin());
  // Sampling needs the logits after the last prompt token: reuse all of it only when known.
  if (extends && h > 0 && (h < prompt.size() || !last_logits_.empty())) return (int)h;
  if (cache) {
    if (int n = cache->restore_longest_prefix(prompt, prompt.size() - 1, session_); n > 0) {
      history_.assign(prompt.begin(), prompt.begin() + n);
      last_logits_.clear();
      return n;
    }
  }
  reset();
  return 0;
}

const TokenTrie& Generator::token_trie() {
  if (!trie_) trie_ = std::make_shared<const TokenTrie>(tokenizer_);
  return *trie_;
}

GenerationResult Generator::generate(std::span<const int32_t> prompt, const GenerationConfig& config,
                                     const TextSink& on_text, const std::atomic<bool>* cancel,
                                     PromptCache* cache) {
  Generation g(*this, prompt, config, on_text, cancel, cache);
  while (g.prefilling()) g.prefill_chunk();
  while (std::optional<int32_t> token = g.next_token()) g.decoded(session_.decode(*token));
  return g.finish();
}

}  // namespace rl
