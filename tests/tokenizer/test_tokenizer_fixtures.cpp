// Tokenizer against llama.cpp: the reference tokenizations of the fixtures (model A with the
// full Qwen2 vocabulary, model B with its reduced vocabulary), detokenization and streaming.
#include <nlohmann/json.hpp>

#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "common/error.h"
#include "common/format.h"
#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace rl {
namespace {

using nlohmann::json;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json read_json(const std::string& path) { return json::parse(read_file(path)); }


std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

// A model's tokenizer, loaded once per test binary.
struct Loaded {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};
const Loaded& model(const std::string& name) {
  static std::map<std::string, Loaded> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    Loaded l;
    l.file = GgufFile::open(test::fixture(name));
    l.tok = Tokenizer::from_gguf(*l.file);
    it = cache.emplace(name, std::move(l)).first;
  }
  return it->second;
}

const char* kModelA = "tiny-qwen3next-iq2xxs.gguf";
const char* kModelB = "tiny-qwen3next-q4km.gguf";

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int n = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (int k = 1; k < n; ++k) {
      if (((unsigned char)s[i + k] & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

void expect_stream_equals_whole(const Tokenizer& tok, const std::vector<int32_t>& ids, bool render_special,
                                const std::string& label) {
  StreamDecoder stream(tok, render_special);
  std::string streamed;
  const std::string whole = tok.decode(ids, render_special);
  for (int32_t id : ids) {
    const std::string part = stream.push(id);
    if (is_valid_utf8(whole)) {
      EXPECT_TRUE(is_valid_utf8(part)) << label << ": streamed part " << to_hex(part);
    }
    streamed += part;
  }
  streamed += stream.flush();
  EXPECT_EQ(streamed, whole) << label;
}

TEST(TokenizerFixtures, LoadsModelAVocabulary) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelA));
  const Tokenizer& tok = *model(kModelA).tok;
  EXPECT_EQ(tok.n_vocab(), 151936);
  EXPECT_EQ(tok.bos_id(), 151643);
  EXPECT_EQ(tok.eos_id(), 151643);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.token_id("<|im_start|>"), 151644);
  EXPECT_EQ(tok.token_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok.token_id("[PAD151650]"), 151650);
  EXPECT_EQ(tok.token_id("no such token"), std::nullopt);
  EXPECT_TRUE(tok.is_eog(151643));
  EXPECT_TRUE(tok.is_eog(151645));
  EXPECT_FALSE(tok.is_eog(151644));
  EXPECT_TRUE(tok.is_control(151644));
  EXPECT_FALSE(tok.is_control(151650));  // user-defined, not control
  // `</s>` is a normal token in the file; llama.cpp makes it control (and end of generation).
  EXPECT_TRUE(tok.is_control(128247));
  EXPECT_TRUE(tok.is_eog(128247));
  EXPECT_FALSE(tok.is_control(9707));
  EXPECT_NE(tok.chat_template().find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(tok.piece(9707), "Hello");
  EXPECT_EQ(tok.piece(151644), "<|im_start|>");
}

TEST(TokenizerFixtures, ReferenceCasesMatchLlamaCpp) {
  const std::string path = test::fixture("tiny-qwen3next-iq2xxs.tokens.json");
  RL_REQUIRE_FIXTURE(path);
  RL_REQUIRE_FIXTURE(test::fixture(kModelA));
  const Tokenizer& tok = *model(kModelA).tok;
  const json ref = read_json(path);
  ASSERT_EQ(ref["cases"].size(), 32u);
  for (const json& c : ref["cases"]) {
    const std::string text = c["text"];
    ASSERT_EQ(to_hex(text), c["text_utf8_hex"].get<std::string>());
    for (bool special : {false, true}) {
      const std::string sfx = special ? "true" : "false";
      const std::string label = "case " + std::to_string(c["id"].get<int>()) + " parse_special=" + sfx;
      const std::vector<int32_t> want = c["ids_parse_special_" + sfx];
      const std::vector<int32_t> got = tok.encode(text, special);
      EXPECT_EQ(ids_str(got), ids_str(want)) << label << " text: " << text;
      // Pieces (control tokens as their text) and llama_detokenize of the reference ids.
      const std::vector<std::string> pieces_hex = c["pieces_hex_parse_special_" + sfx];
      ASSERT_EQ(pieces_hex.size(), want.size()) << label;
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(to_hex(tok.piece(want[i])), pieces_hex[i]) << label << " token " << i;
      EXPECT_EQ(tok.decode(want, true), c["detokenized_parse_special_" + sfx].get<std::string>()) << label;
      EXPECT_EQ(tok.decode(got, true), text) << label << ": round trip";
      expect_stream_equals_whole(tok, want, true, label);
      expect_stream_equals_whole(tok, want, false, label);
    }
  }
}

// The 46 cases of llama.cpp's models/ggml-vocab-qwen2.gguf.inp/.out (parse_special = false).
TEST(TokenizerFixtures, LlamaCppVocabTestCases) {
  const std::string inp = test::fixture("qwen2-vocab-tokenizer-tests.inp");
  const std::string outp = test::fixture("qwen2-vocab-tokenizer-tests.out");
  RL_REQUIRE_FIXTURE(inp);
  RL_REQUIRE_FIXTURE(outp);
  RL_REQUIRE_FIXTURE(test::fixture(kModelA));
  const Tokenizer& tok = *model(kModelA).tok;
  const std::string all = read_file(inp);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0;;) {
    const size_t at = all.find(sep, pos);
    if (at == std::string::npos) break;
    texts.push_back(all.substr(pos, at - pos));
    pos = at + sep.size();
  }
  std::vector<std::vector<int32_t>> expected;
  std::istringstream lines(read_file(outp));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream ids(line);
    std::vector<int32_t> v;
    for (int32_t id; ids >> id;) v.push_back(id);
    expected.push_back(v);
  }
  ASSERT_EQ(texts.size(), 46u);
  ASSERT_EQ(expected.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(ids_str(tok.encode(texts[i], false)), ids_str(expected[i])) << "case " << i << ": " << texts[i];
    EXPECT_EQ(tok.decode(expected[i]), texts[i]) << "case " << i;
  }
}

void check_reference_prompts(const char* model_name, const char* ref_name, size_t min_prompts) {
  const std::string ref_path = test::fixture(ref_name);
  RL_REQUIRE_FIXTURE(ref_path);
  RL_REQUIRE_FIXTURE(test::fixture(model_name));
  const Tokenizer& tok = *model(model_name).tok;
  const json ref = read_json(ref_path);
  ASSERT_GE(ref["prompts"].size(), min_prompts);
  for (const json& p : ref["prompts"]) {
    const std::string text = p["text"];
    const bool special = p["parse_special"];
    const std::vector<int32_t> want = p["token_ids"];
    const std::vector<int32_t> got = tok.encode(text, special);
    EXPECT_EQ(ids_str(got), ids_str(want)) << ref_name << " prompt " << p["name"];
    EXPECT_EQ(tok.decode(got), text) << ref_name << " prompt " << p["name"] << ": round trip";
    expect_stream_equals_whole(tok, got, true, p["name"]);
  }
}

TEST(TokenizerFixtures, ModelAPromptsMatchReference) {
  check_reference_prompts(kModelA, "tiny-qwen3next-iq2xxs.ref-f32.json", 7);
}

TEST(TokenizerFixtures, ModelBReducedVocabularyPromptsMatchReference) {
  check_reference_prompts(kModelB, "tiny-qwen3next-q4km.ref-f32.json", 7);
  RL_REQUIRE_FIXTURE(test::fixture(kModelB));
  const Tokenizer& tok = *model(kModelB).tok;
  EXPECT_EQ(tok.n_vocab(), 4099);
  EXPECT_EQ(tok.token_id("<|im_start|>"), 4097);
  EXPECT_TRUE(tok.is_eog(4098));
  EXPECT_TRUE(tok.is_control(4096));
}

// A random string of well-formed UTF-8 drawn from scripts, symbols and white space that
// exercise every branch of the pre-tokenizer.
std::string random_utf8(std::mt19937& rng, size_t n_chars) {
  static const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x20, 0x7E}, {0x20, 0x7E}, {0x20, 0x7E}, {0x09, 0x0D}, {0x00, 0x1F}, {0x80, 0xFF},
      {0x100, 0x24F}, {0x370, 0x3FF}, {0x400, 0x4FF}, {0x590, 0x6FF}, {0x900, 0x97F},
      {0x2000, 0x206F}, {0x3000, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0xFF00, 0xFFEF},
      {0x1F300, 0x1F6FF}, {0x1F900, 0x1F9FF}, {0x10000, 0x10FFFF}};
  std::string s;
  for (size_t i = 0; i < n_chars; ++i) {
    const auto [lo, hi] = ranges[std::uniform_int_distribution<size_t>(0, ranges.size() - 1)(rng)];
    uint32_t cp = std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    if (cp < 0x80) {
      s.push_back((char)cp);
    } else if (cp < 0x800) {
      s.push_back((char)(0xC0 | (cp >> 6)));
      s.push_back((char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      s.push_back((char)(0xE0 | (cp >> 12)));
      s.push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
      s.push_back((char)(0x80 | (cp & 0x3F)));
    } else {
      s.push_back((char)(0xF0 | (cp >> 18)));
      s.push_back((char)(0x80 | ((cp >> 12) & 0x3F)));
      s.push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
      s.push_back((char)(0x80 | (cp & 0x3F)));
    }
  }
  return s;
}

TEST(TokenizerFixtures, RandomUtf8RoundTripsAndStreams) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelA));
  RL_REQUIRE_FIXTURE(test::fixture(kModelB));
  for (const char* name : {kModelA, kModelB}) {
    const Tokenizer& tok = *model(name).tok;
    std::mt19937 rng(1234);
    for (int iter = 0; iter < 300; ++iter) {
      const std::string text = random_utf8(rng, std::uniform_int_distribution<size_t>(0, 80)(rng));
      for (bool special : {false, true}) {
        const std::vector<int32_t> ids = tok.encode(text, special);
        ASSERT_EQ(tok.decode(ids), text) << name << " iter " << iter << " hex " << to_hex(text);
        for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.n_vocab());
        expect_stream_equals_whole(tok, ids, true, "random");
      }
    }
  }
}

// Invalid UTF-8 is tokenized as llama.cpp does: each bad byte becomes U+FFFD.
TEST(TokenizerFixtures, InvalidUtf8BecomesReplacementCharacter) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelA));
  const Tokenizer& tok = *model(kModelA).tok;
  EXPECT_EQ(tok.encode("a\xff" "b", false), tok.encode("a\xef\xbf\xbd" "b", false));
  EXPECT_EQ(tok.encode("\xe4\xb8", false), tok.encode("\xef\xbf\xbd\xef\xbf\xbd", false));
  // Several rewritten fragments whose words repeat (the word cache keys point into them).
  EXPECT_EQ(tok.encode("\xff ab<|im_end|>\xfe ab<|im_end|>\xfd ab", true),
            tok.encode("\xef\xbf\xbd ab<|im_end|>\xef\xbf\xbd ab<|im_end|>\xef\xbf\xbd ab", true));
  // An overlong '/' is the code point '/' to llama.cpp.
  EXPECT_EQ(tok.encode("x\xc0\xafy", false), tok.encode("x/y", false));
}

// CPU seconds of this thread (time the scheduler gave to other work does not count).
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// CPU seconds tok.encode(text) takes (it runs on the calling thread), the best of three runs;
// `ids` receives the tokens.
double encode_seconds(const Tokenizer& tok, const std::string& text, std::vector<int32_t>& ids) {
  double best = INFINITY;
  for (int run = 0; run < 3; run++) {
    const double t0 = thread_cpu_seconds();
    ids = tok.encode(text, true);
    best = std::min(best, thread_cpu_seconds() - t0);
  }
  return best;
}

// Long runs are one word (or one regex match) each. Each kind of run is encoded at n and 8n bytes:
// the linear stages (with the merge heap's log n and the caches) measured 9.6-13x the CPU time for 8x
// the bytes on the dev machine, a quadratic stage takes 64x; more than 32x (plus 2 ms for the
// clock at short times) fails. A ratio of the thread's CPU time, which neither a slow nor a busy
// machine changes much.
TEST(TokenizerFixtures, LongRunsStayLinear) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelA));
  const Tokenizer& tok = *model(kModelA).tok;
  auto cjk = [](size_t bytes) {
    std::string s;
    for (size_t i = 0; i < bytes / 3; ++i) s += (i % 7 == 0) ? "\u4e2d" : "\u6587";
    return s;
  };
  const std::vector<std::pair<std::string, std::function<std::string(size_t)>>> runs = {
      {"letters", [](size_t n) { return std::string(n, 'a'); }},
      {"spaces then a letter", [](size_t n) { return std::string(n, ' ') + "x"; }},
      {"newlines", [](size_t n) { return std::string(n, '\n'); }},
      {"spaces, tabs, CRLF", [](size_t n) { return std::string(n / 2, ' ') + std::string(n / 2, '\t') + "\r\n"; }},
      {"CJK", cjk},
      {"punctuation", [](size_t n) { return std::string(n, '!'); }},
      {"invalid bytes", [](size_t n) { return std::string(n, '\xff'); }}};
  constexpr size_t kShort = 37500, kLong = 8 * kShort;
  for (const auto& [name, make] : runs) {
    SCOPED_TRACE(name);
    const std::string short_text = make(kShort), long_text = make(kLong);
    std::vector<int32_t> ids;
    const double t_short = encode_seconds(tok, short_text, ids);
    EXPECT_FALSE(ids.empty());
    const double t_long = encode_seconds(tok, long_text, ids);
    EXPECT_FALSE(ids.empty());
    if (long_text[0] != '\xff') {
      EXPECT_EQ(tok.decode(ids), long_text);
    }
    std::printf("%-22s %6zu bytes %7.2f ms, %6zu bytes %7.2f ms (x%.1f)\n", name.c_str(), short_text.size(),
                t_short * 1e3, long_text.size(), t_long * 1e3, t_long / t_short);
    EXPECT_LT(t_long, 32 * t_short + 0.002) << "8x the input took " << t_long / t_short << "x the time";
  }
  // 300,000 'a': the 96-letter case of the fixture is 12 tokens of 8 letters (id 69440).
  const std::vector<int32_t> a = tok.encode(std::string(300000, 'a'), false);
  EXPECT_EQ(a.size(), 300000u / 8);
  EXPECT_EQ(a.front(), 69440);
}

TEST(TokenizerFixtures, DecodeWithoutSpecialRendering) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelA));
  const Tokenizer& tok = *model(kModelA).tok;
  const std::vector<int32_t> ids = tok.encode("<|im_start|>user\nHi [PAD151650]<|im_end|>", true);
  EXPECT_EQ(tok.decode(ids, true), "<|im_start|>user\nHi [PAD151650]<|im_end|>");
  // Control tokens vanish; user-defined tokens are text.
  EXPECT_EQ(tok.decode(ids, false), "user\nHi [PAD151650]");
  EXPECT_THROW(tok.decode(std::vector<int32_t>{151936}), Error);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{-1}), Error);
}

TEST(TokenizerFixtures, StreamDecoderHoldsIncompleteCharacters) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelA));
  const Tokenizer& tok = *model(kModelA).tok;
  // "🙂" is split over byte tokens by the vocabulary: check that no partial bytes come out.
  const std::vector<int32_t> ids = tok.encode("a🙂b中", false);
  StreamDecoder stream(tok);
  std::string out;
  for (int32_t id : ids) {
    const std::string part = stream.push(id);
    EXPECT_TRUE(is_valid_utf8(part)) << to_hex(part);
    out += part;
  }
  EXPECT_EQ(stream.flush(), "");
  EXPECT_EQ(out, "a🙂b中");
  // An incomplete character at the end comes out of flush() as-is. The byte-level stand-ins
  // of bytes E4 and B8 are U+00E4 and U+00B8, tokens of one byte each.
  const auto e4 = tok.token_id("\xc3\xa4"), b8 = tok.token_id("\xc2\xb8");
  ASSERT_TRUE(e4 && b8);
  StreamDecoder tail(tok);
  EXPECT_EQ(tail.push(*e4), "");
  EXPECT_EQ(tail.push(*b8), "");
  EXPECT_EQ(tail.flush(), "\xe4\xb8");
  EXPECT_EQ(tail.push(tok.encode("x", false).front()), "x");
}

}  // namespace
}  // namespace rl
