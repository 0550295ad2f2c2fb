#include "cuda/plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"

namespace rl::cuda {

NumericForms NumericForms::choose(const Config& c, const DeviceWeights& w, const CudaOptions& opts) {
  NumericForms f;
  f.x24 = device_info().cc_major >= 8 && c.n_embd % 256 == 0 && c.n_ff_exp % 256 == 0;
  f.fast = opts.numerics == Numerics::kFast && opts.fast_products;
  f.bf16 = f.fast && device_info().cc_major >= 8;
  f.q8 = f.fast && opts.q8_decode && device_info().cc_major >= 7;
  f.mma_q8 = f.q8 && device_info().cc_major >= 8;
  const bool fast_tier = opts.numerics == Numerics::kFast;
  f.fast_routing = fast_tier && opts.fast_routing;
  f.fast_attention = fast_tier && opts.fast_attention;
  f.fast_deltanet = fast_tier && opts.fast_deltanet;
  check_kv_type(opts.numerics, opts.kv_type, c.head_dim);
  if (opts.kv_type != KvType::kF32 && !f.fast_attention)
    fail("--kv-type {}: the exact tier's attention kernels read an f32 cache only", kv_type_name(opts.kv_type));
  f.kv_type = opts.kv_type;
  f.x32_always = opts.x32_always;
  for (const LayerDev& d : w.layers) {
    for (const TensorView* v : {&d.moe.gate_exps, &d.moe.up_exps, &d.moe.down_exps})
      f.routed_x24 = f.routed_x24 || (v->present() && f.use_x24(v->type));
    f.h2_x24 = f.h2_x24 || f.moe_input_x24(d.moe);
  }
  f.x32 = f.x24 && device_info().cc_major >= 9;
  if (f.x32) {
    // Every matrix a prefill projects through project() (the LM head when all logits are asked for).
    auto widen = [&](const DMat& m) {
      if (x32_supported(m.type) && m.cols % 256 == 0) f.x32_cols = std::max(f.x32_cols, m.cols);
    };
    widen(w.output);
    for (const LayerDev& d : w.layers)
      for (const DMat* m : {&d.attn.q, &d.attn.k, &d.attn.v, &d.attn.o, &d.ssm.qkv, &d.ssm.z, &d.ssm.ba, &d.ssm.out,
                            &d.moe.router, &d.moe.shared_gate_inp, &d.moe.gate_sh, &d.moe.up_sh, &d.moe.down_sh})
        widen(*m);
  }
  return f;
}

bool NumericForms::use_x24(GgmlType t) const { return x24 && x24_supported(t); }

Kernel NumericForms::matvec() const { return fast ? Kernel::kMatvecF32 : Kernel::kMatvec; }

Kernel NumericForms::matvec(GgmlType t) const { return fast && q8 && q8_supported(t) ? Kernel::kMatvecQ8 : matvec(); }

Kernel NumericForms::prefill_matmul() const { return bf16 ? Kernel::kMatmulBf16 : Kernel::kMatmulF64; }

bool NumericForms::use_x32(const DMat& w, int T) const {
  return x32 && x32_supported(w.type) && w.cols % 256 == 0 && w.cols <= x32_cols &&
         reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % 16 == 0 &&
         (x32_always || x32_blocks(w.rows, T) >= device_info().sm_count);
}

bool NumericForms::moe_input_x24(const MoeDev& m) const {
  return use_x24(m.gate_sh.type) || (m.gate_exps.present() && (use_x24(m.gate_exps.type) || use_x24(m.up_exps.type)));
}

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::kMatvec: return "matvec";
    case Kernel::kMatvecF32: return "matvec-f32";
    case Kernel::kMatvecQ8: return "matvec-q8";
    case Kernel::kMatmulF64: return "f64";
    case Kernel::kMatmulX24: return "x24";
    case Kernel::kMatmulX8: return "x8";
    case Kernel::kMatmulX8Q4K: return "x8-q4k";
    case Kernel::kMatmulX32: return "x32";
    case Kernel::kMatmulBf16: return "bf16";
    case Kernel::kMatmulQ8: return "mma-q8";
  }
  return "?";
}

const char* routing_name(Routing r) {
  switch (r) {
    case Routing::kHostRouted: return "host-routed";
    case Routing::kGpuGrouped: return "gpu-grouped";
    case Routing::kGpuRouted: return "gpu-routed";
  }
  return "?";
}

namespace {
// A pass of 2 to kQ8PassTokens tokens on matvec-q8 token columns for a matrix of type t.
bool q8_columns(const NumericForms& forms, GgmlType t, int T) {
  return T <= kQ8PassTokens && forms.matvec(t) == Kernel::kMatvecQ8;
}
}  // namespace

Kernel dense_kernel(const NumericForms& forms, const DMat& w, int rows) {
  if (rows == 1) return forms.matvec(w.type);
  // A few tokens (a short chunk, a batched decode step): the fast tier's Q8 decode products, each
  // matrix read once for all their columns; the types without them (the F32 routers and shared
  // gates) the fp32 decode product once a column: the prefill forms' grids at these widths are a
  // few blocks (the 512-row router 4, the shared gate 1), ~110 and ~54 µs a launch on the H200
  // against ~5 for a decode launch (Nsight Compute, docs/PERF.md).
  if (q8_columns(forms, w.type, rows)) {
    const bool mma = forms.mma_q8 && rows >= kMmaQ8FromTokens && mma_q8_weights_fit(w.type, w.data, w.row_bytes, w.cols);
    return mma ? Kernel::kMatmulQ8 : Kernel::kMatvecQ8;
  }
  if (forms.fast && rows <= kQ8PassTokens) return forms.matvec();
  return forms.use_x32(w, rows) ? forms.x32_kernel() : forms.prefill_matmul();
}

namespace {

// A dense SwiGLU pair (Products::project_gate_up): one launch when both matrices have one type and
// shape (X24 for an X24 type over n_embd columns, in prefill), else two products.
PairPlan dense_pair(const Config& c, const NumericForms& forms, const DMat& gate, const DMat& up, int T) {
  if ((T == 1 || q8_columns(forms, gate.type, T)) && gate.type == up.type && gate.cols == up.cols) {
    const Kernel k = forms.matvec(gate.type);
    return {k, k, true};
  }
  if (gate.type == up.type && gate.cols == up.cols && gate.rows == up.rows && gate.row_bytes == up.row_bytes) {
    const Kernel k =
        forms.use_x24(gate.type) && gate.cols == c.n_embd ? forms.x24_kernel() : forms.prefill_matmul();
    return {k, k, true};
  }
  return {dense_kernel(forms, gate, T), dense_kernel(forms, up, T), false};
}

// Whether a pass of T tokens runs its routed experts a (token, selection) pair at a time on the
// decode kernels: the fast tier's matvec-q8 for all three matrices' types, 2 to kQ8PassTokens
// tokens, grouped on the GPU (a host-routed pass of that plan, a cache not yet loaded, takes the
// fp64 grouped products on the pair's kernel: Products::expert_products).
bool pairs_on_decode_kernels(const NumericForms& forms, const MoeDev& m, int T, Routing routing) {
  const GgmlType g = m.gate_exps.type, u = m.up_exps.type, d = m.down_exps.type;
  return T >= 2 && T <= kQ8PassTokens && routing == Routing::kGpuGrouped && forms.matvec(g) == Kernel::kMatvecQ8 &&
         forms.matvec(u) == Kernel::kMatvecQ8 && forms.matvec(d) == Kernel::kMatvecQ8;
}

// A routed expert matrix in prefill: X24 (the fast tier: X8) for its type, else the fp64 products
// (the fast tier: bf16).
Kernel expert_kernel(const NumericForms& forms, GgmlType t) {
  return forms.use_x24(t) ? forms.x24_kernel() : forms.prefill_matmul();
}

}  // namespace

PassPlan make_pass_plan(const Config& c, const DeviceWeights& w, const NumericForms& forms, const CudaOptions& opts,
                        bool cache_holds_all, int T) {
  PassPlan p;
  p.T = T;
  p.lm_head_last = dense_kernel(forms, w.output, 1);
  p.lm_head_all = dense_kernel(forms, w.output, T);
  // Decode tries the graph (falling back to the host-routed path when a token misses) unless
  // --speculation keeps it off for this cache; a prefill chunk groups on the GPU when the budget
  // holds every expert (once they are all resident).
  using S = CudaOptions::Speculation;
  // --miss-reads host: the graph reads a miss in place, so every decode token takes it.
  const bool graph = opts.miss_reads == CudaOptions::MissReads::kHost ||
                     (opts.speculation != S::kOff && (opts.speculation != S::kFullyResident || cache_holds_all));
  const bool grouping = opts.gpu_grouping && c.n_expert <= kMaxGroupExperts && cache_holds_all;
  const Routing routing = T == 1 ? (graph ? Routing::kGpuRouted : Routing::kHostRouted)
                                 : (grouping ? Routing::kGpuGrouped : Routing::kHostRouted);
  for (const LayerDev& d : w.layers) {
    LayerPlan l;
    l.recurrent = d.recurrent;
    const DMat* in[3] = {&d.ssm.qkv, &d.ssm.z, &d.ssm.ba};
    const DMat* out = &d.ssm.out;
    if (!d.recurrent) {
      in[0] = &d.attn.q, in[1] = &d.attn.k, in[2] = &d.attn.v;
      out = &d.attn.o;
    }
    for (int i = 0; i < 3; i++) l.mixer_in[i] = dense_kernel(forms, *in[i], T);
    l.mixer_out = dense_kernel(forms, *out, T);
    const MoeDev& m = d.moe;
    l.router = dense_kernel(forms, m.router, T);
    l.shared_gate_inp = dense_kernel(forms, m.shared_gate_inp, T);
    l.shared = dense_pair(c, forms, m.gate_sh, m.up_sh, T);
    l.shared_down = dense_kernel(forms, m.down_sh, T);
    if (T == 1) {
      // One form for the pair (a launch, or two of its types and a swiglu, on one input).
      const GgmlType gt = m.gate_exps.type, ut = m.up_exps.type;
      const Kernel k = forms.matvec(gt) == forms.matvec(ut) ? forms.matvec(gt) : forms.matvec();
      l.experts = {k, k, true};
      l.expert_down = forms.matvec(m.down_exps.type);
    } else if (pairs_on_decode_kernels(forms, m, T, routing)) {
      // A short pass grouped on the GPU: each (token, selection) pair on the decode kernels
      // (Products::expert_pairs), where the prefill forms' tiles would hold one or two rows.
      l.experts = {Kernel::kMatvecQ8, Kernel::kMatvecQ8, true};
      l.expert_down = Kernel::kMatvecQ8;
    } else {
      const TensorView gv = m.gate_exps.matrix(0), uv = m.up_exps.matrix(0);
      l.experts = {expert_kernel(forms, gv.type), expert_kernel(forms, uv.type),
                   gv.type == uv.type && gv.row_bytes == uv.row_bytes};
      l.expert_down = expert_kernel(forms, m.down_exps.type);
    }
    // h2 converted once a layer to each form its products read: X24 (X8) for the prefill forms'
    // shared pair and routed gate/up; Q8 (by the norm that writes h2) for the matvec-q8 products
    // of it and a short pass's pairs (a decode token's experts: the same kernel as the pairs).
    l.moe_input_x24 = is_x24(l.shared.gate) || is_x24(l.experts.gate) || is_x24(l.experts.up);
    l.moe_input_q8 = l.experts.gate == Kernel::kMatvecQ8 || l.shared.gate == Kernel::kMatvecQ8 ||
                     l.router == Kernel::kMatvecQ8 || l.shared_gate_inp == Kernel::kMatvecQ8;
    l.routing = routing;
    p.layers.push_back(l);
  }
  return p;
}

namespace {

std::string pair_text(const PairPlan& p, GgmlType gate, GgmlType up) {
  if (p.fused) return fmt::format("{}+{} {} fused", type_name(gate), type_name(up), kernel_name(p.gate));
  return fmt::format("{} {} / {} {}", type_name(gate), kernel_name(p.gate), type_name(up), kernel_name(p.up));
}

std::string product_text(GgmlType t, Kernel k) { return fmt::format("{} {}", type_name(t), kernel_name(k)); }

}  // namespace

std::string format_plan(const PassPlan& plan, const DeviceWeights& w) {
  std::string out = fmt::format(
      "{} ({} token{}): matrix type and kernel (matvec: fp32 activations, double sums; matvec-q8: dp4a on 8-bit "
      "activations; mma-q8: int8 tensor cores on them; f64: fp64 tensor cores; x24 / x32: 8-bit tensor cores on "
      "X24 / X32 activations)\n",
      plan.T == 1 ? "decode" : "prefill chunk", plan.T, plan.T == 1 ? "" : "s");
  for (size_t L = 0; L < plan.layers.size(); L++) {
    const LayerPlan& l = plan.layers[L];
    const LayerDev& d = w.layers[L];
    const MoeDev& moe = d.moe;
    const char* names[4] = {"qkv", "z", "ba", "out"};
    const DMat* mats[4] = {&d.ssm.qkv, &d.ssm.z, &d.ssm.ba, &d.ssm.out};
    if (!l.recurrent) {
      names[0] = "q", names[1] = "k", names[2] = "v", names[3] = "o";
      mats[0] = &d.attn.q, mats[1] = &d.attn.k, mats[2] = &d.attn.v, mats[3] = &d.attn.o;
    }
    out += fmt::format("layer {:>2} {:<9}", L, l.recurrent ? "deltanet" : "attention");
    for (int i = 0; i < 4; i++)
      out += fmt::format(" {}={}", names[i], product_text(mats[i]->type, i < 3 ? l.mixer_in[i] : l.mixer_out));
    out += fmt::format("\n         moe       router={} shexp_gate_inp={} shexp gate/up={} shexp down={}{}\n",
                       product_text(moe.router.type, l.router),
                       product_text(moe.shared_gate_inp.type, l.shared_gate_inp),
                       pair_text(l.shared, moe.gate_sh.type, moe.up_sh.type),
                       product_text(moe.down_sh.type, l.shared_down),
                       l.moe_input_x24 && l.moe_input_q8 ? " (h2 to X24 and Q8 once)"
                       : l.moe_input_x24                 ? " (h2 to X24 once)"
                       : l.moe_input_q8                  ? " (h2 to Q8 once)"
                                                         : "");
    out += fmt::format("         experts   {} gate/up={} down={}\n", routing_name(l.routing),
                       pair_text(l.experts, moe.gate_exps.type, moe.up_exps.type),
                       product_text(moe.down_exps.type, l.expert_down));
  }
  out += fmt::format("output    lm_head={} (last position), {} (every position)\n",
                     product_text(w.output.type, plan.lm_head_last), kernel_name(plan.lm_head_all));
  return out;
}

}  // namespace rl::cuda
