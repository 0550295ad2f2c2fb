#include "gguf/gguf_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "common/error.h"
#include "common/format.h"

namespace rl {

namespace {

// An integer metadata value of any signedness; nullopt for other types or values out of range.
std::optional<uint64_t> unsigned_value(const GgufValue* v) {
  if (!v || !v->is_integer()) return std::nullopt;
  try {
    return v->as_uint();
  } catch (const Error&) {
    return std::nullopt;  // a negative id ("none") is reported as absent
  }
}

std::string string_value(const GgufValue* v) {
  return v && v->type() == GgufValueType::STRING ? std::string(v->as_string()) : std::string();
}

uint64_t array_size(const GgufValue* v) { return v && v->is_array() ? v->size() : 0; }

TokenizerSummary summarize_tokenizer(const GgufFile& f) {
  TokenizerSummary t;
  t.model = string_value(f.find("tokenizer.ggml.model"));
  t.pre = string_value(f.find("tokenizer.ggml.pre"));
  t.vocab_size = array_size(f.find("tokenizer.ggml.tokens"));
  t.merges = array_size(f.find("tokenizer.ggml.merges"));
  constexpr std::string_view prefix = "tokenizer.ggml.", suffix = "_token_id";
  for (const auto& kv : f.metadata()) {
    if (!kv.key.starts_with(prefix) || !kv.key.ends_with(suffix)) continue;
    if (auto id = unsigned_value(&kv.value)) {
      const std::string_view key = kv.key;
      t.special_ids.emplace_back(std::string(key.substr(prefix.size(), key.size() - prefix.size() - suffix.size())), *id);
    }
  }
  if (const GgufValue* v = f.find("tokenizer.ggml.add_bos_token"); v && v->type() == GgufValueType::BOOL)
    t.add_bos = v->as_bool();
  if (const GgufValue* v = f.find("tokenizer.ggml.add_eos_token"); v && v->type() == GgufValueType::BOOL)
    t.add_eos = v->as_bool();
  t.has_chat_template = f.find("tokenizer.chat_template") != nullptr;
  return t;
}

// Layer index of a routed-expert tensor "blk.<L>.ffn_<part>_exps.weight" (3-D); -1 otherwise.
int routed_expert_layer(const GgufTensorInfo& t) {
  std::string_view name = t.name;
  if (t.n_dims != 3 || !name.starts_with("blk.") || !name.ends_with("_exps.weight")) return -1;
  name.remove_prefix(4);
  int layer = 0;
  size_t digits = 0;
  while (digits < name.size() && digits < 6 && name[digits] >= '0' && name[digits] <= '9')
    layer = layer * 10 + (name[digits++] - '0');
  if (digits == 0 || !name.substr(digits).starts_with(".ffn_")) return -1;
  return layer;
}

ExpertSummary summarize_experts(const GgufFile& f, const std::string& arch) {
  ExpertSummary e;
  e.expert_count = unsigned_value(f.find(arch + ".expert_count")).value_or(0);
  e.expert_used_count = unsigned_value(f.find(arch + ".expert_used_count")).value_or(0);
  // The last nextn_predict_layers blocks are multi-token-prediction blocks.
  const uint64_t block_count = unsigned_value(f.find(arch + ".block_count")).value_or(0);
  const uint64_t n_mtp = unsigned_value(f.find(arch + ".nextn_predict_layers")).value_or(0);
  const uint64_t first_mtp = n_mtp <= block_count ? block_count - n_mtp : 0;

  std::map<int, ExpertLayer> by_layer;
  for (const auto& t : f.tensors()) {
    const int layer = routed_expert_layer(t);
    if (layer < 0) continue;
    ExpertLayer& l = by_layer[layer];
    l.layer = layer;
    l.mtp = n_mtp > 0 && (uint64_t)layer >= first_mtp;
    l.n_experts = std::max(l.n_experts, (uint64_t)t.ne[2]);
    l.slot_bytes += t.nbytes / (uint64_t)t.ne[2];
    l.routed_bytes += t.nbytes;
  }
  for (auto& [layer, l] : by_layer) {
    e.layers.push_back(l);
    if (l.mtp) {
      e.mtp_routed_bytes += l.routed_bytes;
    } else {
      e.max_slot_bytes = std::max(e.max_slot_bytes, l.slot_bytes);
      e.total_routed_bytes += l.routed_bytes;
    }
  }
  return e;
}

std::string percent(uint64_t part, uint64_t whole) {
  return whole ? fmt::format("{:.1f}%", 100.0 * (double)part / (double)whole) : "-";
}

// Columns padded to their widest cell; `right` marks right-aligned (numeric) columns.
std::string format_table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right,
                         const std::string& indent) {
  std::vector<size_t> width(right.size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); c++) width[c] = std::max(width[c], r[c].size());
  std::string out;
  for (const auto& r : rows) {
    std::string line = indent;
    for (size_t c = 0; c < r.size(); c++) {
      if (c) line += "  ";
      const std::string pad(width[c] - r[c].size(), ' ');
      line += right[c] ? pad + r[c] : (c + 1 < r.size() ? r[c] + pad : r[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace

ModelSummary summarize(const GgufFile& f) {
  ModelSummary s;
  s.path = f.path();
  s.architecture = string_value(f.find("general.architecture"));
  s.name = string_value(f.find("general.name"));
  s.version = f.version();
  s.alignment = f.alignment();
  s.file_size = f.file_size();
  s.data_offset = f.data_offset();
  if (!s.architecture.empty())
    for (const auto& kv : f.metadata())
      if (kv.key.starts_with(s.architecture + ".")) s.hyperparameters.push_back(&kv);
  s.tokenizer = summarize_tokenizer(f);

  std::map<uint32_t, TypeBytes> by_type;
  for (const auto& t : f.tensors()) {
    TypeBytes& tb = by_type.try_emplace((uint32_t)t.type, TypeBytes{t.type}).first->second;
    tb.count++;
    tb.bytes += t.nbytes;
    s.tensor_bytes += t.nbytes;
  }
  for (const auto& [id, tb] : by_type) s.types.push_back(tb);
  s.experts = summarize_experts(f, s.architecture);
  return s;
}

std::string format_summary(const ModelSummary& s, const GgufFile& f) {
  std::string out;
  out += fmt::format("file          {}\n", s.path);
  out += fmt::format("format        GGUF v{}, alignment {}, data at byte {}\n", s.version, s.alignment, s.data_offset);
  out += fmt::format("size          {} ({} bytes), tensor data {}\n", human_bytes(s.file_size), s.file_size,
                     human_bytes(s.tensor_bytes));
  out += fmt::format("architecture  {}\n", s.architecture.empty() ? "(none)" : s.architecture);
  out += fmt::format("name          {}\n", s.name.empty() ? "(none)" : s.name);
  out += fmt::format("tensors       {}\n", f.tensors().size());

  if (!s.hyperparameters.empty()) {
    out += fmt::format("\nhyperparameters ({}.*)\n", s.architecture);
    std::vector<std::vector<std::string>> rows;
    for (const GgufKV* kv : s.hyperparameters)
      rows.push_back({kv->key.substr(s.architecture.size() + 1), kv->value.to_string(16)});
    out += format_table(rows, {false, false}, "  ");
  }

  const TokenizerSummary& t = s.tokenizer;
  out += "\ntokenizer\n";
  if (t.model.empty() && t.vocab_size == 0) {
    out += "  (none)\n";
  } else {
    out += fmt::format("  model {}, pre-tokenizer {}, vocabulary {}, merges {}\n", t.model.empty() ? "?" : t.model,
                       t.pre.empty() ? "?" : t.pre, t.vocab_size, t.merges);
    std::string ids;
    for (const auto& [name, id] : t.special_ids) ids += fmt::format("{}{} {}", ids.empty() ? "" : ", ", name, id);
    out += fmt::format("  special ids: {}\n", ids.empty() ? "(none)" : ids);
    auto flag = [](const std::optional<bool>& b) { return b ? (*b ? "true" : "false") : "unset"; };
    out += fmt::format("  add_bos_token {}, add_eos_token {}, chat template {}\n", flag(t.add_bos), flag(t.add_eos),
                       t.has_chat_template ? "yes" : "no");
  }

  out += "\ntensors\n";
  {
    std::vector<std::vector<std::string>> rows = {{"name", "type", "shape", "bytes"}};
    for (const auto& ti : f.tensors())
      rows.push_back({ti.name, type_name(ti.type), ti.shape_string(), human_bytes(ti.nbytes)});
    out += format_table(rows, {false, false, false, true}, "  ");
  }

  out += "\nbytes by type\n";
  {
    std::vector<std::vector<std::string>> rows = {{"type", "tensors", "bytes", "share"}};
    for (const auto& tb : s.types)
      rows.push_back({type_name(tb.type), std::to_string(tb.count), human_bytes(tb.bytes), percent(tb.bytes, s.tensor_bytes)});
    rows.push_back({"total", std::to_string(f.tensors().size()), human_bytes(s.tensor_bytes), percent(s.tensor_bytes, s.tensor_bytes)});
    out += format_table(rows, {false, true, true, true}, "  ");
  }

  const ExpertSummary& e = s.experts;
  out += "\nrouted experts\n";
  if (e.layers.empty()) {
    out += "  (none)\n";
  } else {
    out += fmt::format("  {} experts per layer, {} used per token\n", e.expert_count, e.expert_used_count);
    std::vector<std::vector<std::string>> rows = {{"layer", "experts", "slot bytes", "layer bytes", ""}};
    for (const auto& l : e.layers)
      rows.push_back({std::to_string(l.layer), std::to_string(l.n_experts),
                      fmt::format("{} ({})", human_bytes(l.slot_bytes), l.slot_bytes), human_bytes(l.routed_bytes),
                      l.mtp ? "MTP" : ""});
    out += format_table(rows, {true, true, true, true, false}, "  ");
    out += fmt::format("  expert slot (max over main layers): {} ({} bytes)\n", human_bytes(e.max_slot_bytes), e.max_slot_bytes);
    out += fmt::format("  routed expert bytes (main layers): {} ({} of tensor data)\n", human_bytes(e.total_routed_bytes),
                       percent(e.total_routed_bytes, s.tensor_bytes));
    if (e.mtp_routed_bytes) out += fmt::format("  routed expert bytes (MTP layers): {}\n", human_bytes(e.mtp_routed_bytes));
  }
  out += fmt::format("\ntotal         {} in {} tensors; file {}\n", human_bytes(s.tensor_bytes), f.tensors().size(),
                     human_bytes(s.file_size));
  return out;
}

void dump_tensor_f32(const GgufFile& f, const std::string& name, const std::string& out_path) {
  const GgufTensorInfo& t = f.tensor(name);
  const QuantType& qt = quant_type(t.type);
  if (!qt.dequantize_row) fail("{}: tensor '{}' has type {}, which has no float values to dump", f.path(), name, qt.name);
  const std::string tmp = out_path + ".tmp";
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  if (!out) fail("{}: cannot create {}: {}", out_path, tmp, std::strerror(errno));
  auto abandon = [&](const std::string& why) {
    std::fclose(out);
    std::remove(tmp.c_str());
    fail("{}: {}", out_path, why);
  };
  std::vector<float> row((size_t)t.ne[0]);  // [ne0]
  const size_t row_bytes = t.row_bytes();
  for (int64_t r = 0; r < t.n_rows(); r++) {
    qt.dequantize_row(t.data + (size_t)r * row_bytes, row.data(), t.ne[0]);
    if (std::fwrite(row.data(), sizeof(float), row.size(), out) != row.size())
      abandon(fmt::format("write failed: {}", std::strerror(errno)));
  }
  if (std::fflush(out) != 0) abandon(fmt::format("write failed: {}", std::strerror(errno)));
  if (std::fclose(out) != 0) {
    std::remove(tmp.c_str());
    fail("{}: write failed: {}", out_path, std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), out_path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    fail("{}: cannot rename {} to it: {}", out_path, tmp, std::strerror(e));
  }
}

}  // namespace rl
