// Tokenizer speed: vocabulary load to first token, and encoding of a 1 MiB mixed text (prose,
// code, CJK, emoji, whitespace runs) on one core. Uses model A's full Qwen2 vocabulary.
//   bench_tokenizer [--benchmark_filter=...]   (fixtures: REDLITE_FIXTURES or ../shared/fixtures)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string model_path() {
  const char* dir = std::getenv("REDLITE_FIXTURES");
  const std::string base = dir && *dir ? dir : std::string(REDLITE_SOURCE_DIR) + "/../shared/fixtures";
  return base + "/tiny-qwen3next-iq2xxs.gguf";
}

// Snippets of the kinds of text a chat model sees. Each is used with varying numbers and
// made-up identifiers mixed in, so the text is not one paragraph repeated.
const char* const kSnippets[] = {
    "The quick brown fox jumps over the lazy dog. It wasn't the first time; they'd seen it before.\n",
    "In 2026 the committee reviewed 1,234 proposals and accepted 87 of them (7.05%).\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n",
    "#include <stdio.h>\nint main(void) {\n\tfor (int i = 0; i < 10; ++i) printf(\"%d\\n\", i);\n\treturn 0;\n}\n",
    "{\"name\": \"redlite\", \"version\": [0, 1, 0], \"tags\": [\"moe\", \"cuda\"], \"ok\": true}\n",
    "中文分词测试：今天天气很好，我们去公园散步吧。人工智能正在改变世界。\n",
    "日本語のテキスト、カタカナとひらがな。東京都は日本の首都です。\n",
    "한국어 문장입니다. 안녕하세요! 오늘 날씨가 좋네요.\n",
    "Emoji: 🙂😀🎉👍🏽 👨\u200d👩\u200d👧\u200d👦 🇫🇷 ❤️ ✨ 🚀\n",
    "Русский текст и Ελληνικά γράμματα, עברית, العربية, हिन्दी.\n",
    "        indented    with     runs\t\tof\t whitespace   \n\n\n   \r\n",
    "Ünïcödé àccénts: café, naïve, façade, Ångström, Straße — “quotes” and ‘apostrophes’.\n",
    "https://example.com/path?query=value&x=1#frag user@example.org 0x7fff 1e-6 3.14159\n",
    "    let mut total: u64 = 0;\n    for item in items.iter().filter(|x| x.valid) { total += item.cost; }\n",
    "| column | value |\n|---|---|\n| alpha | 0.125 |\n| beta | 42 |\n",
};

// Deterministic text of at least `bytes` bytes (a fixed linear congruential sequence).
std::string build_mixed_text(size_t bytes) {
  std::string text;
  text.reserve(bytes + 4096);
  uint64_t state = 0x2545F4914F6CDD1Dull;
  auto next = [&]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(state >> 33);
  };
  const size_t n_snippets = sizeof(kSnippets) / sizeof(kSnippets[0]);
  while (text.size() < bytes) {
    text += kSnippets[next() % n_snippets];
    // A made-up identifier and a number, so words vary across the text.
    std::string word;
    const int len = 3 + (int)(next() % 9);
    for (int i = 0; i < len; ++i) word.push_back((char)('a' + next() % 26));
    text += (next() % 2 ? " " : "_") + word + " " + std::to_string(next() % 100000) + "\n";
  }
  return text;
}

void BM_LoadToFirstToken(benchmark::State& state) {
  const std::string path = model_path();
  if (!std::filesystem::exists(path)) {
    state.SkipWithError(("fixture not found: " + path).c_str());
    return;
  }
  for (auto _ : state) {
    auto file = rl::GgufFile::open(path);
    auto tok = rl::Tokenizer::from_gguf(*file);
    auto ids = tok->encode("Hello", false);
    benchmark::DoNotOptimize(ids.data());
  }
}
BENCHMARK(BM_LoadToFirstToken)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// The GGUF parse alone (mapping, metadata, the 151,936 + 151,387 strings), to see what part of
// the load is the tokenizer's own.
void BM_GgufOpenOnly(benchmark::State& state) {
  const std::string path = model_path();
  if (!std::filesystem::exists(path)) {
    state.SkipWithError(("fixture not found: " + path).c_str());
    return;
  }
  for (auto _ : state) {
    auto file = rl::GgufFile::open(path);
    benchmark::DoNotOptimize(file.get());
  }
}
BENCHMARK(BM_GgufOpenOnly)->Unit(benchmark::kMillisecond)->MinTime(2.0);

struct Loaded {
  std::unique_ptr<rl::GgufFile> file;
  std::unique_ptr<rl::Tokenizer> tok;
};
const Loaded* loaded() {
  static std::unique_ptr<Loaded> l;
  if (!l && std::filesystem::exists(model_path())) {
    l = std::make_unique<Loaded>();
    l->file = rl::GgufFile::open(model_path());
    l->tok = rl::Tokenizer::from_gguf(*l->file);
  }
  return l.get();
}

// The timed loop of the encode benchmarks: bytes/s, and the text size and token count.
void encode_loop(benchmark::State& state, const Loaded& l, const std::string& text, bool parse_special) {
  size_t n_tokens = 0;
  for (auto _ : state) {
    auto ids = l.tok->encode(text, parse_special);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed((int64_t)state.iterations() * (int64_t)text.size());
  state.counters["text_bytes"] = (double)text.size();
  state.counters["tokens"] = (double)n_tokens;
}

void BM_Encode1MiBMixed(benchmark::State& state) {
  const Loaded* l = loaded();
  if (!l) {
    state.SkipWithError("fixture not found");
    return;
  }
  encode_loop(state, *l, build_mixed_text(1 << 20), false);
}
BENCHMARK(BM_Encode1MiBMixed)->Unit(benchmark::kMillisecond)->MinTime(3.0);

// A worst case for the word cache: 1 MiB of made-up words (Latin, Cyrillic, CJK runs), nearly
// all distinct, so almost every word goes through the BPE merge loop.
void BM_Encode1MiBDistinctWords(benchmark::State& state) {
  const Loaded* l = loaded();
  if (!l) {
    state.SkipWithError("fixture not found");
    return;
  }
  std::string text;
  uint64_t s = 42;
  auto next = [&]() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(s >> 33);
  };
  auto append_cp = [&](uint32_t cp) {
    if (cp < 0x80) {
      text.push_back((char)cp);
    } else if (cp < 0x800) {
      text.push_back((char)(0xC0 | (cp >> 6)));
      text.push_back((char)(0x80 | (cp & 0x3F)));
    } else {
      text.push_back((char)(0xE0 | (cp >> 12)));
      text.push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
      text.push_back((char)(0x80 | (cp & 0x3F)));
    }
  };
  while (text.size() < (1u << 20)) {
    const uint32_t script = next() % 4;
    const int len = 2 + (int)(next() % (script == 3 ? 12 : 10));
    text.push_back(' ');
    for (int i = 0; i < len; ++i) {
      if (script <= 1) append_cp('a' + next() % 26);
      else if (script == 2) append_cp(0x430 + next() % 32);
      else append_cp(0x4E00 + next() % 3000);
    }
    if (next() % 8 == 0) text += ".\n";
  }
  encode_loop(state, *l, text, false);
}
BENCHMARK(BM_Encode1MiBDistinctWords)->Unit(benchmark::kMillisecond)->MinTime(3.0);

// The same text with ChatML markers every 4 KiB, tokenized with special-token parsing.
void BM_Encode1MiBMixedSpecial(benchmark::State& state) {
  const Loaded* l = loaded();
  if (!l) {
    state.SkipWithError("fixture not found");
    return;
  }
  std::string text = build_mixed_text(1 << 20);
  for (size_t pos = 4096; pos < text.size(); pos += 4096) text.insert(pos, "<|im_end|>\n<|im_start|>user\n");
  encode_loop(state, *l, text, true);
}
BENCHMARK(BM_Encode1MiBMixedSpecial)->Unit(benchmark::kMillisecond)->MinTime(3.0);

void BM_Decode1MiBMixed(benchmark::State& state) {
  const Loaded* l = loaded();
  if (!l) {
    state.SkipWithError("fixture not found");
    return;
  }
  const std::string text = build_mixed_text(1 << 20);
  const std::vector<int32_t> ids = l->tok->encode(text, false);
  for (auto _ : state) {
    std::string out = l->tok->decode(ids);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed((int64_t)state.iterations() * (int64_t)text.size());
}
BENCHMARK(BM_Decode1MiBMixed)->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
