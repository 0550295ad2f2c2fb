// The MoE block of a layer: router, shared expert, routed experts, combine (with the next norm).
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <span>
#include <vector>

#include "cuda/engine.h"
#include "cuda/kernels.h"

namespace rl::cuda {

namespace {

// Expert kernels for one batch of experts (all reserved and resident): group g = experts[g] over
// rows [group_offset[g], +group_rows[g]) of the gathered activations (prefill) or, for one token,
// the shared input h (decode).
void run_expert_batch(Engine& e, int L, const LayerPlan& plan, std::span<const int> experts,
                      std::span<const int> group_rows, std::span<const int> group_offset, int T, int row0 = 0) {
  const MoeDev& moe = e.weights.layers[L].moe;
  const cudaStream_t stream = e.streams.compute;
  const int n = (int)experts.size();
  auto [ptr_h, ptr_d] = e.ws.staging.stage<const uint8_t*>(n);
  for (int g = 0; g < n; g++)
    ptr_h[g] = e.residency.slot_of(L, experts[g]);
  RL_CUDA_CHECK(cudaMemcpyAsync(ptr_d, ptr_h, n * sizeof(void*), cudaMemcpyHostToDevice, stream));
  if (T == 1) {
    // Decode: group g's output row is row0 + g.
    e.products.expert_matvecs(moe, ptr_d, e.ws.h.f(), n, (size_t)row0);
  } else {
    auto [off_h, off_d] = e.ws.staging.stage<int>(2 * n);
    int max_cnt = 0;
    for (int g = 0; g < n; g++) {
      off_h[g] = group_offset[g];
      off_h[n + g] = group_rows[g];
      max_cnt = std::max(max_cnt, group_rows[g]);
    }
    RL_CUDA_CHECK(cudaMemcpyAsync(off_d, off_h, 2 * n * sizeof(int), cudaMemcpyHostToDevice, stream));
    // This batch's rows of the gathered order (contiguous: groups are in gathered order).
    size_t rows = 0;
    for (int g = 0; g < n; g++) rows += group_rows[g];
    e.products.expert_products(moe, plan.experts, plan.expert_down, ptr_d, off_d, n, max_cnt, (size_t)group_offset[0],
                               rows);
  }
  // These slots may be overwritten once the kernels above have read them.
  RL_CUDA_CHECK(cudaEventRecord(e.streams.slots_free, stream));
}

// moe_layer's routed experts when every expert is resident: the selections (route_ids) are
// grouped by expert on the GPU, with the slots from the residency table, so the layer never waits
// for the host. The same products on the same rows as the host's grouping (groups of at most
// kExpertGroupRows rows instead of one group per expert; each row's products do not depend on
// the others), so the same results bit for bit (test).
void moe_experts_grouped(Engine& e, int L, const LayerPlan& plan, const float* h2, int T, float* x,
                         const float* next_norm, float* h_out) {
  const Config& c = e.config();
  const cudaStream_t stream = e.streams.compute;
  Workspace& ws = e.ws;
  const int E = c.n_expert, K = c.n_expert_used, n = T * K, n_groups = expert_group_bound(n, E);
  e.profiler.mark(kExperts, stream);
  int32_t* gather = ws.grouped_gather.get<int32_t>();
  int32_t* assign = ws.grouped_assign.get<int32_t>();
  const uint8_t** ptrs = ws.grouped_slot_ptrs.get<const uint8_t*>();
  int32_t* groups = ws.grouped_groups.get<int32_t>();  // [n_groups] first rows, then [n_groups] row counts
  group_by_expert(ws.route_ids.get<int32_t>(), n, K, E, e.residency.residency_row(L), gather, assign, ptrs, groups,
                  groups + n_groups, n_groups, ws.grouped_distinct.get<int32_t>() + L, stream);
  const MoeDev& moe = e.weights.layers[L].moe;
  e.products.gather_expert_inputs(plan.experts, h2, gather, n);
  e.products.expert_products(moe, plan.experts, plan.expert_down, ptrs, groups, n_groups, kExpertGroupRows, 0,
                             (size_t)n);
  moe_combine_norm(x, ws.expert_out.f(), assign, ws.route_weights.f(), K, ws.shared_out.f(), ws.shared_scalar.f(), T,
                   c.n_embd, next_norm, c.rms_eps, h_out, stream);
  e.grouped_layers.push_back(L);
  e.stats.gpu_grouped_layers++;
}

void moe_layer(Engine& e, int L, const LayerPlan& plan, const float* h2, int T, float* x, TraceSink* trace,
               const float* next_norm, float* h_out) {
  const Config& c = e.config();
  const LayerDev& d = e.weights.layers[L];
  const cudaStream_t stream = e.streams.compute;
  Workspace& ws = e.ws;
  ExpertResidency& residency = e.residency;
  const int E = c.n_expert, K = c.n_expert_used, n_embd = c.n_embd;

  // Routing on the GPU, the selections to the host (which reserves the experts); the shared expert
  // runs on the GPU meanwhile. With every expert resident a chunk's selections are grouped on the
  // GPU instead (moe_experts_grouped) and the layer does not wait for the host.
  e.profiler.mark(kRouter, stream);
  e.products.project_group({{&d.moe.router, plan.router, h2, ws.router_logits.f()},
                            {&d.moe.shared_gate_inp, plan.shared_gate_inp, h2, ws.shared_scalar.f()}},
                           T);
  route_tokens(ws.router_logits.f(), T, E, K, c.expert_weights_scale, ws.route_ids.get<int32_t>(), ws.route_weights.f(),
               stream);
  // The selections to the host: to reserve the experts, or (grouped on the GPU) for the trace only.
  // Prefill with every expert resident (when the plan allows it: GPU grouping, not switched off).
  const bool grouped = plan.routing == Routing::kGpuGrouped && residency.all_resident();
  if (!grouped || trace) {
    RL_CUDA_CHECK(cudaMemcpyAsync(ws.route_ids_host.get<int32_t>(), ws.route_ids.get(), (size_t)T * K * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream));
    if (trace)
      RL_CUDA_CHECK(cudaMemcpyAsync(ws.router_host.get<float>(), ws.router_logits.f(), (size_t)T * E * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream));
    RL_CUDA_CHECK(cudaEventRecord(e.streams.router_ready, stream));
  }
  e.profiler.mark(kSharedExpert, stream);
  // Prefill: h2 in the X24 form once, for the shared pair and (gathered) the routed gate and up.
  const bool h2_x24 = plan.moe_input_x24;
  if (h2_x24)
    quantize_x24(h2, T, n_embd, ws.moe_input_x24.q.get<uint8_t>(), ws.moe_input_x24.scale.get<double>(), stream);
  e.products.project_gate_up(d.moe.gate_sh, d.moe.up_sh, plan.shared, h2, T, ws.shared_act.f(), ws.shared_up.f(),
                             h2_x24);
  e.products.project(d.moe.down_sh, plan.shared_down, ws.shared_act.f(), T, ws.shared_out.f());
  const int32_t* ids_h = ws.route_ids_host.get<int32_t>();
  const float* w_d = ws.route_weights.f();
  if (trace) {
    RL_CUDA_CHECK(cudaEventSynchronize(e.streams.router_ready));
    trace->tensor(fmt::format("ffn_moe_logits-{}", L), T, E, ws.router_host.get<float>());
    trace->ids(fmt::format("ffn_moe_topk-{}", L), T, K, ids_h);
  }
  if (grouped) {
    moe_experts_grouped(e, L, plan, h2, T, x, next_norm, h_out);
    return;
  }
  if (!trace) RL_CUDA_CHECK(cudaEventSynchronize(e.streams.router_ready));
  ws.staging.reset();
  e.profiler.mark(kExperts, stream);

  // The distinct experts: the selections in order (decode), or ascending with the (token,
  // selection) pairs i = t*K + k of each, tokens in order (prefill: each expert's weights are read
  // once per chunk). Prefill groups by a counting sort: group g's pairs are
  // pair_list[group_start[g] .. group_start[g + 1]).
  std::vector<int> experts, group_start, pair_list;
  if (T == 1) {
    experts.assign(ids_h, ids_h + K);
  } else {
    std::vector<int> count(E, 0);
    for (int i = 0; i < T * K; i++) count[ids_h[i]]++;
    for (int ex = 0; ex < E; ex++)
      if (count[ex] > 0) experts.push_back(ex);
    std::vector<int> next(E, 0);  // the next free position of each expert's pairs
    group_start.reserve(experts.size() + 1);
    int a = 0;
    for (int ex : experts) group_start.push_back(a), next[ex] = a, a += count[ex];
    group_start.push_back(a);
    pair_list.resize((size_t)T * K);
    for (int i = 0; i < T * K; i++) pair_list[next[ids_h[i]]++] = i;
  }
  // The groups in the order they run (resident experts first under copy overlap).
  std::vector<size_t> order(experts.size());
  std::iota(order.begin(), order.end(), size_t{0});

  // With copy overlap (and all the layer's experts in one reservation): reserve first, start the
  // copies, and order the experts resident ones first, so their kernels run while the misses are
  // copied; the missed experts' kernels wait for the copies.
  const bool overlap = e.opts.overlap_copies && (int)experts.size() <= residency.cache().n_slots();
  size_t n_resident = 0;
  bool any_miss = false;
  if (overlap) {
    std::vector<char> resident;
    residency.reserve_and_copy(L, experts, false, &resident);
    n_resident = (size_t)(std::stable_partition(order.begin(), order.end(),
                                                [&](size_t g) { return resident[g] != 0; }) -
                          order.begin());
    any_miss = n_resident < experts.size();
    if (any_miss) {  // (with every expert resident the order stays as it is)
      std::vector<int> ex2;
      ex2.reserve(experts.size());
      for (size_t g : order) ex2.push_back(experts[g]);
      experts = std::move(ex2);
    }
  }

  // Assignments: row a of the expert outputs holds (token, selection) assign[t][k] == a.
  auto [assign_h, assign_d] = ws.staging.stage<int32_t>((size_t)T * K);
  std::vector<int> rows, offsets;
  if (T == 1) {
    for (int k = 0; k < K; k++)
      assign_h[k] = (int32_t)(std::find(experts.begin(), experts.end(), ids_h[k]) - experts.begin());
  } else {
    auto [gather_h, gather_d] = ws.staging.stage<int32_t>((size_t)T * K);
    rows.reserve(order.size());
    offsets.reserve(order.size());
    int a = 0;
    for (size_t g : order) {
      offsets.push_back(a);
      rows.push_back(group_start[g + 1] - group_start[g]);
      for (int j = group_start[g]; j < group_start[g + 1]; j++) {
        const int i = pair_list[j];
        gather_h[a] = i / K;
        assign_h[i] = a++;
      }
    }
    RL_CUDA_CHECK(cudaMemcpyAsync(gather_d, gather_h, (size_t)T * K * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  stream));
    e.products.gather_expert_inputs(plan.experts, h2, gather_d, T * K);
  }
  RL_CUDA_CHECK(cudaMemcpyAsync(assign_d, assign_h, (size_t)T * K * sizeof(int32_t), cudaMemcpyHostToDevice,
                                stream));
  // Experts b0 .. b0+n-1 of the list (their rows are contiguous in the gathered order).
  auto run = [&](size_t b0, size_t n) {
    if (n == 0) return;
    std::span<const int> ex(experts.data() + b0, n);
    if (T == 1)
      run_expert_batch(e, L, plan, ex, {}, {}, 1, (int)b0);
    else
      run_expert_batch(e, L, plan, ex, std::span<const int>(rows.data() + b0, n),
                       std::span<const int>(offsets.data() + b0, n), T);
  };

  if (overlap) {
    // The cache already lists the missed experts as resident: if anything throws before the compute
    // stream waits for their copies, finish the copies before the error leaves, so no later kernel
    // reads a slot that is still being written.
    struct CopyGuard {
      cudaStream_t stream;
      bool armed;
      ~CopyGuard() {
        if (armed) cudaStreamSynchronize(stream);
      }
    } guard{e.streams.copy, any_miss};
    run(0, n_resident);
    if (any_miss) {
      e.profiler.mark(kCopyWait, stream);
      RL_CUDA_CHECK(cudaStreamWaitEvent(stream, e.streams.copies_done, 0));
      guard.armed = false;
      e.profiler.mark(kExperts, stream);
    }
    run(n_resident, experts.size() - n_resident);
  } else {
    // Reserve, copy the misses, run: in batches of at most n_slots distinct experts.
    const size_t batch = std::min(experts.size(), (size_t)residency.cache().n_slots());
    for (size_t b0 = 0; b0 < experts.size(); b0 += batch) {
      const size_t n = std::min(experts.size() - b0, batch);
      residency.reserve_and_copy(L, std::span<const int>(experts.data() + b0, n), true);
      run(b0, n);
    }
  }
  moe_combine_norm(x, ws.expert_out.f(), assign_d, w_d, K, ws.shared_out.f(), ws.shared_scalar.f(), T, n_embd,
                   next_norm, c.rms_eps, h_out, stream);
}

// The decode MoE of the synchronous path with the host taken out: route_topk selects on the GPU
// and reads the slots from the residency table; the expert kernels read the slot addresses it
// wrote. Same kernels and the same arithmetic as moe_layer + run_expert_batch for T == 1.
void moe_layer_gpu_routed(Engine& e, int L, const LayerPlan& plan, const float* h2, float* x, const float* next_norm,
                          float* h_out) {
  const Config& c = e.config();
  const MoeDev& moe = e.weights.layers[L].moe;
  const cudaStream_t stream = e.streams.compute;
  Workspace& ws = e.ws;
  const int E = c.n_expert, K = c.n_expert_used, n_embd = c.n_embd;
  float* router = ws.routed_router.f() + (size_t)L * E;
  int32_t* ids = ws.routed_io.get<int32_t>() + (size_t)L * K;
  int32_t* misses = ws.routed_io.get<int32_t>() + (size_t)c.n_layer * K + L;
  float* weights = ws.routed_weights.f() + (size_t)L * K;
  const uint8_t** ptrs = ws.routed_slot_ptrs.get<const uint8_t*>() + (size_t)L * K;
  e.profiler.mark(kRouter, stream);
  e.products.project_group({{&moe.router, plan.router, h2, router},
                            {&moe.shared_gate_inp, plan.shared_gate_inp, h2, ws.shared_scalar.f()}},
                           1);
  route_topk(router, E, K, c.expert_weights_scale, e.residency.residency_row(L), e.residency.slots(), ids, weights,
             ptrs, misses, stream);
  e.profiler.mark(kSharedExpert, stream);
  e.products.project_gate_up(moe.gate_sh, moe.up_sh, plan.shared, h2, 1, ws.shared_act.f(), ws.shared_up.f());
  e.products.project(moe.down_sh, plan.shared_down, ws.shared_act.f(), 1, ws.shared_out.f());
  e.profiler.mark(kExperts, stream);
  e.products.expert_matvecs(moe, ptrs, h2, K, 0);
  moe_combine_norm(x, ws.expert_out.f(), ws.assign_identity.get<int32_t>(), weights, K, ws.shared_out.f(),
                   ws.shared_scalar.f(), 1, n_embd, next_norm, c.rms_eps, h_out, stream);
}

}  // namespace

void moe_block(Engine& e, int L, const LayerPlan& plan, const float* h2, int T, float* x, const float* next_norm,
               float* h_out, TraceSink* trace, bool gpu_routed) {
  if (gpu_routed)
    moe_layer_gpu_routed(e, L, plan, h2, x, next_norm, h_out);
  else
    moe_layer(e, L, plan, h2, T, x, trace, next_norm, h_out);
}

}  // namespace rl::cuda
