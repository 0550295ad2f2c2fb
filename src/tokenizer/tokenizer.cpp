// Byte-level BPE tokenizer (tokenizer.ggml.model = gpt2, pre = qwen2), reproducing llama.cpp's
// llama-vocab.cpp: token attributes from tokenizer.ggml.token_type plus llama.cpp's detection of
// control-looking tokens by their text, special-token partitioning (longest token first), the
// qwen2 regex split, rank-ordered merges and byte-level decoding.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <set>
#include <unordered_map>

#include "common/error.h"
#include "common/utf8.h"
#include "gguf/gguf.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"

namespace rl {
namespace {

// Token attributes (the subset of llama.cpp's llama_token_attr this vocabulary family uses).
enum TokenAttr : uint8_t {
  kAttrUnknown = 1 << 0,
  kAttrUnused = 1 << 1,
  kAttrNormal = 1 << 2,
  kAttrControl = 1 << 3,
  kAttrUserDefined = 1 << 4,
  kAttrByte = 1 << 5,
};

// tokenizer.ggml.token_type values (llama_token_type).
uint8_t attr_from_token_type(int64_t type) {
  switch (type) {
    case 1: return kAttrNormal;
    case 2: return kAttrUnknown;
    case 3: return kAttrControl;
    case 4: return kAttrUserDefined;
    case 5: return kAttrUnused;
    case 6: return kAttrByte;
    default: return 0;  // undefined: renders as nothing, never matched as special
  }
}

// Pre-tokenizer names that llama.cpp maps to its QWEN2 regex (and clean_spaces = false).
constexpr std::array<std::string_view, 4> kQwen2PreNames = {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"};

// Texts llama.cpp recognises (load(), "auto-detect special tokens by text"). A token with one
// of these texts is forced to be a control token even when the file says otherwise; this is
// why the plain-text token `</s>` of the Qwen2 vocabulary is a control token in llama.cpp.
const std::set<std::string_view> kEotTexts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<end_of_utterance>"};
const std::set<std::string_view> kEomTexts = {"<|eom_id|>"};
const std::set<std::string_view> kFimPreTexts = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
    "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"};
const std::set<std::string_view> kFimSufTexts = {
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>",
    "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"};
const std::set<std::string_view> kFimMidTexts = {
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
    "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"};
const std::set<std::string_view> kFimPadTexts = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
const std::set<std::string_view> kFimRepTexts = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
const std::set<std::string_view> kFimSepTexts = {"<|file_sep|>"};
const std::set<std::string_view> kEogTexts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~["};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const GgufFile& file);

  std::vector<int32_t> encode(std::string_view text, bool parse_special) const override;
  std::string decode(std::span<const int32_t> ids, bool render_special) const override;
  std::string piece(int32_t id) const override;
  int n_vocab() const override { return n_vocab_; }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  bool add_bos() const override { return add_bos_; }
  bool is_eog(int32_t id) const override { return eog_.count(id) > 0; }
  bool is_control(int32_t id) const override {
    return id >= 0 && id < n_vocab_ && (attrs_[id] & kAttrControl);
  }
  std::optional<int32_t> token_id(std::string_view text) const override {
    const int32_t id = bpe_.find_symbol(text);
    if (id < 0 || id >= n_vocab_) return std::nullopt;
    return id;
  }
  const std::string& chat_template() const override { return chat_template_; }

 private:
  struct Fragment {
    size_t offset = 0, length = 0;
    int32_t token = -1;  // -1: raw text to be tokenized
  };
  // Per-call cache of word -> ids (open addressing); keys point into text that outlives the call.
  struct WordCache {
    struct Slot {
      const char* data = nullptr;  // nullptr: empty
      uint32_t size = 0, hash = 0;
      uint32_t first = 0, count = 0;  // the ids, in `ids`
    };
    std::vector<Slot> slots = std::vector<Slot>(1024);
    size_t used = 0;
    std::vector<int32_t> ids;
    std::vector<int32_t> scratch;
    std::optional<Pretokenizer::Scratch> regex;  // created on the first raw fragment

    static uint32_t hash_of(std::string_view w) { return (uint32_t)std::hash<std::string_view>{}(w); }
    const Slot* find(std::string_view w, uint32_t h) const {
      for (size_t i = h & (slots.size() - 1);; i = (i + 1) & (slots.size() - 1)) {
        const Slot& s = slots[i];
        if (!s.data) return nullptr;
        if (s.hash == h && s.size == w.size() && std::memcmp(s.data, w.data(), w.size()) == 0) return &s;
      }
    }
    void insert(std::string_view w, uint32_t h, uint32_t first, uint32_t count) {
      if ((used + 1) * 2 > slots.size()) {
        std::vector<Slot> old(slots.size() * 2);
        old.swap(slots);
        for (const Slot& s : old) {
          if (s.data) place(s);
        }
      }
      place(Slot{w.data(), (uint32_t)w.size(), h, first, count});
      ++used;
    }
    void place(const Slot& s) {
      size_t i = s.hash & (slots.size() - 1);
      while (slots[i].data) i = (i + 1) & (slots.size() - 1);
      slots[i] = s;
    }
  };
  static constexpr size_t kWordCacheMaxEntries = 1 << 20;
  // How many entries ahead the loaders prefetch hash-table slots (covers a DRAM miss).
  static constexpr int kPrefetchDistance = 16;

  void load_vocabulary(const GgufFile& file);
  void load_merges(const GgufFile& file);
  void load_special_ids(const GgufFile& file);
  void detect_special_tokens_by_text();
  void build_special_index();
  void build_pieces();

  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;
  void encode_raw(std::string_view text, WordCache& cache, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, WordCache& cache, std::vector<int32_t>& out) const;
  void emit_symbol(int32_t sym, std::vector<int32_t>& out) const;
  std::string_view piece_view(int32_t id, bool render_special) const;

  std::string path_;
  int n_vocab_ = 0;
  BpeModel bpe_;
  std::vector<uint8_t> attrs_;
  std::array<int32_t, 256> byte_symbol_{};        // symbol of each byte's byte-level character
  std::array<int32_t, 256> single_byte_token_{};  // vocabulary token whose text is that one byte
  Pretokenizer pretokenizer_;

  int32_t bos_ = -1, eos_ = -1, eot_ = -1, eom_ = -1, unk_ = -1, sep_ = -1, pad_ = -1, mask_ = -1;
  int32_t fim_pre_ = -1, fim_suf_ = -1, fim_mid_ = -1, fim_pad_ = -1, fim_rep_ = -1, fim_sep_ = -1;
  bool add_bos_ = false;
  std::set<int32_t> eog_;
  std::string chat_template_;

  // Special tokens (control, user-defined, unknown), longest text first: the order in which
  // llama.cpp carves them out of the text.
  std::vector<int32_t> specials_;
  std::unordered_map<std::string_view, int32_t> special_by_text_;
  std::array<std::vector<uint32_t>, 256> special_lengths_by_first_byte_;

  // Rendered pieces (special rendering on) of every token, back to back.
  std::string piece_arena_;
  std::vector<uint32_t> piece_offsets_;
};

BpeTokenizer::BpeTokenizer(const GgufFile& file) : path_(file.path()) {
  const std::string model = file.get_string("tokenizer.ggml.model");
  if (model != "gpt2") {
    fail("{}: tokenizer.ggml.model = '{}' is not supported (supported: 'gpt2', byte-level BPE)", path_, model);
  }
  const GgufValue* pre = file.find("tokenizer.ggml.pre");
  if (!pre) {
    fail("{}: metadata key 'tokenizer.ggml.pre' is missing (supported pre-tokenizers: 'qwen2', "
         "'deepseek-r1-qwen', 'kormo', 'f2llmv2')", path_);
  }
  if (pre->type() != GgufValueType::STRING) {
    fail("{}: tokenizer.ggml.pre has type {}, expected a string", path_, gguf_value_type_name(pre->type()));
  }
  const std::string_view pre_name = pre->as_string();
  if (std::find(kQwen2PreNames.begin(), kQwen2PreNames.end(), pre_name) == kQwen2PreNames.end()) {
    fail("{}: tokenizer.ggml.pre = '{}' is not supported (supported pre-tokenizers: 'qwen2', "
         "'deepseek-r1-qwen', 'kormo', 'f2llmv2')", path_, pre_name);
  }
  load_vocabulary(file);
  load_merges(file);
  load_special_ids(file);
  detect_special_tokens_by_text();
  build_special_index();
  build_pieces();
  if (const GgufValue* t = file.find("tokenizer.chat_template"); t && t->type() == GgufValueType::STRING) {
    chat_template_ = std::string(t->as_string());
  }
}

void BpeTokenizer::load_vocabulary(const GgufFile& file) {
  const GgufValue& tokens = file.get("tokenizer.ggml.tokens");
  if (!tokens.is_array() || tokens.elem_type() != GgufValueType::STRING) {
    fail("{}: tokenizer.ggml.tokens must be an array of strings, found {}", path_, tokens.to_string(0));
  }
  if (tokens.size() == 0) fail("{}: tokenizer.ggml.tokens is empty", path_);
  if (tokens.size() >= (size_t)INT32_MAX / 2) fail("{}: tokenizer.ggml.tokens has too many entries ({})", path_, tokens.size());
  n_vocab_ = (int)tokens.size();

  const GgufValue* merges = file.find("tokenizer.ggml.merges");
  bpe_ = BpeModel((size_t)n_vocab_ + 256, merges && merges->is_array() ? merges->size() : 0);
  // Hash every text first, then insert with the slot of a later token prefetched: the index
  // is megabytes, and waiting on each probe's cache miss dominated the load time.
  std::deque<std::string> renamed;  // texts of empty tokens, renamed as llama.cpp does (stable)
  std::vector<std::string_view> texts((size_t)n_vocab_);
  std::vector<uint32_t> hashes((size_t)n_vocab_);
  for (int32_t i = 0; i < n_vocab_; ++i) {
    std::string_view text = tokens.str_at((size_t)i);
    if (text.empty()) {
      renamed.push_back(fmt::format("[EMPTY_{}]", i));
      text = renamed.back();
    }
    texts[(size_t)i] = text;
    hashes[(size_t)i] = BpeModel::hash_text(text);
  }
  for (int32_t i = 0; i < n_vocab_; ++i) {
    if (i + kPrefetchDistance < n_vocab_) bpe_.prefetch_symbol(hashes[(size_t)(i + kPrefetchDistance)]);
    const std::string_view text = texts[(size_t)i];
    if (const int32_t other = bpe_.find_symbol(text, hashes[(size_t)i]); other >= 0) {
      fail("{}: tokenizer.ggml.tokens: duplicate token '{}' at ids {} and {}", path_, text, other, i);
    }
    bpe_.add_symbol(text, hashes[(size_t)i]);
  }

  attrs_.assign((size_t)n_vocab_, kAttrNormal);
  if (const GgufValue* types = file.find("tokenizer.ggml.token_type")) {
    if (!types->is_array() || !(types->elem_type() == GgufValueType::INT32 || types->elem_type() == GgufValueType::UINT32 ||
                                types->elem_type() == GgufValueType::INT8 || types->elem_type() == GgufValueType::UINT8 ||
                                types->elem_type() == GgufValueType::INT16 || types->elem_type() == GgufValueType::UINT16 ||
                                types->elem_type() == GgufValueType::INT64 || types->elem_type() == GgufValueType::UINT64)) {
      fail("{}: tokenizer.ggml.token_type must be an array of integers, found {}", path_, types->to_string(0));
    }
    if (types->size() < (size_t)n_vocab_) {
      fail("{}: tokenizer.ggml.token_type has {} entries for {} tokens", path_, types->size(), n_vocab_);
    }
    if (types->elem_type() == GgufValueType::INT32) {
      const uint8_t* raw = types->raw_data();
      for (int32_t i = 0; i < n_vocab_; ++i) {
        int32_t t;
        std::memcpy(&t, raw + 4 * (size_t)i, 4);
        attrs_[(size_t)i] = attr_from_token_type(t);
      }
    } else {
      for (int32_t i = 0; i < n_vocab_; ++i) attrs_[(size_t)i] = attr_from_token_type(types->int_at((size_t)i));
    }
  }

  // BPE starts from one symbol per byte: the byte-level character of that byte.
  for (int b = 0; b < 256; ++b) {
    const std::string& ch = byte_level::byte_to_utf8((uint8_t)b);
    int32_t sym = bpe_.find_symbol(ch);
    if (sym < 0) sym = bpe_.add_symbol(ch);
    byte_symbol_[(size_t)b] = sym;
    const char raw = (char)b;
    const int32_t single = bpe_.find_symbol(std::string_view(&raw, 1));
    single_byte_token_[(size_t)b] = single < n_vocab_ ? single : -1;
  }
}

void BpeTokenizer::load_merges(const GgufFile& file) {
  const GgufValue& merges = file.get("tokenizer.ggml.merges");
  if (!merges.is_array() || merges.elem_type() != GgufValueType::STRING) {
    fail("{}: tokenizer.ggml.merges must be an array of strings, found {}", path_, merges.to_string(0));
  }
  // Three passes so that every hash-table probe can be prefetched well ahead of its use:
  // split and hash the rules, resolve the symbols, insert the rank entries.
  const size_t n = merges.size();
  struct Rule {
    std::string_view left, right;
    uint32_t left_hash, right_hash;
  };
  std::vector<Rule> rules;
  rules.reserve(n);
  std::vector<int32_t> ranks;
  ranks.reserve(n);
  for (size_t rank = 0; rank < n; ++rank) {
    const std::string_view rule = merges.str_at(rank);
    // "left right", split at the first space after the first byte (a part may not be empty).
    const size_t space = rule.size() > 1 ? rule.find(' ', 1) : std::string_view::npos;
    if (space == std::string_view::npos || space + 1 >= rule.size()) continue;  // can never apply
    const std::string_view left = rule.substr(0, space), right = rule.substr(space + 1);
    rules.push_back({left, right, BpeModel::hash_text(left), BpeModel::hash_text(right)});
    ranks.push_back((int32_t)rank);
  }
  auto symbol_of = [&](std::string_view text, uint32_t hash) {
    const int32_t id = bpe_.find_symbol(text, hash);
    return id >= 0 ? id : bpe_.add_symbol(text, hash);
  };
  struct Resolved {
    int32_t left, right, result;
  };
  std::vector<Resolved> resolved(rules.size());
  int32_t guess = -1;
  for (size_t i = 0; i < rules.size(); ++i) {
    if (i + kPrefetchDistance < rules.size()) {
      bpe_.prefetch_symbol(rules[i + kPrefetchDistance].left_hash);
      bpe_.prefetch_symbol(rules[i + kPrefetchDistance].right_hash);
    }
    const Rule& r = rules[i];
    const int32_t l = symbol_of(r.left, r.left_hash), rt = symbol_of(r.right, r.right_hash);
    // Vocabularies usually list merge results in merge order: try the token after the last
    // result before hashing the concatenation (the text comparison keeps this exact).
    int32_t result = -1;
    if (guess >= 0 && guess + 1 < bpe_.n_symbols()) {
      const std::string_view t = bpe_.symbol_text(guess + 1);
      if (t.size() == r.left.size() + r.right.size() && t.substr(0, r.left.size()) == r.left &&
          t.substr(r.left.size()) == r.right)
        result = guess + 1;
    }
    if (result < 0) result = bpe_.find_concat(r.left, r.right);
    if (result < 0) result = bpe_.add_symbol(std::string(r.left) + std::string(r.right));
    guess = result;
    resolved[i] = {l, rt, result};
  }
  for (size_t i = 0; i < resolved.size(); ++i) {
    if (i + kPrefetchDistance < resolved.size()) {
      bpe_.prefetch_merge(resolved[i + kPrefetchDistance].left, resolved[i + kPrefetchDistance].right);
    }
    bpe_.add_merge(resolved[i].left, resolved[i].right, resolved[i].result, ranks[i]);
  }
}

void BpeTokenizer::load_special_ids(const GgufFile& file) {
  // Defaults of llama.cpp for BPE vocabularies (disabled when out of range).
  bos_ = 11 < n_vocab_ ? 11 : -1;
  eos_ = 11 < n_vocab_ ? 11 : -1;
  auto read_id = [&](std::string_view key, int32_t& id) {
    const GgufValue* v = file.find(key);
    if (!v || !v->is_integer()) return;
    const int64_t x = v->as_int();
    if (x >= 0 && x < n_vocab_) id = (int32_t)x;  // out-of-range ids keep the default, as in llama.cpp
  };
  read_id("tokenizer.ggml.bos_token_id", bos_);
  read_id("tokenizer.ggml.eos_token_id", eos_);
  read_id("tokenizer.ggml.eot_token_id", eot_);
  read_id("tokenizer.ggml.eom_token_id", eom_);
  read_id("tokenizer.ggml.unknown_token_id", unk_);
  read_id("tokenizer.ggml.seperator_token_id", sep_);  // sic: the GGUF key is spelled this way
  read_id("tokenizer.ggml.padding_token_id", pad_);
  read_id("tokenizer.ggml.mask_token_id", mask_);
  read_id("tokenizer.ggml.fim_pre_token_id", fim_pre_);
  read_id("tokenizer.ggml.fim_suf_token_id", fim_suf_);
  read_id("tokenizer.ggml.fim_mid_token_id", fim_mid_);
  read_id("tokenizer.ggml.fim_pad_token_id", fim_pad_);
  read_id("tokenizer.ggml.fim_rep_token_id", fim_rep_);
  read_id("tokenizer.ggml.fim_sep_token_id", fim_sep_);
  read_id("tokenizer.ggml.prefix_token_id", fim_pre_);
  read_id("tokenizer.ggml.suffix_token_id", fim_suf_);
  read_id("tokenizer.ggml.middle_token_id", fim_mid_);
  if (const GgufValue* v = file.find("tokenizer.ggml.add_bos_token"); v && v->type() == GgufValueType::BOOL) {
    add_bos_ = v->as_bool();
  }
  if (add_bos_ && bos_ < 0) {
    fail("{}: tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set", path_);
  }
}

void BpeTokenizer::detect_special_tokens_by_text() {
  // llama.cpp walks its text -> id hash map here; the walk order only matters for vocabularies
  // with two candidates for the same role, which we resolve by the lower id.
  auto force_control = [&](int32_t id) { attrs_[(size_t)id] |= kAttrControl; };
  auto ids_with_text = [&](const std::set<std::string_view>& texts) {
    std::vector<int32_t> ids;
    for (std::string_view t : texts) {
      if (auto id = token_id(t)) ids.push_back(*id);
    }
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  auto detect = [&](const std::set<std::string_view>& texts, int32_t& role) {
    if (role >= 0) return;
    const std::vector<int32_t> ids = ids_with_text(texts);
    if (ids.empty()) return;
    role = ids.front();
    force_control(role);
  };
  detect(kEotTexts, eot_);
  detect(kEomTexts, eom_);
  detect(kFimPreTexts, fim_pre_);
  detect(kFimSufTexts, fim_suf_);
  detect(kFimMidTexts, fim_mid_);
  detect(kFimPadTexts, fim_pad_);
  detect(kFimRepTexts, fim_rep_);
  detect(kFimSepTexts, fim_sep_);

  for (int32_t id : {fim_pad_, fim_rep_, fim_sep_}) {
    if (id >= 0) eog_.insert(id);
  }
  for (int32_t id : ids_with_text(kEogTexts)) {
    eog_.insert(id);
    force_control(id);
  }
  // gpt-oss: these are always rendered, so llama.cpp makes them user-defined.
  for (std::string_view text : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    if (auto id = token_id(text)) attrs_[(size_t)*id] = kAttrUserDefined;
  }
  for (int32_t id : {eos_, eot_, eom_}) {
    if (id >= 0) eog_.insert(id);
  }
  // o200k_harmony / solar-open: "<|end|>" is not an end of generation when these exist.
  auto in_eog = [&](std::string_view text) {
    auto id = token_id(text);
    return id && eog_.count(*id) ? id : std::optional<int32_t>{};
  };
  if (auto end = in_eog("<|end|>");
      end && ((in_eog("<|return|>") && in_eog("<|call|>")) || (in_eog("<|calls|>") && in_eog("<|flush|>")))) {
    eog_.erase(*end);
    attrs_[(size_t)*end] = kAttrUserDefined;
  }
  // gemma4 / paddleocr: "</s>" is plain text next to "<|tool_response>".
  if (auto s = in_eog("</s>"); s && in_eog("<|tool_response>")) {
    eog_.erase(*s);
    attrs_[(size_t)*s] = kAttrNormal;
  }
}

void BpeTokenizer::build_special_index() {
  for (int32_t id = 0; id < n_vocab_; ++id) {
    if (attrs_[(size_t)id] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) specials_.push_back(id);
  }
  std::stable_sort(specials_.begin(), specials_.end(), [&](int32_t a, int32_t b) {
    return bpe_.symbol_text(a).size() > bpe_.symbol_text(b).size();
  });
  for (int32_t id : specials_) {
    const std::string_view text = bpe_.symbol_text(id);
    special_by_text_.emplace(text, id);
    auto& lengths = special_lengths_by_first_byte_[(uint8_t)text[0]];
    if (std::find(lengths.begin(), lengths.end(), (uint32_t)text.size()) == lengths.end()) {
      lengths.push_back((uint32_t)text.size());
    }
  }
}

void BpeTokenizer::build_pieces() {
  piece_offsets_.reserve((size_t)n_vocab_ + 1);
  piece_offsets_.push_back(0);
  piece_arena_.reserve((size_t)n_vocab_ * 8);
  for (int32_t id = 0; id < n_vocab_; ++id) {
    const uint8_t attr = attrs_[(size_t)id];
    const std::string_view text = bpe_.symbol_text(id);
    if (attr & (kAttrControl | kAttrUnknown | kAttrUserDefined)) {
      piece_arena_.append(text);
    } else if (attr & kAttrNormal) {
      // Each character of the token is the stand-in of one byte (GPT-2 byte-to-unicode).
      size_t pos = 0;
      while (pos < text.size()) {
        uint32_t cp = 0;
        if (!byte_level::decode_lenient(text, pos, cp)) {
          ++pos;
          cp = 0xFFFD;
        }
        const int b = byte_level::codepoint_to_byte(cp);
        if (b >= 0) {
          piece_arena_.push_back((char)b);
        } else {  // not a byte stand-in: llama.cpp writes this marker
          std::string utf8;
          append_utf8(utf8, cp);
          piece_arena_ += "[UNK_BYTE_0x";
          for (unsigned char c : utf8) piece_arena_ += fmt::format("{:02x}", c);
          piece_arena_.append(text);
          piece_arena_ += "]";
        }
      }
    } else if (attr & kAttrByte) {  // "<0xXX>"
      if (text.size() >= 5) {
        piece_arena_.push_back((char)std::strtol(std::string(text.substr(3, 2)).c_str(), nullptr, 16));
      }
    }
    // Unused or undefined tokens render as nothing.
    piece_offsets_.push_back((uint32_t)piece_arena_.size());
  }
}

std::vector<BpeTokenizer::Fragment> BpeTokenizer::partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({0, text.size(), -1});
  // Which special tokens occur anywhere? Usually none, and then the text stays one fragment.
  std::vector<int32_t> present;
  for (size_t pos = 0; pos < text.size(); ++pos) {
    const auto& lengths = special_lengths_by_first_byte_[(uint8_t)text[pos]];
    for (uint32_t len : lengths) {
      if (pos + len > text.size()) continue;
      auto it = special_by_text_.find(text.substr(pos, len));
      if (it == special_by_text_.end()) continue;
      const int32_t id = it->second;
      if (!parse_special && (attrs_[(size_t)id] & (kAttrControl | kAttrUnknown))) continue;
      if (std::find(present.begin(), present.end(), id) == present.end()) present.push_back(id);
    }
  }
  if (present.empty()) return frags;
  // llama.cpp's order: each special token, longest first, splits every remaining raw fragment
  // at all of its (non-overlapping, leftmost-first) occurrences.
  for (int32_t id : specials_) {
    if (std::find(present.begin(), present.end(), id) == present.end()) continue;
    const std::string_view special = bpe_.symbol_text(id);
    std::vector<Fragment> next;
    next.reserve(frags.size() + 4);
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.offset;
      const size_t end = f.offset + f.length;
      while (pos < end) {
        const size_t match = text.substr(0, end).find(special, pos);
        if (match == std::string_view::npos) break;
        if (match > pos) next.push_back({pos, match - pos, -1});
        next.push_back({match, special.size(), id});
        pos = match + special.size();
      }
      if (pos < end) next.push_back({pos, end - pos, -1});
    }
    frags = std::move(next);
  }
  return frags;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  WordCache cache;
  std::deque<std::string> normalized_keep;  // rewritten fragments; stable, the cache keys point in
  for (const Fragment& f : partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      continue;
    }
    std::string_view raw = text.substr(f.offset, f.length);
    if (!byte_level::is_strict_utf8(raw)) {
      normalized_keep.push_back(byte_level::normalize_like_llama(raw));
      raw = normalized_keep.back();
    }
    encode_raw(raw, cache, out);
  }
  return out;
}

void BpeTokenizer::encode_raw(std::string_view text, WordCache& cache, std::vector<int32_t>& out) const {
  // PCRE2 needs well-formed UTF-8; surrogates (which llama.cpp lets through) are matched as
  // U+FFFD, which is in the same class (neither letter, number nor space) and as long.
  std::string regex_view;
  std::string_view subject = text;
  for (size_t i = 0; i + 2 < text.size(); ++i) {
    if ((uint8_t)text[i] == 0xED && (uint8_t)text[i + 1] >= 0xA0) {
      if (regex_view.empty()) regex_view.assign(text);
      regex_view[i] = (char)0xEF;
      regex_view[i + 1] = (char)0xBF;
      regex_view[i + 2] = (char)0xBD;
      subject = regex_view;
    }
  }
  if (!cache.regex) cache.regex.emplace(pretokenizer_);
  pretokenizer_.split(subject, *cache.regex, [&](size_t offset, size_t length) {
    encode_word(text.substr(offset, length), cache, out);
  });
}

void BpeTokenizer::encode_word(std::string_view word, WordCache& cache, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    emit_symbol(byte_symbol_[(uint8_t)word[0]], out);
    return;
  }
  const uint32_t h = WordCache::hash_of(word);
  if (const WordCache::Slot* hit = cache.find(word, h)) {
    out.insert(out.end(), cache.ids.begin() + hit->first, cache.ids.begin() + hit->first + hit->count);
    return;
  }
  std::vector<int32_t>& syms = cache.scratch;
  syms.clear();
  for (unsigned char c : word) syms.push_back(byte_symbol_[c]);
  bpe_.merge_word(syms);
  const size_t before = out.size();
  for (int32_t s : syms) emit_symbol(s, out);
  if (cache.used < kWordCacheMaxEntries) {
    const uint32_t first = (uint32_t)cache.ids.size();
    cache.ids.insert(cache.ids.end(), out.begin() + (std::ptrdiff_t)before, out.end());
    cache.insert(word, h, first, (uint32_t)(out.size() - before));
  }
}

void BpeTokenizer::emit_symbol(int32_t sym, std::vector<int32_t>& out) const {
  if (sym < n_vocab_) {
    out.push_back(sym);
    return;
  }
  // A merge produced a string the vocabulary lacks: llama.cpp falls back to the tokens of its
  // single bytes (only those that exist as one-byte tokens).
  for (unsigned char c : bpe_.symbol_text(sym)) {
    if (single_byte_token_[c] >= 0) out.push_back(single_byte_token_[c]);
  }
}

std::string_view BpeTokenizer::piece_view(int32_t id, bool render_special) const {
  if (id < 0 || id >= n_vocab_) fail("{}: token id {} is out of range [0, {})", path_, id, n_vocab_);
  if (!render_special && (attrs_[(size_t)id] & (kAttrControl | kAttrUnknown))) return {};
  return std::string_view(piece_arena_.data() + piece_offsets_[(size_t)id],
                          piece_offsets_[(size_t)id + 1] - piece_offsets_[(size_t)id]);
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  std::string text;
  for (int32_t id : ids) text.append(piece_view(id, render_special));
  return text;
}

std::string BpeTokenizer::piece(int32_t id) const { return std::string(piece_view(id, true)); }

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  return std::make_unique<BpeTokenizer>(file);
}

// Streaming: hold back a trailing lead byte whose sequence is not complete yet.
std::string StreamDecoder::push(int32_t id) {
  const int32_t one[1] = {id};
  pending_ += tok_.decode(std::span<const int32_t>(one, 1), render_special_);
  const size_t n = pending_.size();
  size_t keep_from = n;
  // The last character starts at most 3 bytes before the end.
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const uint8_t b = (uint8_t)pending_[n - back];
    if (is_utf8_continuation(b)) continue;  // keep looking for the lead
    if (utf8_sequence_length(b) > (int)back) keep_from = n - back;
    break;
  }
  std::string ready = pending_.substr(0, keep_from);
  pending_.erase(0, keep_from);
  return ready;
}

std::string StreamDecoder::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace rl
