// The qwen2 pre-tokenizer: splits text into the "words" that BPE merges never cross, with the
// regular expression of the Qwen2 tokenizer.json, run by PCRE2 (JIT-compiled where available).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>

namespace rl {

class Pretokenizer {
 public:
  // Throws rl::Error when PCRE2 rejects the pattern (a build without Unicode support).
  Pretokenizer();
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // PCRE2 match state (match data, JIT stack) for one thread; reusing it across the fragments of
  // a text saves an allocation and a JIT stack mapping per fragment.
  class Scratch {
   public:
    explicit Scratch(const Pretokenizer& pre);
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

   private:
    friend class Pretokenizer;
    struct State;
    std::unique_ptr<State> state_;
  };

  // Calls on_word(offset, length) for consecutive words covering all of `text` (byte offsets).
  // `text` must be well-formed UTF-8 (no surrogates). Thread-safe (with a Scratch per thread).
  using WordFn = std::function<void(size_t offset, size_t length)>;
  void split(std::string_view text, const WordFn& on_word) const;
  void split(std::string_view text, Scratch& scratch, const WordFn& on_word) const;

  bool jit_enabled() const;

  // The pattern, as given to PCRE2 (for documentation and tests).
  static const char* pattern();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rl
