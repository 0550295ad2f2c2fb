// Model-free tokenizer tests: a tiny vocabulary written as a GGUF image in memory, the
// pre-tokenizer's splits, the two merge loops, byte-level helpers and the load errors.
#include <random>

#include "common/error.h"
#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace rl {
namespace {

// Writes a GGUF v3 image with metadata only (no tensors).
class GgufImage {
 public:
  void add_string(const std::string& key, const std::string& v) {
    begin(key, 8);
    str(v);
  }
  void add_u32(const std::string& key, uint32_t v) {
    begin(key, 4);
    u32(v);
  }
  void add_bool(const std::string& key, bool v) {
    begin(key, 7);
    kv_.push_back(v ? 1 : 0);
  }
  void add_strings(const std::string& key, const std::vector<std::string>& v) {
    begin(key, 9);
    u32(8);
    u64(v.size());
    for (const auto& s : v) str(s);
  }
  void add_i32s(const std::string& key, const std::vector<int32_t>& v) {
    begin(key, 9);
    u32(5);
    u64(v.size());
    for (int32_t x : v) u32((uint32_t)x);
  }
  std::vector<uint8_t> bytes() const {
    GgufImage h;
    h.kv_ = {'G', 'G', 'U', 'F'};
    h.u32(3);
    h.u64(0);  // tensors
    h.u64(n_kv_);
    std::vector<uint8_t> out = h.kv_;
    out.insert(out.end(), kv_.begin(), kv_.end());
    return out;
  }

 private:
  void begin(const std::string& key, uint32_t type) {
    ++n_kv_;
    str(key);
    u32(type);
  }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) kv_.push_back((uint8_t)(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) kv_.push_back((uint8_t)(v >> (8 * i)));
  }
  void str(const std::string& s) {
    u64(s.size());
    kv_.insert(kv_.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
};

// A byte-level vocabulary: the 256 byte characters, a few merges and special tokens.
struct TinyVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges = {"a b", "ab c", "x y", "Ġ a"};
  std::string model = "gpt2", pre = "qwen2";
  bool with_pre = true, with_merges = true, with_tokens = true;

  TinyVocab() {
    for (int b = 0; b < 256; ++b) add(byte_level::byte_to_utf8((uint8_t)b), 1);
    add("ab", 1);
    add("abc", 1);
    add("Ġa", 1);
    add("<|endoftext|>", 3);
    add("<|im_end|>", 3);
    add("<tool_call>", 4);
    add("AB", 4);
    add("BCD", 4);
    add("</s>", 1);  // a normal token that llama.cpp turns into a control token
  }
  void add(const std::string& t, int32_t type) {
    tokens.push_back(t);
    types.push_back(type);
  }
  int32_t id(const std::string& t) const {
    return (int32_t)(std::find(tokens.begin(), tokens.end(), t) - tokens.begin());
  }
  std::vector<uint8_t> image() const {
    GgufImage g;
    g.add_string("general.architecture", "qwen3next");
    g.add_string("tokenizer.ggml.model", model);
    if (with_pre) g.add_string("tokenizer.ggml.pre", pre);
    if (with_tokens) g.add_strings("tokenizer.ggml.tokens", tokens);
    g.add_i32s("tokenizer.ggml.token_type", types);
    if (with_merges) g.add_strings("tokenizer.ggml.merges", merges);
    g.add_u32("tokenizer.ggml.eos_token_id", (uint32_t)id("<|endoftext|>"));
    g.add_bool("tokenizer.ggml.add_bos_token", false);
    g.add_string("tokenizer.chat_template", "{{ messages }}");
    return g.bytes();
  }
};

struct TinyLoaded {
  std::vector<uint8_t> bytes;
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};
TinyLoaded load(const TinyVocab& v) {
  TinyLoaded l;
  l.bytes = v.image();
  l.file = GgufFile::from_bytes(l.bytes, "tiny.gguf");
  l.tok = Tokenizer::from_gguf(*l.file);
  return l;
}

std::string error_of(const TinyVocab& v) {
  try {
    load(v);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenizerTiny, MergesByRank) {
  const TinyVocab v;
  const TinyLoaded l = load(v);
  const Tokenizer& tok = *l.tok;
  EXPECT_EQ(tok.n_vocab(), (int)v.tokens.size());
  EXPECT_EQ(tok.encode("abc", false), std::vector<int32_t>{v.id("abc")});
  EXPECT_EQ(tok.encode("ab", false), std::vector<int32_t>{v.id("ab")});
  EXPECT_EQ(tok.encode("cab", false), (std::vector<int32_t>{v.id("c"), v.id("ab")}));
  // " a" is one word (a space joins the letters after it) and merges to "Ġa".
  EXPECT_EQ(tok.encode("c a", false), (std::vector<int32_t>{v.id("c"), v.id("Ġa")}));
  // "x y" merges to "xy", which the vocabulary lacks: llama.cpp falls back to the single bytes.
  EXPECT_EQ(tok.encode("xy", false), (std::vector<int32_t>{v.id("x"), v.id("y")}));
  EXPECT_EQ(tok.decode(tok.encode("abc xy", false)), "abc xy");
  EXPECT_EQ(tok.chat_template(), "{{ messages }}");
  EXPECT_EQ(tok.eos_id(), v.id("<|endoftext|>"));
  EXPECT_TRUE(tok.is_eog(v.id("<|endoftext|>")));
  EXPECT_TRUE(tok.is_eog(v.id("<|im_end|>")));
}

TEST(TokenizerTiny, SpecialTokens) {
  const TinyVocab v;
  const TinyLoaded l = load(v);
  const Tokenizer& tok = *l.tok;
  const int32_t eot = v.id("<|endoftext|>"), tool = v.id("<tool_call>"), s = v.id("</s>");
  // Control tokens only with parse_special; user-defined tokens always.
  EXPECT_EQ(tok.encode("<|endoftext|>", true), std::vector<int32_t>{eot});
  EXPECT_NE(tok.encode("<|endoftext|>", false), std::vector<int32_t>{eot});
  EXPECT_EQ(tok.encode("<tool_call>", false), std::vector<int32_t>{tool});
  EXPECT_EQ(tok.encode("<tool_call>", true), std::vector<int32_t>{tool});
  // "</s>" is normal in the file but control by its look.
  EXPECT_TRUE(tok.is_control(s));
  EXPECT_TRUE(tok.is_eog(s));
  EXPECT_EQ(tok.encode("</s>", true), std::vector<int32_t>{s});
  EXPECT_NE(tok.encode("</s>", false), std::vector<int32_t>{s});
  EXPECT_EQ(tok.decode(std::vector<int32_t>{s}, false), "");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{s}, true), "</s>");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{tool}, false), "<tool_call>");
  // Longest special token first (not leftmost first): "BCD" wins over the earlier "AB".
  EXPECT_EQ(tok.encode("ABCD", false), (std::vector<int32_t>{v.id("A"), v.id("BCD")}));
  EXPECT_EQ(tok.encode("ABAB", false), (std::vector<int32_t>{v.id("AB"), v.id("AB")}));
  EXPECT_EQ(tok.encode("xAB<|endoftext|>AB", true),
            (std::vector<int32_t>{v.id("x"), v.id("AB"), eot, v.id("AB")}));
}

TEST(TokenizerTiny, UnsupportedModelOrPreTokenizerIsAnError) {
  TinyVocab v;
  v.model = "llama";
  std::string e = error_of(v);
  EXPECT_NE(e.find("tiny.gguf"), std::string::npos) << e;
  EXPECT_NE(e.find("tokenizer.ggml.model"), std::string::npos) << e;
  EXPECT_NE(e.find("'llama'"), std::string::npos) << e;
  EXPECT_NE(e.find("gpt2"), std::string::npos) << e;

  v = TinyVocab();
  v.pre = "llama-bpe";
  e = error_of(v);
  EXPECT_NE(e.find("tokenizer.ggml.pre"), std::string::npos) << e;
  EXPECT_NE(e.find("'llama-bpe'"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen2"), std::string::npos) << e;

  v = TinyVocab();
  v.with_pre = false;
  e = error_of(v);
  EXPECT_NE(e.find("tokenizer.ggml.pre"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;

  v = TinyVocab();
  v.with_tokens = false;
  e = error_of(v);
  EXPECT_NE(e.find("tokenizer.ggml.tokens"), std::string::npos) << e;

  v = TinyVocab();
  v.with_merges = false;
  e = error_of(v);
  EXPECT_NE(e.find("tokenizer.ggml.merges"), std::string::npos) << e;

  v = TinyVocab();
  v.add("abc", 1);
  e = error_of(v);
  EXPECT_NE(e.find("duplicate token 'abc'"), std::string::npos) << e;
}

std::vector<std::string> split(std::string_view text) {
  static const Pretokenizer pre;
  std::vector<std::string> words;
  pre.split(text, [&](size_t off, size_t len) { words.emplace_back(text.substr(off, len)); });
  return words;
}

using Words = std::vector<std::string>;

TEST(Pretokenizer, SplitsLikeQwen2Regex) {
  EXPECT_EQ(split("Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(split("I'm they'RE"), (Words{"I", "'m", " they", "'RE"}));
  EXPECT_EQ(split("abc 123"), (Words{"abc", " ", "1", "2", "3"}));
  EXPECT_EQ(split("a  b"), (Words{"a", " ", " b"}));
  EXPECT_EQ(split("x = (y);\n\nz"), (Words{"x", " =", " (", "y", ");\n\n", "z"}));
  EXPECT_EQ(split("a \n\n b"), (Words{"a", " \n\n", " b"}));
  EXPECT_EQ(split("end   "), (Words{"end", "   "}));
  EXPECT_EQ(split("\tfoo"), (Words{"\tfoo"}));
  // Non-ASCII white space: U+00A0 and U+3000 are spaces, U+200B (zero width) is not.
  EXPECT_EQ(split("a\u00a0b"), (Words{"a", "\u00a0b"}));
  EXPECT_EQ(split("a\u3000\u3000b"), (Words{"a", "\u3000", "\u3000b"}));
  EXPECT_EQ(split("a\u200bb"), (Words{"a", "\u200bb"}));
  // Letters include CJK; combining marks are not letters.
  EXPECT_EQ(split("中文字符"), (Words{"中文字符"}));
  // A mark may lead a word as the optional non-letter: "ि" + "न".
  EXPECT_EQ(split("हिन्दी"), (Words{"ह", "िन", "्द", "ी"}));
  // U+00B2 (superscript two) is a number, one per word.
  EXPECT_EQ(split("x²²"), (Words{"x", "²", "²"}));
  EXPECT_EQ(split(""), Words{});
  // Unicode 15.x letters and numbers (llama.cpp's tables are 15.1): CJK Extension I U+2EBF0 is
  // a letter, Kaktovik numeral U+1D2C1 a number.
  EXPECT_EQ(split("x\U0002EBF0y"), (Words{"x\U0002EBF0y"}));
  EXPECT_EQ(split("a\U0001D2C1\U0001D2C2"), (Words{"a", "\U0001D2C1", "\U0001D2C2"}));
}

TEST(Pretokenizer, UsesJitWhenAvailable) {
  const Pretokenizer pre;
  // Informational: PCRE2 on this platform should JIT; the interpreter gives the same words.
  if (!pre.jit_enabled()) GTEST_SKIP() << "PCRE2 JIT not available here (interpreter in use)";
  SUCCEED();
}

// The quadratic and the heap merge loops must agree on every word, including long ones.
TEST(BpeModel, ShortAndLongMergeLoopsAgree) {
  std::mt19937 rng(7);
  BpeModel bpe;
  std::vector<std::string> texts;
  for (char c = 'a'; c <= 'e'; ++c) {
    texts.push_back(std::string(1, c));
    bpe.add_symbol(texts.back());
  }
  // Random merge rules between existing symbols, in rank order.
  for (int rank = 0; rank < 60; ++rank) {
    const int32_t l = (int32_t)(rng() % texts.size()), r = (int32_t)(rng() % texts.size());
    const std::string joined = texts[(size_t)l] + texts[(size_t)r];
    if (joined.size() > 6) continue;
    int32_t res = bpe.find_symbol(joined);
    if (res < 0) {
      res = bpe.add_symbol(joined);
      texts.push_back(joined);
    }
    bpe.add_merge(l, r, res, rank);
  }
  ASSERT_GT(bpe.n_merges(), 20u);
  for (int iter = 0; iter < 2000; ++iter) {
    const size_t n = 1 + rng() % BpeModel::kShortWordMax;  // the short loop hands longer words on
    std::vector<int32_t> word(n);
    for (auto& s : word) s = (int32_t)(rng() % 5);
    std::vector<int32_t> a = word, b = word;
    bpe.merge_word_short(a);
    bpe.merge_word_long(b);
    ASSERT_EQ(a, b) << "iter " << iter;
    std::string joined_in, joined_out;
    for (int32_t s : word) joined_in += bpe.symbol_text(s);
    for (int32_t s : a) joined_out += bpe.symbol_text(s);
    ASSERT_EQ(joined_in, joined_out);
  }
}

TEST(BpeModel, LowestRankFirstLeftmostAmongEquals) {
  BpeModel bpe;
  const int32_t a = bpe.add_symbol("a"), b = bpe.add_symbol("b");
  const int32_t aa = bpe.add_symbol("aa"), ab = bpe.add_symbol("ab");
  bpe.add_merge(a, b, ab, 0);
  bpe.add_merge(a, a, aa, 1);
  bpe.add_merge(a, a, bpe.add_symbol("x"), 5);  // a duplicate rule: the first one stays
  std::vector<int32_t> w = {a, a, a, b};  // "aaab": "ab" (rank 0) first, then "aa"
  bpe.merge_word(w);
  EXPECT_EQ(w, (std::vector<int32_t>{aa, ab}));
  w = {a, a, a};  // leftmost pair first: "aa" + "a"
  bpe.merge_word(w);
  EXPECT_EQ(w, (std::vector<int32_t>{aa, a}));
}

TEST(ByteLevel, MappingIsGpt2s) {
  EXPECT_EQ(byte_level::byte_to_codepoint('A'), (uint32_t)'A');
  EXPECT_EQ(byte_level::byte_to_codepoint(' '), 0x120u);   // "Ġ"
  EXPECT_EQ(byte_level::byte_to_codepoint('\n'), 0x10Au);  // "Ċ"
  EXPECT_EQ(byte_level::byte_to_codepoint(0xAD), 0x143u);  // the last substitute
  for (int b = 0; b < 256; ++b) EXPECT_EQ(byte_level::codepoint_to_byte(byte_level::byte_to_codepoint((uint8_t)b)), b);
  EXPECT_EQ(byte_level::codepoint_to_byte(0x144), -1);
}

TEST(ByteLevel, NormalizesLikeLlamaCpp) {
  EXPECT_TRUE(byte_level::is_strict_utf8("héllo 中文 🙂"));
  EXPECT_FALSE(byte_level::is_strict_utf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(byte_level::is_strict_utf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(byte_level::is_strict_utf8("\xf4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(byte_level::is_strict_utf8("\xe4\xb8"));          // truncated
  EXPECT_EQ(byte_level::normalize_like_llama("a\xff" "b"), "a\xef\xbf\xbd" "b");
  EXPECT_EQ(byte_level::normalize_like_llama("\xc0\xaf"), "/");
  EXPECT_EQ(byte_level::normalize_like_llama("\xed\xa0\x80"), "\xed\xa0\x80");
  EXPECT_EQ(byte_level::normalize_like_llama("\xe4\xb8"), "\xef\xbf\xbd\xef\xbf\xbd");
}

TEST(TokenizerTiny, SurrogatesAndInvalidBytesRoundTripAsLlamaSeesThem) {
  const TinyVocab v;
  const TinyLoaded l = load(v);
  // A surrogate passes through as its three bytes (llama.cpp keeps it); no crash in PCRE2.
  EXPECT_EQ(l.tok->decode(l.tok->encode("x\xed\xa0\x80y", false)), "x\xed\xa0\x80y");
  EXPECT_EQ(l.tok->decode(l.tok->encode("x\xffy", false)), "x\xef\xbf\xbdy");
}

}  // namespace
}  // namespace rl
