// One generation as a sequence of steps, so a scheduler can interleave several: the prompt's
// prefill in chunks, then per token a sample and a decode that the caller runs (alone, or in one
// batched pass with other sequences: Backend::decode_batch). Generator::generate is these steps
// run back to back:
//
//   Generation g(generator, prompt, config, on_text, cancel, cache);  // reuses a prefix
//   while (g.prefilling()) g.prefill_chunk();
//   while (std::optional<int32_t> t = g.next_token()) g.decoded(session.decode(*t));
//   GenerationResult r = g.finish();
//
// Sampling, stop strings, the token limit, constraints and streaming are per generation; the
// Generator's history and the PromptCache are updated as generate() updates them.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "generate/generator.h"
#include "generate/mask_worker.h"
#include "tokenizer/tokenizer.h"  // StreamDecoder

namespace rl {

class Generation {
 public:
  // Brings the generator's session to the longest reusable prefix of `prompt` (its history, else
  // `cache`). Throws rl::Error for an empty prompt, one that fills the context, max_tokens < 0.
  Generation(Generator& generator, std::span<const int32_t> prompt, const GenerationConfig& config,
             TextSink on_text, const std::atomic<bool>* cancel = nullptr, PromptCache* cache = nullptr);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Whether prompt tokens are not yet in the session (false once the prompt is in, or it ended).
  bool prefilling() const { return !ended_ && next_prompt_ < prompt_.size(); }
  // Prefills the next chunk of at most session().prefill_chunk() prompt tokens (a cancel request ends the
  // generation instead).
  void prefill_chunk();
  // prefill_chunk() in two halves, for a caller that prefills several sequences' chunks in one call
  // (Backend::prefill_batch_into): the next chunk (empty when the prompt is in, or a cancel request
  // ended the generation here), then prefilled() with that chunk's logits once the session holds it.
  std::span<const int32_t> next_prefill_chunk();
  void prefilled(std::span<const int32_t> chunk, std::vector<float> logits);

  // Samples the next token. Returns it when the session must decode it next (then decoded() is
  // called with its logits); nullopt when the generation has ended (end of generation, a stop
  // string, the token limit or a full context, a cancel request).
  std::optional<int32_t> next_token();
  // The logits of decoding the token next_token() returned.
  void decoded(std::vector<float> logits);
  // As decoded(), swapping: the generation keeps these logits and gives back in `logits` the
  // buffer of its previous ones, for the caller's next step to write into (a batched step's
  // buffers then go round without an allocation).
  void take_logits(std::vector<float>& logits);

  // Ends the generation (flushes held-back text, stores the final state in the cache).
  GenerationResult finish();

  bool cancelled() const { return cancel_ && cancel_->load(std::memory_order_relaxed); }


 private:
  void end_prefill();
  void compute_mask(int budget);
  void emit(const std::string& piece);

  Generator& g_;
  std::vector<int32_t> prompt_;
  GenerationConfig config_;
  TextSink on_text_;
  const std::atomic<bool>* cancel_;
  PromptCache* cache_;

  GenerationResult r_;
  std::chrono::steady_clock::time_point prefill_start_, decode_start_;
  size_t next_prompt_ = 0;
  bool ended_ = false;           // no more tokens: finish() is next
  bool sampling_started_ = false;
  std::optional<int32_t> to_decode_;  // returned by next_token(), its logits not yet given

  Sampler sampler_;
  std::optional<TokenConstraint> constraint_;
  TokenMask mask_;
  // Computes the next step's mask into mask_ while the session decodes (made with the constraint;
  // declared after what its job touches, so it stops before they go).
  std::optional<MaskWorker> mask_worker_;
  StreamDecoder decoder_;
  StopMatcher stop_;
  int generated_ = 0;
};

}  // namespace rl
