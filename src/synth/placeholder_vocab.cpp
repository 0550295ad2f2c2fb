#include "synth/placeholder_vocab.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "common/utf8.h"

namespace rl::synth {

namespace {

// GPT-2's byte-to-unicode map, in its order: printable Latin-1 bytes stand for themselves, the
// others are moved to U+0100 and up. Byte token i is the i-th entry.
std::vector<std::string> byte_tokens() {
  std::vector<int> bytes;
  for (int b = '!'; b <= '~'; b++) bytes.push_back(b);
  for (int b = 0xA1; b <= 0xAC; b++) bytes.push_back(b);
  for (int b = 0xAE; b <= 0xFF; b++) bytes.push_back(b);
  std::vector<uint32_t> code_points(bytes.begin(), bytes.end());
  uint32_t next = 256;
  for (int b = 0; b < 256; b++) {
    if (std::find(bytes.begin(), bytes.end(), b) == bytes.end()) {
      bytes.push_back(b);
      code_points.push_back(next++);
    }
  }
  std::vector<std::string> tokens(256);
  for (int i = 0; i < 256; i++) append_utf8(tokens[i], code_points[i]);
  return tokens;
}

constexpr int kQwen2EndOfTextId = 151643;

}  // namespace

const std::string& chatml_template() {
  static const std::string t =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  return t;
}

PlaceholderVocab make_placeholder_vocab(int n_vocab) {
  if (n_vocab < 259) fail("--n-vocab {}: a placeholder vocabulary needs at least 259 tokens (256 bytes + 3 control)", n_vocab);
  PlaceholderVocab v;
  v.tokens = byte_tokens();
  v.token_types.assign(256, 1);

  const int control_first = std::min(kQwen2EndOfTextId, n_vocab - 3);
  // Merges of pairs over the space marker U+0120 and letters in rough English frequency order,
  // ranked so that pairs of frequent symbols merge first.
  std::vector<std::string> symbols;
  append_utf8(symbols.emplace_back(), 0x120);
  for (char c : std::string("etaoinshrdlcumwfgypbvkjxqz")) symbols.emplace_back(1, c);
  for (char c : std::string("TAISOWHBCMEFPDRLNGUVYJKQXZ")) symbols.emplace_back(1, c);
  const int n_sym = (int)symbols.size();
  std::vector<std::pair<int, int>> pairs;
  for (int i = 0; i < n_sym; i++)
    for (int j = 0; j < n_sym; j++) pairs.push_back({i, j});
  std::stable_sort(pairs.begin(), pairs.end(),
                   [](const auto& a, const auto& b) { return a.first + a.second < b.first + b.second; });
  const int n_merges = std::min<int>((int)pairs.size(), control_first - 256);
  for (int m = 0; m < n_merges; m++) {
    const auto& [i, j] = pairs[m];
    v.merges.push_back(symbols[i] + " " + symbols[j]);
    v.tokens.push_back(symbols[i] + symbols[j]);
    v.token_types.push_back(1);
  }
  auto pad_to = [&](int end) {
    while ((int)v.tokens.size() < end) {
      v.tokens.push_back(fmt::format("[PAD{}]", v.tokens.size()));
      v.token_types.push_back(4);
    }
  };
  pad_to(control_first);
  v.endoftext_id = (uint32_t)control_first;
  for (const char* t : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    v.tokens.push_back(t);
    v.token_types.push_back(3);
  }
  pad_to(n_vocab);
  return v;
}

}  // namespace rl::synth
