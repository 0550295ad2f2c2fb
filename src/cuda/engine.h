// The parts of the CUDA backend, wired together once per loaded model (cuda_backend.cpp), and the
// functions that run a forward pass on them:
//   device_weights   dense weights on the GPU, expert layout in a slot, bytes per token
//   workspace        every activation buffer, by role and shape
//   expert_residency the ExpertCache's slots, residency table and copies
//   plan             which kernel and numeric form each product uses, how each layer routes
//   products         the product launchers, as the plan says
//   forward          the pass, one function per stage (as src/cpu/forward.cpp)
//   moe_layer        the MoE block: routing modes feeding one gather -> products -> combine
//   expert_prefetch  the next layer's experts predicted and copied ahead (bounded caches)
//   decode_graph     the GPU-routed decode token: capture, replay, speculation, fallback
//   cuda_session     sessions and snapshots; profiler: per-stage GPU times
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <span>
#include <memory>
#include <vector>

#include "cache/admission.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "cuda/device_weights.h"
#include "cuda/expert_residency.h"
#include "cuda/kernels.h"
#include "cuda/plan.h"
#include "cuda/products.h"
#include "cuda/profiler.h"
#include "cuda/streams.h"
#include "cuda/workspace.h"
#include "model/model.h"
#include "model/session.h"

namespace rl::cuda {

// One session's state on the device.
struct SessionState {
  int position = 0;
  int n_ctx = 0;
  KvType kv_type = KvType::kF32;
  std::vector<DeviceBuffer> k_cache, v_cache;  // [n_layer]: [n_ctx][kv_dim] of kv_type (attention layers;
                                               // q8_0: values, then scales, KvCacheRef)
  std::vector<DeviceBuffer> conv, ssm;         // [n_layer]: [K-1][conv_dim], [nv][dv][dk] (DeltaNet layers)
  // A decode step's attention splits (kernels.h AttentionSplits; one set serves every layer, as
  // the layers run one after another): [n_head][ceil(n_ctx / kSplitKeys)][hd + 2] doubles.
  // The fast tier's (AttentionSplitsF: a fixed 1,024 partials a head) in the same storage.
  DeviceBuffer attn_split_storage;
  AttentionSplits attn_splits;
  AttentionSplitsF attn_splits_f;
  // GPU-routed decode: the state backups the graph writes first, and the graph (captured on the
  // first GPU-routed token; it holds this session's buffer addresses).
  std::vector<DeviceBuffer> conv_backup, ssm_backup;
  cudaGraphExec_t token_graph = nullptr;
  // Layer L's caches as the attention kernels take them.
  KvCacheRef kv(int L) const { return {k_cache[L].get(), v_cache[L].get(), kv_type, n_ctx}; }
  SessionState() = default;
  SessionState(const SessionState&) = delete;
  SessionState& operator=(const SessionState&) = delete;
  ~SessionState() {
    if (token_graph) cudaGraphExecDestroy(token_graph);
  }
};

// A batched decode step of `rows` sessions captured as one graph (decode_graph.cpp), replayed for
// any `rows` sessions whose attention takes `max_splits` decode splits: its kernels read every
// row's states, caches and split buffers from the graph's tables, which a step rewrites (on the
// stream, after the replays before it) when its sessions are not those the tables hold. A session
// that goes away leaves the tables that hold it (forget_batch_graphs), so that a later session at
// its address gets its own tables written.
struct BatchGraph {
  int rows = 0, max_splits = 0;
  std::vector<const SessionState*> tables_of;  // the sessions the tables hold, in row order (empty: none)
  // The rows' states as the batched kernels take them: per layer, the B conv states then the B
  // recurrent states (float*; nullptr for attention layers); per layer the B rows' caches and
  // split buffers (AttentionRow; empty for DeltaNet layers).
  DeviceBuffer state_table, attention_table;
  cudaGraphExec_t exec = nullptr;
  uint64_t last_use = 0;  // the engine's batch step count at its last replay (the oldest is dropped first)
  BatchGraph() = default;
  BatchGraph(const BatchGraph&) = delete;
  BatchGraph& operator=(const BatchGraph&) = delete;
  ~BatchGraph() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

// Everything a forward pass reads and writes besides the session's state. Members are built in
// this order (the memory plan: dense weights, then the working set, then the expert slots in
// what is left).
struct Engine {
  Engine(std::shared_ptr<const Model> model, const CudaOptions& options);
  ~Engine();
  const Config& config() const { return model->config(); }
  // The layer plan of a pass of T tokens, made on first use (host work only: safe during capture).
  const PassPlan& plan(int T);

  std::shared_ptr<const Model> model;
  CudaOptions opts;
  EngineStats stats;
  Streams streams;
  Profiler profiler;
  DeviceWeights weights;
  NumericForms forms;
  Workspace ws;
  ExpertResidency residency;
  Products products;
  Products side_products;           // the same launchers on streams.side (the decode graph's shared expert)
  Products predict_products;        // on streams.predict (the decode graph's prediction branch)
  std::map<int, PassPlan> plans;    // by chunk size
  std::vector<int> grouped_layers;  // the layers of the pass in progress grouped on the GPU
  bool gpu_routed_broken = false;   // capture failed once: stay on the synchronous path
  bool batch_graph_broken = false;  // a batch's capture failed once: batches decode one after another
  std::vector<std::unique_ptr<BatchGraph>> batch_graphs;  // at most kMaxBatchGraphs, by last use; one a batch size
  uint64_t batch_steps = 0;
  // While a batch graph is captured: its tables, and the most decode splits any row's attention
  // takes (the batched attention's grid).
  float* const* batch_states = nullptr;
  const AttentionRow* batch_attention = nullptr;
  int batch_max_splits = 0;
  int predicted_layer = -1;         // the layer whose predicted selections are on their way to the host
  // --miss-reads host: how many of a token's misses come into the cache (--miss-admit, or adaptive).
  AdaptiveAdmission admission{opts.miss_admit};
};

// ---- forward.cpp ----------------------------------------------------------------------------
// One forward pass of T <= ws.max_tokens (--prefill-chunk) tokens on the synchronous path: the token ids and positions
// uploaded, the pass, the logits (every position's when all_logits, else the last one's) copied to
// logits_out, the statistics updated.
void run_pass(Engine& e, SessionState& st, std::span<const int32_t> tokens, bool all_logits, float* logits_out,
              TraceSink* trace);
// One pass over several sessions' pieces (sts[i] reads chunks[i] at its position; at most
// ws.max_tokens tokens in all): the products and the MoE over all their tokens, each session's
// DeltaNet and attention on its own rows; out[i] (n_vocab floats) the logits of sts[i]'s last token.
void run_pass_batch(Engine& e, std::span<SessionState* const> sts, std::span<const std::span<const int32_t>> chunks,
                    std::span<float* const> out);
// Enqueues a forward pass of T tokens whose ids and positions are already in device memory, up to
// the LM head's logits in `logits` ([T or 1][n_vocab]): T tokens of one session (sts = {st}, at
// positions pos_d[0..T)), or a batched decode step, one token of each of T sessions (sts[t] decodes
// row t at pos_d[t]: the products over every row, each row's DeltaNet and attention on its
// session's state), or (seq_begin given) several sessions' pieces, sts[i]'s rows from
// seq_begin[i] to the next one's (or T), logits [sts.size()][n_vocab] of each one's last row.
// gpu_routed (T == 1): the routing runs on the GPU and the pass never waits for the host, so it
// can be captured into a graph; so can a pass whose layers all group on the GPU.
void encode_pass(Engine& e, std::span<SessionState* const> sts, const int32_t* ids_d, const int32_t* pos_d, int T,
                 bool all_logits, float* logits, TraceSink* trace, bool gpu_routed,
                 std::span<const int> seq_begin = {});

// ---- moe_layer.cpp --------------------------------------------------------------------------
// The MoE block of layer L on h2 [T][n_embd]: x += routed experts + shared expert; then
// h_out = RMSNorm(x) * next_norm (the next layer's input norm or the output norm, fused into the
// combine). gpu_routed: for the captured decode token (T == 1), never waiting for the host.
// h2_q8_ready: ws.q8_moe_input already holds h2's Q8 form (add_rms_norm wrote it); next_q8: where
// the combine also writes h_out's Q8 form (the next layer's mixer input; none by default).
void moe_block(Engine& e, int L, const LayerPlan& plan, const float* h2, int T, float* x, const float* next_norm,
               float* h_out, TraceSink* trace, bool gpu_routed, bool h2_q8_ready = false,
               const Q8Target& next_q8 = {});

// ---- expert_prefetch.cpp ----------------------------------------------------------------------
// Whether layer L of a pass of T tokens routed as `routing` predicts layer L+1's experts at point
// `when` of the layer (CudaOptions::prefetch).
bool predicts_next_layer(const Engine& e, int L, int T, Routing routing, CudaOptions::Prefetch when);
// Enqueues layer L+1's router and top-k on the residual x (normed with layer L+1's post-attention
// norm) into the prediction buffers, their copy to the host and Streams::prediction_ready.
void predict_next_layer(Engine& e, int L);
// --miss-reads host, in the decode graph: layer L+1's router on RMSNorm(x) · its post-attention
// norm (x: layer L's MoE input residual), its top n predicted experts that are not resident named
// and copied into the residency's predicted staging for L+1, on Streams::predict (forked here;
// layer L+1's routing waits for the names, its expert kernels for the copies).
void stage_next_layer_prediction(Engine& e, int L, const float* x, int n);
// When layer L's predicted selections are on their way: waits for them and prefetches their misses
// (ExpertResidency::prefetch).
void prefetch_predicted(Engine& e, int L);

// ---- cuda_session.cpp -----------------------------------------------------------------------
// A session of n_ctx positions on this engine (refused when n_ctx <= 0).
std::unique_ptr<Session> new_cuda_session(Engine& e, int n_ctx);
// Fails, naming its index in a decode_batch call, when session s is not a session of e.
void check_session_of(const Engine& e, Session& s, size_t index);
// Session s (one of this engine's: check_session_of) as a row of a batched decode step about to
// write its next position: the KV rows its snapshots reference there are frozen first (as its own
// decode does); nullptr, with nothing done, when s traces its passes (a traced session decodes
// alone).
SessionState* batch_row(Session& s);
// Device bytes such a session allocates: the KV cache (of forms.kv_type), the DeltaNet states (and
// their backups for the GPU-routed token) and the decode attention's split buffers.
size_t session_bytes(const Config& c, const NumericForms& forms, int n_ctx);
// Throws rl::Error, naming --ctx and the bytes, when such a session does not fit in free device memory.
void check_session_fits(const Engine& e, int n_ctx);

// ---- decode_graph.cpp -----------------------------------------------------------------------
// One decode token on the GPU-routed path. False (state unchanged) when the token must be
// recomputed by run_pass: the path is off for this cache (--speculation), or a layer selected a
// non-resident expert.
bool decode_gpu_routed(Engine& e, SessionState& st, int32_t token, float* logits_out, TraceSink* trace);
// The most sessions one batched decode step takes (2 .. kQ8PassTokens), or 0 where batches decode
// one after another: the exact tier (each sequence's tokens are then those it gets alone, bit for
// bit), --profile, --speculation off, a cache that does not hold every expert, a plan that does not
// group every layer's experts on the GPU, or a capture that failed.
int batch_rows(Engine& e);
// One token of each session (sts[i] decodes tokens[i] at its position; 2 to batch_rows(e) of
// them, distinct, each with room for the token) in one pass: a graph captured for these sessions
// in this order, replayed while they decode together. logits_out[i]: sts[i]'s logits, resized to
// n_vocab (in place where it has that size). The positions advance. False, with nothing changed,
// when the graph could not be captured (then batch_rows gives 0 from now on).
bool decode_batch_graph(Engine& e, std::span<SessionState* const> sts, std::span<const int32_t> tokens,
                        std::span<std::vector<float>> logits_out);
// The batch graphs' tables that hold st no longer count as written for it (st goes away).
void forget_batch_graphs(Engine& e, const SessionState& st);

}  // namespace rl::cuda
