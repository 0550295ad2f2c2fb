// The forward pass on the GPU, stage for stage as the oracle's (src/cpu/forward.cpp):
//   x = embed(tokens)
//   per layer: x += Mixer(RMSNorm(x) * attn_norm)            deltanet_block or attention_block
//              x += MoE(RMSNorm(x) * post_attention_norm)    moe_block (moe_layer.cpp)
//   logits = output (RMSNorm(x) * output_norm)               lm_head
// Where the GPU fuses two stages it says so: the residual add with the post-attention norm
// (add_rms_norm), and the MoE combine with the next layer's input norm (or the output norm).
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/engine.h"
#include "cuda/kernels.h"

namespace rl::cuda {

namespace {

// x[t] = token_embd[token[t]]                                     x: [T][n_embd]
void embed(Engine& e, const int32_t* ids_d, int T, float* x) {
  const DMat& w = e.weights.token_embd;
  get_rows(w.type, w.data, w.row_bytes, e.config().n_embd, ids_d, T, x, e.streams.compute);
}

// The views of a pass's rows from row o on (one session's piece of a pass over several).
DeltaNetViews rows_from(const DeltaNetViews& v, const Config& c, int o) {
  const size_t conv = (size_t)c.ssm_conv_dim() * o, value = (size_t)c.ssm_n_v_heads * c.ssm_head_dim * o;
  const size_t nv = (size_t)c.ssm_n_v_heads * o;
  return {v.qkv + conv, v.conv + conv, v.z + value, v.o + value, v.ba + 2 * nv, v.beta + nv, v.g + nv};
}
AttentionViews rows_from(const AttentionViews& v, const Config& c, int o) {
  const size_t q = (size_t)c.n_head * c.head_dim * o, kv = (size_t)c.n_head_kv * c.head_dim * o;
  return {v.qg + 2 * q, v.q + q, v.gate + q, v.att + q, v.k + kv, v.v + kv};
}
// The rows [begin, end) of piece i of seq_begin in a pass of T.
int piece_end(std::span<const int> seq_begin, size_t i, int T) {
  return i + 1 < seq_begin.size() ? seq_begin[i + 1] : T;
}

// The recurrent part of Gated DeltaNet over the views' T rows: the causal conv and gates, the L2
// norm of q and k, the recurrence. Either T tokens of session st in order, or (st null; the fast
// tier) one token of each of T sessions in one launch per kernel, their states from `batch` ([2][T]
// device pointers: the conv states, then the recurrent states of layer L).
void deltanet_core(Engine& e, int L, const DeltaNetViews& v, int T, SessionState* st, float* const* batch) {
  const Config& c = e.config();
  const SsmDev& w = e.weights.layers[L].ssm;
  const cudaStream_t stream = e.streams.compute;
  const int nk = c.ssm_n_k_heads, nv = c.ssm_n_v_heads, dk = c.ssm_head_dim, dv = c.ssm_head_dim;
  const int key_dim = c.ssm_key_dim(), conv_dim = c.ssm_conv_dim();
  // The fast tier's kernels are fp32 (deltanet_fast.cu), the exact tier's the oracle's arithmetic.
  const bool fast = e.forms.fast_deltanet;
  if (batch)
    deltanet_conv_gates_fast_rows(v.qkv, conv_dim, v.conv, batch, w.conv, T, conv_dim, c.ssm_conv_kernel, v.ba,
                                  w.dt_bias, w.a, v.beta, v.g, nk, nv, stream);
  else
    (fast ? deltanet_conv_gates_fast : deltanet_conv_gates)(v.qkv, conv_dim, v.conv, st->conv[L].f(), w.conv, T,
                                                            conv_dim, c.ssm_conv_kernel, v.ba, w.dt_bias, w.a, v.beta,
                                                            v.g, nk, nv, stream);
  // q heads (scaled by 1/sqrt(dk)) and then k heads, adjacent in each token's row: one launch;
  // the recurrence normalises them itself instead (the same values) where it can: heads of 128,
  // at any T in the fast tier, a decode step in the exact.
  const L2Norm qk_norm{1e-6f, (float)(1.0 / std::sqrt((double)dk))};
  const bool fuse_norm = dk == 128 && (fast || T == 1);
  if (!fuse_norm) l2_norm(v.conv, T, 2 * nk, dk, conv_dim, qk_norm.eps, qk_norm.q_scale, stream, nk);
  const L2Norm* norm = fuse_norm ? &qk_norm : nullptr;
  if (batch)
    deltanet_recurrence_fast_rows(v.conv, v.conv + key_dim, v.conv + 2 * key_dim, conv_dim, v.beta, v.g, batch + T,
                                  v.o, T, nk, nv, dk, dv, stream, norm);
  else if (fast)
    deltanet_recurrence_fast(v.conv, v.conv + key_dim, v.conv + 2 * key_dim, conv_dim, v.beta, v.g, st->ssm[L].f(),
                             v.o, T, nk, nv, dk, dv, stream, norm);
  else
    deltanet_recurrence(v.conv, v.conv + key_dim, v.conv + 2 * key_dim, conv_dim, v.beta, v.g, st->ssm[L].f(), v.o, T,
                        nk, nv, dk, dv, stream, norm);
}

// Gated DeltaNet of T tokens: of one session (sts[0]), or one token each of T sessions (a batched
// decode step: sts[t] for row t; products and norms over all rows, the recurrent part in one launch
// per kernel from the batch graph's state table, Engine::batch_states).
//                                                                  h, out: [T][n_embd]
void deltanet_block(Engine& e, std::span<SessionState* const> sts, int L, const LayerPlan& plan, const float* h, int T,
                    float* out, std::span<const int> seq_begin) {
  const Config& c = e.config();
  const SsmDev& w = e.weights.layers[L].ssm;
  const cudaStream_t stream = e.streams.compute;
  const int nv = c.ssm_n_v_heads, dv = c.ssm_head_dim;
  const DeltaNetViews v = e.ws.deltanet_views(c, T);
  e.profiler.mark(kProjections, stream);
  e.products.project_group({{&w.qkv, plan.mixer_in[0], h, v.qkv},
                            {&w.z, plan.mixer_in[1], h, v.z},
                            {&w.ba, plan.mixer_in[2], h, v.ba}},
                           T);
  e.profiler.mark(kDeltaNet, stream);
  if (!seq_begin.empty()) {  // several sessions' pieces: each on its own rows and state
    for (size_t i = 0; i < sts.size(); i++)
      deltanet_core(e, L, rows_from(v, c, seq_begin[i]), piece_end(seq_begin, i, T) - seq_begin[i], sts[i], nullptr);
  } else {
    if (sts.size() > 1 && !e.batch_states) throw_error("deltanet: a batched pass without its graph's state table");
    deltanet_core(e, L, v, T, sts.size() == 1 ? sts[0] : nullptr,
                  sts.size() == 1 ? nullptr : e.batch_states + (size_t)L * 2 * T);
  }
  // Decode and short passes: the norm also writes the output projection's Q8 input.
  const Q8Target q8 =
      reads_q8_form(plan.mixer_out) && T <= kQ8PassTokens ? e.products.q8_target() : Q8Target{};
  gated_rms_norm(v.o, v.z, w.norm, v.o, T * nv, dv, c.rms_eps, stream, q8.q, q8.ds);
  if (q8.q) e.products.hold_q8(v.o);
  e.profiler.mark(kProjections, stream);
  e.products.project(w.out, plan.mixer_out, v.o, T, out);
}

// Attention of T tokens of one session at positions pos_d[0..T): per-head norms, RoPE and the KV
// append, then the gated attention over the session's cache.
void attention_core(Engine& e, SessionState& st, int L, const AttentionViews& v, int T, const int32_t* pos_d) {
  const Config& c = e.config();
  const AttnDev& w = e.weights.layers[L].attn;
  const cudaStream_t stream = e.streams.compute;
  const int hd = c.head_dim, nh = c.n_head, nkv = c.n_head_kv;
  const float theta_scale = std::pow(c.rope_base, -2.0f / (float)c.rope_dim);
  attention_prep(v.qg, v.k, v.v, v.q, v.gate, w.q_norm, w.k_norm, st.kv(L), T, nh, nkv, hd, c.rms_eps, c.rope_dim,
                 theta_scale, pos_d, stream);
  const float scale = (float)(1.0 / std::sqrt((double)hd));
  if (e.forms.fast_attention)
    gated_attention_fast(v.q, v.gate, st.kv(L), v.att, T, nh, nkv, hd, 0, scale, stream, pos_d, &st.attn_splits_f);
  else
    gated_attention(v.q, v.gate, st.k_cache[L].f(), st.v_cache[L].f(), v.att, T, nh, nkv, hd, 0, scale, stream, pos_d,
                    &st.attn_splits);
}

// A batched decode step's attention, one token of each of B sessions at pos_d[0..B), in one
// launch per kernel: the rows' caches and split buffers from the batch graph's table
// (Engine::batch_attention, layer L's B entries).
void attention_rows(Engine& e, int L, const AttentionViews& v, int B, const int32_t* pos_d) {
  const Config& c = e.config();
  const AttnDev& w = e.weights.layers[L].attn;
  const cudaStream_t stream = e.streams.compute;
  const int hd = c.head_dim, nh = c.n_head, nkv = c.n_head_kv;
  const float theta_scale = std::pow(c.rope_base, -2.0f / (float)c.rope_dim);
  const AttentionRow* rows = e.batch_attention + (size_t)L * B;
  attention_prep_rows(v.qg, v.k, v.v, v.q, v.gate, w.q_norm, w.k_norm, rows, e.forms.kv_type, B, nh, nkv, hd,
                      c.rms_eps, c.rope_dim, theta_scale, pos_d, stream);
  const float scale = (float)(1.0 / std::sqrt((double)hd));
  gated_attention_fast_rows(v.q, v.gate, rows, e.forms.kv_type, e.batch_max_splits, v.att, B, nh, nkv, hd, scale,
                            pos_d, stream);
}

// Gated attention of T tokens: of one session (sts[0]), or one token each of T sessions (sts[t]
// for row t, at pos_d[t]: in one launch per kernel from the batch graph's table). Positions come
// from pos_d, so a captured graph replays at any position.
//                                                                  h, out: [T][n_embd]
void attention_block(Engine& e, std::span<SessionState* const> sts, int L, const LayerPlan& plan, const float* h, int T,
                     const int32_t* pos_d, float* out, std::span<const int> seq_begin) {
  const AttnDev& w = e.weights.layers[L].attn;
  const cudaStream_t stream = e.streams.compute;
  const AttentionViews v = e.ws.attention_views();
  e.profiler.mark(kProjections, stream);
  e.products.project_group(
      {{&w.q, plan.mixer_in[0], h, v.qg}, {&w.k, plan.mixer_in[1], h, v.k}, {&w.v, plan.mixer_in[2], h, v.v}}, T);
  e.profiler.mark(kAttention, stream);
  if (!seq_begin.empty()) {  // several sessions' pieces: each on its own rows, positions and cache
    for (size_t i = 0; i < sts.size(); i++)
      attention_core(e, *sts[i], L, rows_from(v, e.config(), seq_begin[i]), piece_end(seq_begin, i, T) - seq_begin[i],
                     pos_d + seq_begin[i]);
  } else if (sts.size() == 1)
    attention_core(e, *sts[0], L, v, T, pos_d);
  else if (e.batch_attention)
    attention_rows(e, L, v, T, pos_d);
  else
    throw_error("attention: a batched pass without its graph's attention table");
  e.profiler.mark(kProjections, stream);
  e.products.project(w.o, plan.mixer_out, v.att, T, out);
}

// logits = output h for every token (all_logits) or only the last.   h: [T][n_embd]
void lm_head(Engine& e, const PassPlan& plan, const float* h, int T, bool all_logits, float* logits) {
  const int n_embd = e.config().n_embd;
  const int rows = all_logits ? T : 1;
  e.products.project(e.weights.output, all_logits ? plan.lm_head_all : plan.lm_head_last,
                     all_logits ? h : h + (size_t)(T - 1) * n_embd, rows, logits);
}

// Copies a [T][width] device tensor to the trace (synchronous; traced passes only).
void trace_rows(Engine& e, TraceSink* trace, const std::string& name, const float* d, int T, int width) {
  std::vector<float> h((size_t)T * width);
  RL_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, h.size() * sizeof(float), cudaMemcpyDeviceToHost, e.streams.compute));
  RL_CUDA_CHECK(cudaStreamSynchronize(e.streams.compute));
  trace->tensor(name, T, width, h.data());
}

}  // namespace

void encode_pass(Engine& e, std::span<SessionState* const> sts, const int32_t* ids_d, const int32_t* pos_d, int T,
                 bool all_logits, float* logits, TraceSink* trace, bool gpu_routed, std::span<const int> seq_begin) {
  if (!seq_begin.empty() && (seq_begin.size() != sts.size() || seq_begin[0] != 0 || all_logits || trace || gpu_routed))
    throw_error("encode_pass: several sessions' pieces take one start each from row 0, last logits, no trace");
  const Config& c = e.config();
  const int n_embd = c.n_embd;
  const cudaStream_t stream = e.streams.compute;
  // Under a trace a GPU-routed token reports only the router logits and selections of each layer.
  TraceSink* tensors = gpu_routed ? nullptr : trace;
  float* x = e.ws.x.f();
  float* h = e.ws.h.f();
  float* mixer_out = e.ws.block_out.f();
  const DeviceWeights& w = e.weights;
  const PassPlan& plan = e.plan(T);
  embed(e, ids_d, T, x);

  for (int L = 0; L < c.n_layer; L++) {
    const LayerDev& d = w.layers[L];
    const LayerPlan& lp = plan.layers[L];
    // h = RMSNorm(x) * attn_norm; from layer 1 on, the previous layer's MoE combine wrote it.
    e.profiler.mark(kNorms, stream);
    if (L == 0) rms_norm(x, d.attn_norm, h, T, n_embd, c.rms_eps, stream);
    if (d.recurrent)
      deltanet_block(e, sts, L, lp, h, T, mixer_out, seq_begin);
    else
      attention_block(e, sts, L, lp, h, T, pos_d, mixer_out, seq_begin);
    // x += mixer_out; h = RMSNorm(x) * post_attention_norm: one kernel unless the trace needs x.
    e.profiler.mark(kNorms, stream);
    bool moe_input_q8_ready = false;  // h's Q8 form in ws.q8_moe_input
    if (tensors) {
      add_inplace(x, mixer_out, (size_t)T * n_embd, stream);
      trace_rows(e, tensors, fmt::format("attn_residual-{}", L), x, T, n_embd);
      rms_norm(x, d.post_norm, h, T, n_embd, c.rms_eps, stream);
    } else {
      // Decode and short passes: h's Q8 form for the MoE's matvec-q8 products from the same kernel.
      Q8Rows& q8 = e.ws.q8_moe_input;
      const bool q8_here = lp.moe_input_q8 && T <= q8.rows;
      add_rms_norm(x, mixer_out, d.post_norm, h, T, n_embd, c.rms_eps, stream, q8_here ? q8.values() : nullptr,
                   q8_here ? q8.scales() : nullptr);
      moe_input_q8_ready = q8_here;
    }
    // x += MoE(h); h = RMSNorm(x) * (next layer's attn_norm, or output_norm after the last).
    const float* next_norm = L + 1 < c.n_layer ? w.layers[L + 1].attn_norm : w.output_norm;
    // Decode and short passes: the combine also writes h's Q8 form when the next layer's mixer
    // reads it by matvec-q8.
    bool next_in_q8 = false;
    if (T <= kQ8PassTokens && L + 1 < c.n_layer && !tensors)
      for (Kernel k : plan.layers[L + 1].mixer_in) next_in_q8 = next_in_q8 || reads_q8_form(k);
    moe_block(e, L, lp, h, T, x, next_norm, h, trace, gpu_routed, moe_input_q8_ready,
              next_in_q8 ? e.products.q8_target() : Q8Target{});
    if (tensors) trace_rows(e, tensors, fmt::format("l_out-{}", L), x, T, n_embd);
  }

  // h holds the output norm (the last layer's combine).
  if (tensors) trace_rows(e, tensors, "result_norm", h, T, n_embd);
  e.profiler.mark(kLmHead, stream);
  if (!seq_begin.empty()) {
    // Each piece's last row of h gathered (into block_out, free after the last layer), then the LM
    // head on those rows as a pass of that many tokens would run it.
    float* last = e.ws.block_out.f();
    const int k = (int)sts.size();
    for (int i = 0; i < k; i++)
      RL_CUDA_CHECK(cudaMemcpyAsync(last + (size_t)i * n_embd, h + (size_t)(piece_end(seq_begin, i, T) - 1) * n_embd,
                                    n_embd * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    e.products.project(w.output, k == 1 ? plan.lm_head_last : e.plan(k).lm_head_all, last, k, logits);
    return;
  }
  lm_head(e, plan, h, T, all_logits, logits);
}

namespace {

// The synchronous path's pass over `sts`' rows (one session's tokens, or several sessions' pieces
// from seq_begin): each row's id and position (its session's position plus its index in its piece)
// staged and uploaded, the pass, its logits (`rows` of them) copied to the host, the sessions'
// positions moved on, the statistics after it. Returns the host copy (ws.logits_host), valid until
// the next pass.
const float* pass_rows(Engine& e, std::span<SessionState* const> sts, std::span<const int> seq_begin,
                       std::span<const int32_t> ids, bool all_logits, int rows, TraceSink* trace) {
  const Config& c = e.config();
  const int T = (int)ids.size();
  const cudaStream_t stream = e.streams.compute;
  Workspace& ws = e.ws;
  ws.staging.reset();
  e.residency.begin_pass();
  e.predicted_layer = -1;

  e.profiler.mark(kOther, stream);
  auto [ids_h, ids_staged] = ws.staging.stage<int32_t>(T);
  auto [pos_h, pos_staged] = ws.staging.stage<int32_t>(T);
  (void)ids_staged;
  (void)pos_staged;
  for (size_t i = 0; i < sts.size(); i++) {
    const int begin = seq_begin.empty() ? 0 : seq_begin[i];
    const int end = seq_begin.empty() ? T : piece_end(seq_begin, i, T);
    for (int t = begin; t < end; t++) {
      ids_h[t] = ids[t];
      pos_h[t] = sts[i]->position + (t - begin);
    }
  }
  // Into buffers of their own: the staging area is reused from the first layer on.
  int32_t* ids_d = ws.ids.get<int32_t>();
  int32_t* pos_d = ws.pos.get<int32_t>();
  RL_CUDA_CHECK(cudaMemcpyAsync(ids_d, ids_h, T * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  RL_CUDA_CHECK(cudaMemcpyAsync(pos_d, pos_h, T * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  ws.reserve_logits(rows, c.n_vocab);
  e.grouped_layers.clear();
  encode_pass(e, sts, ids_d, pos_d, T, all_logits, ws.logits.f(), trace, false, seq_begin);
  if (!e.grouped_layers.empty())
    RL_CUDA_CHECK(cudaMemcpyAsync(ws.grouped_distinct_host.get(), ws.grouped_distinct.get(),
                                  (size_t)c.n_layer * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  const size_t n_out = (size_t)rows * c.n_vocab;
  float* logits_host = ws.logits_host.get<float>();
  RL_CUDA_CHECK(cudaMemcpyAsync(logits_host, ws.logits.f(), n_out * sizeof(float), cudaMemcpyDeviceToHost, stream));
  e.profiler.mark(kOther, stream);
  RL_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < sts.size(); i++)
    sts[i]->position += seq_begin.empty() ? T : piece_end(seq_begin, i, T) - seq_begin[i];
  e.residency.end_pass();
  // The GPU-grouped layers' experts, each a hit (as a reservation would have counted them).
  uint64_t grouped_hits = 0;
  for (int L : e.grouped_layers) grouped_hits += (uint64_t)ws.grouped_distinct_host.get<int32_t>()[L];
  if (!e.grouped_layers.empty()) e.residency.cache().count_hits(grouped_hits);

  // Statistics that need the GPU's clock.
  RL_CUDA_CHECK(cudaStreamSynchronize(e.streams.copy));
  e.residency.record_copy_times(e.profiler);
  e.profiler.collect();
  return logits_host;
}

}  // namespace

void run_pass(Engine& e, SessionState& st, std::span<const int32_t> tokens, bool all_logits, float* logits_out,
              TraceSink* trace) {
  const int rows = all_logits ? (int)tokens.size() : 1;
  SessionState* const one[] = {&st};
  const float* logits = pass_rows(e, one, {}, tokens, all_logits, rows, trace);
  std::memcpy(logits_out, logits, (size_t)rows * e.config().n_vocab * sizeof(float));
}

void run_pass_batch(Engine& e, std::span<SessionState* const> sts, std::span<const std::span<const int32_t>> chunks,
                    std::span<float* const> out) {
  if (sts.size() != chunks.size() || out.size() != sts.size() || sts.empty())
    throw_error("run_pass_batch: a piece and an output for each session");
  std::vector<int> begin;
  std::vector<int32_t> ids;
  for (const auto& chunk : chunks) {
    if (chunk.empty()) throw_error("run_pass_batch: an empty piece");
    begin.push_back((int)ids.size());
    ids.insert(ids.end(), chunk.begin(), chunk.end());
  }
  if ((int)ids.size() > e.ws.max_tokens)
    throw_error("run_pass_batch: " + std::to_string(ids.size()) + " tokens, a pass takes " +
                std::to_string(e.ws.max_tokens));
  const size_t n_vocab = (size_t)e.config().n_vocab;
  const float* logits = pass_rows(e, sts, begin, ids, false, (int)sts.size(), nullptr);
  for (size_t i = 0; i < sts.size(); i++) std::memcpy(out[i], logits + i * n_vocab, n_vocab * sizeof(float));
}

}  // namespace rl::cuda
