// redlite inspect: what a GGUF model holds: metadata, hyperparameters, tokenizer summary, tensor
// table, bytes per type and the routed-expert slot size; --json prints the same as one object;
// --dump writes one tensor dequantised to little-endian f32; --plan prints the CUDA backend's layer
// plan (each matrix's kernel and numeric form, each layer's routing) for this GPU and budget.
//   redlite inspect MODEL [--json]
//   redlite inspect MODEL --dump TENSOR --out FILE
//   redlite inspect MODEL --plan --backend cuda [--cache-mib N] [--chunk T] [CUDA flags]
#include <cstdio>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "cli/common_options.h"
#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_summary.h"
#include "model/model.h"
#ifdef REDLITE_HAVE_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#endif

namespace rl::cli {
namespace {

struct InspectArgs {
  std::string model_path;
  bool json = false;
  std::string dump_tensor;
  std::string out_path;
  bool plan = false;
  std::string backend = "cuda";
  int64_t cache_mib = 0;
  int chunk = 0;  // 0: the backend's --prefill-chunk
  std::string numerics = "fast";
  int ctx = 0;          // 0: the model's context_length
  std::string kv_type;  // empty: the tier's default
  cuda::CudaOptions cuda;
};

// The KV cache a session would hold: its type, bytes per token and at the context asked for.
struct KvCacheSize {
  KvType type;
  size_t bytes_per_token;
  int context;
};

// From the model's hyperparameters; throws rl::Error naming --kv-type or --ctx when the model or
// the tier refuses them, as loading the model would.
KvCacheSize kv_cache_size(const InspectArgs& a) {
  const Numerics numerics = *parse_numerics(a.numerics);
  const KvType type = kv_type_for(numerics, a.kv_type);
  const std::shared_ptr<const Model> model = Model::open(a.model_path);
  const Config& c = model->config();
  check_kv_type(numerics, type, c.head_dim);
  check_ctx(a.ctx, c.n_ctx_train, a.model_path);
  return {type, c.kv_bytes_per_token(type), a.ctx > 0 ? a.ctx : c.n_ctx_train};
}

nlohmann::json value_json(const GgufValue& v) {
  switch (v.type()) {
    case GgufValueType::STRING: return std::string(v.as_string());
    case GgufValueType::BOOL: return v.as_bool();
    case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: return v.as_float();
    case GgufValueType::UINT8: case GgufValueType::UINT16: case GgufValueType::UINT32: case GgufValueType::UINT64:
      return v.as_uint();
    case GgufValueType::ARRAY: {
      nlohmann::json a = nlohmann::json::array();
      for (size_t i = 0; i < v.size(); i++) {
        switch (v.elem_type()) {
          case GgufValueType::STRING: a.push_back(std::string(v.str_at(i))); break;
          case GgufValueType::ARRAY: a.push_back(value_json(v.array_at(i))); break;
          case GgufValueType::BOOL: a.push_back(v.int_at(i) != 0); break;
          case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: a.push_back(v.float_at(i)); break;
          case GgufValueType::UINT64: a.push_back((uint64_t)v.int_at(i)); break;
          default: a.push_back(v.int_at(i)); break;
        }
      }
      return a;
    }
    default: return v.as_int();
  }
}

nlohmann::json summary_json(const ModelSummary& s, const GgufFile& f) {
  nlohmann::json j;
  j["path"] = s.path;
  j["architecture"] = s.architecture;
  j["name"] = s.name;
  j["version"] = s.version;
  j["alignment"] = s.alignment;
  j["file_size"] = s.file_size;
  j["data_offset"] = s.data_offset;
  j["n_tensors"] = f.tensors().size();
  j["tensor_bytes"] = s.tensor_bytes;

  nlohmann::json hp = nlohmann::json::object();
  for (const GgufKV* kv : s.hyperparameters) hp[kv->key] = value_json(kv->value);
  j["hyperparameters"] = hp;

  const TokenizerSummary& t = s.tokenizer;
  nlohmann::json tok = {{"model", t.model}, {"pre", t.pre}, {"vocab_size", t.vocab_size}, {"merges", t.merges},
                        {"has_chat_template", t.has_chat_template}};
  nlohmann::json ids = nlohmann::json::object();
  for (const auto& [name, id] : t.special_ids) ids[name] = id;
  tok["special_ids"] = ids;
  tok["add_bos_token"] = t.add_bos ? nlohmann::json(*t.add_bos) : nlohmann::json(nullptr);
  tok["add_eos_token"] = t.add_eos ? nlohmann::json(*t.add_eos) : nlohmann::json(nullptr);
  j["tokenizer"] = tok;

  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& ti : f.tensors()) {
    nlohmann::json shape = nlohmann::json::array();
    for (uint32_t d = 0; d < ti.n_dims; d++) shape.push_back(ti.ne[d]);
    tensors.push_back({{"name", ti.name}, {"type", type_name(ti.type)}, {"shape", shape}, {"bytes", ti.nbytes},
                       {"offset", ti.offset}});
  }
  j["tensors"] = tensors;

  nlohmann::json types = nlohmann::json::object();
  for (const auto& tb : s.types)
    types[type_name(tb.type)] = {{"count", tb.count}, {"bytes", tb.bytes},
                                 {"percent", s.tensor_bytes ? 100.0 * (double)tb.bytes / (double)s.tensor_bytes : 0.0}};
  j["bytes_by_type"] = types;

  const ExpertSummary& e = s.experts;
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : e.layers)
    layers.push_back({{"layer", l.layer}, {"mtp", l.mtp}, {"n_experts", l.n_experts}, {"slot_bytes", l.slot_bytes},
                      {"routed_bytes", l.routed_bytes}});
  j["experts"] = {{"expert_count", e.expert_count}, {"expert_used_count", e.expert_used_count},
                  {"max_slot_bytes", e.max_slot_bytes}, {"total_routed_bytes", e.total_routed_bytes},
                  {"mtp_routed_bytes", e.mtp_routed_bytes}, {"layers", layers}};
  return j;
}

// The layer plans of a prefill chunk and of a decode token. The experts are not loaded: the plan
// depends on the budget, not on what is resident.
int run_plan(const InspectArgs& a) {
  if (a.backend != "cuda") fail("--plan --backend {}: only the cuda backend has a layer plan", a.backend);
#ifdef REDLITE_HAVE_CUDA
  if (!cuda::device_available())
    fail("--plan --backend cuda: no CUDA device is available (the plan depends on the GPU: its compute "
         "capability and number of SMs)");
  cuda::CudaOptions o = a.cuda;
  o.cache_mib = a.cache_mib;
  o.numerics = *parse_numerics(a.numerics);
  o.kv_type = kv_cache_size(a).type;
  o.preload = false;
  auto backend = cuda::make_cuda_backend(Model::open(a.model_path), o);
  std::fputs(backend->plan_report(a.chunk > 0 ? a.chunk : o.prefill_chunk).c_str(), stdout);
  std::fputs(backend->plan_report(1).c_str(), stdout);
  return 0;
#else
  fail("--plan --backend cuda: this redlite was built without the CUDA backend");
#endif
}

int run_inspect(const InspectArgs& a) {
  if (a.plan) return run_plan(a);
  const auto file = GgufFile::open(a.model_path);
  if (!a.dump_tensor.empty()) {
    dump_tensor_f32(*file, a.dump_tensor, a.out_path);
    const GgufTensorInfo& t = file->tensor(a.dump_tensor);
    std::fprintf(stderr, "%s: %s %s (%s) -> %s, %lld f32 values\n", a.model_path.c_str(), t.name.c_str(),
                 type_name(t.type), t.shape_string().c_str(), a.out_path.c_str(), (long long)t.n_elements());
    return 0;
  }
  const ModelSummary s = summarize(*file);
  // A file of another architecture has no KV cache to size unless one was asked for.
  std::optional<KvCacheSize> kv;
  if (s.architecture == "qwen3next" || a.ctx > 0 || !a.kv_type.empty()) kv = kv_cache_size(a);
  if (a.json) {
    nlohmann::json j = summary_json(s, *file);
    if (kv)
      j["kv_cache"] = {{"type", kv_type_name(kv->type)}, {"bytes_per_token", kv->bytes_per_token},
                       {"context", kv->context}, {"bytes", kv->bytes_per_token * (size_t)kv->context}};
    // GGUF strings are not guaranteed to be UTF-8; invalid bytes print as U+FFFD.
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::fputs(format_summary(s, *file).c_str(), stdout);
    if (kv)
      std::printf("KV cache: %s, %zu bytes per token; %zu bytes (%.1f MiB) at a context of %d tokens\n",
                  kv_type_name(kv->type), kv->bytes_per_token, kv->bytes_per_token * (size_t)kv->context,
                  kv->bytes_per_token * (double)kv->context / 1048576.0, kv->context);
  }
  return 0;
}

const Registrar registrar(
    "inspect", "Show a GGUF model: metadata, hyperparameters, tensors, bytes by type, expert slot size",
    [](CLI::App& sub) -> std::function<int()> {
      auto args = std::make_shared<InspectArgs>();
      sub.add_option("model,-m,--model", args->model_path, "GGUF model file")->required();
      sub.add_flag("--json", args->json, "Print the summary as one JSON object");
      auto* dump = sub.add_option("--dump", args->dump_tensor, "Write this tensor dequantised to little-endian f32");
      auto* out = sub.add_option("--out", args->out_path, "Output file for --dump");
      dump->needs(out);
      out->needs(dump);
      auto* plan = sub.add_flag("--plan", args->plan,
                                "Print the CUDA backend's layer plan: each matrix's kernel and numeric form and "
                                "each layer's routing, for a prefill chunk and a decode token (needs a GPU)");
      plan->excludes(dump);
      sub.add_option("--backend", args->backend, "Backend whose plan --plan prints (cuda, the only one with a plan)")
          ->needs(plan);
      sub.add_option("--cache-mib", args->cache_mib, "GPU expert-cache budget the plan assumes (as for the other "
                                                      "commands; 0: every expert when they fit)")
          ->check(CLI::NonNegativeNumber)
          ->needs(plan);
      sub.add_option("--chunk", args->chunk,
                     "Tokens of the prefill pass whose plan --plan prints (default: the --prefill-chunk, 2048 "
                     "unless given; at most that)")
          ->check(CLI::Range(1, cuda::kMaxPrefillChunk))
          ->needs(plan);
      sub.add_option("--numerics", args->numerics,
                     "Numeric tier of the plan --plan prints and of the KV cache's default type: fast (default) or "
                     "exact")
          ->check(CLI::IsMember({"fast", "exact"}));
      sub.add_option("--ctx", args->ctx, "Context whose KV cache bytes are reported (default: the model's "
                                         "context_length)")
          ->check(CLI::NonNegativeNumber);
      add_kv_type_option(sub, args->kv_type);
      add_cuda_options(sub, args->cuda);
      return [args] { return run_inspect(*args); };
    });

}  // namespace
}  // namespace rl::cli
