// A recording of the router's selections over a run (`redlite bench --record-routing FILE`), so
// that cache replacement policies can be compared on the same accesses (bench/cache_policy_sim,
// docs/cache.md). One pass is one forward call of the backend (a prefill chunk or a decode token);
// it holds every layer's top-k expert ids of every token of the pass.
//
// File format (little-endian, docs/cache.md):
//   header  "RLROUTE\0", u32 version (1), u32 n_layer, u32 n_expert, u32 n_expert_used,
//           u64 slot_bytes (an expert's bytes in a GPU cache slot, 0 when unknown), u64 n_passes
//   pass    u32 n_tokens, then u16 ids [n_layer][n_tokens][n_expert_used]
// The file ends exactly after the last pass.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "model/session.h"

namespace rl {

struct RoutingPass {
  int n_tokens = 0;
  std::vector<uint16_t> ids;  // [n_layer][n_tokens][n_expert_used]
};

struct RoutingRecording {
  int n_layer = 0, n_expert = 0, n_expert_used = 0;
  uint64_t slot_bytes = 0;
  std::vector<RoutingPass> passes;

  // The ids layer L selected for the tokens of pass p: [n_tokens][n_expert_used].
  std::span<const uint16_t> layer_ids(size_t p, int L) const {
    const RoutingPass& pass = passes[p];
    const size_t n = (size_t)pass.n_tokens * n_expert_used;
    return std::span<const uint16_t>(pass.ids).subspan((size_t)L * n, n);
  }
  size_t n_tokens() const;  // over all passes
};

// Bytes of one routed expert in a GPU cache slot: its gate, up and down matrices each padded to
// kSlotAlign bytes, the largest over the layers (as the CUDA backend's DeviceWeights::slot_bytes).
constexpr size_t kSlotAlign = 256;
size_t expert_slot_bytes(const Model& m);

// A trace sink that records the selections ("ffn_moe_topk-L") of every pass: a pass begins at
// layer 0 and must reach every layer in order. Other traced tensors are ignored.
class RoutingRecorder final : public TraceSink {
 public:
  RoutingRecorder(int n_layer, int n_expert, int n_expert_used, uint64_t slot_bytes);
  void tensor(std::string_view, int, int, const float*) override {}
  void ids(std::string_view name, int n_tokens, int width, const int32_t* data) override;
  // The recording so far; throws rl::Error when the last pass has not reached every layer.
  const RoutingRecording& recording() const;

 private:
  RoutingRecording rec_;
  int next_layer_ = 0;  // the layer the current pass expects next (n_layer: the pass is complete)
};

// Writes PATH.tmp and renames it to PATH; throws rl::Error naming the file.
void write_routing_recording(const std::string& path, const RoutingRecording& rec);
// Reads and validates a recording; throws rl::Error naming the file and what is wrong
// (bad magic or version, shape out of range, truncated pass, id out of range or repeated in a
// token, trailing bytes).
RoutingRecording read_routing_recording(const std::string& path);

}  // namespace rl
