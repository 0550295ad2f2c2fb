// End to end: a tiny synthetic model runs through the CPU oracle with finite, non-constant logits
// of a healthy spread, and its placeholder vocabulary tokenizes and round-trips text.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <cstring>

#include "common/fp16.h"
#include "cpu/cpu_backend.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/model.h"
#include "synth/routing_study.h"
#include "synth/synth.h"
#include "synth_test_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace rl::synth {
namespace {

std::string write_tiny(const std::string& recipe, double skew = 0) {
  return test_support::write_tiny_model("synth-oracle", recipe, skew);
}

struct LogitStats {
  double mean = 0, std = 0;
  bool finite = true;
};

LogitStats stats_of(const float* v, size_t n) {
  LogitStats s;
  double sum = 0, sq = 0;
  for (size_t i = 0; i < n; i++) {
    s.finite = s.finite && std::isfinite(v[i]);
    sum += v[i];
    sq += (double)v[i] * v[i];
  }
  s.mean = sum / n;
  s.std = std::sqrt(std::max(0.0, sq / n - s.mean * s.mean));
  return s;
}

class SynthOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(SynthOracle, TinyModelGivesFiniteHealthyLogits) {
  const std::string path = write_tiny(GetParam());
  auto model = Model::open(path);
  auto backend = cpu::make_cpu_backend(model, 2);
  auto session = backend->new_session(256);
  const int n_vocab = session->n_vocab();
  std::vector<int32_t> tokens;
  for (int i = 0; i < 48; i++) tokens.push_back((i * 37 + 11) % n_vocab);
  std::vector<float> all;
  session->prefill(tokens, &all);
  ASSERT_EQ(all.size(), tokens.size() * (size_t)n_vocab);
  for (size_t p = 0; p < tokens.size(); p++) {
    const LogitStats s = stats_of(all.data() + p * n_vocab, n_vocab);
    SCOPED_TRACE("position " + std::to_string(p));
    ASSERT_TRUE(s.finite);
    // "a standard deviation of a few units", as the fixtures' 4.4.
    EXPECT_GT(s.std, 1.0);
    EXPECT_LT(s.std, 12.0);
  }
  // Different positions give different logits (not a constant function of the input).
  EXPECT_NE(std::vector<float>(all.begin(), all.begin() + n_vocab),
            std::vector<float>(all.begin() + n_vocab, all.begin() + 2 * n_vocab));
  test::remove_temp(path);
}

INSTANTIATE_TEST_SUITE_P(Recipes, SynthOracle, ::testing::ValuesIn(recipe_names()));

TEST(SynthOracle, PlaceholderVocabularyTokenizesText) {
  const std::string path = write_tiny("seed-mix");
  auto f = GgufFile::open(path);
  auto tok = Tokenizer::from_gguf(*f);
  const std::string text = "Hello, synthetic world! 123 \xe4\xb8\xad";
  const auto ids = tok->encode(text, false);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(tok->decode(ids), text);
  const auto chat = tok->encode("<|im_start|>user\nHi<|im_end|>", true);
  ASSERT_GE(chat.size(), 3u);
  EXPECT_TRUE(tok->is_control(chat.front()));
  EXPECT_TRUE(tok->is_eog(chat.back()));
  EXPECT_FALSE(tok->chat_template().empty());
  test::remove_temp(path);
}

}  // namespace
}  // namespace rl::synth

namespace rl::synth {
namespace {

// Routing as the engine sees it: the tiny model's router selections from the oracle's trace over
// a token stream (a text repeated and tokenized with the placeholder vocabulary), LRU hit rates
// at 10/25/50 % of all experts. Printed for docs/synth.md; skew must raise the hit rate. (At 10 %
// the cache holds 12 experts and a token needs 16, so LRU cycles and hits nothing: expected.)
TEST(SynthOracleRouting, SkewRaisesLruHitRatesThroughTheOracle) {
  const std::string text =
      "The quick brown fox jumps over the lazy dog. A cache of experts keeps the popular ones on the "
      "device and copies the others on demand; how often it hits depends on how routing is spread. ";
  std::printf("| router skew | top-1%% share | reuse prev (uniform) | zipf fit | hit 10%% | hit 25%% | hit 50%% |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<double> hit25;
  for (double skew : {0.0, 0.5, 1.0}) {
    const std::string path = write_tiny("seed-mix", skew);
    auto model = Model::open(path);
    auto tok = Tokenizer::from_gguf(model->gguf());
    std::vector<int32_t> tokens;
    while (tokens.size() < 400) {
      const auto ids = tok->encode(text, false);
      tokens.insert(tokens.end(), ids.begin(), ids.end());
    }
    tokens.resize(400);
    auto backend = cpu::make_cpu_backend(model, 2);
    auto session = backend->new_session(512);
    const int n_layer = model->config().n_layer, n_expert = model->config().n_expert;
    const Selections s = route_through_session(*session, tokens, n_layer);
    const RoutingStats st = routing_stats(s, n_layer, n_expert);
    std::vector<double> hit;
    for (double frac : {0.10, 0.25, 0.50})
      hit.push_back(lru_hit_rate(s, n_layer, n_expert, (int64_t)(frac * n_layer * n_expert), 100).hit_rate);
    std::printf("| %.1f | %.3f | %.3f (%.3f) | %.2f | %.3f | %.3f | %.3f |\n", skew, st.top1pct_share, st.reuse_previous,
                st.reuse_uniform, st.zipf_fit_exponent, hit[0], hit[1], hit[2]);
    hit25.push_back(hit[1]);
    test::remove_temp(path);
  }
  EXPECT_GT(hit25[1], hit25[0]);
  EXPECT_GT(hit25[2], hit25[1]);
}

}  // namespace
}  // namespace rl::synth

namespace rl::synth {
namespace {

// q4km-shexp-f16 stores ffn_gate_inp_shexp as F16 (as real files do). The same model with that
// tensor widened to F32 (the F16 values exactly, converted here) must give the same logits on
// the oracle: the F16 gate is read as F16, in every layer.
TEST(SynthOracle, F16SharedExpertGateReadsAsItsF32Widening) {
  const std::string path = write_tiny("q4km-shexp-f16");
  auto f16_file = GgufFile::open(path);
  int n_f16 = 0;
  GgufWriter w(f16_file->alignment());
  for (const GgufKV& kv : f16_file->metadata()) w.add_value(kv.key, kv.value);
  for (const GgufTensorInfo& t : f16_file->tensors()) {
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    const bool gate = t.name.find("ffn_gate_inp_shexp") != std::string::npos;
    if (!gate) {
      w.add_tensor_bytes(t.name, t.type, ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
      continue;
    }
    ASSERT_EQ(t.type, GgmlType::F16) << t.name;
    ++n_f16;
    std::vector<uint8_t> bytes((size_t)t.n_elements() * sizeof(float));
    for (int64_t i = 0; i < t.n_elements(); ++i) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      const float x = fp16_to_f32(h);
      std::memcpy(bytes.data() + 4 * i, &x, 4);
    }
    w.add_tensor_bytes(t.name, GgmlType::F32, ne, std::move(bytes));
  }
  EXPECT_EQ(n_f16, (int)f16_file->get_uint("qwen3next.block_count"));
  const std::string widened = test::temp_path("synth-oracle", "shexp-f32.gguf");
  w.write(widened);

  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; i++) tokens.push_back((i * 53 + 7) % 1000);
  std::vector<float> a, b;
  cpu::make_cpu_backend(Model::open(path), 2)->new_session(64)->prefill(tokens, &a);
  cpu::make_cpu_backend(Model::open(widened), 2)->new_session(64)->prefill(tokens, &b);
  ASSERT_EQ(a.size(), b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    norm += (double)b[i] * b[i];
  }
  // One F16 dot product against its F32 equal: only the summation may differ.
  EXPECT_LT(std::sqrt(diff / norm), 1e-5);
  test::remove_temp(widened);
  test::remove_temp(path);
}

}  // namespace
}  // namespace rl::synth
