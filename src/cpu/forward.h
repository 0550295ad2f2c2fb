// The CPU oracle's forward pass: the qwen3next math in fp32 (double where sums are formed), one
// function per stage. The fixtures README ("Computation") and DESIGN.md §1 are the reference.
// The fast tier runs the same stages with its own matrix products (cpu/products.h).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

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
  std::vector<float> k_cache, v_cache;  // [position][kv_dim]; attention layers
  std::vector<float> conv;              // [conv_kernel-1][conv_dim], oldest input first; DeltaNet
  std::vector<float> ssm;               // [n_v_heads][dv][dk]; DeltaNet
};

struct State {
  int position = 0;
  std::vector<LayerState> layers;
  size_t bytes() const;
};

// Zero recurrent states, empty KV caches, position 0.
State initial_state(const Config& c);

// Tokens processed in one pass at most (bounds activation memory; a longer prefill is split, which
// gives identical results because every stage is computed per token or in token order).
constexpr int kMaxBatch = 512;

// Runs `tokens` (at most kMaxBatch) at positions state.position.. and advances the state; the
// matrix products are mm's (the oracle's for the exact tier, the fast tier's otherwise).
// logits: [n_tokens][n_vocab] when all_logits, else [n_vocab] of the last token.
// The caller has checked token ids and the context limit.
void forward(const OracleWeights& w, const Products& mm, State& state,
             std::span<const int32_t> tokens, bool all_logits, float* logits, TraceSink* trace);

}  // namespace rl::cpu
