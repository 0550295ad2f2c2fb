// A 512-token prefill chunk's kernels at the 80B's shapes, in forward-pass order, each called as
// the forward pass calls it for a chunk. The dense Q4_K products appear in both forms the layer
// plan chooses between (fp64 matmul, X32), the fp64 ones also with each token tile forced (the
// tile rule in matmul.cu); the IQ products in the X24 form the plan gives them.
#include <fmt/format.h>

#include <cmath>

#include "bench.h"
#include "cuda/kernels.h"

namespace rl::bench {

namespace {

using S = Shapes80B;
constexpr size_t kF = sizeof(float);
constexpr int T = S::chunk;
constexpr int prefill_tokens = T;

// The activations of a chunk in the X24 / X32 form, converted once when the case is made.
struct Quantised {
  std::shared_ptr<cuda::DeviceBuffer> q, scale, sum;
};
// form: kX24 or kX8 (x32: kX32 or kX8).
Quantised quantised(bool x32, const float* x, int rows, int cols, cuda::XForm form = cuda::XForm::kX24) {
  Quantised r;
  if (x32 && form == cuda::XForm::kX24) form = cuda::XForm::kX32;
  r.q = device_buffer(x32 ? cuda::x32_bytes(rows, cols, form) : cuda::x24_bytes(rows, cols, form));
  r.scale = device_buffer((size_t)rows * (cols / 256) * sizeof(double));
  r.sum = device_buffer((size_t)rows * (cols / 32) * sizeof(double));
  if (x32)
    cuda::quantize_x32(x, rows, cols, r.q->get<uint8_t>(), r.scale->get<double>(), r.sum->get<double>(), nullptr,
                       form);
  else
    cuda::quantize_x24(x, rows, cols, r.q->get<uint8_t>(), r.scale->get<double>(), nullptr, form);
  RL_CUDA_CHECK(cudaDeviceSynchronize());
  return r;
}

// Y [T][rows] = X [T][cols] · Wᵀ: fp64 matmul (token_tile 0: its own pick) or X32 (matmul_x32 on
// the converted input; kX8: the fast tier's X8 form of it).
enum class Form { kFp64, kX32, kX8 };
// T: the tokens (default the chunk of 512; a few tokens to set beside decode/'s "xN columns" cases).
CaseDef product_case(const std::string& what, GgmlType t, int rows, int cols, Form form, int token_tile = 0,
                     int T = prefill_tokens) {
  const std::string kind = form == Form::kX32 ? "matmul_x32" : form == Form::kX8 ? "matmul_x32_x8" : "matmul";
  const std::string tile = token_tile ? fmt::format(" tile={}", token_tile) : "";
  return {fmt::format("prefill/{}/{} {} {}->{} T={}{}", kind, what, type_name(t), cols, rows, T, tile), [=] {
            Case c;
            const std::vector<uint8_t> w0 = random_weights(t, rows, cols, 41);
            auto w = make_copies(w0.data(), w0.size(), copies_for(w0.size()));
            auto x = device_vector(random_values((size_t)T * cols, 42));
            auto y = device_buffer((size_t)T * rows * kF);
            c.copies = w->n();
            c.flops = 2.0 * rows * cols * T;
            const size_t rb = row_size(t, cols);
            if (form != Form::kFp64) {
              const cuda::XForm xf = form == Form::kX8 ? cuda::XForm::kX8 : cuda::XForm::kX32;
              const Quantised xq = quantised(true, x->f(), T, cols, xf);
              c.bytes = (double)w0.size() + cuda::x32_bytes(T, cols, xf) + (double)T * rows * kF;
              c.run = [=](int copy, cudaStream_t s) {
                cuda::matmul_x32(t, w->at(copy), rb, rows, cols, xq.q->get<uint8_t>(), xq.scale->get<double>(),
                                 xq.sum->get<double>(), T, y->f(), s, xf);
              };
              c.keep = {w, x, y, xq.q, xq.scale, xq.sum};
            } else {
              c.bytes = (double)w0.size() + (double)T * (cols + rows) * kF;
              c.run = [=](int copy, cudaStream_t s) {
                cuda::matmul(t, w->at(copy), rb, rows, cols, x->f(), T, y->f(), s, token_tile);
              };
              c.keep = {w, x, y};
            }
            return c;
          }};
}

// The chunk's conversion to the X32 (dense Q4_K input) or X24 (IQ input) form.
CaseDef quantize_case(bool x32, int cols) {
  return {fmt::format("prefill/quantize_{} {}x{}", x32 ? "x32" : "x24", T, cols), [=] {
            Case c;
            auto x = device_vector(random_values((size_t)T * cols, 43));
            const Quantised r = quantised(x32, x->f(), T, cols);
            c.bytes = (double)T * cols * kF + (x32 ? cuda::x32_bytes(T, cols) : cuda::x24_bytes(T, cols)) +
                      (double)T * (cols / 256) * sizeof(double) + (x32 ? (double)T * (cols / 32) * sizeof(double) : 0.0);
            c.run = [=](int, cudaStream_t s) {
              if (x32)
                cuda::quantize_x32(x->f(), T, cols, r.q->get<uint8_t>(), r.scale->get<double>(), r.sum->get<double>(), s);
              else
                cuda::quantize_x24(x->f(), T, cols, r.q->get<uint8_t>(), r.scale->get<double>(), s);
            };
            c.keep = {x, r.q, r.scale, r.sum};
            return c;
          }};
}

// The shared expert's gate/up pair on X24 activations (matmul_x24_gate_up).
CaseDef shexp_gate_up_case(GgmlType t) {
  return {fmt::format("prefill/matmul_x24/shexp_gate_up {} {}->{}x2 T={}", type_name(t), S::n_embd, S::n_ff_shexp, T), [=] {
            Case c;
            Image img;
            img.add(random_weights(t, S::n_ff_shexp, S::n_embd, 44));
            const size_t up = img.add(random_weights(t, S::n_ff_shexp, S::n_embd, 45));
            auto w = make_copies(img.bytes.data(), img.bytes.size(), copies_for(img.bytes.size()));
            auto x = device_vector(random_values((size_t)T * S::n_embd, 46));
            const Quantised xq = quantised(false, x->f(), T, S::n_embd);
            auto act = device_buffer((size_t)T * S::n_ff_shexp * kF);
            c.copies = w->n();
            c.flops = 2.0 * 2 * S::n_ff_shexp * S::n_embd * T;
            c.bytes = (double)img.bytes.size() + cuda::x24_bytes(T, S::n_embd) + (double)T * S::n_ff_shexp * kF;
            const size_t rb = row_size(t, S::n_embd);
            c.run = [=](int copy, cudaStream_t s) {
              cuda::matmul_x24_gate_up(t, w->at(copy), w->at(copy) + up, rb, S::n_ff_shexp, S::n_embd, xq.q->get<uint8_t>(),
                                       xq.scale->get<double>(), T, act->f(), s);
            };
            c.keep = {w, x, xq.q, xq.scale, xq.sum, act};
            return c;
          }};
}

// The chunk's routed experts on X24 (the fast tier: X8) activations: T·k = 5120 selections spread
// evenly, 10 rows for each of the 512 experts (one group each), every expert's slot in device memory.
CaseDef experts_case(bool down_product, cuda::XForm form) {
  const GgmlType t = GgmlType::IQ2_XS;
  const int E = S::n_expert, rows_each = T * S::n_expert_used / E, n_rows = T * S::n_expert_used;
  const char* fname = form == cuda::XForm::kX8 ? "x8" : "x24";
  const std::string name = down_product
      ? fmt::format("prefill/experts_{}/down {} {}->{} {}x{} rows", fname, type_name(t), S::n_ff_exp, S::n_embd, E,
                    rows_each)
      : fmt::format("prefill/experts_{}/gate_up {} {}->{}x2 {}x{} rows", fname, type_name(t), S::n_embd, S::n_ff_exp,
                    E, rows_each);
  return {name, [=] {
            Case c;
            Image slot;
            slot.add(random_weights(t, S::n_ff_exp, S::n_embd, 47));
            const size_t up = slot.add(random_weights(t, S::n_ff_exp, S::n_embd, 48));
            const size_t down = slot.add(random_weights(t, S::n_embd, S::n_ff_exp, 49));
            auto pool = make_copies(slot.bytes.data(), slot.bytes.size(), E);
            std::vector<const uint8_t*> ptrs(E);
            std::vector<int32_t> off_cnt(2 * E);
            for (int e = 0; e < E; e++) ptrs[e] = pool->at(e), off_cnt[e] = e * rows_each, off_cnt[E + e] = rows_each;
            auto ptr_d = device_vector(ptrs), off_d = device_vector(off_cnt);
            const int cols = down_product ? S::n_ff_exp : S::n_embd, out_cols = down_product ? S::n_embd : S::n_ff_exp;
            auto x = device_vector(random_values((size_t)n_rows * cols, 50));
            const Quantised xq = quantised(false, x->f(), n_rows, cols, form);
            auto y = device_buffer((size_t)n_rows * out_cols * kF);
            const int group_rows = cuda::kExpertGroupRows;
            if (down_product) {
              const size_t rb = row_size(t, S::n_ff_exp);
              c.flops = 2.0 * n_rows * S::n_ff_exp * S::n_embd;
              c.bytes = (double)E * rb * S::n_embd + cuda::x24_bytes(n_rows, cols, form) + (double)n_rows * out_cols * kF;
              c.run = [=](int, cudaStream_t s) {
                cuda::matmul_x24_experts(t, ptr_d->get<const uint8_t*>(), down, rb, S::n_embd, S::n_ff_exp,
                                         xq.q->get<uint8_t>(), xq.scale->get<double>(), off_d->get<int32_t>(),
                                         off_d->get<int32_t>() + E, E, group_rows, y->f(), s, form);
              };
            } else {
              const size_t rb = row_size(t, S::n_embd);
              c.flops = 2.0 * 2 * n_rows * S::n_embd * S::n_ff_exp;
              c.bytes = 2.0 * E * rb * S::n_ff_exp + cuda::x24_bytes(n_rows, cols, form) + (double)n_rows * out_cols * kF;
              c.run = [=](int, cudaStream_t s) {
                cuda::matmul_x24_experts_gate_up(t, ptr_d->get<const uint8_t*>(), 0, up, rb, S::n_ff_exp, S::n_embd,
                                                 xq.q->get<uint8_t>(), xq.scale->get<double>(), off_d->get<int32_t>(),
                                                 off_d->get<int32_t>() + E, E, group_rows, y->f(), s, form);
              };
            }
            c.keep = {pool, ptr_d, off_d, x, xq.q, xq.scale, xq.sum, y};
            return c;
          }};
}

// The chunk's grouping by expert on the GPU (every expert resident) and the MoE combine with the
// next norm.
CaseDef group_case() {
  return {fmt::format("prefill/group_by_expert {}x{} E={}", T, S::n_expert_used, S::n_expert), [] {
            Case c;
            const int E = S::n_expert, K = S::n_expert_used, n = T * K, n_groups = cuda::expert_group_bound(n, E);
            std::vector<int32_t> ids(n);
            for (int t = 0; t < T; t++)
              for (int j = 0; j < K; j++) ids[(size_t)t * K + j] = (t * 7 + j * 51) % E;  // distinct within a token
            auto ids_d = device_vector(ids);
            auto slots = device_buffer(256);
            auto residency = device_vector(std::vector<uint64_t>(E, reinterpret_cast<uint64_t>(slots->get())));
            auto gather = device_buffer(n * 4), assign = device_buffer(n * 4), ptrs = device_buffer((size_t)n_groups * 8),
                 off = device_buffer(n_groups * 4), cnt = device_buffer(n_groups * 4), distinct = device_buffer(4);
            c.bytes = n * 4.0 * 3 + E * 8.0 + n_groups * 16.0;
            c.run = [=](int, cudaStream_t s) {
              cuda::group_by_expert(ids_d->get<int32_t>(), n, K, E, residency->get<uint64_t>(), gather->get<int32_t>(),
                                    assign->get<int32_t>(), ptrs->get<const uint8_t*>(), off->get<int32_t>(),
                                    cnt->get<int32_t>(), n_groups, distinct->get<int32_t>(), s);
            };
            c.keep = {ids_d, slots, residency, gather, assign, ptrs, off, cnt, distinct};
            return c;
          }};
}

CaseDef combine_case() {
  return {fmt::format("prefill/moe_combine_norm T={} k={} {}", T, S::n_expert_used, S::n_embd), [] {
            Case c;
            const int K = S::n_expert_used, n = S::n_embd;
            auto x = device_vector(random_values((size_t)T * n, 51));
            auto y = device_vector(random_values((size_t)T * K * n, 52, 1e-3f));
            std::vector<int32_t> assign((size_t)T * K);
            for (size_t i = 0; i < assign.size(); i++) assign[i] = (int32_t)((i * 7919) % assign.size());
            auto a = device_vector(assign), wts = device_vector(std::vector<float>((size_t)T * K, 0.1f));
            auto shared = device_vector(random_values((size_t)T * n, 53, 1e-3f)), gate = device_vector(random_values(T, 54));
            auto nw = device_vector(random_values(n, 55));
            auto out = device_buffer((size_t)T * n * kF);
            c.bytes = (double)T * (K + 5) * n * kF;
            c.run = [=](int, cudaStream_t s) {
              cuda::moe_combine_norm(x->f(), y->f(), a->get<int32_t>(), wts->f(), K, shared->f(), gate->f(), T, n, nw->f(),
                                     S::rms_eps, out->f(), s);
            };
            c.keep = {x, y, a, wts, shared, gate, nw, out};
            return c;
          }};
}

// The DeltaNet block's own kernels for a chunk: conv + gates, the q/k L2 norm, the recurrence
// (its state rotating), the gated output norm.
std::vector<CaseDef> deltanet_cases() {
  const int C = S::conv_dim, K = S::conv_kernel, nk = S::ssm_k_heads, nv = S::ssm_v_heads, d = S::ssm_head_dim;
  std::vector<CaseDef> v;
  v.push_back({fmt::format("prefill/deltanet/conv_gates T={} C={}", T, C), [=] {
                 Case c;
                 auto x = device_vector(random_values((size_t)T * C, 56)), out = device_buffer((size_t)T * C * kF);
                 auto state = device_vector(random_values((size_t)(K - 1) * C, 57));
                 auto w = device_vector(random_values((size_t)C * K, 58));
                 auto ba = device_vector(random_values((size_t)T * 2 * nv, 59)), dt = device_vector(random_values(nv, 60));
                 auto a = device_vector(std::vector<float>(nv, -1.0f));
                 auto beta = device_buffer((size_t)T * nv * kF), g = device_buffer((size_t)T * nv * kF);
                 c.bytes = (2.0 * T * C + (double)C * K + 4.0 * T * nv) * kF;
                 c.run = [=](int, cudaStream_t s) {
                   cuda::deltanet_conv_gates(x->f(), C, out->f(), state->f(), w->f(), T, C, K, ba->f(), dt->f(), a->f(),
                                             beta->f(), g->f(), nk, nv, s);
                 };
                 c.keep = {x, out, state, w, ba, dt, a, beta, g};
                 return c;
               }});
  v.push_back({fmt::format("prefill/deltanet/l2_norm T={} {}x{}", T, 2 * nk, d), [=] {
                 Case c;
                 auto x = device_vector(random_values((size_t)T * C, 61));
                 c.bytes = 2.0 * T * 2 * S::key_dim * kF;
                 c.run = [=](int, cudaStream_t s) {
                   cuda::l2_norm(x->f(), T, 2 * nk, d, C, 1e-6f, (float)(1.0 / std::sqrt((double)d)), s, nk);
                 };
                 c.keep = {x};
                 return c;
               }});
  // rows_per_warp 0: the launcher's pick (2 rows a warp at dv = 128); 1: the one-row kernel.
  for (int rows_per_warp : {0, 1})
    v.push_back({fmt::format("prefill/deltanet/recurrence T={} {}x{}x{}{}", T, nv, d, d,
                             rows_per_warp ? " rows_per_warp=1" : ""), [=] {
                 Case c;
                 const size_t state_bytes = (size_t)nv * d * d * kF;
                 const std::vector<float> s0 = random_values((size_t)nv * d * d, 62, 0.05f);
                 auto st = make_copies(s0.data(), state_bytes, copies_for(state_bytes));
                 // q and k as the L2 norm leaves them (unit rows, q scaled): random rows normalised once.
                 auto qkv = device_vector(random_values((size_t)T * C, 63));
                 cuda::l2_norm(qkv->f(), T, 2 * nk, d, C, 1e-6f, (float)(1.0 / std::sqrt((double)d)), nullptr, nk);
                 auto beta = device_vector(std::vector<float>((size_t)T * nv, 0.5f));
                 auto g = device_vector(std::vector<float>((size_t)T * nv, -0.1f));
                 auto out = device_buffer((size_t)T * nv * d * kF);
                 c.copies = st->n();
                 c.bytes = 2.0 * state_bytes + (double)T * (C + nv * d + 2 * nv) * kF;
                 c.run = [=](int copy, cudaStream_t s) {
                   const float* q = qkv->f();
                   cuda::deltanet_recurrence(q, q + S::key_dim, q + 2 * S::key_dim, C, beta->f(), g->f(), st->f(copy),
                                             out->f(), T, nk, nv, d, d, s, nullptr, rows_per_warp);
                 };
                 c.keep = {st, qkv, beta, g, out};
                 return c;
               }});
  v.push_back({fmt::format("prefill/deltanet/gated_rms_norm {}x{}", T * nv, d), [=] {
                 Case c;
                 auto o = device_vector(random_values((size_t)T * nv * d, 64));
                 auto z = device_vector(random_values((size_t)T * nv * d, 65));
                 auto w = device_vector(random_values(d, 66));
                 c.bytes = 3.0 * T * nv * d * kF;
                 c.run = [=](int, cudaStream_t s) {
                   cuda::gated_rms_norm(o->f(), z->f(), w->f(), o->f(), T * nv, d, S::rms_eps, s);
                 };
                 c.keep = {o, z, w};
                 return c;
               }});
  return v;
}

// Causal attention of a chunk of T queries at positions pos0 .. pos0 + T - 1 over the KV cache
// (the chunk's own keys included); flops: q·k and the weighted values, 4·hd per query head and key.
CaseDef attention_case(int pos0) {
  return {fmt::format("prefill/attention T={} pos0={}", T, pos0), [=] {
            Case c;
            const int nh = S::n_head, nkv = S::n_kv, hd = S::head_dim, n_keys = pos0 + T;
            auto kc = device_vector(random_values((size_t)n_keys * nkv * hd, 67));
            auto vc = device_vector(random_values((size_t)n_keys * nkv * hd, 68));
            auto q = device_vector(random_values((size_t)T * nh * hd, 69));
            auto gate = device_vector(random_values((size_t)T * nh * hd, 70));
            auto out = device_buffer((size_t)T * nh * hd * kF);
            double keys = 0;
            for (int t = 0; t < T; t++) keys += pos0 + t + 1;
            c.flops = 4.0 * hd * nh * keys;
            c.bytes = 2.0 * n_keys * nkv * hd * kF + 3.0 * T * nh * hd * kF;
            c.run = [=](int, cudaStream_t s) {
              cuda::gated_attention(q->f(), gate->f(), kc->f(), vc->f(), out->f(), T, nh, nkv, hd, pos0,
                                    (float)(1.0 / std::sqrt((double)hd)), s);
            };
            c.keep = {kc, vc, q, gate, out};
            return c;
          }};
}

CaseDef attention_prep_case() {
  return {fmt::format("prefill/attention/prep T={}", T), [] {
            Case c;
            const int nh = S::n_head, nkv = S::n_kv, hd = S::head_dim;
            auto qg = device_vector(random_values((size_t)T * nh * 2 * hd, 71));
            auto k = device_vector(random_values((size_t)T * nkv * hd, 72));
            auto v = device_vector(random_values((size_t)T * nkv * hd, 73));
            auto q = device_buffer((size_t)T * nh * hd * kF), gate = device_buffer((size_t)T * nh * hd * kF);
            auto qn = device_vector(random_values(hd, 74)), kn = device_vector(random_values(hd, 75));
            auto kc = device_buffer((size_t)T * nkv * hd * kF), vc = device_buffer((size_t)T * nkv * hd * kF);
            std::vector<int32_t> pos(T);
            for (int t = 0; t < T; t++) pos[t] = t;
            auto pos_d = device_vector(pos);
            c.bytes = (double)T * (4.0 * nh * hd + 4.0 * nkv * hd) * kF;
            c.run = [=](int, cudaStream_t s) {
              cuda::attention_prep(qg->f(), k->f(), v->f(), q->f(), gate->f(), qn->f(), kn->f(), kc->f(), vc->f(), T, nh, nkv,
                                   hd, S::rms_eps, S::rope_dims, std::pow(1e7f, -2.0f / S::rope_dims), pos_d->get<int32_t>(),
                                   s);
            };
            c.keep = {qg, k, v, q, gate, qn, kn, kc, vc, pos_d};
            return c;
          }};
}

CaseDef add_norm_case() {
  return {fmt::format("prefill/norm/add_rms_norm T={} {}", T, S::n_embd), [] {
            Case c;
            const size_t n = (size_t)T * S::n_embd;
            auto x = device_vector(random_values(n, 76)), y = device_vector(random_values(n, 77, 1e-3f));
            auto w = device_vector(random_values(S::n_embd, 78));
            auto out = device_buffer(n * kF);
            c.bytes = 4.0 * n * kF;
            c.run = [=](int, cudaStream_t s) {
              cuda::add_rms_norm(x->f(), y->f(), w->f(), out->f(), T, S::n_embd, S::rms_eps, s);
            };
            c.keep = {x, y, w, out};
            return c;
          }};
}

}  // namespace

std::vector<CaseDef> prefill_cases() {
  using G = GgmlType;
  const int n = S::n_embd;
  std::vector<CaseDef> v;
  v.push_back(add_norm_case());
  // DeltaNet layers: the in projections (qkv, z: X32 in the plan; fp64 shown too), ba, out.
  v.push_back(quantize_case(true, n));
  for (Form f : {Form::kX32, Form::kX8}) {
    v.push_back(product_case("ssm_qkv", G::Q4_K, S::conv_dim, n, f));
    v.push_back(product_case("ssm_z", G::Q4_K, S::value_dim, n, f));
  }
  v.push_back(product_case("ssm_qkv", G::Q4_K, S::conv_dim, n, Form::kFp64));
  for (int tile : {0, 32, 64}) v.push_back(product_case("ssm_z", G::Q4_K, S::value_dim, n, Form::kFp64, tile));
  v.push_back(product_case("ssm_ba", G::Q8_0, 2 * S::ssm_v_heads, n, Form::kFp64));
  // A few tokens (a short prompt's chunk, a batched step) on the chunk's forms (the conversion not
  // timed), beside decode/'s matvec-q8 "xN columns" cases (the conversion timed).
  for (int few : {2, 4, 8, 16}) {
    v.push_back(product_case("ssm_in", G::Q4_K, S::conv_dim + S::value_dim, n, Form::kX8, 0, few));
    v.push_back(product_case("ssm_out", G::Q4_K, n, S::value_dim, Form::kX8, 0, few));
  }
  for (CaseDef& d : deltanet_cases()) v.push_back(std::move(d));
  v.push_back(quantize_case(true, S::value_dim));
  for (Form f : {Form::kX32, Form::kX8}) v.push_back(product_case("ssm_out", G::Q4_K, n, S::value_dim, f));
  for (int tile : {0, 32, 64}) v.push_back(product_case("ssm_out", G::Q4_K, n, S::value_dim, Form::kFp64, tile));
  // Attention layers: q (k alike at 512 rows), v, the block; the output product is ssm_out's shape.
  for (Form f : {Form::kX32, Form::kX8}) v.push_back(product_case("attn_q", G::Q4_K, 2 * S::n_head * S::head_dim, n, f));
  v.push_back(product_case("attn_k", G::Q4_K, S::n_kv * S::head_dim, n, Form::kX32));
  v.push_back(product_case("attn_v", G::Q6_K, S::n_kv * S::head_dim, n, Form::kFp64));
  v.push_back(attention_prep_case());
  for (int pos0 : {0, 4096}) v.push_back(attention_case(pos0));
  // MoE: router, grouping, the experts on X24, the shared expert, the combine.
  v.push_back(product_case("router", G::F32, S::n_expert, n, Form::kFp64));
  v.push_back(group_case());
  v.push_back(quantize_case(false, n));
  for (cuda::XForm f : {cuda::XForm::kX24, cuda::XForm::kX8}) v.push_back(experts_case(false, f));
  v.push_back(quantize_case(false, S::n_ff_exp));
  for (cuda::XForm f : {cuda::XForm::kX24, cuda::XForm::kX8}) v.push_back(experts_case(true, f));
  v.push_back(shexp_gate_up_case(G::IQ2_XXS));
  v.push_back(product_case("shexp_down", G::Q6_K, n, S::n_ff_shexp, Form::kFp64));
  v.push_back(combine_case());
  return v;
}

}  // namespace rl::bench
