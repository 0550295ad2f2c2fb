#include "generate/generation.h"

#include <algorithm>

#include "common/error.h"
#include "model/session.h"
#include "tokenizer/tokenizer.h"

namespace rl {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Generation::Generation(Generator& generator, std::span<const int32_t> prompt, const GenerationConfig& config,
                       TextSink on_text, const std::atomic<bool>* cancel, PromptCache* cache)
    : g_(generator),
      prompt_(prompt.begin(), prompt.end()),
      config_(config),
      on_text_(std::move(on_text)),
      cancel_(cancel),
      cache_(cache),
      sampler_(config.sampling),
      decoder_(generator.tokenizer(), config.render_special),
      stop_(config.stop_strings) {
  Session& session = g_.session();
  if (prompt.empty()) fail("prompt: no tokens to start from");
  if (prompt.size() >= (size_t)session.n_ctx())
    fail("prompt: {} tokens leave no room in a context of {} tokens (--ctx)", prompt.size(), session.n_ctx());
  if (config.max_tokens < 0) fail("-n: must be >= 0, got {}", config.max_tokens);

  r_.prompt_tokens = (int)prompt.size();
  prefill_start_ = std::chrono::steady_clock::now();
  r_.reused_tokens = g_.reuse_prefix(prompt_, cache_);
  next_prompt_ = (size_t)r_.reused_tokens;

  if (config_.penalize_prompt) {
    const int window = config_.sampling.repeat_last_n;
    size_t from = window < 0 ? 0 : prompt_.size() - std::min(prompt_.size(), (size_t)window);
    for (size_t i = from; i < prompt_.size(); ++i) sampler_.accept(prompt_[i]);
  }
  if (config_.constraint) {
    constraint_.emplace(*config_.constraint.grammar, g_.token_trie(), config_.constraint.after_reasoning);
    mask_worker_.emplace([this](int budget) { compute_mask(budget); });
  }
  if (!prefilling()) end_prefill();
}

Generation::~Generation() = default;  // mask_worker_ goes first: it waits for a mask in flight

void Generation::prefill_chunk() {
  const std::span<const int32_t> chunk = next_prefill_chunk();
  if (!chunk.empty()) prefilled(chunk, g_.session().prefill(chunk));
}

std::span<const int32_t> Generation::next_prefill_chunk() {
  if (!prefilling()) return {};
  if (cancelled()) {
    r_.finish = FinishReason::Cancelled;
    r_.prefill_seconds = seconds_since(prefill_start_);
    ended_ = true;
    return {};
  }
  // A backend pass at a time: a cancel request lands between them, and in the server one sequence's
  // prefill holds up the others' decode steps by at most one pass.
  const size_t piece = (size_t)g_.session().prefill_chunk();
  return std::span<const int32_t>(prompt_).subspan(next_prompt_, std::min(piece, prompt_.size() - next_prompt_));
}

void Generation::prefilled(std::span<const int32_t> chunk, std::vector<float> logits) {
  if (!prefilling() || chunk.data() != prompt_.data() + next_prompt_)
    fail("Generation: prefilled() takes the chunk next_prefill_chunk() gave");
  g_.last_logits_ = std::move(logits);
  g_.history_.insert(g_.history_.end(), chunk.begin(), chunk.end());
  r_.prefill_tokens += (int)chunk.size();
  next_prompt_ += chunk.size();
  if (!prefilling()) end_prefill();
}

void Generation::end_prefill() {
  r_.prefill_seconds = seconds_since(prefill_start_);
  if (cache_ && r_.prefill_tokens > 0) cache_->put(g_.history_, g_.session());
}

void Generation::compute_mask(int budget) {
  auto tm = std::chrono::steady_clock::now();
  constraint_->allowed_tokens(budget, mask_);
  r_.constraint_compute_seconds += seconds_since(tm);
}

void Generation::emit(const std::string& piece) {
  if (piece.empty()) return;
  r_.text += piece;
  if (on_text_) on_text_(piece);
}

// Sample, stream, and hand back the token to decode. The token that ends generation is never
// decoded: it is pending.
std::optional<int32_t> Generation::next_token() {
  if (ended_ || prefilling()) return std::nullopt;
  if (to_decode_) fail("Generation: next_token() called before the logits of token {} were given", *to_decode_);
  Session& session = g_.session();
  if (!sampling_started_) {
    sampling_started_ = true;
    decode_start_ = std::chrono::steady_clock::now();
    r_.finish = FinishReason::Length;
  }
  auto end = [&]() -> std::optional<int32_t> {
    ended_ = true;
    return std::nullopt;
  };
  if (generated_ >= config_.max_tokens) return end();
  if (cancelled()) {
    r_.finish = FinishReason::Cancelled;
    return end();
  }
  const TokenMask* allowed = nullptr;
  if (constraint_) {
    auto tm = std::chrono::steady_clock::now();
    // Sampling steps left: the token limit, and the context (the last step may still end it).
    if (mask_worker_->started()) mask_worker_->wait();
    else compute_mask(std::min(config_.max_tokens - generated_, session.n_ctx() - session.position()));
    allowed = &mask_;
    r_.constraint_seconds += seconds_since(tm);
    ++r_.constrained_steps;
  }
  const int32_t token = sampler_.sample(g_.last_logits_, allowed);
  if (constraint_) {
    auto ta = std::chrono::steady_clock::now();
    constraint_->accept(token);
    r_.constraint_seconds += seconds_since(ta);
  }
  if (config_.on_token) config_.on_token(token, g_.last_logits_);
  r_.tokens.push_back(token);
  if (config_.stop_at_eog && g_.tokenizer().is_eog(token)) {
    r_.finish = FinishReason::Stop;
    r_.stop_token = token;
    r_.pending_token = token;
    return end();
  }
  sampler_.accept(token);
  emit(stop_.push(decoder_.push(token)));
  ++generated_;
  if (stop_.matched()) {
    r_.finish = FinishReason::Stop;
    r_.stop_string = stop_.matched();
    r_.pending_token = token;
    return end();
  }
  if (generated_ == config_.max_tokens || session.position() + 1 >= session.n_ctx()) {
    r_.pending_token = token;  // length: the limit or a full context
    return end();
  }
  // The next step's mask, computed while the session decodes this token.
  if (constraint_)
    mask_worker_->start(std::min(config_.max_tokens - generated_, session.n_ctx() - session.position() - 1));
  to_decode_ = token;
  return token;
}

void Generation::decoded(std::vector<float> logits) { take_logits(logits); }

void Generation::take_logits(std::vector<float>& logits) {
  if (!to_decode_) fail("Generation: logits given with no token to decode");
  g_.history_.push_back(*to_decode_);
  to_decode_.reset();
  std::swap(g_.last_logits_, logits);
  ++r_.decode_passes;
}

GenerationResult Generation::finish() {
  // Ended with a mask in flight (a cancel request): it writes into r_; no step takes it, so what
  // it threw does not matter.
  if (mask_worker_ && mask_worker_->started()) {
    try {
      mask_worker_->wait();
    } catch (const Error&) {
    }
  }
  ended_ = true;
  if (!sampling_started_) return r_;  // cancelled during the prefill
  if (!stop_.matched()) {
    emit(stop_.push(decoder_.flush()));
    emit(stop_.flush());
    if (stop_.matched()) {  // the last bytes completed a stop string
      r_.finish = FinishReason::Stop;
      r_.stop_string = stop_.matched();
    }
  }
  r_.decode_seconds = seconds_since(decode_start_);
  if (cache_ && r_.decode_passes > 0) cache_->put(g_.history_, g_.session());
  return r_;
}

}  // namespace rl
