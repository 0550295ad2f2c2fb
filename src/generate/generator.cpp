#include "generate/generator.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "common/error.h"
#include "common/format.h"
#include "model/session.h"
#include "tokenizer/tokenizer.h"

namespace rl {

namespace {
// Prompt tokens per Session::prefill call: bounds the activations a backend allocates and lets a
// cancel request land between chunks (the CUDA backend's own chunk is 512 too, DESIGN.md §5).
constexpr size_t kPrefillChunk = 512;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

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

Generator::Generator(Session& session, const Tokenizer& tokenizer) : session_(session), tokenizer_(tokenizer) {}

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

GenerationResult Generator::generate(std::span<const int32_t> prompt, const GenerationConfig& config,
                                     const TextSink& on_text, const std::atomic<bool>* cancel,
                                     PromptCache* cache) {
  if (prompt.empty()) fail("prompt: no tokens to start from");
  if (prompt.size() >= (size_t)session_.n_ctx())
    fail("prompt: {} tokens leave no room in a context of {} tokens (--ctx)", prompt.size(), session_.n_ctx());
  if (config.max_tokens < 0) fail("-n: must be >= 0, got {}", config.max_tokens);

  GenerationResult r;
  r.prompt_tokens = (int)prompt.size();
  auto is_cancelled = [&] { return cancel && cancel->load(std::memory_order_relaxed); };

  // Prefill what the session does not hold yet.
  auto t0 = std::chrono::steady_clock::now();
  r.reused_tokens = reuse_prefix(prompt, cache);
  std::vector<float> logits = last_logits_;
  for (size_t pos = r.reused_tokens; pos < prompt.size(); pos += kPrefillChunk) {
    if (is_cancelled()) {
      r.finish = FinishReason::Cancelled;
      r.prefill_seconds = seconds_since(t0);
      return r;
    }
    auto chunk = prompt.subspan(pos, std::min(kPrefillChunk, prompt.size() - pos));
    logits = session_.prefill(chunk);
    history_.insert(history_.end(), chunk.begin(), chunk.end());
    last_logits_ = logits;
    r.prefill_tokens += (int)chunk.size();
  }
  r.prefill_seconds = seconds_since(t0);
  if (cache && r.prefill_tokens > 0) cache->put(history_, session_.snapshot());

  Sampler sampler(config.sampling);
  if (config.penalize_prompt) {
    const int window = config.sampling.repeat_last_n;
    size_t from = window < 0 ? 0 : prompt.size() - std::min(prompt.size(), (size_t)window);
    for (size_t i = from; i < prompt.size(); ++i) sampler.accept(prompt[i]);
  }
  std::optional<TokenConstraint> constraint;
  TokenMask mask;
  if (config.constraint) {
    if (!trie_) trie_ = std::make_unique<TokenTrie>(tokenizer_);
    constraint.emplace(*config.constraint.grammar, *trie_, config.constraint.after_reasoning);
  }
  // The next step's mask is computed on another thread while the session decodes (a GPU backend
  // leaves this thread waiting), so only what is left of it delays sampling.
  std::future<void> next_mask;
  auto compute_mask = [&](int budget) {
    auto tm = std::chrono::steady_clock::now();
    constraint->allowed_tokens(budget, mask);
    r.constraint_compute_seconds += seconds_since(tm);
  };
  StreamDecoder decoder(tokenizer_, config.render_special);
  StopMatcher stop(config.stop_strings);
  auto emit = [&](const std::string& piece) {
    if (piece.empty()) return;
    r.text += piece;
    if (on_text) on_text(piece);
  };

  // Sample, stream, decode. The token that ends generation is never decoded: it is pending.
  auto t1 = std::chrono::steady_clock::now();
  int generated = 0;
  r.finish = FinishReason::Length;
  while (generated < config.max_tokens) {
    if (is_cancelled()) {
      r.finish = FinishReason::Cancelled;
      break;
    }
    const TokenMask* allowed = nullptr;
    if (constraint) {
      auto tm = std::chrono::steady_clock::now();
      // Sampling steps left: the token limit, and the context (the last step may still end it).
      if (next_mask.valid()) next_mask.get();
      else compute_mask(std::min(config.max_tokens - generated, session_.n_ctx() - session_.position()));
      allowed = &mask;
      r.constraint_seconds += seconds_since(tm);
      ++r.constrained_steps;
    }
    const int32_t token = sampler.sample(logits, allowed);
    if (constraint) {
      auto ta = std::chrono::steady_clock::now();
      constraint->accept(token);
      r.constraint_seconds += seconds_since(ta);
    }
    if (config.on_token) config.on_token(token, logits);
    r.tokens.push_back(token);
    if (config.stop_at_eog && tokenizer_.is_eog(token)) {
      r.finish = FinishReason::Stop;
      r.stop_token = token;
      r.pending_token = token;
      break;
    }
    sampler.accept(token);
    emit(stop.push(decoder.push(token)));
    ++generated;
    if (stop.matched()) {
      r.finish = FinishReason::Stop;
      r.stop_string = stop.matched();
      r.pending_token = token;
      break;
    }
    if (generated == config.max_tokens || session_.position() + 1 >= session_.n_ctx()) {
      r.pending_token = token;  // length: the limit or a full context
      break;
    }
    if (constraint)
      next_mask = std::async(std::launch::async, compute_mask,
                             std::min(config.max_tokens - generated, session_.n_ctx() - session_.position() - 1));
    logits = session_.decode(token);
    history_.push_back(token);
    last_logits_ = logits;
    ++r.decode_passes;
  }
  if (next_mask.valid()) next_mask.wait();  // cancelled with a mask in flight: it writes into r
  if (!stop.matched()) {
    emit(stop.push(decoder.flush()));
    emit(stop.flush());
    if (stop.matched()) {  // the last bytes completed a stop string
      r.finish = FinishReason::Stop;
      r.stop_string = stop.matched();
    }
  }
  r.decode_seconds = seconds_since(t1);
  if (cache && r.decode_passes > 0) cache->put(history_, session_.snapshot());
  return r;
}

}  // namespace rl
