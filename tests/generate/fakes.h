// Deterministic stand-ins for a Session and a Tokenizer, so the generation logic is tested
// without a model: the session's logits come from a script, the tokenizer is a tiny vocabulary.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/session.h"
#include "tokenizer/tokenizer.h"

namespace rl::test {

// Vocabulary: ids 0-255 are single bytes; then multi-byte words; then control tokens.
class FakeTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kImStart = 300, kImEnd = 301, kEndOfText = 302;

  FakeTokenizer() {
    for (int b = 0; b < 256; ++b) pieces_.push_back(std::string(1, (char)b));
    for (const char* w : {"Hel", "lo", " wor", "ld", "<", "STOP", "\xC3\xA9t\xC3\xA9", "ab"})  // 256..263
      pieces_.push_back(w);
    while (pieces_.size() < 300) pieces_.push_back("[unused]");
    pieces_.push_back("<|im_start|>");
    pieces_.push_back("<|im_end|>");
    pieces_.push_back("<|endoftext|>");
  }

  // Greedy longest match (enough for tests; not BPE).
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const override {
    std::vector<int32_t> out;
    size_t i = 0;
    while (i < text.size()) {
      int32_t best = (unsigned char)text[i];
      size_t best_len = 1;
      for (size_t id = 256; id < pieces_.size(); ++id) {
        const std::string& p = pieces_[id];
        if (p == "[unused]" || (is_control((int32_t)id) && !parse_special)) continue;
        if (p.size() > best_len && text.substr(i, p.size()) == p) {
          best = (int32_t)id;
          best_len = p.size();
        }
      }
      out.push_back(best);
      i += best_len;
    }
    return out;
  }
  std::string decode(std::span<const int32_t> ids, bool render_special) const override {
    std::string s;
    for (int32_t id : ids)
      if (render_special || !is_control(id)) s += pieces_.at(id);
    return s;
  }
  std::string piece(int32_t id) const override { return pieces_.at(id); }
  int n_vocab() const override { return (int)pieces_.size(); }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return kEndOfText; }
  bool add_bos() const override { return false; }
  bool is_eog(int32_t id) const override { return id == kImEnd || id == kEndOfText; }
  bool is_control(int32_t id) const override { return id >= 300; }
  std::optional<int32_t> token_id(std::string_view text) const override {
    for (size_t i = 0; i < pieces_.size(); ++i)
      if (pieces_[i] == text) return (int32_t)i;
    return std::nullopt;
  }
  const std::string& chat_template() const override { return template_; }

 private:
  std::vector<std::string> pieces_;
  std::string template_;
};

class FakeSnapshot : public SessionSnapshot {
 public:
  explicit FakeSnapshot(std::vector<int32_t> t) : tokens(std::move(t)) {}
  size_t bytes() const override { return 1000 + tokens.size() * 4; }
  int position() const override { return (int)tokens.size(); }
  std::vector<int32_t> tokens;
};

// Logits are a function of every token processed so far (as a real model's are). The default
// script makes the next token `next(processed)` with a clear margin.
class FakeSession : public Session {
 public:
  using Script = std::function<int32_t(const std::vector<int32_t>& processed)>;
  FakeSession(int n_vocab, Script next, int n_ctx = 4096) : n_vocab_(n_vocab), n_ctx_(n_ctx), next_(std::move(next)) {}

  std::vector<float> prefill(std::span<const int32_t> tokens, std::vector<float>* all_logits) override {
    if (processed.size() + tokens.size() > (size_t)n_ctx_) fail("fake: context full");
    prefill_calls.push_back((int)tokens.size());
    for (int32_t t : tokens) {
      processed.push_back(t);
      if (all_logits) {
        auto l = logits();
        all_logits->insert(all_logits->end(), l.begin(), l.end());
      }
    }
    return logits();
  }
  std::vector<float> decode(int32_t token) override {
    ++decode_calls;
    if (processed.size() + 1 > (size_t)n_ctx_) fail("fake: context full");
    processed.push_back(token);
    return logits();
  }
  int position() const override { return (int)processed.size(); }
  int n_ctx() const override { return n_ctx_; }
  int n_vocab() const override { return n_vocab_; }
  std::unique_ptr<SessionSnapshot> snapshot() const override {
    ++snapshots;
    return std::make_unique<FakeSnapshot>(processed);
  }
  void restore(const SessionSnapshot& snap) override {
    auto* s = dynamic_cast<const FakeSnapshot*>(&snap);
    if (!s) fail("fake: foreign snapshot");
    processed = s->tokens;
    ++restores;
  }
  void reset() override {
    processed.clear();
    ++resets;
  }
  void set_trace(TraceSink*) override {}

  std::vector<int32_t> processed;
  std::vector<int> prefill_calls;  // tokens per prefill() call
  int decode_calls = 0, restores = 0, resets = 0;
  mutable int snapshots = 0;  // snapshot() calls

 private:
  std::vector<float> logits() const {
    std::vector<float> l(n_vocab_, 0.0f);
    for (int i = 0; i < n_vocab_; ++i) l[i] = -(float)(i % 7);  // some structure below the winner
    l[next_(processed)] = 10.0f;
    return l;
  }
  int n_vocab_, n_ctx_;
  Script next_;
};

}  // namespace rl::test
