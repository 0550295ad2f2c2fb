#include "synth/synth.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <memory>
#include <thread>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "synth/placeholder_vocab.h"
#include "synth/random_blocks.h"
#include "synth/recipes.h"
#include "synth/router_skew.h"

namespace rl::synth {

// ---- presets and dimensions ---------------------------------------------------------------------

namespace {

struct DimField {
  const char* name;
  int Dims::*field;
};

const DimField kDimFields[] = {
    {"n_embd", &Dims::n_embd},
    {"n_layer", &Dims::n_layer},
    {"n_vocab", &Dims::n_vocab},
    {"n_ctx_train", &Dims::n_ctx_train},
    {"n_ff", &Dims::n_ff},
    {"n_head", &Dims::n_head},
    {"n_head_kv", &Dims::n_head_kv},
    {"head_dim", &Dims::head_dim},
    {"rope_dim", &Dims::rope_dim},
    {"ssm_k_heads", &Dims::ssm_k_heads},
    {"ssm_v_heads", &Dims::ssm_v_heads},
    {"ssm_head_dim", &Dims::ssm_head_dim},
    {"conv_kernel", &Dims::conv_kernel},
    {"n_expert", &Dims::n_expert},
    {"n_expert_used", &Dims::n_expert_used},
    {"n_ff_exp", &Dims::n_ff_exp},
    {"n_ff_shexp", &Dims::n_ff_shexp},
    {"full_attention_interval", &Dims::full_attention_interval},
};

std::string flag(const std::string& dim_name) {
  std::string f = "--" + dim_name;
  std::replace(f.begin(), f.end(), '_', '-');
  return f;
}

}  // namespace

const std::vector<std::string>& dim_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& f : kDimFields) n.push_back(f.name);
    return n;
  }();
  return names;
}

int& dim_by_name(Dims& d, const std::string& name) {
  for (const auto& f : kDimFields)
    if (name == f.name) return d.*(f.field);
  fail("unknown dimension '{}' (known: {})", name, fmt::join(dim_names(), ", "));
}

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> n{"tiny", "80b"};
  return n;
}

Dims preset_dims(const std::string& preset) {
  Dims d;
  if (preset == "80b") {
    // Qwen3-Next-80B-A3B.
    d.n_embd = 2048;
    d.n_layer = 48;
    d.n_vocab = 151936;
    d.n_ff = 5120;
    d.n_head = 16;
    d.n_head_kv = 2;
    d.head_dim = 256;
    d.rope_dim = 64;
    d.ssm_k_heads = 16;
    d.ssm_v_heads = 32;
    d.ssm_head_dim = 128;
    d.conv_kernel = 4;
    d.n_expert = 512;
    d.n_expert_used = 10;
    d.n_ff_exp = 512;
    d.n_ff_shexp = 512;
  } else if (preset == "tiny") {
    // The fixtures' width with fewer experts and a small vocabulary: a few MB, milliseconds per
    // token on the CPU. Widths stay multiples of 256 so every recipe's K/IQ types fit.
    d.n_embd = 256;
    d.n_layer = 4;
    d.n_vocab = 2048;
    d.n_ff = 640;
    d.n_head = 4;
    d.n_head_kv = 2;
    d.head_dim = 64;
    d.rope_dim = 16;
    d.ssm_k_heads = 2;
    d.ssm_v_heads = 4;
    d.ssm_head_dim = 64;
    d.conv_kernel = 4;
    d.n_expert = 32;
    d.n_expert_used = 4;
    d.n_ff_exp = 256;
    d.n_ff_shexp = 256;
  } else {
    fail("--preset {}: unknown preset (known: {})", preset, fmt::join(preset_names(), ", "));
  }
  return d;
}

// ---- the tensor table (types: recipes.cpp) ------------------------------------------------------

namespace {

WeightInit normal(double std) { return WeightInit{WeightInit::Kind::Normal, (float)std, 0, 0, {}, {}}; }
WeightInit one_plus_normal(float std) { return WeightInit{WeightInit::Kind::OnePlusNormal, std, 0, 0, {}, {}}; }

// Builds the table in the file order of llama.cpp's converter for qwen3next.
class TableBuilder {
 public:
  TableBuilder(const Options& o, const Dims& d) : o_(o), d_(d) {}

  void add(std::string name, Role role, int layer, std::vector<int64_t> ne, WeightInit init, std::string row_dim) {
    TensorPlan t;
    t.name = std::move(name);
    // An up matrix shares its gate's place in the cycle (its type), as llama.cpp's mixes pair them.
    const bool up = role == Role::UpExps || role == Role::UpShexp;
    const TensorPlace place{role, layer, d_.n_layer, up ? matrices_ - 1 : matrices_, attn_v_, ffn_down_};
    t.type = recipe_type(o_.recipe, place);
    matrices_ += is_matrix(role) && !up;
    attn_v_ += is_attn_v_like(role);
    ffn_down_ += is_ffn_down(role);
    t.ne = std::move(ne);
    t.init = std::move(init);
    check_row_length(t, row_dim);
    tensors.push_back(std::move(t));
  }

  std::vector<TensorPlan> tensors;

 private:
  void check_row_length(const TensorPlan& t, const std::string& row_dim) const {
    const QuantType& qt = quant_type(t.type);
    if (t.ne[0] % qt.block_size != 0)
      fail("{}: tensor {} is {} in recipe {}, whose rows need a multiple of {} values; its row length {} is not",
           row_dim, t.name, qt.name, o_.recipe, qt.block_size, t.ne[0]);
  }
  const Options& o_;
  const Dims& d_;
  int matrices_ = 0;  // weight matrices added so far
  int attn_v_ = 0;    // attn_v / attn_qkv tensors added so far
  int ffn_down_ = 0;  // ffn_down_exps / ffn_down_shexp tensors added so far
};

void validate_dims(const Dims& d) {
  for (const auto& f : kDimFields)
    if (d.*(f.field) <= 0) fail("{} {}: must be positive", flag(f.name), d.*(f.field));
  if (d.n_expert_used > d.n_expert)
    fail("--n-expert-used {}: more than --n-expert {}", d.n_expert_used, d.n_expert);
  if (d.n_head % d.n_head_kv != 0)
    fail("--n-head {}: not a multiple of --n-head-kv {}", d.n_head, d.n_head_kv);
  if (d.ssm_v_heads % d.ssm_k_heads != 0)
    fail("--ssm-v-heads {}: not a multiple of --ssm-k-heads {}", d.ssm_v_heads, d.ssm_k_heads);
  if (d.rope_dim > d.head_dim || d.rope_dim % 2 != 0)
    fail("--rope-dim {}: must be even and at most --head-dim {}", d.rope_dim, d.head_dim);
}

// The topic heads' changes to the DeltaNet tensors of one layer (see TopicHeads, docs/synth.md).
// Rows are those of the tensors as stored: ssm_in grouped per key head [q k v z], attn_gate = z of
// all value heads, conv channels = [q of all key heads | k of all key heads | v of all value heads].
struct TopicEdits {
  std::vector<float> ssm_in_gains, attn_gate_gains;
  std::function<void(int64_t, float*, int64_t)> conv, dt_bias, ssm_a;
};

TopicEdits topic_edits(const Dims& d, const TopicHeads& topic) {
  TopicEdits e;
  if (topic.n_key_heads == 0) return e;
  const int64_t hd = d.ssm_head_dim, vpk = d.ssm_v_heads / d.ssm_k_heads, kd = d.key_dim();
  const int64_t group = 2 * hd + 2 * vpk * hd;
  const int64_t topic_k_channels = topic.n_key_heads * hd, topic_v_heads = topic.n_key_heads * vpk;
  // Output gate rows: z_gain times the usual spread, so SiLU(z) is mostly its positive part and
  // the topic heads dominate the layer's output.
  e.ssm_in_gains.assign((size_t)(2 * kd + 2 * d.value_dim()), 1.0f);
  for (int g = 0; g < topic.n_key_heads; g++)
    for (int64_t r = 2 * hd + vpk * hd; r < group; r++) e.ssm_in_gains[(size_t)(g * group + r)] = topic.z_gain;
  e.attn_gate_gains.assign((size_t)d.value_dim(), 1.0f);
  for (int64_t r = 0; r < topic_v_heads * hd; r++) e.attn_gate_gains[(size_t)r] = topic.z_gain;
  // q and k channels: only the current token, amplified, so SiLU acts as a rectifier and the
  // L2-normalised q and k share a large positive common component (cos^2 ~ 1/pi between tokens).
  const float tap = topic.qk_tap;
  e.conv = [=](int64_t ch, float* taps, int64_t n) {
    const bool is_q = ch < topic_k_channels, is_k = ch >= kd && ch < kd + topic_k_channels;
    if (!is_q && !is_k) return;
    for (int64_t i = 0; i < n; i++) taps[i] = 0;
    taps[n - 1] = tap;
  };
  const float dt = topic.dt_bias, a = topic.ssm_a;
  e.dt_bias = [=](int64_t, float* v, int64_t n) {
    for (int64_t j = 0; j < std::min<int64_t>(n, topic_v_heads); j++) v[j] = dt;
  };
  e.ssm_a = [=](int64_t, float* v, int64_t n) {
    for (int64_t j = 0; j < std::min<int64_t>(n, topic_v_heads); j++) v[j] = a;
  };
  return e;
}

std::vector<TensorPlan> build_table(const Options& o, const Dims& d, const std::vector<float>& gains_by_rank,
                                    const std::vector<std::vector<int>>& ranks) {
  TableBuilder b(o, d);
  const TopicEdits topic = topic_edits(d, topic_heads(d, o.router_skew));
  const int64_t E = d.n_embd;
  auto inv = [](int64_t fan_in) { return 1.0 / std::sqrt((double)fan_in); };
  b.add("token_embd.weight", Role::TokenEmbd, -1, {E, d.n_vocab}, normal(1.0), "--n-embd");
  for (int L = 0; L < d.n_layer; L++) {
    const std::string p = fmt::format("blk.{}.", L);
    b.add(p + "attn_norm.weight", Role::Norm, L, {E}, one_plus_normal(0.05f), "--n-embd");
    b.add(p + "post_attention_norm.weight", Role::Norm, L, {E}, one_plus_normal(0.05f), "--n-embd");
    if (d.is_recurrent(L)) {
      const int64_t kd = d.key_dim(), vd = d.value_dim();
      const int64_t conv_dim = 2 * kd + vd;
      if (o.layout == ProjectionLayout::LegacyFused) {
        WeightInit in = normal(inv(E));
        in.row_gains = topic.ssm_in_gains;
        b.add(p + "ssm_in.weight", Role::SsmIn, L, {E, 2 * kd + 2 * vd}, std::move(in), "--n-embd");
      } else {
        b.add(p + "attn_qkv.weight", Role::AttnQkv, L, {E, conv_dim}, normal(inv(E)), "--n-embd");
        WeightInit gate = normal(inv(E));
        gate.row_gains = topic.attn_gate_gains;
        b.add(p + "attn_gate.weight", Role::AttnGate, L, {E, vd}, std::move(gate), "--n-embd");
      }
      WeightInit conv{WeightInit::Kind::ConvTaps, 0.25f, 0.6f, 0, {}, {}};
      conv.adjust_row = topic.conv;
      b.add(p + "ssm_conv1d.weight", Role::SsmConv, L, {d.conv_kernel, conv_dim}, std::move(conv), "--conv-kernel");
      WeightInit dt{WeightInit::Kind::Uniform, -2.0f, 1.0f, 0, {}, {}};
      dt.adjust_row = topic.dt_bias;
      b.add(p + "ssm_dt.bias", Role::SsmDtBias, L, {d.ssm_v_heads}, std::move(dt), "--ssm-v-heads");
      WeightInit a{WeightInit::Kind::NegLogUniform, 0.05f, 4.0f, 0, {}, {}};
      a.adjust_row = topic.ssm_a;
      b.add(p + "ssm_a", Role::SsmA, L, {d.ssm_v_heads}, std::move(a), "--ssm-v-heads");
      b.add(p + "ssm_ba.weight", Role::SsmBa, L, {E, 2 * d.ssm_v_heads}, normal(inv(E)), "--n-embd");
      b.add(p + "ssm_norm.weight", Role::Norm, L, {d.ssm_head_dim}, one_plus_normal(0.1f), "--ssm-head-dim");
      b.add(p + "ssm_out.weight", Role::SsmOut, L, {vd, E}, normal(1.5 * inv(vd)), "--ssm-v-heads x --ssm-head-dim");
    } else {
      const int64_t qd = (int64_t)d.n_head * d.head_dim, kvd = (int64_t)d.n_head_kv * d.head_dim;
      b.add(p + "attn_q.weight", Role::AttnQ, L, {E, 2 * qd}, normal(inv(E)), "--n-embd");
      b.add(p + "attn_k.weight", Role::AttnK, L, {E, kvd}, normal(inv(E)), "--n-embd");
      b.add(p + "attn_v.weight", Role::AttnV, L, {E, kvd}, normal(inv(E)), "--n-embd");
      b.add(p + "attn_output.weight", Role::AttnOutput, L, {qd, E}, normal(1.5 * inv(qd)), "--n-head x --head-dim");
      b.add(p + "attn_q_norm.weight", Role::Norm, L, {d.head_dim}, one_plus_normal(0.1f), "--head-dim");
      b.add(p + "attn_k_norm.weight", Role::Norm, L, {d.head_dim}, one_plus_normal(0.1f), "--head-dim");
    }
    WeightInit router = normal(2.5 * inv(E));
    if (!gains_by_rank.empty()) {
      router.row_gains.resize(d.n_expert);
      for (int e = 0; e < d.n_expert; e++) router.row_gains[e] = gains_by_rank[ranks[L][e]];
    }
    b.add(p + "ffn_gate_inp.weight", Role::Router, L, {E, d.n_expert}, std::move(router), "--n-embd");
    b.add(p + "ffn_gate_exps.weight", Role::GateExps, L, {E, d.n_ff_exp, d.n_expert}, normal(inv(E)), "--n-embd");
    b.add(p + "ffn_up_exps.weight", Role::UpExps, L, {E, d.n_ff_exp, d.n_expert}, normal(inv(E)), "--n-embd");
    b.add(p + "ffn_down_exps.weight", Role::DownExps, L, {d.n_ff_exp, E, d.n_expert}, normal(2.0 * inv(d.n_ff_exp)),
          "--n-ff-exp");
    b.add(p + "ffn_gate_inp_shexp.weight", Role::SharedGateInp, L, {E}, normal(inv(E)), "--n-embd");
    b.add(p + "ffn_gate_shexp.weight", Role::GateShexp, L, {E, d.n_ff_shexp}, normal(inv(E)), "--n-embd");
    b.add(p + "ffn_up_shexp.weight", Role::UpShexp, L, {E, d.n_ff_shexp}, normal(inv(E)), "--n-embd");
    b.add(p + "ffn_down_shexp.weight", Role::DownShexp, L, {d.n_ff_shexp, E}, normal(1.5 * inv(d.n_ff_shexp)),
          "--n-ff-shexp");
  }
  b.add("output_norm.weight", Role::Norm, -1, {E}, one_plus_normal(0.05f), "--n-embd");
  WeightInit head = normal(4.0 * inv(E));
  head.row_log_std = 0.3f;  // widens the gap between the first and second logit, as in the fixtures
  b.add("output.weight", Role::Output, -1, {E, d.n_vocab}, std::move(head), "--n-embd");
  return b.tensors;
}

std::string model_name(const std::string& preset) {
  if (preset == "80b") return "Qwen3-Next-80B-A3B synthetic (random weights)";
  return "Qwen3-Next " + preset + " synthetic (random weights)";
}

std::vector<std::pair<std::string, MetaValue>> build_metadata(const Options& o, const Dims& d) {
  const std::string a = "qwen3next.";
  auto u = [](int v) { return MetaValue{(uint32_t)v}; };
  return {
      {"general.architecture", std::string("qwen3next")},
      {"general.name", model_name(o.preset)},
      {a + "block_count", u(d.n_layer)},
      {a + "context_length", u(d.n_ctx_train)},
      {a + "embedding_length", u(d.n_embd)},
      {a + "feed_forward_length", u(d.n_ff)},
      {a + "attention.head_count", u(d.n_head)},
      {a + "attention.head_count_kv", u(d.n_head_kv)},
      {a + "rope.freq_base", 1e7f},
      {a + "attention.layer_norm_rms_epsilon", 1e-6f},
      {a + "expert_count", u(d.n_expert)},
      {a + "expert_used_count", u(d.n_expert_used)},
      {a + "attention.key_length", u(d.head_dim)},
      {a + "attention.value_length", u(d.head_dim)},
      {a + "expert_feed_forward_length", u(d.n_ff_exp)},
      {a + "expert_shared_feed_forward_length", u(d.n_ff_shexp)},
      {a + "ssm.conv_kernel", u(d.conv_kernel)},
      {a + "ssm.state_size", u(d.ssm_head_dim)},
      {a + "ssm.group_count", u(d.ssm_k_heads)},
      {a + "ssm.time_step_rank", u(d.ssm_v_heads)},
      {a + "ssm.inner_size", u(d.value_dim())},
      {a + "full_attention_interval", u(d.full_attention_interval)},
      {a + "rope.dimension_count", u(d.rope_dim)},
      {"general.file_type", MetaValue{recipe_file_type(o.recipe)}},
      {"general.quantization_version", MetaValue{(uint32_t)2}},
  };
}

// The vocabulary size of --vocab-from (its token list).
int vocab_size_of(const GgufFile& f) {
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  if (!tokens || !tokens->is_array())
    fail("--vocab-from {}: no tokenizer.ggml.tokens array, so there is no tokenizer to copy", f.path());
  return (int)tokens->size();
}

}  // namespace

TopicHeads topic_heads(const Dims& d, double router_skew) {
  TopicHeads t;
  if (!(router_skew > 0)) return t;
  // One topic key head per 8 (at least one): 2 of 32 value heads at 80B, 2 of 4 in the tiny preset.
  t.n_key_heads = std::max(1, d.ssm_k_heads / 8);
  t.qk_tap = 4.0f;    // q, k pre-activations ~N(0, 4^2): SiLU acts as a rectifier
  t.z_gain = 8.0f;    // the topic heads' output outweighs the token embedding in the residual
  t.ssm_a = -0.1f;    // log-decay -0.1 softplus(a) per token: memory of ~10 tokens
  t.dt_bias = 0.0f;
  return t;
}

int64_t TensorPlan::n_rows() const {
  int64_t r = 1;
  for (size_t i = 1; i < ne.size(); i++) r *= ne[i];
  return r;
}

uint64_t TensorPlan::n_bytes() const { return (uint64_t)row_size(type, ne[0]) * (uint64_t)n_rows(); }

uint64_t Plan::data_bytes() const {
  uint64_t s = 0;
  for (const auto& t : tensors) s += t.n_bytes();
  return s;
}

Plan make_plan(const Options& options) {
  Plan plan;
  plan.options = options;
  Dims d = preset_dims(options.preset);
  if (std::find(recipe_names().begin(), recipe_names().end(), options.recipe) == recipe_names().end())
    fail("--recipe {}: unknown recipe (known: {})", options.recipe, fmt::join(recipe_names(), ", "));
  for (const auto& [name, value] : options.dim_overrides) dim_by_name(d, name) = value;
  if (!options.vocab_from.empty()) {
    const int n = vocab_size_of(*GgufFile::open(options.vocab_from));
    if (options.dim_overrides.count("n_vocab") && options.dim_overrides.at("n_vocab") != n)
      fail("--n-vocab {}: --vocab-from {} has {} tokens", options.dim_overrides.at("n_vocab"), options.vocab_from, n);
    d.n_vocab = n;
  } else if (d.n_vocab < 259) {
    fail("--n-vocab {}: a placeholder vocabulary needs at least 259 tokens (256 bytes + 3 control)", d.n_vocab);
  }
  validate_dims(d);
  if (!(options.router_skew >= 0) || !std::isfinite(options.router_skew))
    fail("--router-skew {}: must be a finite number >= 0", options.router_skew);
  if (options.router_skew > 0 && d.n_expert_used > kMaxSelectionProbability * d.n_expert)
    fail("--router-skew {}: needs --n-expert-used ({}) <= {} x --n-expert ({})", options.router_skew,
         d.n_expert_used, kMaxSelectionProbability, d.n_expert);
  plan.dims = d;

  std::vector<float> gains;
  if (options.router_skew > 0) {
    gains = router_gains(d.n_expert, d.n_expert_used, options.router_skew, options.seed);
    plan.expert_rank = expert_ranks(d.n_layer, d.n_expert, options.seed);
  }
  plan.tensors = build_table(options, d, gains, plan.expert_rank);
  plan.metadata = build_metadata(options, d);
  return plan;
}

// ---- JSON table -------------------------------------------------------------------------------

nlohmann::ordered_json plan_json(const Plan& plan) {
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [key, value] : plan.metadata)
    std::visit([&](const auto& v) { meta[key] = v; }, value);
  nlohmann::ordered_json tok = nlohmann::ordered_json::object();
  if (plan.options.vocab_from.empty()) {
    const PlaceholderVocab v = make_placeholder_vocab(plan.dims.n_vocab);
    tok["tokenizer.ggml.model"] = "gpt2";
    tok["tokenizer.ggml.pre"] = "qwen2";
    tok["tokenizer.ggml.tokens"] = fmt::format("array[{}]", v.tokens.size());
    tok["tokenizer.ggml.token_type"] = fmt::format("array[{}]", v.token_types.size());
    tok["tokenizer.ggml.merges"] = fmt::format("array[{}]", v.merges.size());
    tok["tokenizer.ggml.eos_token_id"] = v.endoftext_id;
    tok["tokenizer.ggml.padding_token_id"] = v.endoftext_id;
    tok["tokenizer.ggml.bos_token_id"] = v.endoftext_id;
    tok["tokenizer.ggml.add_bos_token"] = false;
    tok["tokenizer.chat_template"] = chatml_template();
  } else {
    const auto f = GgufFile::open(plan.options.vocab_from);
    for (const auto& kv : f->metadata()) {
      if (kv.key.rfind("tokenizer.", 0) != 0) continue;
      const GgufValue& v = kv.value;
      if (v.is_array()) tok[kv.key] = fmt::format("array[{}]", v.size());
      else if (v.type() == GgufValueType::STRING) tok[kv.key] = std::string(v.as_string());
      else if (v.type() == GgufValueType::BOOL) tok[kv.key] = v.as_bool();
      else if (v.is_float()) tok[kv.key] = v.as_float();
      else tok[kv.key] = v.as_int();
    }
  }
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const auto& t : plan.tensors) {
    std::string type = type_name(t.type);
    std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return (char)std::toupper(c); });
    tensors.push_back({{"name", t.name}, {"type", type}, {"ne", t.ne}});
  }
  nlohmann::ordered_json j;
  j["metadata"] = meta;
  j["tokenizer_keys"] = tok;
  j["n_tensors"] = plan.tensors.size();
  j["data_bytes"] = plan.data_bytes();
  j["tensors"] = tensors;
  return j;
}

// ---- tensor data ------------------------------------------------------------------------------

namespace {

void fill_row(const TensorPlan& t, uint64_t seed, size_t index, int64_t row, uint8_t* dst) {
  Rng rng(mix_seed(seed, index, (uint64_t)row));
  const WeightInit& w = t.init;
  const int64_t n = t.ne[0];
  if (w.kind == WeightInit::Kind::Normal) {
    float std = w.a;
    if (!w.row_gains.empty()) std *= w.row_gains[(size_t)row];
    if (w.row_log_std > 0) std *= std::exp(w.row_log_std * rng.normal());
    fill_normal_row(t.type, dst, n, std, rng);
    return;
  }
  std::vector<float> v((size_t)n);
  for (int64_t i = 0; i < n; i++) {
    switch (w.kind) {
      case WeightInit::Kind::OnePlusNormal: v[i] = 1.0f + w.a * rng.normal(); break;
      case WeightInit::Kind::Uniform: v[i] = w.a + (w.b - w.a) * rng.uniform(); break;
      case WeightInit::Kind::NegLogUniform:
        v[i] = -std::exp(std::log(w.a) + (std::log(w.b) - std::log(w.a)) * rng.uniform());
        break;
      case WeightInit::Kind::ConvTaps: v[i] = w.a * rng.normal() + (i == n - 1 ? w.b : 0.0f); break;
      case WeightInit::Kind::Normal: break;
    }
  }
  if (w.adjust_row) w.adjust_row(row, v.data(), n);
  store_float_row(t.type, v.data(), n, dst);
}

// Rows of one chunk over the worker threads: each row's bytes depend only on (seed, tensor, row).
void fill_rows_parallel(const Plan& plan, size_t index, uint8_t* dst, int64_t first_row, int64_t n_rows,
                        int threads) {
  const TensorPlan& t = plan.tensors[index];
  const size_t row_bytes = row_size(t.type, t.ne[0]);
  auto work = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; r++) fill_row(t, plan.options.seed, index, first_row + r, dst + (size_t)r * row_bytes);
  };
  // Below ~1 MiB a thread costs more than the rows it would fill.
  const int n_threads = (int)std::min<int64_t>(threads, std::max<int64_t>(1, (int64_t)(n_rows * row_bytes >> 20)));
  if (n_threads <= 1 || n_rows < 2) {
    work(0, n_rows);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(n_threads);
  const int64_t per = (n_rows + n_threads - 1) / n_threads;
  for (int i = 0; i < n_threads; i++) {
    const int64_t begin = std::min<int64_t>(n_rows, i * per), end = std::min<int64_t>(n_rows, begin + per);
    pool.emplace_back([&, i, begin, end] {
      try {
        work(begin, end);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  return (int)std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

void fill_tensor_rows(const Plan& plan, size_t index, uint8_t* dst, int64_t first_row, int64_t n_rows) {
  fill_rows_parallel(plan, index, dst, first_row, n_rows, resolve_threads(plan.options.threads));
}

WriteStats write_model(const Plan& plan, const std::string& path) {
  const auto start = std::chrono::steady_clock::now();
  WriteStats stats;
  stats.threads = resolve_threads(plan.options.threads);
  // Calibrate each quantised type's block scale once, before the worker threads need it.
  for (const auto& t : plan.tensors) unit_rms(t.type);

  GgufWriter w;
  for (const auto& [key, value] : plan.metadata) {
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, uint32_t>) w.add_u32(key, v);
          else if constexpr (std::is_same_v<T, float>) w.add_f32(key, v);
          else if constexpr (std::is_same_v<T, bool>) w.add_bool(key, v);
          else w.add_string(key, v);
        },
        value);
  }

  std::unique_ptr<GgufFile> vocab_source;
  if (plan.options.vocab_from.empty()) {
    const PlaceholderVocab v = make_placeholder_vocab(plan.dims.n_vocab);
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "qwen2");
    w.add_array_string("tokenizer.ggml.tokens", v.tokens);
    w.add_array_i32("tokenizer.ggml.token_type", v.token_types);
    w.add_array_string("tokenizer.ggml.merges", v.merges);
    w.add_u32("tokenizer.ggml.eos_token_id", v.endoftext_id);
    w.add_u32("tokenizer.ggml.padding_token_id", v.endoftext_id);
    w.add_u32("tokenizer.ggml.bos_token_id", v.endoftext_id);
    w.add_bool("tokenizer.ggml.add_bos_token", false);
    w.add_string("tokenizer.chat_template", chatml_template());
    stats.placeholder_vocab = true;
  } else {
    vocab_source = GgufFile::open(plan.options.vocab_from);
    if (vocab_size_of(*vocab_source) != plan.dims.n_vocab)
      fail("--vocab-from {}: token count changed since the plan was made", plan.options.vocab_from);
    for (const auto& kv : vocab_source->metadata())
      if (kv.key.rfind("tokenizer.", 0) == 0) w.add_value(kv.key, kv.value);
  }

  // Provenance: how to make the same file again.
  const Options& o = plan.options;
  w.add_string("redlite.synth.preset", o.preset);
  w.add_string("redlite.synth.recipe", o.recipe);
  w.add_string("redlite.synth.layout", o.layout == ProjectionLayout::LegacyFused ? "legacy" : "split");
  w.add_u64("redlite.synth.seed", o.seed);
  w.add_f32("redlite.synth.router_skew", (float)o.router_skew);
  w.add_bool("redlite.synth.placeholder_vocab", stats.placeholder_vocab);

  for (size_t i = 0; i < plan.tensors.size(); i++) {
    const TensorPlan& t = plan.tensors[i];
    const int threads = stats.threads;
    w.add_tensor(t.name, t.type, t.ne, [&plan, i, threads](uint8_t* dst, int64_t first_row, int64_t n_rows) {
      fill_rows_parallel(plan, i, dst, first_row, n_rows, threads);
    });
  }
  w.write(path);
  stats.file_bytes = w.file_size();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace rl::synth
