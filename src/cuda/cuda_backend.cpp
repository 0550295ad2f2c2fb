// The CUDA backend: wires the parts of engine.h together once per loaded model and answers the
// Backend interface with them. docs/cuda.md describes how a token flows through them.
#include "cuda/cuda_backend.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "cuda/engine.h"
#include "cuda/kernels.h"

namespace rl::cuda {

namespace {

// Checks for a usable device and loads the quantisation tables into it, before any stream or
// allocation is made; the statistics start with the device's name.
EngineStats open_device() {
  if (!device_available()) fail("--backend cuda: no CUDA device is available");
  cudaDeviceProp prop{};
  RL_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  EngineStats s;
  s.gpu_name = prop.name;
  upload_quant_tables();
  return s;
}

}  // namespace

Engine::Engine(std::shared_ptr<const Model> m, const CudaOptions& options)
    : model(std::move(m)),
      opts(options),
      stats(open_device()),
      weights(upload_weights(*model)),
      forms(NumericForms::choose(model->config(), weights, opts)),
      ws(model->config(), forms, opts.prefill_chunk),
      residency(*model, weights, streams, opts.cache_mib, opts.cache_policy, ws.bytes(),
                opts.miss_reads == CudaOptions::MissReads::kHost),
      products(model->config(), ws, ws.q8_input, streams.compute, &stats.x32_products),
      side_products(model->config(), ws, ws.q8_side_input, streams.side, &stats.x32_products),
      predict_products(model->config(), ws, ws.q8_predict_input, streams.predict, &stats.x32_products) {
  profiler.on = opts.profile;
  // Independent decode launches of a layer run side by side, except under --profile, which times
  // the stages one after another.
  if (!opts.profile) products.set_side(&streams);
  products.allow_split_k();
  const ExpertCache& cache = residency.cache();
  stats.dense_bytes = weights.dense_bytes;
  stats.decode_bytes_per_token = weights.decode_bytes_per_token;
  stats.working_bytes = ws.bytes();
  stats.n_slots = cache.n_slots();
  stats.n_experts_total = config().n_layer * config().n_expert;
  stats.slot_bytes = cache.slot_bytes();
  stats.cache_bytes = (size_t)cache.n_slots() * cache.slot_bytes();
  stats.fully_resident = cache.holds_all();
  stats.pinned_copies = residency.pinned_copies();
  // --miss-reads host holds only where the host memory was had (and the cache is bounded); the
  // plan reads the mode from opts.
  if (!residency.host_misses()) opts.miss_reads = CudaOptions::MissReads::kCopy;
  stats.host_misses = residency.host_misses();
  // The prediction's count: the one asked for, else the path's for this cache (cuda_options.h).
  opts.prefetch_experts =
      prefetch_count(opts, residency.host_misses(), (double)stats.n_slots / std::max(stats.n_experts_total, 1));
  stats.prefetch_experts = opts.prefetch_experts;
  if (cache.holds_all() && opts.preload) stats.preload_seconds = residency.preload_all();
}

const PassPlan& Engine::plan(int T) {
  auto it = plans.find(T);
  if (it == plans.end())
    it = plans.emplace(T, make_pass_plan(config(), weights, forms, opts, residency.cache().holds_all(), T)).first;
  return it->second;
}

Engine::~Engine() {
  // Nothing may still run on the buffers the members free.
  cudaStreamSynchronize(streams.compute);
  cudaStreamSynchronize(streams.copy);
}

namespace {

class CudaBackendImpl final : public CudaBackend {
 public:
  CudaBackendImpl(std::shared_ptr<const Model> model, const CudaOptions& opts) : engine_(std::move(model), opts) {}

  std::string name() const override { return "cuda"; }
  std::unique_ptr<Session> new_session(int n_ctx) override { return new_cuda_session(engine_, n_ctx); }
  size_t session_bytes(int n_ctx) const override { return cuda::session_bytes(engine_.config(), engine_.forms, n_ctx); }
  // The fast tier with every expert resident: steps of up to batch_rows() sessions, each one
  // captured graph (the products and the MoE once over the rows, each row's DeltaNet and attention
  // on its session's state). Otherwise (batch_rows: the exact tier, a bounded cache, --profile),
  // and for a traced session, the sessions decode one after another, each on its own graph.
  void decode_batch_into(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                         std::span<std::vector<float>> out) override {
    check_decode_batch(sessions, tokens, out);
    for (size_t i = 0; i < sessions.size(); i++) check_session_of(engine_, *sessions[i], i);
    const size_t rows = (size_t)batch_rows(engine_);
    if (sessions.size() < 2 || rows < 2) return decode_one_after_another(sessions, tokens, out);
    std::vector<SessionState*> sts;
    for (size_t b = 0; b < sessions.size(); b += rows) {
      const size_t n = std::min(sessions.size() - b, rows);
      const auto some = sessions.subspan(b, n);
      const auto their = tokens.subspan(b, n);
      sts.clear();
      for (Session* s : some) sts.push_back(batch_row(*s));  // each checked above
      const auto into = out.subspan(b, n);
      const bool batched = n >= 2 && std::find(sts.begin(), sts.end(), nullptr) == sts.end() &&
                           decode_batch_graph(engine_, sts, their, into);
      if (!batched) decode_one_after_another(some, their, into);
    }
  }
  // Consecutive sessions' pieces as one pass (run_pass_batch: the products and the MoE over all
  // their tokens, each session's DeltaNet and attention on its own rows) while they fit a pass
  // (--prefill-chunk tokens; prefill_in_passes); a traced session's through its prefill.
  void prefill_batch_into(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> chunks,
                          std::span<std::vector<float>> out) override {
    check_prefill_batch(sessions, chunks, out);
    for (size_t i = 0; i < sessions.size(); i++) check_session_of(engine_, *sessions[i], i);
    const size_t n_vocab = (size_t)engine_.config().n_vocab;
    std::vector<SessionState*> rows(sessions.size());  // batch_row: its snapshots' rows frozen where the pass writes
    prefill_in_passes(
        sessions, chunks, out, (size_t)engine_.ws.max_tokens,
        [&](size_t i) { return (rows[i] = batch_row(*sessions[i])) != nullptr; },  // null: a traced session
        [&](size_t first, size_t end) {
          std::vector<float*> into;
          for (size_t i = first; i < end; i++) {
            out[i].resize(n_vocab);
            into.push_back(out[i].data());
          }
          run_pass_batch(engine_, std::span(rows).subspan(first, end - first), chunks.subspan(first, end - first),
                         into);
        });
  }
  EngineStats stats() const override {
    EngineStats s = engine_.stats;
    s.cache = engine_.residency.cache().stats();
    return s;
  }
  void reset_stats() override {
    engine_.residency.cache().reset_stats();
    EngineStats& s = engine_.stats;
    s.tokens_decoded = 0;
    s.gpu_routed_tokens = 0;
    s.gpu_routed_fallbacks = 0;
    s.misses_read_in_place = 0;
    s.gpu_grouped_layers = 0;
    s.x32_products = 0;
    s.batched_steps = s.batched_captures = 0;
    s.batched_graph_ms = s.batched_copy_ms = 0;
    engine_.profiler.reset();
  }
  std::string profile_report() const override { return engine_.profiler.report(); }
  void check_session_fits(int n_ctx) const override { cuda::check_session_fits(engine_, n_ctx); }
  std::string plan_report(int tokens) const override {
    if (tokens < 1 || tokens > engine_.ws.max_tokens)
      fail("plan: {} tokens is not a pass (1 to {}, the --prefill-chunk)", tokens, engine_.ws.max_tokens);
    const Engine& e = engine_;
    const ExpertCache& cache = e.residency.cache();
    const PassPlan plan =
        make_pass_plan(e.config(), e.weights, e.forms, e.opts, cache.holds_all(), tokens);
    return fmt::format("{}, {} SMs, compute capability {}; expert cache: {} of {} experts ({})\n",
                       e.stats.gpu_name, device_info().sm_count, device_info().cc_major, cache.n_slots(),
                       e.stats.n_experts_total, cache.holds_all() ? "all resident" : "bounded") +
           format_plan(plan, e.weights);
  }

 private:
  Engine engine_;
};

}  // namespace

std::unique_ptr<CudaBackend> make_cuda_backend(std::shared_ptr<const Model> model, const CudaOptions& options) {
  if (!model) fail("make_cuda_backend: no model");
  const int max_chunk = max_prefill_chunk(model->config().n_expert_used);
  if (options.prefill_chunk < 1 || options.prefill_chunk > max_chunk)  // before any upload
    fail("CUDA backend: a prefill chunk of {} tokens (--prefill-chunk: 1 to {}{})", options.prefill_chunk, max_chunk,
         max_chunk < kMaxPrefillChunk ? fmt::format(" for a model of {} experts a token", model->config().n_expert_used)
                                      : std::string());
  return std::make_unique<CudaBackendImpl>(std::move(model), options);
}

}  // namespace rl::cuda
