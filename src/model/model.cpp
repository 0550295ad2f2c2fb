// Binding a qwen3next GGUF: hyperparameters from `qwen3next.*` metadata, then every tensor the
// main pass needs, checked for presence, shape and a float view of its type.
#include "model/model.h"

#include <cmath>

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "common/error.h"
#include "gguf/gguf.h"

namespace rl {

TensorView TensorView::rows(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first + count > n_rows())
    fail("{}: rows [{}, {}) out of range (tensor has {} rows)", name, first, first + count, n_rows());
  TensorView v = *this;
  v.ne = {ne[0], count, 1, 1};
  v.data = data + (size_t)first * row_bytes;
  v.file_offset = file_offset + (uint64_t)first * row_bytes;
  v.nbytes = (size_t)count * row_bytes;
  return v;
}

TensorView TensorView::matrix(int64_t i) const {
  if (i < 0 || i >= ne[2] || ne[3] != 1)
    fail("{}: matrix {} out of range (tensor is {})", name, i, shape_string());
  return rows(i * ne[1], ne[1]);
}

std::string TensorView::shape_string() const {
  std::string s = fmt::format("{}", ne[0]);
  int last = 0;
  for (int d = 1; d < 4; d++)
    if (ne[d] != 1) last = d;
  for (int d = 1; d <= last; d++) s += fmt::format(" x {}", ne[d]);
  return s;
}

std::vector<float> to_f32(const TensorView& t) {
  std::vector<float> out((size_t)t.n_elements());
  for (int64_t r = 0; r < t.n_rows(); r++)
    dequantize_row(t.type, t.row(r), out.data() + r * t.row_length(), t.row_length());
  return out;
}

namespace {

constexpr const char* kArch = "qwen3next";

// Reads `qwen3next.<key>`. Some converters write per-layer arrays for head counts (with 0 for the
// layers that have no attention); those are accepted when every non-zero entry is the same.
class HparamReader {
 public:
  explicit HparamReader(const GgufFile& f) : f_(f) {}

  std::string key(const char* k) const { return fmt::format("{}.{}", kArch, k); }

  int64_t get_int(const char* k) const {
    const std::string full = key(k);
    const GgufValue* v = f_.find(full);
    if (!v) fail("{}: missing metadata key {}", f_.path(), full);
    return as_int(full, *v);
  }
  int64_t get_int(const char* k, int64_t def) const {
    const std::string full = key(k);
    const GgufValue* v = f_.find(full);
    return v ? as_int(full, *v) : def;
  }
  double get_float(const char* k, double def) const {
    const std::string full = key(k);
    const GgufValue* v = f_.find(full);
    if (!v) return def;
    if (!v->is_float() && !v->is_integer())
      fail("{}: metadata key {} has type {}, expected a number", f_.path(), full,
           gguf_value_type_name(v->type()));
    return v->as_float();
  }
  double get_float(const char* k) const {
    const std::string full = key(k);
    if (!f_.find(full)) fail("{}: missing metadata key {}", f_.path(), full);
    return get_float(k, 0.0);
  }

 private:
  int64_t as_int(const std::string& full, const GgufValue& v) const {
    if (v.is_integer()) return v.as_int();
    if (v.is_array() && v.size() > 0) {
      int64_t value = 0;
      for (size_t i = 0; i < v.size(); i++) {
        const int64_t x = v.int_at(i);
        if (x == 0) continue;
        if (value != 0 && x != value)
          fail("{}: metadata key {} varies per layer ({} vs {}); qwen3next needs one value",
               f_.path(), full, value, x);
        value = x;
      }
      return value;
    }
    fail("{}: metadata key {} has type {}, expected an integer", f_.path(), full,
         gguf_value_type_name(v.type()));
  }
  const GgufFile& f_;
};

void require_positive(const GgufFile& f, const char* what, int64_t v) {
  if (v <= 0 || v > (1 << 30)) fail("{}: metadata {}.{} = {} is not a valid size", f.path(), kArch, what, v);
}

Config read_config(const GgufFile& f) {
  Config c;
  c.architecture = f.get_string("general.architecture", "");
  if (c.architecture != kArch)
    fail("{}: unsupported architecture '{}' (general.architecture); this engine supports '{}'",
         f.path(), c.architecture, kArch);
  HparamReader h(f);
  c.n_layer_file = (int)h.get_int("block_count");
  c.nextn_predict_layers = (int)h.get_int("nextn_predict_layers", 0);
  c.n_layer = c.n_layer_file - c.nextn_predict_layers;
  c.n_embd = (int)h.get_int("embedding_length");
  c.n_ctx_train = (int)std::min<int64_t>(h.get_int("context_length", 262144), INT32_MAX);
  c.rms_eps = (float)h.get_float("attention.layer_norm_rms_epsilon");
  c.n_head = (int)h.get_int("attention.head_count");
  c.n_head_kv = (int)h.get_int("attention.head_count_kv");
  c.head_dim = (int)h.get_int("attention.key_length", c.n_head > 0 ? c.n_embd / c.n_head : 0);
  const int64_t value_length = h.get_int("attention.value_length", c.head_dim);
  c.rope_dim = (int)h.get_int("rope.dimension_count", c.head_dim);
  c.rope_base = (float)h.get_float("rope.freq_base", 10000.0);
  c.ssm_n_k_heads = (int)h.get_int("ssm.group_count");
  c.ssm_n_v_heads = (int)h.get_int("ssm.time_step_rank");
  c.ssm_head_dim = (int)h.get_int("ssm.state_size");
  c.ssm_conv_kernel = (int)h.get_int("ssm.conv_kernel");
  const int64_t inner = h.get_int("ssm.inner_size");
  c.n_expert = (int)h.get_int("expert_count");
  c.n_expert_used = (int)h.get_int("expert_used_count");
  c.n_ff_exp = (int)h.get_int("expert_feed_forward_length");
  c.n_ff_shexp = (int)h.get_int("expert_shared_feed_forward_length", c.n_ff_exp);
  c.expert_weights_scale = (float)h.get_float("expert_weights_scale", 0.0);

  require_positive(f, "block_count", c.n_layer_file);
  if (c.nextn_predict_layers < 0 || c.n_layer <= 0)
    fail("{}: {}.nextn_predict_layers = {} leaves no decoder layer of block_count {}", f.path(),
         kArch, c.nextn_predict_layers, c.n_layer_file);
  require_positive(f, "embedding_length", c.n_embd);
  require_positive(f, "attention.head_count", c.n_head);
  require_positive(f, "attention.head_count_kv", c.n_head_kv);
  require_positive(f, "attention.key_length", c.head_dim);
  require_positive(f, "ssm.group_count", c.ssm_n_k_heads);
  require_positive(f, "ssm.time_step_rank", c.ssm_n_v_heads);
  require_positive(f, "ssm.state_size", c.ssm_head_dim);
  require_positive(f, "ssm.conv_kernel", c.ssm_conv_kernel);
  require_positive(f, "expert_count", c.n_expert);
  require_positive(f, "expert_used_count", c.n_expert_used);
  require_positive(f, "expert_feed_forward_length", c.n_ff_exp);
  require_positive(f, "expert_shared_feed_forward_length", c.n_ff_shexp);
  if (value_length != c.head_dim)
    fail("{}: {}.attention.value_length {} differs from key_length {}; qwen3next needs them equal",
         f.path(), kArch, value_length, c.head_dim);
  if (c.n_head % c.n_head_kv != 0)
    fail("{}: attention.head_count {} is not a multiple of head_count_kv {}", f.path(), c.n_head,
         c.n_head_kv);
  if (c.rope_dim <= 0 || c.rope_dim > c.head_dim || c.rope_dim % 2 != 0)
    fail("{}: {}.rope.dimension_count {} must be even and at most the head dim {}", f.path(), kArch,
         c.rope_dim, c.head_dim);
  if (c.ssm_n_v_heads % c.ssm_n_k_heads != 0)
    fail("{}: ssm.time_step_rank {} (value heads) is not a multiple of ssm.group_count {}", f.path(),
         c.ssm_n_v_heads, c.ssm_n_k_heads);
  if (inner != (int64_t)c.ssm_n_v_heads * c.ssm_head_dim)
    fail("{}: {}.ssm.inner_size {} != time_step_rank {} x state_size {}", f.path(), kArch, inner,
         c.ssm_n_v_heads, c.ssm_head_dim);
  if (c.n_expert_used > c.n_expert)
    fail("{}: expert_used_count {} exceeds expert_count {}", f.path(), c.n_expert_used, c.n_expert);
  // Values that make every logit NaN or infinite: refused here rather than served as garbage.
  if (!std::isfinite(c.rms_eps) || c.rms_eps <= 0)
    fail("{}: {}.attention.layer_norm_rms_epsilon = {} must be a finite positive number", f.path(), kArch,
         c.rms_eps);
  // Below 1 the rotation frequencies grow past one radian a position and overflow for tiny bases.
  if (!std::isfinite(c.rope_base) || c.rope_base < 1)
    fail("{}: {}.rope.freq_base = {} must be a finite number >= 1", f.path(), kArch, c.rope_base);
  if (!std::isfinite(c.expert_weights_scale) || c.expert_weights_scale < 0)
    fail("{}: {}.expert_weights_scale = {} must be a finite number >= 0", f.path(), kArch, c.expert_weights_scale);

  // Which layers are Gated DeltaNet: the explicit per-layer flags when present, else every layer
  // but each full_attention_interval-th.
  c.is_recurrent.assign(c.n_layer, false);
  const std::string recr_key = h.key("attention.recurrent_layers");
  if (const GgufValue* v = f.find(recr_key)) {
    if (v->is_array()) {
      if (v->size() < (size_t)c.n_layer)
        fail("{}: {} has {} entries, fewer than the {} decoder layers", f.path(), recr_key, v->size(),
             c.n_layer);
      for (int i = 0; i < c.n_layer; i++) c.is_recurrent[i] = v->int_at(i) != 0;
    } else {
      const bool all = v->type() == GgufValueType::BOOL ? v->as_bool() : v->as_int() != 0;
      c.is_recurrent.assign(c.n_layer, all);
    }
  } else {
    const int64_t interval = h.get_int("full_attention_interval", 4);
    if (interval <= 0) fail("{}: {}.full_attention_interval = {} must be positive", f.path(), kArch, interval);
    for (int i = 0; i < c.n_layer; i++) c.is_recurrent[i] = (i + 1) % interval != 0;
  }
  return c;
}

// Binds tensors by name with shape and type checks.
class Binder {
 public:
  explicit Binder(const GgufFile& f) : f_(f) {}

  // `ne` in GGUF order; trailing dims left out are 1.
  TensorView bind(const std::string& name, std::vector<int64_t> ne) const {
    const GgufTensorInfo* t = f_.find_tensor(name);
    if (!t) fail("{}: missing tensor {} (expected shape {})", f_.path(), name, shape_of(ne));
    return view(*t, ne);
  }
  TensorView bind_optional(const std::string& name, std::vector<int64_t> ne) const {
    const GgufTensorInfo* t = f_.find_tensor(name);
    return t ? view(*t, ne) : TensorView{};
  }
  bool has(const std::string& name) const { return f_.find_tensor(name) != nullptr; }

 private:
  static std::string shape_of(const std::vector<int64_t>& ne) {
    std::string s;
    for (size_t i = 0; i < ne.size(); i++) s += (i ? " x " : "") + std::to_string(ne[i]);
    return s;
  }
  TensorView view(const GgufTensorInfo& t, const std::vector<int64_t>& ne) const {
    std::array<int64_t, 4> want{1, 1, 1, 1};
    for (size_t i = 0; i < ne.size(); i++) want[i] = ne[i];
    if (t.ne != want)
      fail("{}: tensor {} has shape {}, expected {}", f_.path(), t.name, t.shape_string(), shape_of(ne));
    const QuantType* q = find_quant_type((uint32_t)t.type);
    if (!q || !q->dequantize_row)
      fail("{}: tensor {} has type {}, which has no float view this engine can compute with", f_.path(),
           t.name, type_name(t.type));
    if (t.ne[0] % q->block_size != 0)
      fail("{}: tensor {} row length {} is not a multiple of the {} block size {}", f_.path(), t.name,
           t.ne[0], q->name, q->block_size);
    TensorView v;
    v.name = t.name;
    v.type = t.type;
    v.ne = t.ne;
    v.data = t.data;
    v.nbytes = t.nbytes;
    v.row_bytes = row_size(t.type, t.ne[0]);
    v.file_offset = f_.data_offset() + t.offset;
    if (v.row_bytes * (size_t)t.n_rows() != t.nbytes)
      fail("{}: tensor {} holds {} bytes, expected {} for {} {}", f_.path(), t.name, t.nbytes,
           v.row_bytes * (size_t)t.n_rows(), q->name, t.shape_string());
    return v;
  }
  const GgufFile& f_;
};

std::string blk(int layer, const char* what) { return fmt::format("blk.{}.{}", layer, what); }

AttentionWeights bind_attention(const Binder& b, const Config& c, int L) {
  AttentionWeights a;
  if (b.has(blk(L, "attn_qkv.weight"))) {
    // Fused projection (some converters): rows [q|gate (2*q_dim), k (kv_dim), v (kv_dim)].
    const TensorView qkv = b.bind(blk(L, "attn_qkv.weight"), {c.n_embd, 2 * c.q_dim() + 2 * c.kv_dim()});
    a.q = qkv.rows(0, 2 * c.q_dim());
    a.k = qkv.rows(2 * c.q_dim(), c.kv_dim());
    a.v = qkv.rows(2 * c.q_dim() + c.kv_dim(), c.kv_dim());
  } else {
    a.q = b.bind(blk(L, "attn_q.weight"), {c.n_embd, 2 * c.q_dim()});
    a.k = b.bind(blk(L, "attn_k.weight"), {c.n_embd, c.kv_dim()});
    a.v = b.bind(blk(L, "attn_v.weight"), {c.n_embd, c.kv_dim()});
  }
  a.q_norm = b.bind(blk(L, "attn_q_norm.weight"), {c.head_dim});
  a.k_norm = b.bind(blk(L, "attn_k_norm.weight"), {c.head_dim});
  a.output = b.bind(blk(L, "attn_output.weight"), {c.q_dim(), c.n_embd});
  return a;
}

DeltaNetWeights bind_deltanet(const Binder& b, const Config& c, const GgufFile& f, int L) {
  DeltaNetWeights s;
  const int64_t key_dim = c.ssm_key_dim(), value_dim = c.ssm_value_dim();
  if (b.has(blk(L, "ssm_in.weight"))) {
    s.legacy_fused = true;
    s.in = b.bind(blk(L, "ssm_in.weight"), {c.n_embd, 2 * key_dim + 2 * value_dim});
  } else if (b.has(blk(L, "attn_qkv.weight"))) {
    s.qkv = b.bind(blk(L, "attn_qkv.weight"), {c.n_embd, 2 * key_dim + value_dim});
    s.gate = b.bind(blk(L, "attn_gate.weight"), {c.n_embd, value_dim});
  } else {
    fail("{}: missing tensor {} (or {} + {}): layer {} is a linear-attention layer", f.path(),
         blk(L, "ssm_in.weight"), blk(L, "attn_qkv.weight"), blk(L, "attn_gate.weight"), L);
  }
  s.ba = b.bind(blk(L, "ssm_ba.weight"), {c.n_embd, 2 * c.ssm_n_v_heads});
  s.conv1d = b.bind(blk(L, "ssm_conv1d.weight"), {c.ssm_conv_kernel, c.ssm_conv_dim()});
  s.dt_bias = b.bind(blk(L, "ssm_dt.bias"), {c.ssm_n_v_heads});
  s.a = b.bind(blk(L, "ssm_a"), {c.ssm_n_v_heads});
  s.norm = b.bind(blk(L, "ssm_norm.weight"), {c.ssm_head_dim});
  s.out = b.bind(blk(L, "ssm_out.weight"), {value_dim, c.n_embd});
  return s;
}

MoeWeights bind_moe(const Binder& b, const Config& c, int L) {
  MoeWeights m;
  m.router = b.bind(blk(L, "ffn_gate_inp.weight"), {c.n_embd, c.n_expert});
  m.gate_exps = b.bind(blk(L, "ffn_gate_exps.weight"), {c.n_embd, c.n_ff_exp, c.n_expert});
  m.up_exps = b.bind(blk(L, "ffn_up_exps.weight"), {c.n_embd, c.n_ff_exp, c.n_expert});
  m.down_exps = b.bind(blk(L, "ffn_down_exps.weight"), {c.n_ff_exp, c.n_embd, c.n_expert});
  m.shared_gate_inp = b.bind(blk(L, "ffn_gate_inp_shexp.weight"), {c.n_embd});
  m.gate_shexp = b.bind(blk(L, "ffn_gate_shexp.weight"), {c.n_embd, c.n_ff_shexp});
  m.up_shexp = b.bind(blk(L, "ffn_up_shexp.weight"), {c.n_embd, c.n_ff_shexp});
  m.down_shexp = b.bind(blk(L, "ffn_down_shexp.weight"), {c.n_ff_shexp, c.n_embd});
  return m;
}

}  // namespace

Model::~Model() = default;

const std::string& Model::path() const { return file_->path(); }

std::shared_ptr<const Model> Model::open(const std::string& path) {
  return from_gguf(GgufFile::open(path));
}

std::shared_ptr<const Model> Model::from_gguf(std::unique_ptr<GgufFile> file) {
  std::shared_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  const GgufFile& f = *m->file_;
  m->config_ = read_config(f);
  Config& c = m->config_;
  const Binder b(f);

  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd) fail("{}: missing tensor token_embd.weight", f.path());
  if (embd->ne[1] <= 0 || embd->ne[1] > INT32_MAX)
    fail("{}: tensor token_embd.weight has shape {}, which gives no valid vocabulary size", f.path(),
         embd->shape_string());
  c.n_vocab = (int)embd->ne[1];
  m->token_embd = b.bind("token_embd.weight", {c.n_embd, c.n_vocab});
  m->output_norm = b.bind("output_norm.weight", {c.n_embd});
  m->output = b.bind_optional("output.weight", {c.n_embd, c.n_vocab});
  if (!m->output.present()) {
    m->output = m->token_embd;  // tied embeddings
    m->output_is_token_embd = true;
  }

  m->layers.resize(c.n_layer);
  for (int L = 0; L < c.n_layer; L++) {
    LayerWeights& w = m->layers[L];
    w.recurrent = c.is_recurrent[L];
    w.attn_norm = b.bind(blk(L, "attn_norm.weight"), {c.n_embd});
    w.post_attention_norm = b.bind(blk(L, "post_attention_norm.weight"), {c.n_embd});
    if (w.recurrent)
      w.ssm = bind_deltanet(b, c, f, L);
    else
      w.attn = bind_attention(b, c, L);
    w.moe = bind_moe(b, c, L);
  }
  return m;
}

}  // namespace rl
