// The model's dense weights in device memory (DESIGN.md §3): every non-expert tensor, uploaded
// once into one allocation, and where each routed expert's matrices sit in a cache slot. Matrices
// keep their ggml type ([rows x cols] = [out x in], as in model.h); small vectors are fp32.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/cuda_check.h"
#include "model/model.h"

namespace rl::cuda {

constexpr size_t kAlign = 256;  // every device sub-allocation (and expert matrix in a slot)
inline size_t align_up(size_t n, size_t a = kAlign) { return (n + a - 1) / a * a; }

// A quantised matrix [rows x cols] in device memory.
struct DMat {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  int rows = 0, cols = 0;
};

struct AttnDev {
  DMat q;               // [n_head*2*hd x n_embd] (query, gate per head)
  DMat k, v;            // [kv_dim x n_embd]
  DMat o;               // [n_embd x n_head*hd]
  const float* q_norm;  // [hd]
  const float* k_norm;  // [hd]
};

struct SsmDev {
  DMat qkv;              // [conv_dim x n_embd] (legacy fused ssm_in: rows permuted, see upload)
  DMat z;                // [value_dim x n_embd]
  DMat ba;               // [2 nv x n_embd]
  DMat out;              // [n_embd x value_dim]
  const float* conv;     // [conv_dim][K]
  const float* dt_bias;  // [nv]
  const float* a;        // [nv]
  const float* norm;     // [dv]
};

struct MoeDev {
  DMat router;                    // [n_expert x n_embd]
  DMat shared_gate_inp;           // [1 x n_embd]
  DMat gate_sh, up_sh, down_sh;   // shared expert: [ff_sh x n_embd] twice, [n_embd x ff_sh]
  // Routed experts: the host views (copied into slots) and where each matrix sits in a slot.
  TensorView gate_exps, up_exps, down_exps;
  size_t up_offset = 0, down_offset = 0, expert_bytes = 0;
};

struct LayerDev {
  bool recurrent = false;
  const float* attn_norm = nullptr;  // [n_embd]
  const float* post_norm = nullptr;  // [n_embd]
  AttnDev attn{};                    // attention layers
  SsmDev ssm{};                      // DeltaNet layers
  MoeDev moe;
};

struct DeviceWeights {
  DeviceBuffer dense;  // the one allocation every pointer below points into
  std::vector<LayerDev> layers;
  DMat token_embd;     // [n_vocab x n_embd]
  DMat output;         // [n_vocab x n_embd] (token_embd when the file shares it)
  const float* output_norm = nullptr;  // [n_embd]
  size_t dense_bytes = 0;              // the allocation's size
  // Weight bytes one decode token reads: every dense matrix, one embedding row (unless it is also
  // the LM head), and n_expert_used experts per layer.
  size_t decode_bytes_per_token = 0;
  // The largest expert (gate, up and down at their slot offsets): the cache's slot size.
  size_t slot_bytes() const;
};

// Uploads every dense tensor of `m`; throws rl::Error naming the tensor when its type is not one
// the CUDA kernels run or its rows are not a multiple of 32 values.
DeviceWeights upload_weights(const Model& m);

}  // namespace rl::cuda
