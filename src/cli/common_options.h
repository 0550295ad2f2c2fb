// Flags every model-running command shares (-m, --backend, --threads, --ctx, --cache-mib and the
// CUDA backend's options) and the one place that turns them into a loaded model on a backend, so commands never differ in how a
// model is opened or which backends exist.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_options.h"
#include "model/kv_type.h"
#include "model/model.h"
#include "model/numerics.h"
#include "model/session.h"

namespace rl::cli {

struct CommonOptions {
  std::string model_path;
  std::string backend;     // "cpu" or "cuda"; empty: cuda when this build has it, else cpu
  int threads = 0;         // CPU threads; 0: every hardware thread
  int ctx = 0;             // context length of a session; 0: min(4096, the model's context_length)
  int64_t cache_mib = 0;   // GPU expert-cache budget; 0: the backend's default
  std::string numerics;    // "fast" or "exact"; empty: fast
  std::string kv_type;     // "f32", "f16", "bf16" or "q8_0"; empty: the tier's default (default_kv_type)
  cuda::CudaOptions cuda;  // --no-preload, --speculation, --profile, --x32-always (cache_mib: above)
};

// Adds -m/--model (required when model_required), --backend, --threads, --ctx, --kv-type,
// --numerics, --cache-mib and the CUDA options (add_cuda_options).
void add_common_options(CLI::App& app, CommonOptions& opts, bool model_required = true);
// Adds the CUDA backend's flags (--no-preload, --speculation, --profile, --x32-always), known in
// every build; a build without CUDA has no backend they apply to.
void add_cuda_options(CLI::App& app, cuda::CudaOptions& opts);
// The CUDA backend's options of a command: its flags with --cache-mib (the one budget flag).
cuda::CudaOptions cuda_options(const CommonOptions& opts);

// The backend a plain command uses when --backend is not given.
std::string default_backend_name();

// The numeric tier the backends run in for these options (--numerics; fast when not given);
// throws rl::Error naming the flag for an unknown tier.
Numerics resolve_numerics(const CommonOptions& opts);
// The KV cache type of these options (--kv-type; the tier's default when not given); throws
// rl::Error naming both flags when the tier does not take it (exact: f32 only).
KvType resolve_kv_type(const CommonOptions& opts);
// The --kv-type value `kv_type` (empty: the tier's default) for `numerics`; fails naming the flag
// for an unknown type or one the tier refuses.
KvType kv_type_for(Numerics numerics, const std::string& kv_type);
// --kv-type's flag with its help text (also inspect's, which has no CommonOptions).
CLI::Option* add_kv_type_option(CLI::App& app, std::string& kv_type);

struct LoadedModel {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Backend> backend;
  Numerics numerics = Numerics::kExact;  // the tier the backend computes in
  KvType kv_type = KvType::kF32;         // the type of its sessions' KV caches
  int n_ctx = 0;  // resolved context length for new sessions
  std::unique_ptr<Session> new_session() const { return backend->new_session(n_ctx); }
};

// Opens the model file and the backend named by opts.backend (or the default); throws rl::Error
// naming the file or the unknown backend.
LoadedModel open_model(const CommonOptions& opts);
// Throws rl::Error naming --ctx when ctx (0: the default) is past the model's context_length.
void check_ctx(int ctx, int n_ctx_train, const std::string& model_path);
// A backend by name on an already opened model (parity runs two on one model).
std::unique_ptr<Backend> open_backend(const std::string& name, std::shared_ptr<const Model> model,
                                      const CommonOptions& opts);

// "1,2,3" -> {1, 2, 3}; throws rl::Error naming `flag` on anything else.
std::vector<int32_t> parse_token_ids(const std::string& text, const char* flag);

}  // namespace rl::cli
