// The MoE block of a layer, one path for every routing mode:
//   router logits (and the shared expert's gate scalar) -> route -> shared expert
//   -> the routing mode produces device arrays: slot pointers and row ranges of the expert groups
//      (ExpertGroups), the gathered order and the assignments (Assignment)
//   -> gather (prefill) -> expert products -> combine with the next norm
// The modes (plan.h Routing): host-routed (the host reads the selections, reserves the experts,
// copies misses, groups them), GPU-grouped (group_by_expert with the residency table, prefill with
// every expert resident) and GPU-routed (route_topk in the decode graph). They differ only in how
// the arrays are made; the products read the same rows in every mode (tests: fused-equals-unfused
// and GPU-routed-equals-synchronous, bit for bit).
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <span>
#include <vector>

#include "cuda/engine.h"
#include "cuda/kernels.h"

namespace rl::cuda {

namespace {

// One launch of the routed experts' products: group g is the expert in slot slot_ptrs[g].
// Prefill: over gathered rows [offsets[g], + offsets[n + g]) (at most max_rows), the groups
// covering rows [row0, row0 + n_rows). Decode: group g's output row is row0 + g.
struct ExpertGroups {
  const uint8_t* const* slot_ptrs = nullptr;  // [n]
  const int* offsets = nullptr;               // [2][n] first rows, row counts (prefill)
  int n = 0;
  int max_rows = 0;
  size_t row0 = 0, n_rows = 0;
};

// Where each (token, selection) pair's expert row is, for the gather and the combine.
struct Assignment {
  const int32_t* gather = nullptr;   // [TK] prefill: the token of each gathered row
  const int32_t* assign = nullptr;   // [TK] the expert-output row of each pair
  const float* weights = nullptr;    // [TK] the pair's routing weight
};

// ---- the shared stages ------------------------------------------------------------------------

// The gathered expert inputs (prefill; decode reads h2 itself).
void gather_inputs(Engine& e, const LayerPlan& plan, const float* h2, int T, const Assignment& a) {
  if (T > 1) e.products.gather_expert_inputs(plan.experts, h2, a.gather, T * e.config().n_expert_used);
}

void expert_products(Engine& e, int L, const LayerPlan& plan, const float* h2, int T, const ExpertGroups& g) {
  const MoeDev& moe = e.weights.layers[L].moe;
  if (T == 1)
    e.products.expert_matvecs(moe, plan.experts, plan.expert_down, g.slot_ptrs, h2, g.n, g.row0);
  else
    e.products.expert_products(moe, plan.experts, plan.expert_down, g.slot_ptrs, g.offsets, g.n, g.max_rows, g.row0,
                               g.n_rows);
}

// x += sum_k w_k expert_out[assign] + sigmoid(shared_scalar) * shared_out; h_out = RMSNorm(x) * next_norm.
void combine(Engine& e, int T, const Assignment& a, float* x, const float* next_norm, float* h_out, const Q8Target& q8) {
  const Config& c = e.config();
  const Workspace& ws = e.ws;
  moe_combine_norm(x, ws.expert_out.f(), a.assign, a.weights, c.n_expert_used, ws.shared_out.f(),
                   ws.shared_scalar.f(), T, c.n_embd, next_norm, c.rms_eps, h_out, e.streams.compute, q8.q, q8.ds);
  // Declared where it is written: a later conversion into the scratch (a --prefetch late
  // prediction's product, say) then ends the declaration instead of being read as h_out's.
  if (q8.q) e.products.hold_q8(h_out);
}

// ---- GPU-routed: the decode graph's token ---------------------------------------------------

// --miss-reads host with --prefetch: the decode graph's prediction branch (expert_prefetch.cpp)
// stages each layer's predicted misses from the layer before; layer L reads what layer L-1 staged.
bool predicts_in_graph(const Engine& e) {
  return e.residency.staging() && e.opts.prefetch != CudaOptions::Prefetch::kOff;
}
bool predicting_layer(const Engine& e, int L) { return predicts_in_graph(e) && L > 0; }

// route_topk selected on the GPU and read each selection's slot from the residency table (a
// miss is counted for the host, which then discards the token, or with --miss-reads host reads its
// staged or host copy); pair k is expert row k.
// shared_on_side: the shared expert ran on the side branch; the combine waits for it.
void run_gpu_routed(Engine& e, int L, const LayerPlan& plan, const float* h2, float* x, const float* next_norm,
                    float* h_out, bool shared_on_side, const Q8Target& q8) {
  const Config& c = e.config();
  const Workspace& ws = e.ws;
  const int K = c.n_expert_used;
  e.profiler.mark(kExperts, e.streams.compute);
  const ExpertGroups groups{ws.routed_slot_ptrs.get<const uint8_t*>() + (size_t)L * K, nullptr, K, 0, 0, (size_t)K};
  const Assignment a{nullptr, ws.assign_identity.get<int32_t>(), ws.routed_weights.f() + (size_t)L * K};
  // The previous layer's prediction branch copied some of this layer's misses (predicting_layer).
  if (predicting_layer(e, L)) e.streams.wait_staged(L);
  expert_products(e, L, plan, h2, 1, groups);
  if (shared_on_side) e.streams.join_side();
  combine(e, 1, a, x, next_norm, h_out, q8);
}

// ---- GPU-grouped: a prefill chunk with every expert resident ------------------------------------

// The selections (route_ids) grouped by expert on the GPU, with the slots from the residency
// table, so the layer never waits for the host. The same products on the same rows as the host's
// grouping (groups of at most kExpertGroupRows rows instead of one group per expert; each row's
// products do not depend on the others), so the same results bit for bit (test).
void run_gpu_grouped(Engine& e, int L, const LayerPlan& plan, const float* h2, int T, float* x,
                     const float* next_norm, float* h_out, const Q8Target& q8) {
  const Config& c = e.config();
  Workspace& ws = e.ws;
  const int E = c.n_expert, K = c.n_expert_used, n = T * K, n_groups = expert_group_bound(n, E);
  e.profiler.mark(kExperts, e.streams.compute);
  Assignment a{nullptr, nullptr, ws.route_weights.f()};
  if (plan.experts.gate == Kernel::kMatvecQ8) {
    // A short pass (plan.cpp): each (token, selection) pair on the decode kernels, pair i the
    // expert-output row i, as a decode token's selections are.
    const uint8_t** ptrs = ws.pair_slot_ptrs.get<const uint8_t*>();
    pair_slots(ws.route_ids.get<int32_t>(), n, e.residency.residency_row(L), e.residency.slots(), ptrs,
               ws.grouped_distinct.get<int32_t>() + L, e.streams.compute);
    e.products.expert_pairs(e.weights.layers[L].moe, plan.experts, plan.expert_down, ptrs, n, plan.moe_input_q8);
    a.assign = ws.assign_identity.get<int32_t>();
  } else {
    int32_t* gather = ws.grouped_gather.get<int32_t>();
    int32_t* assign = ws.grouped_assign.get<int32_t>();
    const uint8_t** ptrs = ws.grouped_slot_ptrs.get<const uint8_t*>();
    int32_t* offsets = ws.grouped_groups.get<int32_t>();  // [n_groups] first rows, then [n_groups] row counts
    group_by_expert(ws.route_ids.get<int32_t>(), n, K, E, e.residency.residency_row(L), gather, assign, ptrs,
                    offsets, offsets + n_groups, n_groups, ws.grouped_distinct.get<int32_t>() + L, e.streams.compute);
    a.gather = gather, a.assign = assign;
    gather_inputs(e, plan, h2, T, a);
    expert_products(e, L, plan, h2, T, {ptrs, offsets, n_groups, kExpertGroupRows, 0, (size_t)n});
  }
  combine(e, T, a, x, next_norm, h_out, q8);
  e.grouped_layers.push_back(L);
  e.stats.gpu_grouped_layers++;
}

// ---- host-routed: any cache, any pass ---------------------------------------------------------

// The distinct experts of the selections ids_h [T][K], in the order they run, with their rows:
// decode, the selections in order (expert g's row is g); prefill, ascending with the (token,
// selection) pairs i = t*K + k of each, tokens in order (each expert's weights are read once per
// chunk; a counting sort); with `wave` (one per distinct expert in that order) the experts of a
// lower wave first, keeping that order within a wave. Fills assign_h [TK] and, prefill, gather_h
// [TK], rows / offsets [groups].
struct HostGroups {
  std::vector<int> experts, rows, offsets;
};
HostGroups group_on_host(const int32_t* ids_h, int T, int K, int E, std::span<const char> wave, int32_t* assign_h,
                         int32_t* gather_h);

// When an expert's kernels may run under copy overlap: resident, landing (prefetched, its copy
// perhaps still running), copied now.
enum Wave : char { kResident, kLanding, kCopied };

// Experts are reserved, the misses copied, the groups' slot pointers and row ranges staged, in
// batches the cache can hold; with copy overlap the resident experts' products run while the
// misses are copied.
void run_host_routed(Engine& e, int L, const LayerPlan& plan, const float* h2, int T, float* x,
                     const float* next_norm, float* h_out, const Q8Target& q8) {
  const Config& c = e.config();
  const cudaStream_t stream = e.streams.compute;
  Workspace& ws = e.ws;
  ExpertResidency& residency = e.residency;
  const int E = c.n_expert, K = c.n_expert_used;
  const int32_t* ids_h = ws.route_ids_host.get<int32_t>();
  ws.staging.reset();
  e.profiler.mark(kExperts, stream);

  // With copy overlap (and all the layer's experts in one reservation): reserve first, start the
  // copies, and order the experts resident ones first, so their kernels run while the misses are
  // copied; the missed experts' kernels wait for the copies. Prefetched ones run between the two,
  // after the prefetch's copies.
  const std::vector<int> distinct =
      ExpertCache::layer_request(std::span<const int32_t>(ids_h, (size_t)T * K), T, K);
  const bool overlap = e.opts.overlap_copies && (int)distinct.size() <= residency.cache().n_slots();
  std::vector<char> wave;
  if (overlap) {
    residency.reserve_and_copy(L, distinct, false, &wave);
    for (size_t i = 0; i < distinct.size(); i++)
      wave[i] = !wave[i] ? kCopied : residency.landing(L, distinct[i]) ? kLanding : kResident;
  }

  auto [assign_h, assign_d] = ws.staging.stage<int32_t>((size_t)T * K);
  int32_t* gather_h = nullptr;
  int32_t* gather_d = nullptr;
  if (T > 1) std::tie(gather_h, gather_d) = ws.staging.stage<int32_t>((size_t)T * K);
  const HostGroups g = group_on_host(ids_h, T, K, E, wave, assign_h, gather_h);
  if (T > 1)
    RL_CUDA_CHECK(cudaMemcpyAsync(gather_d, gather_h, (size_t)T * K * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  stream));
  const Assignment a{gather_d, assign_d, ws.route_weights.f()};
  gather_inputs(e, plan, h2, T, a);
  RL_CUDA_CHECK(cudaMemcpyAsync(assign_d, assign_h, (size_t)T * K * sizeof(int32_t), cudaMemcpyHostToDevice,
                                stream));

  // Experts b0 .. b0+n-1 of the list (their rows are contiguous in the gathered order): their slot
  // pointers and row ranges staged, the products, and the slots freed for later copies.
  auto run = [&](size_t b0, size_t n) {
    if (n == 0) return;
    auto [ptr_h, ptr_d] = ws.staging.stage<const uint8_t*>(n);
    for (size_t i = 0; i < n; i++) ptr_h[i] = residency.slot_of(L, g.experts[b0 + i]);
    RL_CUDA_CHECK(cudaMemcpyAsync(ptr_d, ptr_h, n * sizeof(void*), cudaMemcpyHostToDevice, stream));
    ExpertGroups groups{ptr_d, nullptr, (int)n, 0, b0, n};
    if (T > 1) {
      auto [off_h, off_d] = ws.staging.stage<int>(2 * n);
      size_t rows = 0;
      for (size_t i = 0; i < n; i++) {
        off_h[i] = g.offsets[b0 + i];
        off_h[n + i] = g.rows[b0 + i];
        groups.max_rows = std::max(groups.max_rows, g.rows[b0 + i]);
        rows += g.rows[b0 + i];
      }
      RL_CUDA_CHECK(cudaMemcpyAsync(off_d, off_h, 2 * n * sizeof(int), cudaMemcpyHostToDevice, stream));
      groups.offsets = off_d;
      groups.row0 = (size_t)g.offsets[b0];
      groups.n_rows = rows;
    }
    expert_products(e, L, plan, h2, T, groups);
    // These slots may be overwritten once the kernels above have read them.
    RL_CUDA_CHECK(cudaEventRecord(e.streams.slots_free, stream));
  };

  const size_t n_experts = g.experts.size();
  if (overlap) {
    const size_t n_resident = (size_t)std::count(wave.begin(), wave.end(), kResident);
    const size_t n_landing = (size_t)std::count(wave.begin(), wave.end(), kLanding);
    const size_t n_ready = n_resident + n_landing;  // the experts not copied by this layer
    const bool any_miss = n_ready < n_experts;
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
    if (n_landing > 0) {
      e.profiler.mark(kCopyWait, stream);
      RL_CUDA_CHECK(cudaStreamWaitEvent(stream, e.streams.prefetch_done, 0));
      e.profiler.mark(kExperts, stream);
      run(n_resident, n_landing);
    }
    if (any_miss) {
      e.profiler.mark(kCopyWait, stream);
      RL_CUDA_CHECK(cudaStreamWaitEvent(stream, e.streams.copies_done, 0));
      guard.armed = false;
      e.profiler.mark(kExperts, stream);
    }
    // The next layer's predicted misses, copied behind this layer's (every wait for this layer's
    // copies is enqueued, so the prefetch's events cannot be taken for them).
    prefetch_predicted(e, L + 1);
    run(n_ready, n_experts - n_ready);
  } else {
    // Reserve, copy the misses, run: in batches of at most n_slots distinct experts.
    const size_t batch = std::min(n_experts, (size_t)residency.cache().n_slots());
    for (size_t b0 = 0; b0 < n_experts; b0 += batch) {
      const size_t n = std::min(n_experts - b0, batch);
      residency.reserve_and_copy(L, std::span<const int>(g.experts.data() + b0, n), true);
      run(b0, n);
    }
  }
  combine(e, T, a, x, next_norm, h_out, q8);
}

HostGroups group_on_host(const int32_t* ids_h, int T, int K, int E, std::span<const char> wave, int32_t* assign_h,
                         int32_t* gather_h) {
  HostGroups out;
  std::vector<int> group_start, pair_list;  // group g's pairs: pair_list[group_start[g] .. group_start[g + 1])
  std::vector<int> experts;
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
  // The groups in the order they run: by wave when the reservation said which.
  std::vector<size_t> order(experts.size());
  std::iota(order.begin(), order.end(), size_t{0});
  if (!wave.empty()) std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return wave[a] < wave[b]; });
  for (size_t g : order) out.experts.push_back(experts[g]);
  // Assignments: row a of the expert outputs holds (token, selection) assign[t][k] == a.
  if (T == 1) {
    for (int k = 0; k < K; k++)
      assign_h[k] = (int32_t)(std::find(out.experts.begin(), out.experts.end(), ids_h[k]) - out.experts.begin());
    return out;
  }
  int a = 0;
  for (size_t g : order) {
    out.offsets.push_back(a);
    out.rows.push_back(group_start[g + 1] - group_start[g]);
    for (int j = group_start[g]; j < group_start[g + 1]; j++) {
      const int i = pair_list[j];
      gather_h[a] = i / K;
      assign_h[i] = a++;
    }
  }
  return out;
}

}  // namespace

void moe_block(Engine& e, int L, const LayerPlan& plan, const float* h2, int T, float* x, const float* next_norm,
               float* h_out, TraceSink* trace, bool gpu_routed, bool h2_q8_ready, const Q8Target& next_q8) {
  const Config& c = e.config();
  const MoeDev& moe = e.weights.layers[L].moe;
  const cudaStream_t stream = e.streams.compute;
  Workspace& ws = e.ws;
  const int E = c.n_expert, K = c.n_expert_used;
  // The graph's token routes on the GPU; a prefill chunk groups there when the plan allows it and
  // every expert is resident; everything else is routed by the host.
  const Routing routing = gpu_routed ? Routing::kGpuRouted
                          : plan.routing == Routing::kGpuGrouped && e.residency.all_resident()
                              ? Routing::kGpuGrouped
                              : Routing::kHostRouted;

  // The decode graph's shared expert needs only h2: it runs on the side branch, beside the
  // routing and the routed experts (the same kernels, so the same results), unless --profile
  // times the stages one after another.
  const bool shared_on_side = routing == Routing::kGpuRouted && !e.profiler.on;
  // Decode and short passes: h2 in the Q8 form once (before the side branch forks), for every
  // matvec-q8 product of it and a short pass's pairs (by the norm that wrote h2, when it could).
  if (plan.moe_input_q8 && !h2_q8_ready) e.products.convert_moe_input_q8(h2, T);
  const float* h2_q8 = plan.moe_input_q8 ? h2 : nullptr;
  if (shared_on_side) {
    e.streams.fork_side();
    e.side_products.project_gate_up(moe.gate_sh, moe.up_sh, plan.shared, h2, T, ws.shared_act.f(), ws.shared_up.f(),
                                    plan.moe_input_q8);
    e.side_products.project(moe.down_sh, plan.shared_down, ws.shared_act.f(), T, ws.shared_out.f());
    e.streams.end_side();
  }

  // Router logits and the shared expert's gate scalar; the routing kernel; for the host (to
  // reserve the experts, or for a trace) the selections. The shared expert runs on the GPU
  // meanwhile.
  float* router = gpu_routed ? ws.routed_router.f() + (size_t)L * E : ws.router_logits.f();
  e.profiler.mark(kRouter, stream);
  e.products.project_group({{&moe.router, plan.router, h2, router},
                            {&moe.shared_gate_inp, plan.shared_gate_inp, h2, ws.shared_scalar.f()}},
                           T, h2_q8);
  const Sums routing_sums = e.forms.fast_routing ? Sums::kFast : Sums::kExact;
  if (routing == Routing::kGpuRouted) {
    int32_t* io = ws.routed_io.get<int32_t>();
    // --miss-reads host: a missed selection reads a staging slot, which stage_misses fills from the
    // expert's host copy in whole 16-byte pieces before the expert kernels run, or, when the
    // previous layer's prediction branch staged it already, that slot.
    ExpertResidency& r = e.residency;
    const bool predicting = predicts_in_graph(e);
    const int n_predicted = std::min(K, e.opts.prefetch_experts);
    StagedPrediction pred;
    if (predicting_layer(e, L)) {
      e.streams.wait_marked(L);
      pred = {r.predicted_staged(L), n_predicted, r.predicted_staging(L)};
    }
    route_topk(router, E, K, c.expert_weights_scale, r.residency_row(L), r.miss_source(L), io + (size_t)L * K,
               ws.routed_weights.f() + (size_t)L * K, ws.routed_slot_ptrs.get<const uint8_t*>() + (size_t)L * K,
               io + (size_t)c.n_layer * K + L, stream, routing_sums, r.miss_stride(), r.staging(), r.staged_src(),
               pred);
    if (r.staging()) stage_misses(r.staged_src(), r.staging(), K, moe.expert_bytes, r.miss_stride(), stream);
    if (predicting && L + 1 < c.n_layer) stage_next_layer_prediction(e, L, x, n_predicted);
  } else {
    route_tokens(router, T, E, K, c.expert_weights_scale, ws.route_ids.get<int32_t>(), ws.route_weights.f(), stream,
                 routing_sums);
    if (routing == Routing::kHostRouted || trace) {
      RL_CUDA_CHECK(cudaMemcpyAsync(ws.route_ids_host.get<int32_t>(), ws.route_ids.get(),
                                    (size_t)T * K * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
      if (trace)
        RL_CUDA_CHECK(cudaMemcpyAsync(ws.router_host.get<float>(), router, (size_t)T * E * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream));
      RL_CUDA_CHECK(cudaEventRecord(e.streams.router_ready, stream));
    }
    if (predicts_next_layer(e, L, T, routing, CudaOptions::Prefetch::kEarly)) predict_next_layer(e, L);
  }
  e.profiler.mark(kSharedExpert, stream);
  // Prefill: h2 in the X24 form once, for the shared pair and (gathered) the routed gate and up.
  if (plan.moe_input_x24)
    quantize_x24(h2, T, c.n_embd, ws.moe_input_x24.q.get<uint8_t>(), ws.moe_input_x24.scale.get<double>(), stream,
                 x24_form_of(e.forms.x24_kernel()));
  if (!shared_on_side) {
    e.products.project_gate_up(moe.gate_sh, moe.up_sh, plan.shared, h2, T, ws.shared_act.f(), ws.shared_up.f(),
                               plan.shared.gate == Kernel::kMatvecQ8 ? plan.moe_input_q8 : plan.moe_input_x24);
    e.products.project(moe.down_sh, plan.shared_down, ws.shared_act.f(), T, ws.shared_out.f());
  }
  if (trace && routing != Routing::kGpuRouted) {
    RL_CUDA_CHECK(cudaEventSynchronize(e.streams.router_ready));
    trace->tensor(fmt::format("ffn_moe_logits-{}", L), T, E, ws.router_host.get<float>());
    trace->ids(fmt::format("ffn_moe_topk-{}", L), T, K, ws.route_ids_host.get<int32_t>());
  }

  switch (routing) {
    case Routing::kGpuRouted: run_gpu_routed(e, L, plan, h2, x, next_norm, h_out, shared_on_side, next_q8); break;
    case Routing::kGpuGrouped: run_gpu_grouped(e, L, plan, h2, T, x, next_norm, h_out, next_q8); break;
    case Routing::kHostRouted:
      // (--prefetch late: the previous layer's prediction of this one, before this layer's selections)
      prefetch_predicted(e, L);
      if (!trace) RL_CUDA_CHECK(cudaEventSynchronize(e.streams.router_ready));
      run_host_routed(e, L, plan, h2, T, x, next_norm, h_out, next_q8);
      if (predicts_next_layer(e, L, T, routing, CudaOptions::Prefetch::kLate)) predict_next_layer(e, L);
      break;
  }
}

}  // namespace rl::cuda
