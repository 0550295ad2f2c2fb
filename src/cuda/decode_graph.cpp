// The GPU-routed decode token (DESIGN.md §5): the whole token (every layer, the routing on the
// GPU with slots from the residency table, the experts, the LM head) is one CUDA graph, captured
// once per session and replayed with one synchronisation. The graph starts by backing up the
// DeltaNet conv/SSM states; when a layer selected a non-resident expert the host restores them
// and the token is recomputed on the synchronous path (the KV rows written at this position are
// overwritten by the recomputation). With --miss-reads host the kernels read such an expert in
// place from host memory instead, so the token stands (no backups), and some of its misses are
// copied into the cache after it (ExpertResidency::admit_misses). --speculation decides when the
// graph is tried; under --profile the same work is launched kernel by kernel with stage marks.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "cuda/engine.h"
#include "cuda/kernels.h"

namespace rl::cuda {

namespace {

// Backups of the DeltaNet conv and SSM states, allocated on first use (never while a graph is
// being captured: capture_token_graph allocates them first).
void allocate_state_backups(const Engine& e, SessionState& st) {
  const int n_layer = e.config().n_layer;
  if (st.conv_backup.empty()) {
    st.conv_backup.resize(n_layer);
    st.ssm_backup.resize(n_layer);
    for (int L = 0; L < n_layer; L++) {
      if (st.conv[L].bytes()) st.conv_backup[L].allocate(st.conv[L].bytes());
      if (st.ssm[L].bytes()) st.ssm_backup[L].allocate(st.ssm[L].bytes());
    }
  }
}

// The recurrent states to their backups (to_backup) or back from them, every layer, on the compute
// stream.
void copy_recurrent_states(Engine& e, SessionState& st, bool to_backup) {
  const int n_layer = e.config().n_layer;
  allocate_state_backups(e, st);
  auto copy = [&](DeviceBuffer& live, DeviceBuffer& backup) {
    if (!live.bytes()) return;
    void* dst = to_backup ? backup.get() : live.get();
    const void* src = to_backup ? live.get() : backup.get();
    RL_CUDA_CHECK(cudaMemcpyAsync(dst, src, live.bytes(), cudaMemcpyDeviceToDevice, e.streams.compute));
  };
  for (int L = 0; L < n_layer; L++) {
    copy(st.conv[L], st.conv_backup[L]);
    copy(st.ssm[L], st.ssm_backup[L]);
  }
}

// The GPU-routed token's inputs (token, position), read by the graph from device memory.
void upload_token_position(Engine& e, int32_t token, int position) {
  int32_t* host = e.ws.token_position_host.get<int32_t>();
  host[0] = token;
  host[1] = position;
  RL_CUDA_CHECK(cudaMemcpyAsync(e.ws.token_position.get(), host, 2 * sizeof(int32_t), cudaMemcpyHostToDevice,
                                e.streams.compute));
}

// Whether a GPU-routed token backs up the recurrent states first: only where it can miss. Under
// --speculation resident the graph runs only while the cache holds every expert, so no selection
// misses and the token is never undone.
// With --miss-reads host no token is undone (a miss is read in place).
bool token_backs_up(const Engine& e) {
  return !e.residency.host_misses() && e.opts.speculation != CudaOptions::Speculation::kFullyResident;
}

// What enqueue() puts on `stream`, captured and instantiated. A capture that throws is ended and
// discarded (its error cleared) and the exception passed on.
template <class F>
cudaGraphExec_t capture_graph(cudaStream_t stream, F&& enqueue) {
  RL_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream, &partial);
    if (partial) cudaGraphDestroy(partial);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  RL_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  RL_CUDA_CHECK(err);
  return exec;
}

// Captures the GPU-routed token once per session: the state backups (token_backs_up), then the
// pass. Nothing in it depends on the host between replays except token_position and the residency
// table, both read from device memory at replay time.
void capture_token_graph(Engine& e, SessionState& st) {
  if (token_backs_up(e)) allocate_state_backups(e, st);
  st.token_graph = capture_graph(e.streams.compute, [&] {
    if (token_backs_up(e)) copy_recurrent_states(e, st, true);
    const int32_t* tp = e.ws.token_position.get<int32_t>();
    SessionState* const one[] = {&st};
    encode_pass(e, one, tp, tp + 1, 1, false, e.ws.routed_logits.f(), nullptr, true);
  });
}

}  // namespace

bool decode_gpu_routed(Engine& e, SessionState& st, int32_t token, float* logits_out, TraceSink* trace) {
  using S = CudaOptions::Speculation;
  if (!e.residency.host_misses()) {  // with --miss-reads host every token takes the graph
    switch (e.opts.speculation) {
      case S::kOff: return false;
      case S::kFullyResident: if (!e.residency.cache().holds_all()) return false; break;
      case S::kWarmCache: if (e.residency.last_pass_loaded()) return false; break;
      case S::kAlways: break;
    }
  }
  if (e.gpu_routed_broken) return false;
  const Config& c = e.config();
  const cudaStream_t stream = e.streams.compute;
  Workspace& ws = e.ws;
  Profiler& profiler = e.profiler;
  const int K = c.n_expert_used, E = c.n_expert, n_layer = c.n_layer;
  if (profiler.on) {
    // --profile: the same work launched one by one with stage marks, no graph. A spin
    // kernel holds the GPU while the host enqueues the whole token, so the GPU then runs it back
    // to back and the stage times are kernel times, not launch gaps (the token itself is slower).
    upload_token_position(e, token, st.position);
    if (token_backs_up(e)) allocate_state_backups(e, st);  // before the spin: an allocation would stall the queued work
    // A token that threw may have left its prediction branch running (a graph's is always joined).
    RL_CUDA_CHECK(cudaStreamSynchronize(e.streams.predict));
    gpu_spin(20'000'000, stream);
    profiler.mark(kBackups, stream);
    if (token_backs_up(e)) copy_recurrent_states(e, st, true);
    profiler.mark(kOther, stream);
    const int32_t* tp = ws.token_position.get<int32_t>();
    SessionState* const one[] = {&st};
    encode_pass(e, one, tp, tp + 1, 1, false, ws.routed_logits.f(), nullptr, true);
    profiler.mark(kOther, stream);
  } else if (!st.token_graph) {
    try {
      capture_token_graph(e, st);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "cuda: the GPU-routed decode graph could not be captured (%s); decoding on the "
                   "synchronous path\n", ex.what());
      e.gpu_routed_broken = true;
      return false;
    }
  }
  if (!profiler.on) {
    upload_token_position(e, token, st.position);
    // A pass that threw may have left prefetch copies in flight (a finished pass waits for its
    // copies): the graph reads the slots only after them (run_pass's begin_pass does the same).
    RL_CUDA_CHECK(cudaStreamWaitEvent(stream, e.streams.prefetch_done, 0));
    RL_CUDA_CHECK(cudaGraphLaunch(st.token_graph, stream));
  }
  const size_t io_count = (size_t)n_layer * K + n_layer;
  float* logits_host = ws.logits_host.get<float>();
  int32_t* io_host = ws.routed_io_host.get<int32_t>();
  float* router_host = ws.routed_router_host.get<float>();
  RL_CUDA_CHECK(cudaMemcpyAsync(logits_host, ws.routed_logits.f(), (size_t)c.n_vocab * sizeof(float),
                                cudaMemcpyDeviceToHost, stream));
  RL_CUDA_CHECK(cudaMemcpyAsync(io_host, ws.routed_io.get(), io_count * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                stream));
  if (trace)
    RL_CUDA_CHECK(cudaMemcpyAsync(router_host, ws.routed_router.get(), (size_t)n_layer * E * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream));
  RL_CUDA_CHECK(cudaStreamSynchronize(stream));
  profiler.collect();
  // The last token's admissions (below) were copied before this token's graph read the slots.
  if (e.residency.host_misses()) e.residency.record_copy_times(profiler);

  int misses = 0;
  for (int L = 0; L < n_layer; L++) misses += io_host[(size_t)n_layer * K + L];
  const bool read_in_place = misses > 0 && e.residency.host_misses();
  if (misses > 0 && !read_in_place) {
    if (!token_backs_up(e))
      throw_error("cuda: a GPU-routed token missed " + std::to_string(misses) +
                  " experts while the cache held every expert (residency table out of step with the cache)");
    // Undo the token: the recurrent states come back from the backups; the KV rows written at this
    // position are overwritten by the recomputation.
    copy_recurrent_states(e, st, false);
    e.stats.gpu_routed_fallbacks++;
    return false;
  }
  std::memcpy(logits_out, logits_host, (size_t)c.n_vocab * sizeof(float));
  st.position += 1;
  if (e.residency.host_misses()) e.admission.observe(n_layer * K - misses, n_layer * K);
  for (int L = 0; L < n_layer; L++) {
    const int32_t* ids = io_host + (size_t)L * K;
    e.residency.cache().touch(L, std::span<const int>(ids, (size_t)K));
    if (trace) {
      trace->tensor(fmt::format("ffn_moe_logits-{}", L), 1, E, router_host + (size_t)L * E);
      trace->ids(fmt::format("ffn_moe_topk-{}", L), 1, K, ids);
    }
  }
  if (read_in_place) {
    // Some of the misses into the cache (the next token's graph waits for their copies; their
    // times are collected after it), the rest counted as bypassed. The token stands whatever
    // happens to them: a failed copy leaves its experts in host memory, where they were read.
    e.stats.misses_read_in_place += (uint64_t)misses;
    try {
      e.stats.miss_admit_last = e.admission.limit();
      e.residency.admit_misses(std::span<const int32_t>(io_host, (size_t)n_layer * K), K, e.stats.miss_admit_last);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "cuda: copying a decode token's misses into the expert cache failed (%s); they "
                   "stay in host memory\n", ex.what());
    }
  }
  e.stats.gpu_routed_tokens++;
  return true;
}

// ---- the batched decode step ------------------------------------------------------------------

namespace {

// v into a new device buffer of its size (a capture's tables: before the capture begins).
template <class T>
void upload(DeviceBuffer& dst, const std::vector<T>& v) {
  dst.allocate(v.size() * sizeof(T));
  RL_CUDA_CHECK(cudaMemcpy(dst.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
}

}  // namespace

int batch_rows(Engine& e) {
  // The batched step's DeltaNet and attention kernels are the fast tier's.
  if (!e.forms.fast_deltanet || !e.forms.fast_attention || e.profiler.on || e.batch_graph_broken) return 0;
  if (e.opts.speculation == CudaOptions::Speculation::kOff || !e.residency.all_resident()) return 0;
  const int rows = std::min(kMaxBatchRows, e.ws.max_tokens);
  if (rows < 2) return 0;
  // Every layer groups its experts on the GPU, at every batch size (the plans differ only in their
  // products' kernels).
  for (const LayerPlan& l : e.plan(2).layers)
    if (l.routing != Routing::kGpuGrouped) return 0;
  return rows;
}

namespace {

// The most decode splits any of these sessions' attention takes (the batched attention's grid;
// 0 for a model without attention layers).
int max_splits_of(const Engine& e, std::span<SessionState* const> sts) {
  int m = 0;
  for (int L = 0; L < e.config().n_layer; L++)
    for (const SessionState* st : sts)
      if (st->k_cache[L].bytes()) m = std::max(m, st->attn_splits_f.max_splits);
  return m;
}

// Writes g's tables for these sessions: `fresh`, synchronously into new buffers (before a
// capture); else on the compute stream into g's buffers, after the replays enqueued before it (the
// host vectors may go at once: a copy from pageable memory returns once it is staged).
void write_tables(Engine& e, BatchGraph& g, std::span<SessionState* const> sts, bool fresh) {
  const int B = (int)sts.size(), n_layer = e.config().n_layer;
  std::vector<float*> states((size_t)n_layer * 2 * B, nullptr);
  std::vector<AttentionRow> attention((size_t)n_layer * B);
  for (int L = 0; L < n_layer; L++)
    for (int t = 0; t < B; t++) {
      states[((size_t)L * 2 + 0) * B + t] = sts[t]->conv[L].f();
      states[((size_t)L * 2 + 1) * B + t] = sts[t]->ssm[L].f();
      if (sts[t]->k_cache[L].bytes()) attention[(size_t)L * B + t] = {sts[t]->kv(L), sts[t]->attn_splits_f};
    }
  if (fresh) {
    upload(g.state_table, states);
    upload(g.attention_table, attention);
  } else {
    const cudaStream_t s = e.streams.compute;
    RL_CUDA_CHECK(cudaMemcpyAsync(g.state_table.get(), states.data(), states.size() * sizeof(float*),
                                  cudaMemcpyHostToDevice, s));
    RL_CUDA_CHECK(cudaMemcpyAsync(g.attention_table.get(), attention.data(), attention.size() * sizeof(AttentionRow),
                                  cudaMemcpyHostToDevice, s));
  }
  g.tables_of.assign(sts.begin(), sts.end());
}

// Captures the batched step of B rows: the pass over them, every layer grouped on the GPU, the
// ids and positions read from batch_io, each row's states from the graph's tables (written for
// these sessions), the logits into batch_logits. Nothing in it waits for the host.
std::unique_ptr<BatchGraph> capture_batch_graph(Engine& e, std::span<SessionState* const> sts, int max_splits) {
  const int B = (int)sts.size();
  auto g = std::make_unique<BatchGraph>();
  g->rows = B;
  g->max_splits = max_splits;
  write_tables(e, *g, sts, true);
  // The tables are the engine's only while this capture runs.
  struct Tables {
    Engine& e;
    ~Tables() { e.batch_states = nullptr, e.batch_attention = nullptr; }
  } tables{e};
  e.batch_states = g->state_table.get<float*>();
  e.batch_attention = g->attention_table.get<AttentionRow>();
  e.batch_max_splits = max_splits;
  const int32_t* io = e.ws.batch_io.get<int32_t>();
  // The host's counters of the pass's products move at capture only, not at replay: kept as they
  // were, so they count the passes that run without a graph.
  const uint64_t grouped = e.stats.gpu_grouped_layers, x32 = e.stats.x32_products;
  try {
    g->exec = capture_graph(e.streams.compute, [&] {
      e.grouped_layers.clear();
      encode_pass(e, sts, io, io + kMaxBatchRows, B, true, e.ws.batch_logits.f(), nullptr, false);
      if ((int)e.grouped_layers.size() != e.config().n_layer)
        throw_error("the batch's pass grouped " + std::to_string(e.grouped_layers.size()) + " of " +
                    std::to_string(e.config().n_layer) + " layers on the GPU");
    });
  } catch (...) {
    // A pass that cannot be captured will not be at the next step either (an allocation above
    // that failed might succeed later, so it does not count).
    e.batch_graph_broken = true;
    e.stats.gpu_grouped_layers = grouped, e.stats.x32_products = x32;
    throw;
  }
  e.stats.gpu_grouped_layers = grouped, e.stats.x32_products = x32;
  e.stats.batched_captures++;
  return g;
}

// The graph of this many sessions (and decode splits), captured on first use (the least recently
// used one dropped beyond kMaxBatchGraphs), its tables written for these sessions in this order.
BatchGraph& batch_graph_of(Engine& e, std::span<SessionState* const> sts) {
  static_assert(kMaxBatchGraphs >= kMaxBatchRows - 1, "a graph for every batch size a step takes");
  const int B = (int)sts.size(), max_splits = max_splits_of(e, sts);
  for (auto& g : e.batch_graphs)
    if (g->rows == B && g->max_splits == max_splits) {
      if (!std::equal(g->tables_of.begin(), g->tables_of.end(), sts.begin(), sts.end())) write_tables(e, *g, sts, false);
      return *g;
    }
  auto g = capture_batch_graph(e, sts, max_splits);
  if ((int)e.batch_graphs.size() >= kMaxBatchGraphs) {
    auto oldest = std::min_element(e.batch_graphs.begin(), e.batch_graphs.end(),
                                   [](const auto& a, const auto& b) { return a->last_use < b->last_use; });
    e.batch_graphs.erase(oldest);
  }
  e.batch_graphs.push_back(std::move(g));
  return *e.batch_graphs.back();
}

}  // namespace

bool decode_batch_graph(Engine& e, std::span<SessionState* const> sts, std::span<const int32_t> tokens,
                        std::span<std::vector<float>> logits_out) {
  const Config& c = e.config();
  const cudaStream_t stream = e.streams.compute;
  Workspace& ws = e.ws;
  const int B = (int)sts.size();
  if (B < 2 || B > kMaxBatchRows || tokens.size() != sts.size() || logits_out.size() != sts.size())
    throw_error("decode_batch_graph: " + std::to_string(B) + " sessions and " + std::to_string(tokens.size()) +
                " tokens (2 to " + std::to_string(kMaxBatchRows) + " of each, and an output each)");
  BatchGraph* g = nullptr;
  try {
    g = &batch_graph_of(e, sts);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "cuda: the batched decode graph could not be captured (%s); %s\n", ex.what(),
                 e.batch_graph_broken ? "batches decode one after another from now on"
                                      : "this step's sessions decode one after another");
    return false;
  }
  g->last_use = ++e.batch_steps;
  int32_t* io = ws.batch_io_host.get<int32_t>();
  for (int t = 0; t < B; t++) {
    io[t] = tokens[t];
    io[kMaxBatchRows + t] = sts[t]->position;
  }
  RL_CUDA_CHECK(cudaMemcpyAsync(ws.batch_io.get(), io, 2 * kMaxBatchRows * sizeof(int32_t), cudaMemcpyHostToDevice,
                                stream));
  // A pass that threw may have left prefetch copies in flight: the graph reads the slots after them.
  RL_CUDA_CHECK(cudaStreamWaitEvent(stream, e.streams.prefetch_done, 0));
  RL_CUDA_CHECK(cudaEventRecord(e.streams.step_begin, stream));
  RL_CUDA_CHECK(cudaGraphLaunch(g->exec, stream));
  RL_CUDA_CHECK(cudaEventRecord(e.streams.step_graph_end, stream));
  const size_t n_out = (size_t)B * c.n_vocab;
  RL_CUDA_CHECK(cudaMemcpyAsync(ws.batch_logits_host.get(), ws.batch_logits.get(), n_out * sizeof(float),
                                cudaMemcpyDeviceToHost, stream));
  RL_CUDA_CHECK(cudaMemcpyAsync(ws.grouped_distinct_host.get(), ws.grouped_distinct.get(),
                                (size_t)c.n_layer * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  RL_CUDA_CHECK(cudaEventRecord(e.streams.step_end, stream));
  RL_CUDA_CHECK(cudaStreamSynchronize(stream));
  float graph_ms = 0, copy_ms = 0;
  RL_CUDA_CHECK(cudaEventElapsedTime(&graph_ms, e.streams.step_begin, e.streams.step_graph_end));
  RL_CUDA_CHECK(cudaEventElapsedTime(&copy_ms, e.streams.step_graph_end, e.streams.step_end));
  e.stats.batched_graph_ms += graph_ms;
  e.stats.batched_copy_ms += copy_ms;
  for (int t = 0; t < B; t++) {
    logits_out[t].resize(c.n_vocab);
    std::memcpy(logits_out[t].data(), ws.batch_logits_host.get<float>() + (size_t)t * c.n_vocab,
                (size_t)c.n_vocab * sizeof(float));
  }
  for (SessionState* st : sts) st->position++;
  // Each layer's distinct experts a hit (as a grouped prefill layer counts them).
  uint64_t hits = 0;
  for (int L = 0; L < c.n_layer; L++) hits += (uint64_t)ws.grouped_distinct_host.get<int32_t>()[L];
  e.residency.cache().count_hits(hits);
  e.stats.batched_steps++;
  return true;
}

void forget_batch_graphs(Engine& e, const SessionState& st) {
  for (auto& g : e.batch_graphs)
    if (std::find(g->tables_of.begin(), g->tables_of.end(), &st) != g->tables_of.end()) g->tables_of.clear();
}

}  // namespace rl::cuda
