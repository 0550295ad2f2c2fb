// The recipes modelled on llama.cpp's quantizer (src/synth/recipes.cpp): every tensor's type, read
// back from the written tiny file and in the 80B's table, against rules written here from
// llama_tensor_get_type by tensor name; the file type each declares; that the recipes other than
// all-types and f32 together hold all 23 types; and that each tiny model's CPU fast tier stays
// within the fast tier's bar of the oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/parity.h"
#include "quant/quant.h"
#include "synth/synth.h"
#include "synth_test_util.h"
#include "test_util.h"

namespace rl::synth {
namespace {

// The recipes that model published files (the coverage set of issue 20): all but all-types and f32.
std::vector<std::string> realistic_recipes() {
  std::vector<std::string> r;
  for (const std::string& name : recipe_names())
    if (name != "all-types" && name != "f32") r.push_back(name);
  return r;
}

// A tensor as the rules see it: its name after "blk.N." and its layer (-1 outside the blocks).
struct Tensor {
  std::string kind;
  int layer = -1;
};

Tensor parse_name(const std::string& name) {
  Tensor t{name, -1};
  if (name.rfind("blk.", 0) == 0) {
    const size_t dot = name.find('.', 4);
    t.layer = std::stoi(name.substr(4, dot - 4));
    t.kind = name.substr(dot + 1);
  }
  return t;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// llama.cpp's "first n/8 layers" with the recipes' floor of one layer.
bool first(int index, int n_layer, int divisor) { return index < std::max(1, n_layer / divisor); }

// The type llama_tensor_get_type gives this tensor in the named mix (80B shape: 8 query heads per
// KV head, 512 experts; importance matrix), legacy (fused ssm_in) layout. Tensors it does not
// quantize keep the conversion's F32 (F16 for the shared-expert gate).
GgmlType expected_type(const std::string& recipe, const std::string& name, int n_layer) {
  const Tensor t = parse_name(name);
  const std::string& k = t.kind;
  const bool unquantized = ends_with(k, "_norm.weight") || k == "ssm_conv1d.weight" || k == "ssm_dt.bias" ||
                           k == "ssm_a" || k == "ffn_gate_inp.weight";
  if (unquantized) return GgmlType::F32;
  if (k == "ffn_gate_inp_shexp.weight") return recipe == "mxfp4" ? GgmlType::BF16 : GgmlType::F16;
  const bool down = k == "ffn_down_exps.weight" || k == "ffn_down_shexp.weight";
  // Attention layers are every 4th (3, 7, ...): the attention V tensors before layer L number L / 4.
  const int attn_v_before = t.layer / 4;
  if (recipe == "iq3xxs") {
    if (k == "token_embd.weight" || k == "attn_output.weight") return GgmlType::IQ3_S;
    if (k == "output.weight") return GgmlType::Q5_K;
    if (k == "attn_v.weight") return GgmlType::Q4_K;
    if (k == "attn_q.weight" || k == "attn_k.weight") return GgmlType::IQ2_S;
    return GgmlType::IQ3_XXS;
  }
  if (recipe == "q3km") {
    if (k == "output.weight") return GgmlType::Q6_K;
    if (k == "attn_v.weight") return attn_v_before < 2 ? GgmlType::Q5_K : GgmlType::Q4_K;
    if (down) return first(t.layer, n_layer, 16) ? GgmlType::Q5_K : GgmlType::Q4_K;
    if (k == "attn_output.weight") return GgmlType::Q4_K;
    return GgmlType::Q3_K;
  }
  if (recipe == "iq4xs" || recipe == "iq4nl") {
    if (k == "output.weight") return GgmlType::Q6_K;
    if (k == "attn_v.weight") return GgmlType::Q5_K;
    return recipe == "iq4xs" ? GgmlType::IQ4_XS : GgmlType::IQ4_NL;
  }
  if (recipe == "legacy") {
    if (k == "token_embd.weight" || k == "output.weight") return GgmlType::Q8_0;
    if (k == "ffn_gate_exps.weight" || k == "ffn_up_exps.weight") return GgmlType::Q4_0;
    if (k == "ffn_down_exps.weight") return first(t.layer, n_layer, 8) ? GgmlType::Q4_1 : GgmlType::Q4_0;
    if (k == "ffn_down_shexp.weight") return first(t.layer, n_layer, 8) ? GgmlType::Q5_1 : GgmlType::Q5_0;
    return GgmlType::Q5_0;
  }
  if (recipe == "mxfp4") return ends_with(k, "_exps.weight") ? GgmlType::MXFP4 : GgmlType::Q8_0;
  if (recipe == "iq1s") {
    if (k == "token_embd.weight") return GgmlType::Q2_K;
    if (k == "output.weight") return GgmlType::Q5_K;
    if (k == "attn_v.weight") return GgmlType::Q4_K;
    if (k == "attn_output.weight") return GgmlType::IQ2_XXS;
    // The ffn_down counter runs over the file: exps of layer L is the 2L-th, shexp the next.
    if (down) return first(2 * t.layer + (k == "ffn_down_shexp.weight"), n_layer, 8) ? GgmlType::Q2_K : GgmlType::IQ1_S;
    return GgmlType::IQ1_S;
  }
  ADD_FAILURE() << "no expectation for recipe " << recipe;
  return GgmlType::F32;
}

const std::vector<std::string> kLlamaCppMixes = {"iq3xxs", "q3km", "iq4xs", "iq4nl", "legacy", "mxfp4", "iq1s"};

std::string write_tiny(const std::string& recipe, ProjectionLayout layout = ProjectionLayout::LegacyFused) {
  return test_support::write_tiny_model("synth-recipes", recipe, 0, layout);
}

TEST(SynthRecipes, TinyFileTypesAreTheMixes) {
  for (const std::string& recipe : kLlamaCppMixes) {
    SCOPED_TRACE(recipe);
    const std::string path = write_tiny(recipe);
    auto f = GgufFile::open(path);
    ASSERT_FALSE(f->tensors().empty());
    for (const GgufTensorInfo& t : f->tensors())
      EXPECT_EQ(type_name(t.type), std::string(type_name(expected_type(recipe, t.name, 4)))) << t.name;
    test::remove_temp(path);
  }
}

TEST(SynthRecipes, EightyBTableTypesAreTheMixes) {
  for (const std::string& recipe : kLlamaCppMixes) {
    SCOPED_TRACE(recipe);
    Options o;
    o.preset = "80b";
    o.recipe = recipe;
    const Plan p = make_plan(o);
    std::map<std::string, int> count;
    for (const TensorPlan& t : p.tensors) {
      EXPECT_EQ(type_name(t.type), std::string(type_name(expected_type(recipe, t.name, 48)))) << t.name;
      count[type_name(t.type)]++;
    }
    // The promoted tensors counted by hand from llama.cpp's rules at 48 layers (12 attention).
    const std::map<std::string, std::map<std::string, int>> promoted = {
        {"q3km", {{"q5_K", 2 + 3 * 2}}},                 // attn_v of layers 3, 7; ffn_down of layers 0-2
        {"legacy", {{"q4_1", 6}, {"q5_1", 6}}},          // ffn_down of layers 0-5
        {"iq1s", {{"q2_K", 1 + 6}, {"iq2_xxs", 12}}},    // embedding, ffn_down of layers 0-2; attn_output
        {"mxfp4", {{"mxfp4", 3 * 48}, {"bf16", 48}}},
        {"iq3xxs", {{"iq2_s", 2 * 12}, {"iq3_s", 1 + 12}, {"q4_K", 12}}},
        {"iq4xs", {{"q5_K", 12}, {"q6_K", 1}}},
        {"iq4nl", {{"q5_K", 12}, {"q6_K", 1}}},
    };
    for (const auto& [type, n] : promoted.at(recipe)) EXPECT_EQ(count[type], n) << type;
  }
}

// In the split layout attn_qkv is attention V to llama.cpp (the first two get Q3_K_M's Q5_K, so
// layer 3's attn_v no longer does) and attn_gate takes the base type.
TEST(SynthRecipes, SplitLayoutCountsAttnQkvAsAttentionV) {
  const std::string path = write_tiny("q3km", ProjectionLayout::Split);
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->tensor("blk.0.attn_qkv.weight").type, GgmlType::Q5_K);
  EXPECT_EQ(f->tensor("blk.1.attn_qkv.weight").type, GgmlType::Q5_K);
  EXPECT_EQ(f->tensor("blk.2.attn_qkv.weight").type, GgmlType::Q4_K);
  EXPECT_EQ(f->tensor("blk.3.attn_v.weight").type, GgmlType::Q4_K);
  EXPECT_EQ(f->tensor("blk.0.attn_gate.weight").type, GgmlType::Q3_K);
  test::remove_temp(path);
  const std::string iq = write_tiny("iq3xxs", ProjectionLayout::Split);
  auto g = GgufFile::open(iq);
  EXPECT_EQ(g->tensor("blk.0.attn_qkv.weight").type, GgmlType::Q4_K);
  EXPECT_EQ(g->tensor("blk.0.attn_gate.weight").type, GgmlType::IQ3_XXS);
  test::remove_temp(iq);
}

// general.file_type: llama.h's LLAMA_FTYPE_* ids.
TEST(SynthRecipes, FileTypeIsLlamaCppsId) {
  const std::map<std::string, uint64_t> want = {{"seed-mix", 20}, {"q4km", 15},  {"q4km-shexp-f16", 15},
                                                {"iq3xxs", 23},   {"q3km", 12},  {"iq4xs", 30},
                                                {"iq4nl", 25},    {"legacy", 2}, {"mxfp4", 38},
                                                {"iq1s", 24},     {"all-types", 1024}, {"f32", 0}};
  EXPECT_EQ(want.size(), recipe_names().size());
  for (const std::string& recipe : recipe_names()) {
    const std::string path = write_tiny(recipe);
    EXPECT_EQ(GgufFile::open(path)->get_uint("general.file_type"), want.at(recipe)) << recipe;
    test::remove_temp(path);
  }
}

// The 23 types with a float view (the reference dequantisation's list).
std::set<std::string> every_type() {
  std::set<std::string> want;
  for (uint32_t id = 0; id < 64; id++)
    if (const QuantType* q = find_quant_type(id); q && q->dequantize_row) want.insert(q->name);
  return want;
}

// Every type runs in a realistic file: the union over those recipes, read back from the tiny
// files and in the 80B tables, is all 23 types.
TEST(SynthRecipes, RealisticRecipesTogetherHoldEveryType) {
  std::set<std::string> tiny, big;
  for (const std::string& recipe : realistic_recipes()) {
    const std::string path = write_tiny(recipe);
    for (const GgufTensorInfo& t : GgufFile::open(path)->tensors()) tiny.insert(type_name(t.type));
    test::remove_temp(path);
    Options o;
    o.preset = "80b";
    o.recipe = recipe;
    for (const TensorPlan& t : make_plan(o).tensors) big.insert(type_name(t.type));
  }
  const std::set<std::string> want = every_type();
  EXPECT_EQ(want.size(), 23u);
  EXPECT_EQ(tiny, want);
  EXPECT_EQ(big, want);
}

// The fast tier's bar against the oracle on a synthetic model (tests/cuda/fast_tier_shape_test.cpp):
// the level of llama.cpp's native path against its F32 reference on fixture B (ANCHORS.md: mean
// last rel rms 0.0754, top-1 0.891).
constexpr double kMaxMeanRelRms = 0.075, kMinTop1 = 0.85;
constexpr int kPromptTokens = 48, kDecodeSteps = 8;

struct Logits {
  std::vector<float> prompt;                // [kPromptTokens][n_vocab]
  std::vector<std::vector<float>> decode;   // kDecodeSteps x [n_vocab]
};

Logits run(Backend& b, const std::vector<int32_t>& prompt, const std::vector<int32_t>& feed) {
  auto s = b.new_session(kPromptTokens + kDecodeSteps + 1);
  Logits r;
  s->prefill(prompt, &r.prompt);
  for (int32_t t : feed) r.decode.push_back(s->decode(t));
  return r;
}

class SynthRecipeFastTier : public ::testing::TestWithParam<std::string> {};

// Teacher-forced: the oracle's greedy tokens are fed to both tiers.
TEST_P(SynthRecipeFastTier, CpuFastTierWithinTheBarOfTheOracle) {
  const std::string path = write_tiny(GetParam());
  auto model = Model::open(path);
  const int n_vocab = model->config().n_vocab;
  std::vector<int32_t> prompt;
  for (int i = 0; i < kPromptTokens; i++) prompt.push_back((i * 389 + 17) % n_vocab);
  auto oracle = cpu::make_cpu_backend(model, 2, Numerics::kExact);
  Logits want;
  {
    auto s = oracle->new_session(kPromptTokens + kDecodeSteps + 1);
    std::vector<float> last = s->prefill(prompt, &want.prompt);
    for (int i = 0; i < kDecodeSteps; i++) {
      last = s->decode(argmax(last));
      want.decode.push_back(last);
    }
  }
  std::vector<int32_t> feed;
  feed.push_back(argmax(std::span(want.prompt).subspan((size_t)(kPromptTokens - 1) * n_vocab, n_vocab)));
  for (int i = 0; i + 1 < kDecodeSteps; i++) feed.push_back(argmax(want.decode[i]));

  auto fast = cpu::make_cpu_backend(model, 2, Numerics::kFast);
  const Logits got = run(*fast, prompt, feed);
  int top1 = 0, positions = 0;
  double rms = 0;
  auto score = [&](std::span<const float> a, std::span<const float> b) {
    top1 += argmax(a) == argmax(b);
    rms += relative_rms(a, b);
    positions++;
  };
  for (int i = 0; i < kPromptTokens; i++)
    score(std::span(got.prompt).subspan((size_t)i * n_vocab, n_vocab),
          std::span(want.prompt).subspan((size_t)i * n_vocab, n_vocab));
  for (int i = 0; i < kDecodeSteps; i++) score(got.decode[i], want.decode[i]);
  std::printf("[cpu fast tier] recipe %-15s top-1 %.3f mean rel rms %.3e over %d positions\n", GetParam().c_str(),
              (double)top1 / positions, rms / positions, positions);
  EXPECT_GE((double)top1 / positions, kMinTop1);
  EXPECT_LE(rms / positions, kMaxMeanRelRms);
  EXPECT_GT(rms, 0.0);  // the fast tier did run its own arithmetic
  test::remove_temp(path);
}

INSTANTIATE_TEST_SUITE_P(Recipes, SynthRecipeFastTier, ::testing::ValuesIn(recipe_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace rl::synth
