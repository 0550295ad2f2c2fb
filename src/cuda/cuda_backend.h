// The CUDA backend (DESIGN.md §3-5): dense weights resident on the GPU, routed experts in an
// ExpertCache of device slots filled from the memory-mapped GGUF, activations in fp32. Prefill
// and any decode token the GPU-routed graph cannot take run the synchronous path (the host routes
// each layer's experts); decode first tries the GPU-routed graph (--speculation). Under a trace a
// GPU-routed token reports only the router logits and selections of each layer (what parity
// compares); prefill traces everything. docs/cuda.md describes the parts (engine.h), the data
// flow, the numeric forms, the memory plan and the options.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "cache/expert_cache.h"
#include "cuda/cuda_options.h"
#include "model/model.h"
#include "model/session.h"

namespace rl::cuda {

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
  bool host_misses = false;          // --miss-reads host in force: GPU-routed tokens read misses in place
  uint64_t misses_read_in_place = 0; // of those tokens' selections, the ones read from host memory
  int prefetch_experts = 0;          // the predictions a decode layer copies ahead (prefetch_count)
  int miss_admit_last = 0;           // the misses the last such token could bring into the cache (AdaptiveAdmission)
  // Weight bytes one decode token reads: every dense matrix, one embedding row, the LM head and
  // n_expert_used experts per layer.
  size_t decode_bytes_per_token = 0;
  uint64_t tokens_decoded = 0;       // decode() calls since reset_stats()
  uint64_t gpu_routed_tokens = 0;    // of those, completed by the GPU-routed graph
  uint64_t gpu_routed_fallbacks = 0; // graph replays discarded (a non-resident expert was selected)
  uint64_t gpu_grouped_layers = 0;   // prefill layers whose selections were grouped on the GPU
  uint64_t x32_products = 0;         // prefill dense products run by matmul_x32
  uint64_t batched_captures = 0;     // batched-step graphs captured (one a batch size, reused by any sessions)
  uint64_t batched_steps = 0;        // decode_batch steps run as one batched graph (their tokens
                                     // are not counted in tokens_decoded)
  // Of those steps, the GPU's milliseconds (CUDA events): the graph's replays, and the copies of
  // the logits and counts to pinned memory after them. The step's wall time less these is the
  // host's: staging the ids, the launch, the copies into the caller's buffers.
  double batched_graph_ms = 0, batched_copy_ms = 0;
};

class CudaBackend : public Backend {
 public:
  virtual EngineStats stats() const = 0;
  virtual void reset_stats() = 0;
  // Per-stage GPU milliseconds since the last reset (--profile), as a table; "" when off.
  virtual std::string profile_report() const = 0;
  // The layer plan of a pass of `tokens` tokens (1: decode; up to --prefill-chunk: a prefill
  // chunk) as text: each matrix's type and kernel, each layer's routing (docs/cuda.md).
  virtual std::string plan_report(int tokens) const = 0;
  // check_session_fits (Backend): free device memory against the session's KV cache in the
  // backend's --kv-type, its recurrent states and split buffers.
};

// Throws rl::Error when no GPU is usable, a tensor type is unsupported, or the budget does not fit.
std::unique_ptr<CudaBackend> make_cuda_backend(std::shared_ptr<const Model> model,
                                               const CudaOptions& options);

}  // namespace rl::cuda
