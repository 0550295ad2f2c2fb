// Byte-level BPE tokenizer of the Qwen2/Qwen3 family, read from GGUF metadata
// (tokenizer.ggml.model = gpt2, tokenizer.ggml.pre = qwen2), identical to llama.cpp's.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rl {

class GgufFile;

class Tokenizer {
 public:
  // Throws rl::Error naming the key when the tokenizer model or pre-tokenizer is not supported.
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& file);
  virtual ~Tokenizer() = default;

  // parse_special: match control tokens (<|im_start|>, ...) written in the text. User-defined
  // tokens are always matched, as llama.cpp does.
  virtual std::vector<int32_t> encode(std::string_view text, bool parse_special) const = 0;
  // Concatenated bytes of the tokens; control tokens render as their text when render_special.
  virtual std::string decode(std::span<const int32_t> ids, bool render_special = true) const = 0;
  // The bytes of one token (control tokens: their text).
  virtual std::string piece(int32_t id) const = 0;

  virtual int n_vocab() const = 0;
  virtual int32_t bos_id() const = 0;   // -1 when absent
  virtual int32_t eos_id() const = 0;
  virtual bool add_bos() const = 0;
  // End of generation: eos, <|im_end|>, <|endoftext|> and the file's eot/eom ids.
  virtual bool is_eog(int32_t id) const = 0;
  virtual bool is_control(int32_t id) const = 0;
  // Exact text of a token (e.g. "<|im_start|>"), if the vocabulary has it.
  virtual std::optional<int32_t> token_id(std::string_view text) const = 0;
  // tokenizer.chat_template, empty when absent.
  virtual const std::string& chat_template() const = 0;
};

// Streaming detokenization: a token that ends inside a multi-byte UTF-8 character is held back
// until the character is complete, so every string returned is valid UTF-8 by itself.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool render_special = true)
      : tok_(tok), render_special_(render_special) {}
  // Text that became complete with this token (possibly empty).
  std::string push(int32_t id);
  // Whatever is held back (an incomplete character at the end of generation), as-is.
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool render_special_;
  std::string pending_;
};

}  // namespace rl
