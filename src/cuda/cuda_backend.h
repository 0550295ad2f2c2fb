// The CUDA backend (DESIGN.md §3-5): dense weights resident on the GPU, routed experts in an
// ExpertCache of device slots filled from the memory-mapped GGUF, activations in fp32.
//
// Prefill (and any token the GPU-routed path cannot take) runs the synchronous path: per layer the
// GPU computes the router logits, the host selects the top-k (the oracle's rule, on the same fp32
// logits), reserves slots, copies the misses on a copy stream, and the expert kernels read the
// slots. One device→host round trip per layer; correct for any cache budget.
//
// Decode first tries the GPU-routed path (DESIGN.md §5): the whole token — every layer, the
// routing (route_topk: the same rule on the GPU, slots from the device residency table), the
// experts and the LM head — is one CUDA graph, captured once per session and replayed with one
// synchronisation. The graph starts by backing up the DeltaNet conv/SSM states; if any layer
// selected a non-resident expert, the host restores them and recomputes the token on the
// synchronous path. By default it is tried only when every expert is resident; on a bounded cache
// (RL_ENGINE_SPECULATIVE=2) only after a pass that loaded nothing; RL_ENGINE_SPECULATIVE=0 turns it
// off (CudaOptions::Speculation). Under RL_ENGINE_PROFILE=1 the same token is launched kernel by kernel with stage
// marks instead of the graph (see decode_gpu_routed). Under a trace a GPU-routed token reports only the router
// logits and selections of each layer (what parity compares); prefill traces everything.
//
// Device memory = dense weights + expert slots (--cache-mib) + a working set: per session the KV
// caches (2 × n_ctx × kv_dim floats per attention layer) and the DeltaNet states (twice, once a
// token has been GPU-routed: the graph's backups; 72 MiB at the 80B shape), and per backend
// the activation buffers of one 512-token chunk and a 64 MiB staging area (239 MiB together at the
// 80B shape, EngineStats::working_bytes), plus n_tokens × n_vocab floats when all positions'
// logits are asked for. The cache budget is refused when it exceeds free memory minus 1 GiB.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "cache/expert_cache.h"
#include "model/model.h"
#include "model/session.h"

namespace rl::cuda {

struct CudaOptions {
  // Expert-cache budget in MiB; 0: every expert when that fits in free device memory, else what
  // fits after the working set.
  int64_t cache_mib = 0;
  // Load every expert at open when the budget holds them all (RL_ENGINE_PRELOAD=0 disables).
  bool preload = true;
  // Per-stage GPU timing (RL_ENGINE_PROFILE=1); the GPU-routed decode then runs without its graph.
  bool profile = false;
  // When decode tries the GPU-routed graph (RL_ENGINE_SPECULATIVE=0|1|2|3).
  enum class Speculation {
    kOff,            // 0: always the synchronous path
    kFullyResident,  // 1 (default): when the cache holds every expert, so no token can miss
    kWarmCache,      // 2: also on a bounded cache, after a pass that loaded nothing (DESIGN.md §5)
    kAlways,         // 3: every decode token (tests: exercises the discard-and-recompute path)
  };
  // Bounded caches (2, 3) are off by default: their discard-and-recompute path is tested on the GPU
  // (bit-identical to the synchronous path) but its speed on a bounded cache was never measured.
  Speculation speculation = Speculation::kFullyResident;
  // Synchronous path: a layer's resident experts run while its misses are copied, the missed ones
  // after the copies (RL_ENGINE_OVERLAP=0: all of them after the copies).
  bool overlap_copies = true;
  // Prefill products of the IQ types (routed experts, a shared expert's SwiGLU pair) on 8-bit
  // tensor cores with X24 activations (kernels.h, matmul_x24); RL_ENGINE_X24=0: the fp64 products
  // on the fp32 activations.
  bool x24 = true;
  // Prefill with every expert resident: a layer's selections are grouped by expert on the GPU
  // (group_by_expert) and never wait for the host (RL_ENGINE_GPU_GROUPING=0: the host groups them,
  // as on a bounded cache).
  bool gpu_grouping = true;
  // Dense prefill products of Q4_K weights on 8-bit tensor cores with X32 activations (matmul_x32;
  // compute capability 9.0), under `x24`: RL_ENGINE_X32=1 (default) when the product's grid has a
  // block for every SM (smaller ones keep the fp64 products' column splits), 2 for every such
  // product (parity checks on short prompts, tests), 0 never.
  enum class X32Mode { kOff, kAuto, kAlways };  // 0, 1, 2
  X32Mode x32 = X32Mode::kAuto;
  // Reads RL_ENGINE_PRELOAD, RL_ENGINE_PROFILE, RL_ENGINE_SPECULATIVE, RL_ENGINE_OVERLAP,
  // RL_ENGINE_X24, RL_ENGINE_X32 and RL_ENGINE_GPU_GROUPING (the two enumerations by their
  // enumerators' numbers, as listed with them).
  static CudaOptions from_env(int64_t cache_mib);
};

struct EngineStats {
  std::string gpu_name;
  ExpertCache::Stats cache;
  int n_slots = 0;
  int n_experts_total = 0;           // layers × experts
  size_t slot_bytes = 0;
  size_t cache_bytes = 0;            // n_slots × slot_bytes
  size_t dense_bytes = 0;            // resident dense weights
  size_t working_bytes = 0;          // activations and staging of this backend
  bool fully_resident = false;
  double preload_seconds = 0;
  bool pinned_copies = false;        // misses copied from a registered (pinned) mapping
  // Weight bytes one decode token reads: every dense matrix, one embedding row, the LM head and
  // n_expert_used experts per layer.
  size_t decode_bytes_per_token = 0;
  uint64_t tokens_decoded = 0;       // decode() calls since reset_stats()
  uint64_t gpu_routed_tokens = 0;    // of those, completed by the GPU-routed graph
  uint64_t gpu_routed_fallbacks = 0; // graph replays discarded (a non-resident expert was selected)
  uint64_t gpu_grouped_layers = 0;   // prefill layers whose selections were grouped on the GPU
  uint64_t x32_products = 0;         // prefill dense products run by matmul_x32
};

class CudaBackend : public Backend {
 public:
  virtual EngineStats stats() const = 0;
  virtual void reset_stats() = 0;
  // Per-stage GPU milliseconds since the last reset (RL_ENGINE_PROFILE=1), as a table; "" when off.
  virtual std::string profile_report() const = 0;
};

// Throws rl::Error when no GPU is usable, a tensor type is unsupported, or the budget does not fit.
std::unique_ptr<CudaBackend> make_cuda_backend(std::shared_ptr<const Model> model,
                                               const CudaOptions& options);

}  // namespace rl::cuda
