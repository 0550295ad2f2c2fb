// Text generation on one Session: prefill the prompt, then sample, stream and decode token by
// token until an end-of-generation token, a stop string, the token limit or a cancel request.
//
// The Generator owns the knowledge of what its session holds: history() is exactly the tokens
// the session has processed. A new prompt that extends the history prefills only the new tokens
// (a chat turn, a server request that continues the previous one); otherwise the state comes from
// the PromptCache (a snapshot at an earlier boundary) or from scratch. A hybrid recurrent model
// cannot roll back, so there is no partial reuse without a snapshot.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "generate/prompt_cache.h"
#include "generate/sampler.h"
#include "generate/token_constraint.h"

namespace rl {

class Session;
class Tokenizer;

enum class FinishReason { Stop, Length, Cancelled };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled" (OpenAI names)

// Holds back streamed text that could be the start of a stop string, so no part of a stop string
// ever reaches the client, even when it spans several tokens.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stop_strings);
  // Adds generated text; returns the part that is now safe to emit. After a match, matched() is
  // set and the returned text is everything before the stop string.
  std::string push(std::string_view text);
  // Text held back at the end of generation (it never became a stop string).
  std::string flush();
  const std::optional<std::string>& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::optional<std::string> matched_;
};

struct GenerationConfig {
  SamplingParams sampling;
  int max_tokens = 256;                   // generated tokens, the end-of-generation one excluded
  std::vector<std::string> stop_strings;  // stop when the text contains one (it is not emitted)
  bool stop_at_eog = true;                // stop on the tokenizer's end-of-generation ids
  bool render_special = false;            // stream control tokens' text
  // The penalties see the prompt too (as llama.cpp does); false: generated tokens only.
  bool penalize_prompt = true;
  // When set, every sampled token keeps the output a prefix of the grammar's documents, and
  // generation ends (end-of-generation) only where the document is complete.
  OutputConstraint constraint;
  // Called with every sampled token (the end-of-generation one too) and the logits it was drawn
  // from, before penalties: what the server needs for logprobs. Optional.
  std::function<void(int32_t token, std::span<const float> logits)> on_token;
};

struct GenerationResult {
  FinishReason finish = FinishReason::Length;
  std::string text;                   // everything streamed
  std::vector<int32_t> tokens;        // generated ids, including an end-of-generation id
  std::optional<std::string> stop_string;  // the stop string that ended it
  std::optional<int32_t> stop_token;       // the end-of-generation id that ended it
  // The last sampled id when the session has not processed it (length / stop-string finish,
  // and the end-of-generation id): a continuation that keeps it must feed it first.
  std::optional<int32_t> pending_token;

  int prompt_tokens = 0;      // prompt length
  int reused_tokens = 0;      // of those, already in the session (history or cache)
  int prefill_tokens = 0;     // = prompt_tokens - reused_tokens: what this call prefilled
  int decode_passes = 0;      // session.decode() calls
  double prefill_seconds = 0;
  double decode_seconds = 0;  // from the first sample to the end, sampling included
  // Under a constraint: the time sampling waited for token masks (each computed while the
  // session decodes the previous token) and followed tokens, of decode_seconds; and the whole
  // time the masks took, on whichever thread.
  double constraint_seconds = 0;
  double constraint_compute_seconds = 0;
  int constrained_steps = 0;      // sampling steps under a constraint

  double prefill_tok_s() const { return prefill_seconds > 0 ? prefill_tokens / prefill_seconds : 0; }
  double decode_tok_s() const { return decode_seconds > 0 ? decode_passes / decode_seconds : 0; }
};

// Receives streamed text (valid UTF-8 pieces, never part of a stop string).
using TextSink = std::function<void(std::string_view)>;

class Generator {
 public:
  // `trie`: the tokenizer's token trie for constrained generation, shared by the generators of one
  // tokenizer (built on the first constrained generation when not given).
  Generator(Session& session, const Tokenizer& tokenizer, std::shared_ptr<const TokenTrie> trie = nullptr);

  // Generates after `prompt` (the whole conversation's tokens, not only the new ones). Reuses the
  // session when history() is a prefix of the prompt, else a snapshot from `cache` (when given),
  // else starts over. With a cache, the state right after the prompt and at the end are stored.
  // `cancel` is polled before every token; a cancelled call keeps a consistent history().
  // The steps of a Generation (generation.h) run back to back.
  GenerationResult generate(std::span<const int32_t> prompt, const GenerationConfig& config,
                            const TextSink& on_text, const std::atomic<bool>* cancel = nullptr,
                            PromptCache* cache = nullptr);

  // Tokens the session has processed, in order.
  const std::vector<int32_t>& history() const { return history_; }
  void reset();

  Session& session() { return session_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const TokenTrie& token_trie();
  // Takes a trie shared with other generators (a server's slots) if this one has none yet.
  void use_token_trie(std::shared_ptr<const TokenTrie> trie) {
    if (!trie_) trie_ = std::move(trie);
  }

 private:
  friend class Generation;  // the steps of one generation update history() and the logits after it

  // Brings the session to a prefix of `prompt` (at most prompt.size()-1 tokens unless the logits
  // of the whole prompt are known) and returns how many tokens it already holds.
  int reuse_prefix(std::span<const int32_t> prompt, PromptCache* cache);

  Session& session_;
  const Tokenizer& tokenizer_;
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<int32_t> history_;
  std::vector<float> last_logits_;  // logits after history_ (empty: unknown)
};

}  // namespace rl
