// Binding qwen3next GGUFs: hyperparameters, both linear-attention layouts, MTP blocks, tensor
// views (expert slices), and the errors a bad file gives (files rewritten with GgufWriter).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include <unistd.h>

#include "common/error.h"
#include "cpu/cpu_backend.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/model.h"
#include "model/parity.h"
#include "test_util.h"

namespace rl {
namespace {

const std::string kModelA = "tiny-qwen3next-iq2xxs.gguf";
const std::string kModelB = "tiny-qwen3next-q4km.gguf";

TEST(ModelBinding, LegacyFusedLayoutModelA) {
  const std::string path = test::fixture(kModelA);
  RL_REQUIRE_FIXTURE(path);
  auto m = Model::open(path);
  const Config& c = m->config();
  EXPECT_EQ(c.architecture, "qwen3next");
  EXPECT_EQ(c.n_embd, 256);
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.n_layer_file, 4);
  EXPECT_EQ(c.n_vocab, 151936);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_FLOAT_EQ(c.rope_base, 1e7f);
  EXPECT_EQ(c.ssm_n_k_heads, 2);
  EXPECT_EQ(c.ssm_n_v_heads, 4);
  EXPECT_EQ(c.ssm_head_dim, 64);
  EXPECT_EQ(c.ssm_conv_dim(), 512);
  EXPECT_EQ(c.n_expert, 64);
  EXPECT_EQ(c.n_expert_used, 10);
  EXPECT_EQ(c.n_ff_exp, 256);
  EXPECT_EQ(c.n_ff_shexp, 256);
  // No full_attention_interval key in A: the default interval 4.
  EXPECT_EQ(c.is_recurrent, (std::vector<bool>{true, true, true, false}));
  ASSERT_EQ(m->layers.size(), 4u);
  EXPECT_TRUE(m->layers[0].ssm.legacy_fused);
  EXPECT_EQ(m->layers[0].ssm.in.name, "blk.0.ssm_in.weight");
  EXPECT_FALSE(m->layers[0].ssm.qkv.present());
  EXPECT_EQ(m->layers[3].attn.q.type, GgmlType::IQ2_XXS);
  EXPECT_EQ(m->layers[0].moe.shared_gate_inp.type, GgmlType::F16);
  EXPECT_FALSE(m->output_is_token_embd);
  EXPECT_EQ(m->output.type, GgmlType::Q5_K);
}

TEST(ModelBinding, SplitLayoutWithMtpBlockModelB) {
  const std::string path = test::fixture(kModelB);
  RL_REQUIRE_FIXTURE(path);
  auto m = Model::open(path);
  const Config& c = m->config();
  EXPECT_EQ(c.n_layer_file, 5);
  EXPECT_EQ(c.nextn_predict_layers, 1);
  EXPECT_EQ(c.n_layer, 4);  // the MTP block is not run
  EXPECT_EQ(c.n_vocab, 4099);
  EXPECT_EQ(c.is_recurrent, (std::vector<bool>{true, true, true, false}));
  EXPECT_FALSE(m->layers[1].ssm.legacy_fused);
  EXPECT_EQ(m->layers[1].ssm.qkv.name, "blk.1.attn_qkv.weight");
  EXPECT_EQ(m->layers[1].ssm.gate.name, "blk.1.attn_gate.weight");
  EXPECT_EQ(m->layers[2].ssm.qkv.type, GgmlType::Q6_K);
  EXPECT_EQ(m->layers[0].moe.shared_gate_inp.type, GgmlType::F32);
}

TEST(ModelBinding, ViewsPointIntoTheFileAndSliceExperts) {
  const std::string path = test::fixture(kModelB);
  RL_REQUIRE_FIXTURE(path);
  auto m = Model::open(path);
  const Config& c = m->config();
  const TensorView& gate = m->layers[2].moe.gate_exps;  // [64][256 x 256] Q4_K
  EXPECT_EQ(gate.ne, (std::array<int64_t, 4>{256, 256, 64, 1}));
  EXPECT_EQ(gate.row_bytes, row_size(GgmlType::Q4_K, 256));
  EXPECT_EQ(gate.nbytes, gate.row_bytes * 256 * 64);
  EXPECT_EQ(m->gguf().base() + gate.file_offset, gate.data);
  const TensorView e5 = gate.matrix(5);
  EXPECT_EQ(e5.ne, (std::array<int64_t, 4>{256, (int64_t)c.n_ff_exp, 1, 1}));
  EXPECT_EQ(e5.data, gate.data + 5 * c.n_ff_exp * gate.row_bytes);
  EXPECT_EQ(e5.file_offset, gate.file_offset + 5 * c.n_ff_exp * gate.row_bytes);
  EXPECT_EQ(e5.nbytes, c.n_ff_exp * gate.row_bytes);
  const TensorView down = m->layers[2].moe.down_exps.matrix(63);  // rows [63*n_embd, 64*n_embd)
  EXPECT_EQ(down.ne[1], c.n_embd);
  EXPECT_EQ(down.data + down.nbytes, m->layers[2].moe.down_exps.data + m->layers[2].moe.down_exps.nbytes);
  EXPECT_THROW(gate.matrix(64), Error);
  EXPECT_THROW(gate.rows(16383, 2), Error);
}

// Rewrites fixture model B through GgufWriter with edits, into a temporary file.
struct Rewrite {
  std::map<std::string, std::string> string_keys;     // replace or add string metadata
  std::set<std::string> drop_keys;
  std::set<std::string> drop_tensors;
  std::map<std::string, std::vector<int64_t>> reshape;  // new ne, data truncated/padded with zeros
  std::function<void(GgufWriter&)> extra_keys;
  std::function<void(GgufWriter&)> extra_tensors;  // added after the copied ones
};

Rewrite with(const std::function<void(Rewrite&)>& edit) {
  Rewrite r;
  edit(r);
  return r;
}

std::string rewrite_model_b(const Rewrite& r, const std::string& tag) {
  auto src = GgufFile::open(test::fixture(kModelB));
  GgufWriter w(src->alignment());
  for (const GgufKV& kv : src->metadata()) {
    if (r.drop_keys.count(kv.key)) continue;
    if (auto it = r.string_keys.find(kv.key); it != r.string_keys.end())
      w.add_string(kv.key, it->second);
    else
      w.add_value(kv.key, kv.value);
  }
  if (r.extra_keys) r.extra_keys(w);
  for (const GgufTensorInfo& t : src->tensors()) {
    if (r.drop_tensors.count(t.name)) continue;
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    std::vector<uint8_t> bytes(t.data, t.data + t.nbytes);
    if (auto it = r.reshape.find(t.name); it != r.reshape.end()) {
      ne = it->second;
      int64_t rows = 1;
      for (size_t d = 1; d < ne.size(); d++) rows *= ne[d];
      bytes.resize(row_size(t.type, ne[0]) * rows);
    }
    w.add_tensor_bytes(t.name, t.type, ne, std::move(bytes));
  }
  if (r.extra_tensors) r.extra_tensors(w);
  const std::string out =
      (std::filesystem::temp_directory_path() / ("redlite-oracle-" + tag + "-" + std::to_string(::getpid()) + ".gguf"))
          .string();
  w.write(out);
  return out;
}

// The rl::Error message of Model::open, or "" when it loads.
std::string open_error(const std::string& path) {
  try {
    Model::open(path);
  } catch (const Error& e) {
    std::filesystem::remove(path);
    return e.what();
  }
  std::filesystem::remove(path);
  return "";
}

TEST(ModelErrors, WrongArchitectureNamesFoundAndSupported) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelB));
  const std::string msg = open_error(rewrite_model_b(with([](Rewrite& r) { r.string_keys = {{"general.architecture", "llama"}}; }), "arch"));
  EXPECT_NE(msg.find("'llama'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("qwen3next"), std::string::npos) << msg;
}

TEST(ModelErrors, MissingTensorIsNamed) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelB));
  const std::string msg = open_error(rewrite_model_b(with([](Rewrite& r) { r.drop_tensors = {"blk.1.ssm_out.weight"}; }), "missing"));
  EXPECT_NE(msg.find("missing tensor blk.1.ssm_out.weight"), std::string::npos) << msg;
}

TEST(ModelErrors, MissingLinearAttentionProjectionNamesBothLayouts) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelB));
  const std::string msg = open_error(
      rewrite_model_b(with([](Rewrite& r) { r.drop_tensors = {"blk.2.attn_qkv.weight", "blk.2.attn_gate.weight"}; }), "noproj"));
  EXPECT_NE(msg.find("blk.2.ssm_in.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("blk.2.attn_qkv.weight"), std::string::npos) << msg;
}

TEST(ModelErrors, WrongShapeNamesTensorExpectedAndActual) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelB));
  const std::string msg =
      open_error(rewrite_model_b(with([](Rewrite& r) { r.reshape = {{"blk.0.attn_norm.weight", {128}}}; }), "shape"));
  EXPECT_NE(msg.find("blk.0.attn_norm.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has shape 128"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected 256"), std::string::npos) << msg;
}

TEST(ModelErrors, MissingHyperparameterKeyIsNamed) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelB));
  const std::string msg = open_error(rewrite_model_b(with([](Rewrite& r) { r.drop_keys = {"qwen3next.ssm.state_size"}; }), "key"));
  EXPECT_NE(msg.find("qwen3next.ssm.state_size"), std::string::npos) << msg;
}

// Hyperparameters that would make every logit NaN are refused, naming the key and the value.
TEST(ModelErrors, NonFiniteOrNonPositiveFloatHyperparametersAreRefused) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelB));
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::pair<const char*, float> bad[] = {
      {"qwen3next.attention.layer_norm_rms_epsilon", nan}, {"qwen3next.attention.layer_norm_rms_epsilon", -1e-6f},
      {"qwen3next.attention.layer_norm_rms_epsilon", 0.0f}, {"qwen3next.attention.layer_norm_rms_epsilon", inf},
      {"qwen3next.rope.freq_base", 0.0f},  {"qwen3next.rope.freq_base", nan},
      {"qwen3next.rope.freq_base", -1e4f}, {"qwen3next.rope.freq_base", 1e-30f},
      {"qwen3next.expert_weights_scale", nan}, {"qwen3next.expert_weights_scale", -2.0f}};
  int i = 0;
  for (auto [key, value] : bad) {
    const std::string msg = open_error(rewrite_model_b(
        with([&, key = key, value = value](Rewrite& r) {
          r.drop_keys = {key};
          r.extra_keys = [key, value](GgufWriter& w) { w.add_f32(key, value); };
        }),
        "hparam" + std::to_string(i++)));
    EXPECT_NE(msg.find(key), std::string::npos) << key << "=" << value << ": " << msg;
  }
  // The fixture's own values load.
  EXPECT_EQ(open_error(rewrite_model_b(Rewrite{}, "hparam-ok")), "");
}

TEST(ModelBinding, RecurrentLayersKeyOverridesTheInterval) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelB));
  // Flags for all 5 blocks (as llama.cpp writes them); layer 3 stays the attention layer because
  // only its tensors exist, so the flags must be the real ones: check they are read, not guessed.
  Rewrite r;
  r.drop_keys = {"qwen3next.full_attention_interval"};
  r.extra_keys = [](GgufWriter& w) { w.add_array_bool("qwen3next.attention.recurrent_layers", {true, true, true, false, false}); };
  const std::string path = rewrite_model_b(r, "recr");
  auto m = Model::open(path);
  std::filesystem::remove(path);
  EXPECT_EQ(m->config().is_recurrent, (std::vector<bool>{true, true, true, false}));

  // Flags that disagree with the tensors fail on the tensor the flag asks for.
  Rewrite bad;
  bad.extra_keys = [](GgufWriter& w) { w.add_array_bool("qwen3next.attention.recurrent_layers", {true, true, true, true, false}); };
  const std::string msg = open_error(rewrite_model_b(bad, "recr-bad"));
  EXPECT_NE(msg.find("blk.3."), std::string::npos) << msg;
}

TEST(ModelBinding, FusedAttentionQkvGivesTheSameLogits) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelB));
  // Model B's layer-3 attn_q, attn_k, attn_v are all Q4_K: their rows concatenated are a fused
  // attn_qkv of the same values, so the logits must not change by a bit.
  auto src = GgufFile::open(test::fixture(kModelB));
  std::vector<uint8_t> fused;
  for (const char* n : {"blk.3.attn_q.weight", "blk.3.attn_k.weight", "blk.3.attn_v.weight"}) {
    const GgufTensorInfo& t = src->tensor(n);
    ASSERT_EQ(t.type, GgmlType::Q4_K) << n;
    fused.insert(fused.end(), t.data, t.data + t.nbytes);
  }
  Rewrite r;
  r.drop_tensors = {"blk.3.attn_q.weight", "blk.3.attn_k.weight", "blk.3.attn_v.weight"};
  r.extra_tensors = [&](GgufWriter& w) { w.add_tensor_bytes("blk.3.attn_qkv.weight", GgmlType::Q4_K, {256, 512 + 128 + 128}, fused); };
  const std::string path = rewrite_model_b(r, "fusedqkv");
  auto fused_model = Model::open(path);
  auto plain_model = Model::open(test::fixture(kModelB));
  EXPECT_EQ(fused_model->layers[3].attn.k.name, "blk.3.attn_qkv.weight");
  const std::vector<int32_t> toks = {10, 200, 3000, 7};
  auto a = cpu::make_cpu_backend(fused_model, 0)->new_session(16)->prefill(toks);
  auto b = cpu::make_cpu_backend(plain_model, 0)->new_session(16)->prefill(toks);
  EXPECT_EQ(a, b);
  std::filesystem::remove(path);
}

TEST(ModelBinding, MissingOutputFallsBackToTokenEmbedding) {
  RL_REQUIRE_FIXTURE(test::fixture(kModelB));
  const std::string path = rewrite_model_b(with([](Rewrite& r) { r.drop_tensors = {"output.weight"}; }), "tied");
  auto m = Model::open(path);
  EXPECT_TRUE(m->output_is_token_embd);
  EXPECT_EQ(m->output.name, "token_embd.weight");
  // The tied model runs, and its logits are token_embd . result_norm: check one against a
  // direct computation from the trace's result_norm.
  auto backend = cpu::make_cpu_backend(m, 0);
  auto s = backend->new_session(16);
  RecordingTrace rec;
  s->set_trace(&rec);
  const std::vector<int32_t> toks = {10, 200, 3000};
  const std::vector<float> logits = s->prefill(toks);
  const std::vector<float>& norm = rec.tensors.at("result_norm").f32;  // [3][256]
  std::vector<float> row(256);
  for (int v : {0, 17, 4098}) {
    dequantize_row(m->token_embd.type, m->token_embd.row(v), row.data(), 256);
    double want = 0;
    for (int i = 0; i < 256; i++) want += (double)row[i] * norm[2 * 256 + i];
    EXPECT_NEAR(logits[v], want, 1e-4 * std::max(1.0, std::fabs(want))) << v;
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace rl
