// The qwen3next model as the engine sees it: hyperparameters (Config) and typed views of every
// weight tensor, pointing into the memory-mapped GGUF (no copies). Every backend binds from here:
// the CPU oracle reads rows through the views, the CUDA backend uploads from them and finds the
// routed-expert slices with TensorView::matrix().
//
// Shapes in comments are written as in the math: [out x in] for a matrix means `out` rows of `in`
// values (GGUF ne = {in, out}); a row is what one output value dots with.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/kv_type.h"
#include "quant/quant.h"

namespace rl {

class GgufFile;

// One tensor (or a sub-block of whole rows of one) in the mapping.
struct TensorView {
  std::string name;                       // GGUF tensor name, e.g. "blk.3.attn_q.weight"
  GgmlType type = GgmlType::F32;
  std::array<int64_t, 4> ne{1, 1, 1, 1};  // GGUF order: ne[0] = row length
  const uint8_t* data = nullptr;          // first byte, in the mapping
  size_t nbytes = 0;                      // bytes of this view
  size_t row_bytes = 0;                   // bytes of one row of ne[0] values
  uint64_t file_offset = 0;               // absolute offset of `data` in the file (shard) holding it

  bool present() const { return data != nullptr; }
  int64_t row_length() const { return ne[0]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  int64_t n_elements() const { return ne[0] * n_rows(); }
  const uint8_t* row(int64_t r) const { return data + (size_t)r * row_bytes; }
  // Rows [first, first + count) as a 2-D view [count x ne0].
  TensorView rows(int64_t first, int64_t count) const;
  // Matrix i of a 3-D tensor [ne2][ne1 x ne0] as a 2-D view [ne1 x ne0]. For the routed experts:
  // expert e of ffn_gate_exps / ffn_up_exps is rows [e*n_ff, (e+1)*n_ff), of ffn_down_exps rows
  // [e*n_embd, (e+1)*n_embd); this returns exactly that slice.
  TensorView matrix(int64_t i) const;
  std::string shape_string() const;  // "256 x 512"
};

// Hyperparameters (GGUF metadata `qwen3next.*`), named as in the math.
struct Config {
  std::string architecture;   // "qwen3next"
  int n_embd = 0;             // hidden width (2048 for 80B-A3B)
  int n_layer = 0;            // decoder layers that the main pass runs
  int n_layer_file = 0;       // block_count: n_layer + nextn_predict_layers (MTP blocks, not run)
  int nextn_predict_layers = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;        // context_length
  float rms_eps = 1e-6f;

  // Gated full attention.
  int n_head = 0;             // query heads
  int n_head_kv = 0;          // key/value heads (GQA)
  int head_dim = 0;           // key_length == value_length
  int rope_dim = 0;           // rotary dims at the start of each head (partial rotary)
  float rope_base = 1e7f;

  // Gated DeltaNet.
  int ssm_n_k_heads = 0;      // ssm.group_count
  int ssm_n_v_heads = 0;      // ssm.time_step_rank
  int ssm_head_dim = 0;       // ssm.state_size: dk == dv
  int ssm_conv_kernel = 0;    // ssm.conv_kernel (4)

  // Mixture of experts.
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;           // routed expert width
  int n_ff_shexp = 0;         // shared expert width
  float expert_weights_scale = 0.0f;  // 0: not scaled (the key is optional)

  std::vector<bool> is_recurrent;  // [n_layer]: true = Gated DeltaNet, false = full attention

  int ssm_key_dim() const { return ssm_n_k_heads * ssm_head_dim; }    // q (and k) channels
  int ssm_value_dim() const { return ssm_n_v_heads * ssm_head_dim; }  // v (and z) channels
  int ssm_conv_dim() const { return 2 * ssm_key_dim() + ssm_value_dim(); }  // [q, k, v]
  int ssm_v_per_k() const { return ssm_n_v_heads / ssm_n_k_heads; }   // value heads per key head
  int q_dim() const { return n_head * head_dim; }
  int kv_dim() const { return n_head_kv * head_dim; }
  // Bytes of the K and V rows one token adds over every attention layer, in the cache's type.
  size_t kv_bytes_per_token(KvType kv = KvType::kF32) const {
    size_t attention_layers = 0;
    for (bool r : is_recurrent) attention_layers += !r;
    return attention_layers * 2 * kv_bytes(kv, (size_t)kv_dim());
  }
  // Bytes of the f32 recurrent states of every DeltaNet layer: the conv window and the SSM state.
  size_t recurrent_state_bytes() const {
    size_t values = 0;
    for (bool r : is_recurrent)
      if (r) values += (size_t)(ssm_conv_kernel - 1) * ssm_conv_dim() + (size_t)ssm_n_v_heads * ssm_head_dim * ssm_head_dim;
    return values * sizeof(float);
  }
};

// Full (gated) attention, layers with is_recurrent[L] == false.
// A file with one fused `attn_qkv` for an attention layer binds q, k, v as row ranges of it.
struct AttentionWeights {
  TensorView q;        // [n_head*2*head_dim x n_embd]: per head, head_dim query then head_dim gate
  TensorView k;        // [n_head_kv*head_dim x n_embd]
  TensorView v;        // [n_head_kv*head_dim x n_embd]
  TensorView q_norm;   // [head_dim]
  TensorView k_norm;   // [head_dim]
  TensorView output;   // [n_embd x n_head*head_dim]
};

// Gated DeltaNet, layers with is_recurrent[L] == true. Exactly one projection layout is bound.
struct DeltaNetWeights {
  bool legacy_fused = false;  // true: ssm_in; false: attn_qkv + attn_gate
  TensorView in;       // legacy: [2*key_dim + 2*value_dim x n_embd], rows grouped per key head g:
                       //   [q_g (dk), k_g (dk), v_g (r*dv), z_g (r*dv)]
  TensorView qkv;      // current: [2*key_dim + value_dim x n_embd]: q all heads, k all, v all
  TensorView gate;     // current: [value_dim x n_embd]: z of all value heads
  TensorView ba;       // [2*n_v_heads x n_embd], per key head: [b (r values), a (r values)]
  TensorView conv1d;   // [conv_dim x conv_kernel]: tap conv_kernel-1 multiplies the current token
  TensorView dt_bias;  // [n_v_heads]
  TensorView a;        // [n_v_heads], stored as -exp(A_log)
  TensorView norm;     // [dv]
  TensorView out;      // [n_embd x value_dim]
};

// Routed experts + shared expert.
struct MoeWeights {
  TensorView router;        // ffn_gate_inp  [n_expert x n_embd] (F32 or F16)
  TensorView gate_exps;     // [n_expert][n_ff_exp x n_embd]
  TensorView up_exps;       // [n_expert][n_ff_exp x n_embd]
  TensorView down_exps;     // [n_expert][n_embd x n_ff_exp]
  TensorView shared_gate_inp;  // ffn_gate_inp_shexp [1 x n_embd]: the shared expert's scalar gate
  TensorView gate_shexp;    // [n_ff_shexp x n_embd]
  TensorView up_shexp;      // [n_ff_shexp x n_embd]
  TensorView down_shexp;    // [n_embd x n_ff_shexp]
};

struct LayerWeights {
  bool recurrent = false;
  TensorView attn_norm;            // [n_embd]
  TensorView post_attention_norm;  // [n_embd]
  AttentionWeights attn;           // bound when !recurrent
  DeltaNetWeights ssm;             // bound when recurrent
  MoeWeights moe;
};

class Model {
 public:
  // Maps the GGUF file and binds every tensor. Throws rl::Error naming the file and the key or
  // tensor at fault (architecture, missing tensor, wrong shape or type).
  static std::shared_ptr<const Model> open(const std::string& path);
  // Binds an already-parsed file (takes ownership; for in-memory test files).
  static std::shared_ptr<const Model> from_gguf(std::unique_ptr<GgufFile> file);
  ~Model();

  const Config& config() const { return config_; }
  const GgufFile& gguf() const { return *file_; }
  const std::string& path() const;

  TensorView token_embd;   // [n_vocab x n_embd]
  TensorView output_norm;  // [n_embd]
  TensorView output;       // [n_vocab x n_embd]; token_embd's view when output.weight is absent
  bool output_is_token_embd = false;
  std::vector<LayerWeights> layers;  // [n_layer] (MTP blocks are not bound)

 private:
  Model() = default;
  std::unique_ptr<GgufFile> file_;
  Config config_;
};

// The values of a small tensor (norm weights, biases, conv taps) as fp32, any float type.
std::vector<float> to_f32(const TensorView& t);

}  // namespace rl
