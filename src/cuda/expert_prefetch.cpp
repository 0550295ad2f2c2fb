// Prediction and prefetch of the next layer's experts on a bounded cache (--prefetch; docs/cuda.md
// "Prediction and prefetch"). A host-routed decode token waits, layer after layer, for the copies
// of the experts its router selected. The residual stream changes little from one layer to the
// next, so layer L+1's router applied to layer L's hidden state selects mostly the experts layer
// L+1 will select: the GPU computes that prediction on buffers of its own (the real routing is
// untouched, so the exact tier stays bit-identical to the oracle), the host reads it at the next
// point where it waits for the GPU anyway, and the predicted misses are reserved and copied on the
// copy stream while layer L's experts and layer L+1's mixer run. Layer L+1 then routes as always;
// what it selects that was prefetched it finds resident (its kernels wait for the prefetch's
// copies), what was mispredicted is a copy for nothing, its slot the next one taken. With
// --miss-reads host the GPU-routed token does the same inside its graph: layer L+1's predicted
// misses are copied from their host copies into staging slots on a branch of their own while
// layer L's experts and layer L+1's mixer run, and layer L+1's routing reads those it selected
// from there (stage_next_layer_prediction).
#include <algorithm>
#include <span>

#include "cuda/engine.h"
#include "cuda/kernels.h"

namespace rl::cuda {

bool predicts_next_layer(const Engine& e, int L, int T, Routing routing, CudaOptions::Prefetch when) {
  // Only where the host reserves one token's experts with the copies overlapped, a next layer
  // exists and a miss is possible.
  return e.opts.prefetch == when && T == 1 && routing == Routing::kHostRouted && e.opts.overlap_copies &&
         L + 1 < e.config().n_layer && !e.residency.all_resident();
}

void predict_next_layer(Engine& e, int L) {
  const Config& c = e.config();
  const cudaStream_t stream = e.streams.compute;
  Workspace& ws = e.ws;
  const LayerDev& next = e.weights.layers[L + 1];
  const LayerPlan& next_plan = e.plan(1).layers[L + 1];
  e.profiler.mark(kPrediction, stream);
  // The hidden state as layer L+1's MoE would see it, but for the mixer L+1 has not yet run.
  rms_norm(ws.x.f(), next.post_norm, ws.predict_input.f(), 1, c.n_embd, c.rms_eps, stream);
  e.products.project(next.moe.router, next_plan.router, ws.predict_input.f(), 1, ws.predict_logits.f());
  route_tokens(ws.predict_logits.f(), 1, c.n_expert, c.n_expert_used, c.expert_weights_scale,
               ws.predict_ids.get<int32_t>(), ws.predict_weights.f(), stream,
               e.forms.fast_routing ? Sums::kFast : Sums::kExact);
  RL_CUDA_CHECK(cudaMemcpyAsync(ws.predict_ids_host.get(), ws.predict_ids.get(), c.n_expert_used * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, stream));
  RL_CUDA_CHECK(cudaEventRecord(e.streams.prediction_ready, stream));
  e.predicted_layer = L + 1;
}

void stage_next_layer_prediction(Engine& e, int L, const float* x, int n) {
  const Config& c = e.config();
  Workspace& ws = e.ws;
  const LayerDev& next = e.weights.layers[L + 1];
  const LayerPlan& next_plan = e.plan(1).layers[L + 1];
  ExpertResidency& r = e.residency;
  const cudaStream_t predict = e.streams.predict;
  // The input on the compute stream (the combine rewrites x after this layer's experts); the
  // branch's previous router read predict_input before it named layer L's predictions, which this
  // layer's routing waited for, so predict_input is free.
  rms_norm(x, next.post_norm, ws.predict_input.f(), 1, c.n_embd, c.rms_eps, e.streams.compute);
  e.streams.fork_predict();
  e.predict_products.project(next.moe.router, next_plan.router, ws.predict_input.f(), 1, ws.predict_logits.f());
  route_tokens(ws.predict_logits.f(), 1, c.n_expert, c.n_expert_used, c.expert_weights_scale,
               ws.predict_ids.get<int32_t>(), ws.predict_weights.f(), predict,
               e.forms.fast_routing ? Sums::kFast : Sums::kExact);
  name_predicted_misses(ws.predict_ids.get<int32_t>(), n, r.residency_row(L + 1), r.predicted_staged(L + 1), predict);
  e.streams.mark_predicted(L + 1);  // layer L+1's routing waits for the names only
  stage_predicted(r.predicted_staged(L + 1), n, r.miss_source(L + 1), next.moe.expert_bytes, r.miss_stride(),
                  r.predicted_staging(L + 1), predict);
  e.streams.staged_predicted(L + 1);  // its expert kernels for the copies
}

void prefetch_predicted(Engine& e, int L) {
  if (e.predicted_layer != L) return;
  e.predicted_layer = -1;
  RL_CUDA_CHECK(cudaEventSynchronize(e.streams.prediction_ready));
  const int32_t* ids = e.ws.predict_ids_host.get<int32_t>();
  e.residency.prefetch(L, std::span<const int>(ids, std::min(e.config().n_expert_used, e.opts.prefetch_experts)));
}

}  // namespace rl::cuda
