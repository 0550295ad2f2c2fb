// The CPU oracle's forward pass: the qwen3next math in fp32 (double where sums are formed), one
// function per stage. The fixtures README ("Computation") and DESIGN.md §1 are the reference.
// The fast tier runs the same stages with its own matrix products (cpu/products.h).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cpu/kv_cache.h"
#include "cpu/products.h"
#include "cpu/thread_pool.h"
#include "model/model.h"
#include "model/session.h"

namespace rl::cpu {

// fp32 copies of the small per-layer vectors; the large matrices stay quantised in the mapping.
struct LayerVectors {
  std::vector<float> attn_norm;            // [n_embd]
  std::vector<float> post_attention_norm;  // [n_embd]
  std::vector<float> q_norm, k_norm;       // [head_dim]            (attention layers)
  std::vector<float> conv1d;               // [conv_dim][conv_kernel] (DeltaNet layers)
  std::vector<float> dt_bias, ssm_a;       // [n_v_heads]
  std::vector<float> ssm_norm;             // [dv]
};

struct OracleWeights {
  explicit OracleWeights(std::shared_ptr<const Model> model);
  std::shared_ptr<const Model> model;
  std::vector<float> output_norm;  // [n_embd]
  std::vector<LayerVectors> layers;
};

// One sequence's state.
struct LayerState {
  KvRows k_cache, v_cache;              // [position][kv_dim] in the session's KV type; attention layers
  std::vector<float> conv;              // [conv_kernel-1][conv_dim], oldest input first; DeltaNet
  std::vector<float> ssm;               // [n_v_heads][dv][dk]; DeltaNet
};

struct State {
  int position = 0;
  std::vector<LayerState> layers;
};

// Zero recurrent states, empty KV caches of type kv, position 0.
State initial_state(const Config& c, KvType kv = KvType::kF32);

// What a state holding n_positions tokens in a KV cache of type kv takes,
// and the KV capacity for that many reserved now (std::bad_alloc when the memory is not there).
size_t state_bytes(const Config& c, int n_positions, KvType kv = KvType::kF32);
void reserve_positions(const Config& c, State& state, int n_positions);

// Tokens processed in one pass at most (bounds activation memory; a longer prefill is split, which
// gives identical results because every stage is computed per token or in token order).
constexpr int kMaxBatch = 512;

// One sequence's share of a forward pass: its state and its next tokens (at state->position..).
struct SequenceTokens {
  State* state;
  std::span<const int32_t> tokens;
};

// Runs every sequence's tokens (at most kMaxBatch in all, each sequence's state distinct) and
// advances their states. The matrix products take all the sequences' tokens as one set of columns
// (mm's: the oracle's for the exact tier, the fast tier's otherwise), so each weight is read once
// per pass; attention and the DeltaNet recurrence run per sequence on its own state. Every stage
// computes a token's row alone or in its own sequence's order, so a sequence's results do not
// depend on what else is in the pass (bit for bit in the exact tier).
// logits: [n_tokens in all][n_vocab] when all_logits, else [n_sequences][n_vocab] (the last token
// of each). The caller has checked token ids and the context limits.
void forward(const OracleWeights& w, const Products& mm, std::span<const SequenceTokens> sequences,
             bool all_logits, float* logits, TraceSink* trace);

// One sequence: forward(w, mm, {{&state, tokens}}, ...).
void forward(const OracleWeights& w, const Products& mm, State& state,
             std::span<const int32_t> tokens, bool all_logits, float* logits, TraceSink* trace);

}  // namespace rl::cpu
