// A model file at a glance: what `redlite inspect` reports (metadata, hyperparameters, tokenizer,
// tensor table, bytes per type, routed-expert slot sizes), computed once from a parsed GgufFile so
// any front end can print or serialise it. Also the f32 dump of one tensor.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace rl {

struct TokenizerSummary {
  std::string model;  // tokenizer.ggml.model ("gpt2"); empty when the file has no tokenizer
  std::string pre;    // tokenizer.ggml.pre ("qwen2")
  uint64_t vocab_size = 0;  // items of tokenizer.ggml.tokens
  uint64_t merges = 0;      // items of tokenizer.ggml.merges
  // Every tokenizer.ggml.*_token_id present, as (name without prefix/suffix, id): ("bos", 151643).
  std::vector<std::pair<std::string, uint64_t>> special_ids;
  std::optional<bool> add_bos, add_eos;
  bool has_chat_template = false;
};

struct TypeBytes {
  GgmlType type;
  int count = 0;       // tensors of this type
  uint64_t bytes = 0;  // their data bytes
};

// Routed experts of one layer: the ffn_{gate,up,down}_exps tensors of `blk.<layer>` hold one slice
// per expert along ne2; one expert slot = its slice of each.
struct ExpertLayer {
  int layer = 0;
  bool mtp = false;           // a multi-token-prediction block (not run by the main pass)
  uint64_t n_experts = 0;     // ne2 of the expert tensors
  uint64_t slot_bytes = 0;    // bytes of one expert: sum over the tensors of nbytes / ne2
  uint64_t routed_bytes = 0;  // all experts of the layer
};

struct ExpertSummary {
  uint64_t expert_count = 0;       // <arch>.expert_count (0 when absent)
  uint64_t expert_used_count = 0;  // <arch>.expert_used_count
  std::vector<ExpertLayer> layers; // layers with routed expert tensors, in layer order
  uint64_t max_slot_bytes = 0;     // over the main (non-MTP) layers: the expert cache's slot size
  uint64_t total_routed_bytes = 0; // over the main layers
  uint64_t mtp_routed_bytes = 0;   // over MTP layers
};

struct ModelSummary {
  std::string path;
  std::string architecture;  // general.architecture
  std::string name;          // general.name
  uint32_t version = 0;
  uint64_t alignment = 0;
  uint64_t file_size = 0;
  uint64_t data_offset = 0;
  uint64_t tensor_bytes = 0;  // sum of all tensor data bytes
  std::vector<const GgufKV*> hyperparameters;  // every "<arch>.*" key, in file order
  TokenizerSummary tokenizer;
  std::vector<TypeBytes> types;  // one entry per type present, by ggml type id
  ExpertSummary experts;
};

// The summary of a parsed file (pointers into `f`, which must outlive the result).
ModelSummary summarize(const GgufFile& f);

// The human-readable report: header lines, hyperparameters, tokenizer, aligned tensor table,
// bytes per type, routed experts.
std::string format_summary(const ModelSummary& s, const GgufFile& f);

// Writes tensor `name` of `f` dequantised to little-endian f32, row-major with ne0 fastest, to
// `out_path` (PATH.tmp, then renamed). Throws rl::Error naming the tensor or the output path.
void dump_tensor_f32(const GgufFile& f, const std::string& name, const std::string& out_path);

}  // namespace rl
