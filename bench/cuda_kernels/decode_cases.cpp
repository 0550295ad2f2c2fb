// The decode token's kernels at the 80B's shapes, in forward-pass order: each launcher called as
// the forward pass calls it for one token (src/cuda/forward.cpp, moe_layer.cpp, products.cpp),
// types as the seed-mix recipe gives them.
#include <fmt/format.h>

#include <cmath>
#include <numeric>

#include "bench.h"
#include "cuda/kernels.h"

namespace rl::bench {

namespace {

using S = Shapes80B;
constexpr size_t kF = sizeof(float);

// The numeric tier a product's sums are formed in, as the case names say it.
const char* tier_name(cuda::Sums sums) { return sums == cuda::Sums::kFast ? "fast" : "exact"; }

// A decode product's numeric form: the exact tier's matvec, the fast tier's matvec-f32 or its
// matvec-q8 (fp32 sums, dp4a on the Q8 form), named "exact", "fast", "fast-q8", so that a filter
// on "fast" times both fast forms side by side.
// kMma: mma-q8 (the int8 tensor cores on the Q8 form, token columns of Q4_K / Q5_K / Q6_K), "fast-mma".
enum class Form { kExact, kFast, kQ8, kMma };
const char* form_name(Form f) {
  return f == Form::kExact ? "exact" : f == Form::kFast ? "fast" : f == Form::kQ8 ? "fast-q8" : "fast-mma";
}
cuda::Sums sums_of(Form f) { return f == Form::kExact ? cuda::Sums::kExact : cuda::Sums::kFast; }

// The Q8 form of `rows` inputs of `cols` values. A fast-q8 case converts its input in every run,
// as the forward pass converts a product's input (decode/quantize_q8 times the conversion alone).
struct Q8Input {
  std::shared_ptr<cuda::DeviceBuffer> q, ds;
  Q8Input(size_t rows, size_t cols)
      : q(device_buffer(rows * cols)), ds(device_buffer(rows * (cols / 32) * sizeof(float2))) {}
  void convert(const float* x, int rows, int cols, cudaStream_t s) const {
    cuda::quantize_q8(x, rows, cols, values(), scales(), s);
  }
  int8_t* values() const { return q->get<int8_t>(); }
  float2* scales() const { return ds->get<float2>(); }
};

// The decode products of one launch (matvec_jobs): matrices of type t and width cols with the
// given row counts, as project_group makes them (one job each, a shared input). columns > 1
// (matvec-q8, and matvec-f32 of F32 weights: matvec_f32_columns): that many token columns in one
// call, as a batched decode step takes them.
CaseDef matvec_case(const std::string& what, GgmlType t, int cols, std::vector<int> rows, Form form, int columns = 1) {
  std::string shape;
  for (int r : rows) shape += fmt::format("{}{}", shape.empty() ? "" : "+", r);
  const std::string batch = columns > 1 ? fmt::format(" x{} columns", columns) : "";
  return {fmt::format("decode/matvec/{} {} {}->{} {}{}", what, type_name(t), cols, shape, form_name(form), batch), [=] {
            Case c;
            Image img;
            std::vector<size_t> off;
            for (size_t i = 0; i < rows.size(); i++) off.push_back(img.add(random_weights(t, rows[i], cols, 11 + i)));
            const int n_rows = std::accumulate(rows.begin(), rows.end(), 0);
            auto w = make_copies(img.bytes.data(), img.bytes.size(), copies_for(img.bytes.size()));
            auto x = device_vector(random_values((size_t)columns * cols, 1));
            auto y = device_buffer((size_t)columns * n_rows * kF);
            const Q8Input xq(columns, cols);
            c.copies = w->n();
            c.bytes = (double)row_size(t, cols) * n_rows + (double)columns * (cols + n_rows) * kF;
            c.run = [=](int copy, cudaStream_t s) {
              if (form == Form::kQ8 || form == Form::kMma) xq.convert(x->f(), columns, cols, s);
              std::vector<cuda::MatvecJob> jobs(rows.size());
              float* out = y->f();
              for (size_t i = 0; i < rows.size(); i++) {
                jobs[i].w = w->at(copy) + off[i];
                jobs[i].row_bytes = row_size(t, cols);
                jobs[i].rows = rows[i];
                jobs[i].x = x->f();
                jobs[i].xq = xq.values(), jobs[i].xds = xq.scales();
                jobs[i].y = out;
                jobs[i].y_stride = n_rows;
                out += rows[i];
              }
              if (form == Form::kQ8)
                cuda::matvec_q8_jobs(t, cols, jobs.data(), (int)jobs.size(), s, columns);
              else if (form == Form::kMma)
                cuda::matmul_q8_jobs(t, cols, jobs.data(), (int)jobs.size(), s, columns);
              else if (columns > 1)
                cuda::matvec_f32_columns(cols, jobs.data(), (int)jobs.size(), columns, s);
              else
                cuda::matvec_jobs(t, cols, jobs.data(), (int)jobs.size(), s, sums_of(form));
            };
            c.keep = {w, x, y, xq.q, xq.ds};
            return c;
          }};
}

// The shared expert's gate/up pair in one launch (matvec_gate_up); columns > 1 (matvec-q8 only):
// that many token columns, as a batched decode step takes them.
CaseDef gate_up_case(GgmlType t, Form form, int columns = 1) {
  return {fmt::format("decode/matvec/shexp_gate_up {} {}->{}x2 {}", type_name(t), S::n_embd, S::n_ff_shexp,
                      form_name(form)) + (columns > 1 ? fmt::format(" x{} columns", columns) : ""),
          [=] {
            Case c;
            Image img;
            const size_t g = img.add(random_weights(t, S::n_ff_shexp, S::n_embd, 21));
            const size_t u = img.add(random_weights(t, S::n_ff_shexp, S::n_embd, 22));
            auto w = make_copies(img.bytes.data(), img.bytes.size(), copies_for(img.bytes.size()));
            auto x = device_vector(random_values((size_t)columns * S::n_embd, 2));
            auto act = device_buffer((size_t)columns * S::n_ff_shexp * kF);
            const Q8Input xq(columns, S::n_embd);
            c.copies = w->n();
            c.bytes = 2.0 * row_size(t, S::n_embd) * S::n_ff_shexp + (double)columns * (S::n_embd + S::n_ff_shexp) * kF;
            c.run = [=](int copy, cudaStream_t s) {
              cuda::GateUpJob j;
              j.gate = w->at(copy) + g;
              j.up = w->at(copy) + u;
              j.row_bytes_gate = j.row_bytes_up = row_size(t, S::n_embd);
              j.rows = S::n_ff_shexp;
              j.x = x->f();
              j.act = act->f();
              if (form == Form::kQ8) {
                xq.convert(x->f(), columns, S::n_embd, s);
                j.xq = xq.values(), j.xds = xq.scales();
                cuda::matvec_q8_gate_up(t, S::n_embd, &j, 1, s, columns);
              } else {
                cuda::matvec_gate_up(t, S::n_embd, &j, 1, s, sums_of(form));
              }
            };
            c.keep = {w, x, act, xq.q, xq.ds};
            return c;
          }};
}

// One routed expert's slot as the cache lays it out (gate, up, down) and the offsets.
struct ExpertSlot {
  Image img;
  size_t up = 0, down = 0;
};
ExpertSlot expert_slot(GgmlType gate_up, GgmlType down) {
  ExpertSlot e;
  e.img.add(random_weights(gate_up, S::n_ff_exp, S::n_embd, 31));
  e.up = e.img.add(random_weights(gate_up, S::n_ff_exp, S::n_embd, 32));
  e.down = e.img.add(random_weights(down, S::n_embd, S::n_ff_exp, 33));
  return e;
}

// The ten selected experts' products of a decode token through their slot pointers: gate/up with
// SwiGLU in one launch, or down. Each copy is another ten slots. tokens > 1 (matvec-q8): a short
// pass's (token, selection) pairs, tokens × 10 experts each on its own input row, as
// Products::expert_pairs runs them.
CaseDef experts_case(GgmlType gate_up, GgmlType down, bool down_product, Form form, int tokens = 1) {
  const GgmlType t = down_product ? down : gate_up;
  const int K = S::n_expert_used * tokens;
  const std::string name =
      down_product ? fmt::format("decode/experts/down {} {}->{} x{} {}", type_name(t), S::n_ff_exp, S::n_embd,
                                 K, form_name(form))
                   : fmt::format("decode/experts/gate_up {} {}->{}x2 x{} {}", type_name(t), S::n_embd, S::n_ff_exp,
                                 K, form_name(form));
  return {name, [=] {
            Case c;
            const ExpertSlot slot = expert_slot(gate_up, down);
            const size_t slot_bytes = slot.img.bytes.size(), up_off = slot.up, down_off = slot.down;
            const int copies = copies_for(slot_bytes * K);
            auto pool = make_copies(slot.img.bytes.data(), slot_bytes, copies * K);
            std::vector<const uint8_t*> ptrs((size_t)copies * K);
            for (int i = 0; i < copies * K; i++) ptrs[i] = pool->at(i);
            auto ptr_d = device_vector(ptrs);
            auto x = device_vector(random_values((size_t)K * std::max(S::n_ff_exp, S::n_embd), 3, 0.1f));
            auto act = device_buffer((size_t)K * S::n_ff_exp * kF);
            auto scratch = device_buffer((size_t)K * S::n_ff_exp * kF);
            auto y = device_buffer((size_t)K * S::n_embd * kF);
            // down: K rows of n_ff_exp; gate/up: one row of n_embd (within those), or a row a pair
            const Q8Input xq((size_t)K, tokens > 1 ? S::n_embd : S::n_ff_exp);
            c.copies = copies;
            const size_t rb_gu = row_size(gate_up, S::n_embd), rb_d = row_size(down, S::n_ff_exp);
            if (down_product) {
              c.bytes = (double)K * (rb_d * S::n_embd + (S::n_ff_exp + S::n_embd) * kF);
              c.run = [=](int copy, cudaStream_t s) {
                const uint8_t* const* slots = ptr_d->get<const uint8_t*>() + (size_t)copy * K;
                if (form == Form::kQ8) {
                  xq.convert(x->f(), K, S::n_ff_exp, s);
                  cuda::matvec_q8_experts(down, slots, down_off, rb_d, S::n_embd, S::n_ff_exp, xq.values(),
                                          xq.scales(), 1, y->f(), K, s);
                } else {
                  cuda::matvec_experts(down, slots, down_off, rb_d, S::n_embd, S::n_ff_exp, x->f(), S::n_ff_exp,
                                       y->f(), K, s, sums_of(form));
                }
              };
            } else {
              const int x_rows = tokens > 1 ? K : 1;
              c.bytes = (double)K * (2.0 * rb_gu * S::n_ff_exp + S::n_ff_exp * kF) + (double)x_rows * S::n_embd * kF;
              c.run = [=](int copy, cudaStream_t s) {
                const uint8_t* const* slots = ptr_d->get<const uint8_t*>() + (size_t)copy * K;
                if (form == Form::kQ8) {
                  xq.convert(x->f(), x_rows, S::n_embd, s);
                  cuda::matvec_q8_experts_gate_up(gate_up, gate_up, slots, up_off, rb_gu, rb_gu, S::n_ff_exp,
                                                  S::n_embd, xq.values(), xq.scales(), act->f(), scratch->f(), K, s,
                                                  tokens > 1 ? 1 : 0);
                } else {
                  cuda::matvec_experts_gate_up(gate_up, gate_up, slots, up_off, rb_gu, rb_gu, S::n_ff_exp, S::n_embd,
                                               x->f(), act->f(), scratch->f(), K, s, sums_of(form));
                }
              };
            }
            c.keep = {pool, ptr_d, x, act, scratch, y, xq.q, xq.ds};
            return c;
          }};
}

// The GPU-routed token's top-k over the router logits, slots from a residency row.
CaseDef route_case(cuda::Sums sums) {
  return {fmt::format("decode/route_topk E={} k={} {}", S::n_expert, S::n_expert_used, tier_name(sums)), [=] {
            Case c;
            const int E = S::n_expert, K = S::n_expert_used;
            auto logits = device_vector(random_values(E, 4));
            auto slots = device_buffer(256);
            std::vector<uint64_t> row(E, reinterpret_cast<uint64_t>(slots->get()));
            auto residency = device_vector(row);
            auto ids = device_buffer(K * 4), weights = device_buffer(K * kF), ptrs = device_buffer(K * 8),
                 miss = device_buffer(4);
            c.bytes = E * (kF + 8.0) + K * (4 + kF + 8.0);
            c.run = [=](int, cudaStream_t s) {
              cuda::route_topk(logits->f(), E, K, 0.0f, residency->get<uint64_t>(), slots->get<uint8_t>(),
                               ids->get<int32_t>(), weights->f(), ptrs->get<const uint8_t*>(), miss->get<int32_t>(), s,
                               sums);
            };
            c.keep = {logits, slots, residency, ids, weights, ptrs, miss};
            return c;
          }};
}

// The norms of a token: the first layer's RMSNorm, the residual add fused with the next norm, and
// the MoE combine fused with the next layer's input norm.
std::vector<CaseDef> norm_cases() {
  std::vector<CaseDef> v;
  v.push_back({fmt::format("decode/norm/rms_norm {}", S::n_embd), [] {
                 Case c;
                 auto x = device_vector(random_values(S::n_embd, 5)), w = device_vector(random_values(S::n_embd, 6));
                 auto out = device_buffer(S::n_embd * kF);
                 c.bytes = 3.0 * S::n_embd * kF;
                 c.run = [=](int, cudaStream_t s) { cuda::rms_norm(x->f(), w->f(), out->f(), 1, S::n_embd, S::rms_eps, s); };
                 c.keep = {x, w, out};
                 return c;
               }});
  v.push_back({fmt::format("decode/norm/add_rms_norm {}", S::n_embd), [] {
                 Case c;
                 auto x = device_vector(random_values(S::n_embd, 5)), y = device_vector(random_values(S::n_embd, 7, 1e-3f));
                 auto w = device_vector(random_values(S::n_embd, 6));
                 auto out = device_buffer(S::n_embd * kF);
                 c.bytes = 5.0 * S::n_embd * kF;
                 c.run = [=](int, cudaStream_t s) {
                   cuda::add_rms_norm(x->f(), y->f(), w->f(), out->f(), 1, S::n_embd, S::rms_eps, s);
                 };
                 c.keep = {x, y, w, out};
                 return c;
               }});
  v.push_back({fmt::format("decode/moe_combine_norm k={} {}", S::n_expert_used, S::n_embd), [] {
                 Case c;
                 const int K = S::n_expert_used, n = S::n_embd;
                 auto x = device_vector(random_values(n, 5)), y = device_vector(random_values((size_t)K * n, 8, 1e-3f));
                 std::vector<int32_t> assign(K);
                 std::iota(assign.begin(), assign.end(), 0);
                 auto a = device_vector(assign), wts = device_vector(std::vector<float>(K, 0.1f));
                 auto shared = device_vector(random_values(n, 9, 1e-3f)), gate = device_vector(random_values(1, 10));
                 auto nw = device_vector(random_values(n, 6));
                 auto out = device_buffer(n * kF);
                 c.bytes = (K + 5.0) * n * kF;
                 c.run = [=](int, cudaStream_t s) {
                   cuda::moe_combine_norm(x->f(), y->f(), a->get<int32_t>(), wts->f(), K, shared->f(), gate->f(), 1, n,
                                          nw->f(), S::rms_eps, out->f(), s);
                 };
                 c.keep = {x, y, a, wts, shared, gate, nw, out};
                 return c;
               }});
  return v;
}

// The DeltaNet block's own kernels for a token: conv + gates, the recurrence with the fused L2
// norm (its state copies rotate: 2 MiB a layer), the gated output norm.
std::vector<CaseDef> deltanet_cases() {
  std::vector<CaseDef> v;
  const int C = S::conv_dim, K = S::conv_kernel, nk = S::ssm_k_heads, nv = S::ssm_v_heads, d = S::ssm_head_dim;
  v.push_back({fmt::format("decode/deltanet/conv_gates C={} K={}", C, K), [=] {
                 Case c;
                 auto x = device_vector(random_values(C, 12)), out = device_buffer(C * kF);
                 auto state = device_vector(random_values((size_t)(K - 1) * C, 13)), w = device_vector(random_values((size_t)C * K, 14));
                 auto ba = device_vector(random_values(2 * nv, 15)), dt = device_vector(random_values(nv, 16));
                 auto a = device_vector(std::vector<float>(nv, -1.0f));
                 auto beta = device_buffer(nv * kF), g = device_buffer(nv * kF);
                 c.bytes = (2.0 * C + 2.0 * (K - 1) * C + (double)C * K + 6 * nv) * kF;
                 c.run = [=](int, cudaStream_t s) {
                   cuda::deltanet_conv_gates(x->f(), C, out->f(), state->f(), w->f(), 1, C, K, ba->f(), dt->f(), a->f(),
                                             beta->f(), g->f(), nk, nv, s);
                 };
                 c.keep = {x, out, state, w, ba, dt, a, beta, g};
                 return c;
               }});
  v.push_back({fmt::format("decode/deltanet/recurrence+l2norm {}x{}x{}", nv, d, d), [=] {
                 Case c;
                 const size_t state_bytes = (size_t)nv * d * d * kF;
                 const std::vector<float> s0 = random_values((size_t)nv * d * d, 17, 0.05f);
                 auto st = make_copies(s0.data(), state_bytes, copies_for(state_bytes));
                 auto qkv = device_vector(random_values(C, 18));
                 auto beta = device_vector(std::vector<float>(nv, 0.5f)), g = device_vector(std::vector<float>(nv, -0.1f));
                 auto out = device_buffer((size_t)nv * d * kF);
                 c.copies = st->n();
                 c.bytes = 2.0 * state_bytes + (C + nv * d + 2 * nv) * kF;
                 c.run = [=](int copy, cudaStream_t s) {
                   const cuda::L2Norm norm{1e-6f, (float)(1.0 / std::sqrt((double)d))};
                   const float* q = qkv->f();
                   cuda::deltanet_recurrence(q, q + S::key_dim, q + 2 * S::key_dim, C, beta->f(), g->f(), st->f(copy),
                                             out->f(), 1, nk, nv, d, d, s, &norm);
                 };
                 c.keep = {st, qkv, beta, g, out};
                 return c;
               }});
  v.push_back({fmt::format("decode/deltanet/gated_rms_norm {}x{}", nv, d), [=] {
                 Case c;
                 auto o = device_vector(random_values((size_t)nv * d, 19)), z = device_vector(random_values((size_t)nv * d, 20));
                 auto w = device_vector(random_values(d, 21));
                 c.bytes = 3.0 * nv * d * kF;
                 c.run = [=](int, cudaStream_t s) { cuda::gated_rms_norm(o->f(), z->f(), w->f(), o->f(), nv, d, S::rms_eps, s); };
                 c.keep = {o, z, w};
                 return c;
               }});
  return v;
}

// The attention block's kernels for a token: the fused prep (split, norms, rope, KV store) and
// the split attention over `depth` earlier positions (the decode graph's form: position read from
// device memory, split buffers of a 32k-token session). Each copy is another layer's KV cache.
constexpr int kDecodeContext = 32769;
CaseDef attention_prep_case() {
  return {"decode/attention/prep", [] {
            Case c;
            const int nh = S::n_head, nkv = S::n_kv, hd = S::head_dim;
            auto qg = device_vector(random_values((size_t)nh * 2 * hd, 22));
            auto k = device_vector(random_values((size_t)nkv * hd, 23)), v = device_vector(random_values((size_t)nkv * hd, 24));
            auto q = device_buffer((size_t)nh * hd * kF), gate = device_buffer((size_t)nh * hd * kF);
            auto qn = device_vector(random_values(hd, 25)), kn = device_vector(random_values(hd, 26));
            auto kc = device_buffer(256 * (size_t)nkv * hd * kF), vc = device_buffer(256 * (size_t)nkv * hd * kF);
            auto pos = device_vector(std::vector<int32_t>{100});
            c.bytes = (4.0 * nh * hd + 4.0 * nkv * hd) * kF;
            c.run = [=](int, cudaStream_t s) {
              cuda::attention_prep(qg->f(), k->f(), v->f(), q->f(), gate->f(), qn->f(), kn->f(), kc->f(), vc->f(), 1, nh, nkv,
                                   hd, S::rms_eps, S::rope_dims, std::pow(1e7f, -2.0f / S::rope_dims), pos->get<int32_t>(), s);
            };
            c.keep = {qg, k, v, q, gate, qn, kn, kc, vc, pos};
            return c;
          }};
}

CaseDef attention_decode_case(int depth) {
  return {fmt::format("decode/attention/split depth={}", depth), [=] {
            Case c;
            const int nh = S::n_head, nkv = S::n_kv, hd = S::head_dim;
            const size_t kv_bytes = (size_t)(depth + 1) * nkv * hd * kF;
            const std::vector<float> kv0 = random_values((size_t)(depth + 1) * nkv * hd, 27);
            const int copies = copies_for(2 * kv_bytes);
            auto kc = make_copies(kv0.data(), kv_bytes, copies), vc = make_copies(kv0.data(), kv_bytes, copies);
            auto q = device_vector(random_values((size_t)nh * hd, 28)), gate = device_vector(random_values((size_t)nh * hd, 29));
            auto out = device_buffer((size_t)nh * hd * kF);
            auto pos = device_vector(std::vector<int32_t>{depth});
            auto split_store = device_buffer(cuda::AttentionSplits::bytes(kDecodeContext, nh, hd));
            c.copies = copies;
            c.launches = 3;
            c.bytes = 2.0 * kv_bytes + 3.0 * nh * hd * kF;
            c.run = [=](int copy, cudaStream_t s) {
              const cuda::AttentionSplits sp = cuda::AttentionSplits::within(split_store->get(), kDecodeContext, nh, hd);
              cuda::gated_attention(q->f(), gate->f(), kc->f(copy), vc->f(copy), out->f(), 1, nh, nkv, hd, 0,
                                    (float)(1.0 / std::sqrt((double)hd)), s, pos->get<int32_t>(), &sp);
            };
            c.keep = {kc, vc, q, gate, out, pos, split_store};
            return c;
          }};
}

// The token's embedding row (get_rows of the Q4_K token_embd).
CaseDef embed_case() {
  const GgmlType t = GgmlType::Q4_K;
  return {fmt::format("decode/get_rows {} {}", type_name(t), S::n_embd), [=] {
            Case c;
            auto w = device_vector(random_weights(t, 4096, S::n_embd, 30));
            auto id = device_vector(std::vector<int32_t>{1234});
            auto out = device_buffer(S::n_embd * kF);
            c.bytes = (double)row_size(t, S::n_embd) + S::n_embd * kF;
            c.run = [=](int, cudaStream_t s) {
              cuda::get_rows(t, w->get(), row_size(t, S::n_embd), S::n_embd, id->get<int32_t>(), 1, out->f(), s);
            };
            c.keep = {w, id, out};
            return c;
          }};
}

// The Q8 conversion alone (quantize_q8): one input of n_embd (h, h2), or the ten experts' SwiGLU
// outputs.
CaseDef quantize_q8_case(int cols, int rows) {
  return {fmt::format("decode/quantize_q8 {}x{}", rows, cols), [=] {
            Case c;
            auto x = device_vector(random_values((size_t)rows * cols, 7));
            const Q8Input xq((size_t)rows, (size_t)cols);
            c.bytes = (double)rows * cols * (kF + 1) + rows * (cols / 32) * sizeof(float2);
            c.run = [=](int, cudaStream_t s) { xq.convert(x->f(), rows, cols, s); };
            c.keep = {x, xq.q, xq.ds};
            return c;
          }};
}

}  // namespace

std::vector<CaseDef> decode_cases() {
  using G = GgmlType;
  const int n = S::n_embd;
  std::vector<CaseDef> v;
  v.push_back(embed_case());
  for (CaseDef& d : norm_cases()) v.push_back(std::move(d));
  for (Form form : {Form::kExact, Form::kFast, Form::kQ8}) {
    const bool q8 = form == Form::kQ8;  // the F32 router and the top-k have no Q8 form
    // DeltaNet layers (36 of 48): in projections (qkv and z in one launch, ba), out.
    v.push_back(matvec_case("ssm_in", G::Q4_K, n, {S::conv_dim, S::value_dim}, form));
    v.push_back(matvec_case("ssm_ba", G::Q8_0, n, {2 * S::ssm_v_heads}, form));
    v.push_back(matvec_case("ssm_out", G::Q4_K, S::value_dim, {n}, form));
    // Attention layers (12 of 48): q and k in one launch, v, output.
    v.push_back(matvec_case("attn_qk", G::Q4_K, n, {2 * S::n_head * S::head_dim, S::n_kv * S::head_dim}, form));
    v.push_back(matvec_case("attn_v", G::Q6_K, n, {S::n_kv * S::head_dim}, form));
    v.push_back(matvec_case("attn_output", G::Q4_K, S::n_head * S::head_dim, {n}, form));
    // Every layer's MoE: router with the shared expert's gate scalar, top-k, experts, shared expert.
    if (!q8) v.push_back(matvec_case("router+shexp_gate_inp", G::F32, n, {S::n_expert, 1}, form));
    if (!q8) v.push_back(route_case(sums_of(form)));
    v.push_back(experts_case(G::IQ2_XS, G::IQ2_XS, false, form));
    v.push_back(experts_case(G::IQ1_M, G::IQ2_XS, false, form));
    v.push_back(experts_case(G::IQ2_XS, G::IQ2_XS, true, form));
    // IQ2_XXS experts (real IQ2_XXS files, fixture model A) for comparison.
    v.push_back(experts_case(G::IQ2_XXS, G::IQ2_XXS, false, form));
    v.push_back(experts_case(G::IQ2_XXS, G::IQ2_XXS, true, form));
    v.push_back(gate_up_case(G::IQ2_XXS, form));
    v.push_back(matvec_case("shexp_down", G::Q6_K, S::n_ff_shexp, {n}, form));
    v.push_back(matvec_case("lm_head", G::Q5_K, n, {S::n_vocab}, form));
  }
  // A batched decode step's dense products: each matrix read once for its token columns.
  for (int columns : {2, 4, 8, 16}) {
    v.push_back(matvec_case("ssm_in", G::Q4_K, n, {S::conv_dim, S::value_dim}, Form::kQ8, columns));
    v.push_back(matvec_case("ssm_out", G::Q4_K, S::value_dim, {n}, Form::kQ8, columns));
    v.push_back(matvec_case("attn_qk", G::Q4_K, n, {2 * S::n_head * S::head_dim, S::n_kv * S::head_dim}, Form::kQ8,
                            columns));
    v.push_back(matvec_case("shexp_down", G::Q6_K, S::n_ff_shexp, {n}, Form::kQ8, columns));
    v.push_back(matvec_case("lm_head", G::Q5_K, n, {S::n_vocab}, Form::kQ8, columns));
    // The same Q4_K / Q5_K / Q6_K products on mma-q8.
    v.push_back(matvec_case("ssm_in", G::Q4_K, n, {S::conv_dim, S::value_dim}, Form::kMma, columns));
    v.push_back(matvec_case("ssm_out", G::Q4_K, S::value_dim, {n}, Form::kMma, columns));
    v.push_back(matvec_case("attn_qk", G::Q4_K, n, {2 * S::n_head * S::head_dim, S::n_kv * S::head_dim}, Form::kMma,
                            columns));
    v.push_back(matvec_case("lm_head", G::Q5_K, n, {S::n_vocab}, Form::kMma, columns));
    v.push_back(matvec_case("shexp_down", G::Q6_K, S::n_ff_shexp, {n}, Form::kMma, columns));
    v.push_back(matvec_case("router+shexp_gate_inp", G::F32, n, {S::n_expert, 1}, Form::kFast, columns));
    v.push_back(gate_up_case(G::IQ2_XXS, Form::kQ8, columns));
  }
  // Batched steps of 4 and 16 sessions: their 40 and 160 (token, selection) pairs on the decode
  // kernels (a launch takes kMaxMatvecJobs of them).
  for (int tokens : {4, 16}) {
    v.push_back(experts_case(G::IQ2_XS, G::IQ2_XS, false, Form::kQ8, tokens));
    v.push_back(experts_case(G::IQ2_XS, G::IQ2_XS, true, Form::kQ8, tokens));
  }
  v.push_back(quantize_q8_case(n, 1));
  v.push_back(quantize_q8_case(S::n_ff_exp, S::n_expert_used));
  for (CaseDef& d : deltanet_cases()) v.push_back(std::move(d));
  v.push_back(attention_prep_case());
  for (int depth : {0, 4096, 32768}) v.push_back(attention_decode_case(depth));
  return v;
}

}  // namespace rl::bench
