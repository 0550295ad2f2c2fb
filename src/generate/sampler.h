// Token sampling: turns one row of logits [n_vocab] into the next token id.
//
// The chain, in order (the order of Hugging Face transformers and vLLM, which OpenAI-style
// clients expect):
//   1. penalties over the recent history: repetition (divide a positive logit, multiply a
//      negative one), frequency (subtract count * f) and presence (subtract p once seen);
//   2. temperature <= 0: argmax (greedy) and stop here;
//   3. logits / temperature, then top-k, then softmax, then top-p (the smallest set of the most
//      probable tokens whose mass reaches p), then min-p (keep p_i >= min_p * p_max);
//   4. draw from the renormalised survivors with the seeded generator.
// A token filtered out by any step can never be drawn; ties keep the lower token id first.
// With a TokenMask (an output constraint), the tokens it leaves out are removed before step 1.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/argmax.h"  // argmax: the greedy pick

namespace rl {

struct SamplingParams {
  float temperature = 0.7f;      // <= 0: greedy
  int top_k = 20;                // <= 0: off
  float top_p = 0.8f;            // >= 1: off
  float min_p = 0.0f;            // <= 0: off
  float repeat_penalty = 1.0f;   // 1: off
  int repeat_last_n = 64;        // history window for all penalties; -1: the whole history
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0f; }
  // Throws rl::Error naming the parameter when a value is out of range.
  void validate() const;
  std::string describe() const;  // "temp 0.70 top_k 20 top_p 0.80 min_p 0.00 ... seed 42"
};

// The tokens an output constraint allows at one step, as a bit set over the vocabulary.
class TokenMask {
 public:
  void reset(int n_vocab) { words_.assign(((size_t)n_vocab + 63) / 64, 0); }
  void allow(int32_t token) { words_[(size_t)token >> 6] |= uint64_t(1) << (token & 63); }
  bool allows(int32_t token) const { return (words_[(size_t)token >> 6] >> (token & 63)) & 1; }
  void allow_all_of(const std::vector<uint64_t>& words) {
    for (size_t i = 0; i < words_.size() && i < words.size(); ++i) words_[i] |= words[i];
  }
  bool empty() const {
    for (uint64_t w : words_)
      if (w) return false;
    return true;
  }
  size_t count() const;
  std::vector<uint64_t>& words() { return words_; }

 private:
  std::vector<uint64_t> words_;
};

class Sampler {
 public:
  explicit Sampler(SamplingParams params);

  // Picks the next token from `logits` [n_vocab], applying the penalties over the tokens seen
  // through accept(). Does not record the pick: call accept() with the token that was used.
  // `mask` (optional): only the tokens it allows can be drawn; it must allow at least one.
  int32_t sample(std::span<const float> logits, const TokenMask* mask = nullptr);
  // Records a token (prompt or generated) for the penalties.
  void accept(int32_t token);
  void reset_history();

  // The probabilities sample() would draw from: (token, p) of every survivor of the filters,
  // most probable first, summing to 1. Greedy: the argmax alone with p = 1. For tests and
  // for clients that ask for logprobs.
  std::vector<std::pair<int32_t, float>> candidates(std::span<const float> logits,
                                                    const TokenMask* mask = nullptr) const;

  const SamplingParams& params() const { return params_; }

 private:
  // The logits after the penalties, masked-out tokens at -infinity: `logits` itself when neither
  // applies, else a copy in scratch_ (valid until the next call).
  std::span<const float> penalised(std::span<const float> logits, const TokenMask* mask) const;
  // The survivors with their probabilities; most probable first when sorted_output.
  std::vector<std::pair<int32_t, float>> filtered(std::span<const float> logits, bool sorted_output,
                                                  const TokenMask* mask) const;
  double uniform01();

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> history_;  // tokens seen, oldest first
  // Reused from call to call (a row of logits is ~150k values): the penalised copy, and each
  // survivor's unnormalised probability, indexed by token (only the survivors' entries are read).
  mutable std::vector<float> scratch_;
  mutable std::vector<double> weights_;
};

}  // namespace rl
