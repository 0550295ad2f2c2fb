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
// (--speculation warm) only after a pass that loaded nothing; --speculation off turns it off
// (CudaOptions::Speculation). Under --profile the same token is launched kernel by kernel with
// stage marks instead of the graph (see decode_gpu_routed). Under a trace a GPU-routed token reports only the router
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
  // Per-stage GPU milliseconds since the last reset (--profile), as a table; "" when off.
  virtual std::string profile_report() const = 0;
  // The layer plan of a pass of `tokens` tokens (1: decode; up to kMaxChunk = 512: a prefill
  // chunk) as text: each matrix's type and kernel, each layer's routing (docs/cuda.md).
  virtual std::string plan_report(int tokens) const = 0;
};

// Throws rl::Error when no GPU is usable, a tensor type is unsupported, or the budget does not fit.
std::unique_ptr<CudaBackend> make_cuda_backend(std::shared_ptr<const Model> model,
                                               const CudaOptions& options);

}  // namespace rl::cuda
