// A byte-level BPE vocabulary of any size (>= 259) for synthetic models that are not given a real
// tokenizer: it tokenizes every text (all 256 byte tokens are present), has the three ChatML
// control tokens and a chat template, and is marked as a placeholder in the file's metadata
// (redlite.synth.placeholder_vocab = true). Its merges are not learned from text.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace rl::synth {

struct PlaceholderVocab {
  std::vector<std::string> tokens;   // [n_vocab], GPT-2 byte-to-unicode text
  std::vector<int32_t> token_types;  // 1 normal, 3 control, 4 user-defined (padding)
  std::vector<std::string> merges;   // "left right", in rank order
  uint32_t endoftext_id = 0;         // <|endoftext|>: bos = eos = padding
};

// Layout: ids 0-255 the byte tokens (GPT-2 order), then merges of pairs of frequent letters and
// the space marker (up to 2809), then [PADn] user-defined tokens; the control tokens
// <|endoftext|>, <|im_start|>, <|im_end|> sit at 151643-151645 when the vocabulary is at least
// that large (as in the real Qwen2 vocabulary), else at the last three ids.
PlaceholderVocab make_placeholder_vocab(int n_vocab);

// The ChatML template of the Qwen2 vocabulary files.
const std::string& chatml_template();

}  // namespace rl::synth
