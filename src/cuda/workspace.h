// The activations of one forward pass, in the style of llama2.c's RunState: every device buffer
// the backend computes into, named by its role, with its shape. T is the pass's token count (at
// most kMaxChunk); K = n_expert_used; TK = T·K (token, selection) pairs; E = n_expert.
//
// The two mixer blocks (DeltaNet, attention) are never both in one layer, so they share five
// scratch buffers and the block output; each block names its share through a view
// (deltanet_views, attention_views) rather than by the storage's name.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/device_weights.h"
#include "model/model.h"

namespace rl::cuda {

constexpr size_t kStagingBytes = 64u << 20;  // pinned ring for per-layer host<->device tables
// Workspace::split_k's floats (16 MiB, the fast tier only): a 512-token pass's F32 router (2048 →
// 512) in 8 slices takes 2 Mi of them, a 2 048-token pass's in 3 slices 3 Mi.
constexpr size_t kSplitKFloats = 4u << 20;

struct NumericForms;

// Page-locked host memory (cudaMallocHost), freed on destruction.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { release(); }
  void allocate(size_t bytes);
  void release();
  template <class T = void>
  T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Pinned staging area (host) mirrored by a device area at the same offsets, for the small
// per-layer tables (slot pointers, assignments, gathered order). Reset once per layer, when the
// host has waited for the router logits: by stream order everything staged before was consumed.
class StagingArea {
 public:
  void allocate();
  // `count` values of T: the host copy to fill and the device address the kernels read.
  template <class T>
  std::pair<T*, T*> stage(size_t count) {
    auto [h, d] = stage_bytes(count * sizeof(T));
    return {static_cast<T*>(h), static_cast<T*>(d)};
  }
  void reset() { used_ = 0; }

 private:
  std::pair<void*, void*> stage_bytes(size_t bytes);
  PinnedBuffer host_;
  DeviceBuffer dev_;
  size_t used_ = 0;
};

// Activations in a quantised integer form (quantize_x24 / quantize_x32, kernels.h): the bytes,
// the per-256-column scales and (X32 only) the per-32-column sums.
struct QuantRows {
  DeviceBuffer q;      // [rows][cols] in x24_bytes / x32_bytes
  DeviceBuffer scale;  // [rows][cols / 256] double
  DeviceBuffer sum;    // [rows][cols / 32] double (X32)
};

// Decode inputs in the Q8 form (quantize_q8, kernels.h): int8 values and per-32-value (scale, sum).
struct Q8Rows {
  DeviceBuffer q;   // [rows][cols] int8
  DeviceBuffer ds;  // [rows][cols / 32] float2
  int rows = 0;     // the inputs it holds at once
  int8_t* values() const { return q.get<int8_t>(); }
  float2* scales() const { return ds.get<float2>(); }
};

// The names the DeltaNet block gives the shared storage (one pass of T tokens).
struct DeltaNetViews {
  float* qkv;   // [T][conv_dim]  input projection: q of all key heads | k | v
  float* conv;  // [T][conv_dim]  after the causal conv and SiLU; q, k then L2-normalised in place
  float* z;     // [T][value_dim] output gate projection
  float* o;     // [T][value_dim] recurrence output, then gated RMSNorm in place
  float* ba;    // [T][2 nv]      beta / alpha projection
  float* beta;  // [T][nv]        sigmoid(b): in block_out, free until the out projection writes it
  float* g;     // [T][nv]        log-decay: in block_out after beta
};

// The names the attention block gives the shared storage (one pass of T tokens).
struct AttentionViews {
  float* qg;    // [T][nh][2][hd] query and gate per head
  float* q;     // [T][nh][hd]    normalised, rotated query
  float* gate;  // [T][nh][hd]
  float* att;   // [T][nh][hd]    gated attention output
  float* k;     // [T][nkv][hd]
  float* v;     // [T][nkv][hd]   in block_out, free until the output projection writes it
};

struct Workspace {
  // Allocates every buffer for passes of up to max_tokens tokens (--prefill-chunk); the X24 / X32
  // buffers only where `forms` runs such products. bytes() is the device memory taken
  // (EngineStats::working_bytes).
  Workspace(const Config& c, const NumericForms& forms, int max_tokens);
  int max_tokens = 0;  // the longest pass
  size_t bytes() const { return bytes_; }
  DeltaNetViews deltanet_views(const Config& c, int T) const;
  AttentionViews attention_views() const;

  // ---- the layer stream --------------------------------------------------------------------
  DeviceBuffer x;          // [T][n_embd] residual stream
  DeviceBuffer h;          // [T][n_embd] the next block's normed input (from layer 1 on the previous
                           //             layer's MoE combine writes the next input norm here)
  DeviceBuffer block_out;  // [T][max(n_embd, kv_dim, 2 nv)] a mixer block's output ([T][n_embd]);
                           //             before that, the views' beta, g or v
  // Mixer scratch, named by the views above.
  DeviceBuffer mixer_wide_a, mixer_wide_b;                        // [T][max(conv_dim, 2 q_dim)]
  DeviceBuffer mixer_narrow_a, mixer_narrow_b, mixer_narrow_c;    // [T][max(value_dim, q_dim, 2 nv)]

  // ---- MoE ---------------------------------------------------------------------------------
  DeviceBuffer router_logits;  // [T][E]
  DeviceBuffer route_ids;      // [TK] int32 selections (route_tokens), token-major
  DeviceBuffer route_weights;  // [TK] their weights
  DeviceBuffer shared_act;     // [T][ff_sh] shared expert: SiLU(gate h2) * (up h2)
  DeviceBuffer shared_up;      // [T][ff_sh] up h2 where gate and up are separate launches
  DeviceBuffer shared_out;     // [T][n_embd] down of shared_act
  DeviceBuffer shared_scalar;  // [T] ffn_gate_inp_shexp · h2 (the combine applies its sigmoid)
  DeviceBuffer expert_in;      // [TK][n_embd] gathered routed-expert inputs (row a: a pair's token)
  DeviceBuffer expert_act;     // [TK][ff] gate products, then SiLU(gate) * up
  DeviceBuffer expert_up;      // [TK][ff] up products where gate and up are separate launches
  DeviceBuffer expert_out;     // [TK][n_embd] down products, one row per (token, selection) pair
  // Integer forms of activations (NumericForms).
  QuantRows moe_input_x24;     // [T][n_embd]  h2, converted once a layer for the shared pair and
                               //              (gathered into expert_in_x24) the routed gate and up
  QuantRows expert_in_x24;     // [TK][n_embd] gathered rows of moe_input_x24
  QuantRows expert_act_x24;    // [TK][ff]     expert_act for the X24 down products
  QuantRows dense_input_x32;   // [T][x32_cols] the input of consecutive dense X32 products
  DeviceBuffer split_k;        // [kSplitKFloats] the partial sums of a dense bf16 product split over its
                               //   columns (matmul_bf16; the layer stream's Products only)
  // The Q8 form of decode inputs (NumericForms::q8), one buffer per input that may be live at once.
  Q8Rows q8_input;       // [kQ8PassTokens][max(n_embd, value_dim, q_dim, ff_sh)] a dense product's input
  Q8Rows q8_side_input;  // [1][max(n_embd, ff_sh)] a product's input on the decode graph's side branch
  Q8Rows q8_predict_input;  // [1][n_embd] the prediction branch's router input (expert_prefetch.cpp)
  Q8Rows q8_moe_input;   // [kQ8PassTokens][n_embd] h2, converted once a layer for every matvec-q8 product of it
  Q8Rows q8_expert_act;  // [kQ8PassTokens·K][ff] the routed experts' SwiGLU outputs, for their down products
  // The next layer's predicted selections (prefetch, decode): never the buffers the real routing uses.
  DeviceBuffer predict_input;    // [n_embd] RMSNorm(x) * the next layer's post-attention norm
  DeviceBuffer predict_logits;   // [E] the next layer's router on it
  DeviceBuffer predict_ids;      // [K] int32 its top-k
  DeviceBuffer predict_weights;  // [K] (route_tokens writes them; unused)
  PinnedBuffer predict_ids_host; // [K] for the host's prefetch
  // GPU grouping of a prefill layer's selections (group_by_expert).
  DeviceBuffer grouped_gather;     // [TK] int32 token of each gathered row
  DeviceBuffer grouped_assign;     // [TK] int32 gathered row of each (token, selection) pair
  DeviceBuffer grouped_slot_ptrs;  // [n_groups] slot address of each group's expert
  DeviceBuffer grouped_groups;     // [2][n_groups] int32 first rows, then row counts
  DeviceBuffer grouped_distinct;   // [n_layer] int32 experts used per layer (statistics)
  PinnedBuffer grouped_distinct_host;  // its host copy

  // ---- the pass's inputs and outputs -------------------------------------------------------
  DeviceBuffer ids, pos;       // [T] int32 token ids, positions
  DeviceBuffer logits;         // [rows][n_vocab]; grows when every position's logits are asked for
  size_t logits_rows = 1;
  PinnedBuffer logits_host;    // [rows][n_vocab] their host copy (grows likewise)
  PinnedBuffer router_host;    // [T][E] router logits for a trace
  PinnedBuffer route_ids_host; // [TK] selections for the host's reservation
  StagingArea staging;

  // ---- the GPU-routed decode token (read and written by the captured graph) ----------------
  DeviceBuffer token_position;       // [2] int32 token id, position
  PinnedBuffer token_position_host;
  DeviceBuffer routed_io;            // selections [n_layer][K] then miss counts [n_layer] (one copy back)
  PinnedBuffer routed_io_host;
  DeviceBuffer routed_weights;       // [n_layer][K]
  DeviceBuffer routed_slot_ptrs;     // [n_layer][K] slot addresses (route_topk)
  DeviceBuffer routed_router;        // [n_layer][E] router logits, kept per layer for the trace
  PinnedBuffer routed_router_host;
  DeviceBuffer assign_identity;      // [kQ8PassTokens·K] 0, 1, ...: pair i is expert row i
  // A short pass's routed experts as pairs (Products::expert_pairs): the slot of each (token,
  // selection) pair's expert.
  DeviceBuffer pair_slot_ptrs;       // [kQ8PassTokens·K]
  // The graph's logits have a buffer of their own: `logits` is reallocated when a prefill asks
  // for all positions, and a captured graph must never see an address change.
  DeviceBuffer routed_logits;        // [n_vocab]

  // ---- the batched decode step (decode_graph.cpp; its graphs read and write these) ----------
  DeviceBuffer batch_io;            // [2][kMaxBatchRows] int32 token ids, then positions
  PinnedBuffer batch_io_host;
  DeviceBuffer batch_logits;        // [kMaxBatchRows][n_vocab]
  PinnedBuffer batch_logits_host;

  // Grows `logits` and `logits_host` to `rows` rows of n_vocab.
  void reserve_logits(size_t rows, int n_vocab);

 private:
  size_t bytes_ = 0;
};

}  // namespace rl::cuda
