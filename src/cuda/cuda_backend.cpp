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
      ws(model->config(), forms),
      residency(*model, weights, streams, opts.cache_mib, opts.cache_policy, ws.bytes()),
      products(model->config(), ws, streams.compute, &stats.x32_products),
      side_products(model->config(), ws, streams.side, &stats.x32_products) {
  profiler.on = opts.profile;
  // Independent decode launches of a layer run side by side, except under --profile, which times
  // the stages one after another.
  if (!opts.profile) products.set_side(streams.side, streams.side_fork, streams.side_join);
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
  // The fast tier decodes the sequences in one pass (run_batch_pass, in batches of up to
  // kMaxChunk); the exact tier, a profile or a traced session one after another (each on its own
  // graph), so that every sequence's tokens are those it gets alone.
  std::vector<std::vector<float>> decode_batch(std::span<Session* const> sessions,
                                               std::span<const int32_t> tokens) override {
    check_decode_batch(sessions, tokens);
    std::vector<SessionState*> sts;
    bool traced = false;
    for (size_t i = 0; i < sessions.size(); i++) sts.push_back(&session_state(engine_, *sessions[i], i, &traced));
    if (sessions.size() < 2 || !engine_.forms.fast || engine_.opts.profile || traced)
      return decode_one_after_another(sessions, tokens);
    const size_t n_vocab = (size_t)engine_.config().n_vocab;
    std::vector<std::vector<float>> out;
    std::vector<float> flat;
    for (size_t b = 0; b < sts.size(); b += kMaxChunk) {
      const size_t n = std::min(sts.size() - b, (size_t)kMaxChunk);
      if (n == 1) {  // a last sequence alone
        out.push_back(sessions[b]->decode(tokens[b]));
        continue;
      }
      flat.resize(n * n_vocab);
      run_batch_pass(engine_, std::span(sts).subspan(b, n), tokens.subspan(b, n), flat.data());
      engine_.stats.tokens_decoded += n;
      for (size_t i = 0; i < n; i++) out.emplace_back(flat.begin() + i * n_vocab, flat.begin() + (i + 1) * n_vocab);
    }
    return out;
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
    s.gpu_grouped_layers = 0;
    s.x32_products = 0;
    engine_.profiler.reset();
  }
  std::string profile_report() const override { return engine_.profiler.report(); }
  void check_session_fits(int n_ctx) const override { cuda::check_session_fits(engine_, n_ctx); }
  std::string plan_report(int tokens) const override {
    if (tokens < 1 || tokens > kMaxChunk) fail("plan: {} tokens is not a pass (1 to {})", tokens, kMaxChunk);
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
  return std::make_unique<CudaBackendImpl>(std::move(model), options);
}

}  // namespace rl::cuda
