// Synthetic qwen3next models: the exact tensor table of a real file (or a tiny one) filled with
// random, numerically healthy weights, written straight to GGUF without an fp32 copy in memory.
//
//   Plan plan = make_plan(options);   // presets, dimension overrides, recipe -> tensor table
//   write_model(plan, "/tmp/m.gguf"); // metadata + tokenizer + random blocks, multithreaded
//
// docs/synth.md describes the distributions and the router skew.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "quant/quant.h"

namespace rl::synth {

// Model dimensions (the GGUF `qwen3next.*` hyperparameters).
struct Dims {
  int n_embd = 0;
  int n_layer = 0;
  int n_vocab = 0;
  int n_ctx_train = 262144;
  int n_ff = 0;  // feed_forward_length: written for compatibility, not used by the architecture
  // Gated attention.
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int rope_dim = 0;
  // Gated DeltaNet.
  int ssm_k_heads = 0;   // ssm.group_count
  int ssm_v_heads = 0;   // ssm.time_step_rank
  int ssm_head_dim = 0;  // ssm.state_size
  int conv_kernel = 0;
  // Mixture of experts.
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;
  int n_ff_shexp = 0;
  int full_attention_interval = 4;  // layer i is full attention when (i + 1) % interval == 0

  int key_dim() const { return ssm_k_heads * ssm_head_dim; }
  int value_dim() const { return ssm_v_heads * ssm_head_dim; }
  bool is_recurrent(int layer) const { return (layer + 1) % full_attention_interval != 0; }
};

// The dimension names accepted as overrides (CLI flags --NAME with '_' -> '-').
const std::vector<std::string>& dim_names();
int& dim_by_name(Dims& d, const std::string& name);  // throws rl::Error for unknown names

enum class ProjectionLayout {
  LegacyFused,  // one `ssm_in` per DeltaNet layer (the layout of the 80B files of late 2025)
  Split,        // `attn_qkv` + `attn_gate`
};

struct Options {
  std::string preset = "tiny";      // tiny | 80b
  std::string recipe = "seed-mix";  // one of recipe_names() (recipes.cpp)
  ProjectionLayout layout = ProjectionLayout::LegacyFused;
  uint64_t seed = 1;
  double router_skew = 0;           // Zipf exponent of expert popularity; > 0 also adds topic heads (locality)
  std::string vocab_from;           // GGUF whose tokenizer.* keys are copied; empty = placeholder
  std::map<std::string, int> dim_overrides;  // dim_names() -> value
  int threads = 0;                  // 0 = all hardware threads
};

const std::vector<std::string>& preset_names();
const std::vector<std::string>& recipe_names();
Dims preset_dims(const std::string& preset);  // throws rl::Error naming --preset

// How the values of one tensor are drawn (docs/synth.md has the table).
struct WeightInit {
  enum class Kind {
    Normal,         // N(0, a^2)
    OnePlusNormal,  // 1 + N(0, a^2)                 (norm weights)
    Uniform,        // U(a, b)                       (ssm_dt.bias)
    NegLogUniform,  // -exp(U(log a, log b))         (ssm_a = -A)
    ConvTaps,       // N(0, a^2), plus b on the tap of the current token (ssm_conv1d)
  };
  Kind kind = Kind::Normal;
  float a = 0, b = 0;
  float row_log_std = 0;         // each row scaled by exp(N(0, row_log_std^2)) (the LM head)
  std::vector<float> row_gains;  // per-row gains (router skew, topic heads); empty = 1
  // Float-valued kinds only: called with (row, values, n) after the row is drawn, to pin some
  // values (the topic heads' conv taps, decays); the draw itself is unchanged.
  std::function<void(int64_t row, float* values, int64_t n)> adjust_row;
};

// Temporal locality, part of --router-skew S > 0 (docs/synth.md, "Temporal locality"): in every
// DeltaNet layer the first `n_key_heads` key heads (and the value heads they serve) become slow
// "topic" heads whose output is a slowly varying vector that the routers of later layers see.
struct TopicHeads {
  int n_key_heads = 0;   // topic key heads per DeltaNet layer (0: no locality, the S = 0 model)
  float qk_tap = 0;      // conv taps of their q and k channels: this on the current token, 0 before
  float z_gain = 0;      // row gain of their z (output gate) projection rows
  float ssm_a = 0;       // ssm_a of their value heads (-A; small: decay close to 1)
  float dt_bias = 0;     // ssm_dt.bias of their value heads
};
TopicHeads topic_heads(const Dims& d, double router_skew);

struct TensorPlan {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;  // GGUF order: ne[0] = row length
  WeightInit init;
  int64_t n_rows() const;
  uint64_t n_bytes() const;
};

using MetaValue = std::variant<uint32_t, float, bool, std::string>;

struct Plan {
  Options options;
  Dims dims;
  std::vector<std::pair<std::string, MetaValue>> metadata;  // non-tokenizer keys, in file order
  std::vector<TensorPlan> tensors;                          // in file order
  std::vector<std::vector<int>> expert_rank;  // router skew: [layer][expert] popularity rank (0 = most)
  uint64_t data_bytes() const;
};

// Validates the options (preset, recipe, dimensions, block divisibility, tokenizer source) and
// builds the tensor table. Throws rl::Error naming the argument at fault.
Plan make_plan(const Options& options);

// The table as 80b-seed-mix.tensors.json lays it out: {"metadata", "tokenizer_keys", "n_tensors",
// "tensors": [{"name", "type", "ne"}]}. Tokenizer arrays are summarised as "array[N]".
nlohmann::ordered_json plan_json(const Plan& plan);  // keys in file order

struct WriteStats {
  uint64_t file_bytes = 0;
  double seconds = 0;
  int threads = 0;
  bool placeholder_vocab = false;
};

// Writes the model (PATH.tmp, renamed at the end; no partial file is left behind on failure).
WriteStats write_model(const Plan& plan, const std::string& path);

// Fills rows [first_row, first_row + n_rows) of tensor `index` of the plan, exactly as
// write_model does (for tests and in-memory studies).
void fill_tensor_rows(const Plan& plan, size_t index, uint8_t* dst, int64_t first_row, int64_t n_rows);

}  // namespace rl::synth
