#include "cuda/products.h"

#include <algorithm>

#include "common/error.h"
#include "cuda/kernels.h"

namespace rl::cuda {

namespace {
Sums sums_of(Kernel k) { return k == Kernel::kMatvecF32 ? Sums::kFast : Sums::kExact; }
// A launch of Q8 jobs on T token columns by kernel k.
void q8_launch(Kernel k, GgmlType t, int cols, const MatvecJob* jobs, int n, cudaStream_t s, int T) {
  if (k == Kernel::kMatmulQ8)
    matmul_q8_jobs(t, cols, jobs, n, s, T);
  else
    matvec_q8_jobs(t, cols, jobs, n, s, T);
}
}  // namespace

void Products::convert_q8(const float* x, int T, int cols) {
  if (T < 1 || T > q8_scratch_.rows)
    fail("Products: matvec-q8 of {} token columns, its input buffer holds {}", T, q8_scratch_.rows);
  quantize_q8(x, T, cols, q8_scratch_.values(), q8_scratch_.scales(), stream_);
  q8_held_ = nullptr;
}

void Products::convert_moe_input_q8(const float* h2, int T) {
  if (T < 1 || T > ws_.q8_moe_input.rows)
    fail("Products: the MoE input's Q8 form of {} tokens, its buffer holds {}", T, ws_.q8_moe_input.rows);
  quantize_q8(h2, T, c_.n_embd, ws_.q8_moe_input.values(), ws_.q8_moe_input.scales(), stream_);
}

namespace {
// The job of token column t of y [T][w.rows] = x [T][w.cols] · wᵀ.
MatvecJob column_job(const DMat& w, const float* x, float* y, int t) {
  MatvecJob j;
  j.w = w.data;
  j.row_bytes = w.row_bytes;
  j.rows = w.rows;
  j.x = x + (size_t)t * w.cols;
  j.y = y + (size_t)t * w.rows;
  return j;
}
// A matvec-f32 product of F32 weights on 2 or more token columns (the routers and shared gates of
// a batched step): matvec_f32_columns, one job for the T columns, the matrix read once.
bool on_f32_columns(const DMat& w, Kernel k, const float* x, int T) {
  return k == Kernel::kMatvecF32 && w.type == GgmlType::F32 && T >= 2 &&
         f32_columns_supported(column_job(w, x, nullptr, 0), w.cols);
}
// A decode job (MatvecJob, GateUpJob) on the Q8 form held in `rows`.
template <class Job>
void read_q8(Job& j, const Q8Rows& rows) {
  j.xq = rows.values(), j.xds = rows.scales();
}
}  // namespace

void Products::project(const DMat& w, Kernel k, const float* x, int T, float* y, KqHeld* held) {
  if (reads_q8_form(k)) {  // y [T][rows]
    MatvecJob j = column_job(w, x, y, 0);  // the kernel writes the T columns
    if (x == q8_held_) {  // a kernel wrote its Q8 form (hold_q8)
      read_q8(j, q8_scratch_);
    } else if (k == Kernel::kMatvecQ8 && q8_f32_input_fits(w.cols, T)) {
      // x as it is (j.x): the product's blocks quantise it (a shared expert's down)
    } else {
      convert_q8(x, T, w.cols);
      read_q8(j, q8_scratch_);
    }
    q8_held_ = nullptr;
    q8_launch(k, w.type, w.cols, &j, 1, stream_, T);
  } else if (is_matvec(k)) {  // a job a token column (matvec_jobs splits a long list into launches)
    if (T > kQ8PassTokens) fail("Products::project: a decode product on {} token columns, at most {}", T, kQ8PassTokens);
    if (on_f32_columns(w, k, x, T)) {
      const MatvecJob j = column_job(w, x, y, 0);
      matvec_f32_columns(w.cols, &j, 1, T, stream_);
      return;
    }
    MatvecJob jobs[kQ8PassTokens];
    for (int t = 0; t < T; t++) jobs[t] = column_job(w, x, y, t);
    matvec_jobs(w.type, w.cols, jobs, T, stream_, sums_of(k));
  } else if (is_x32(k)) {
    const XForm form = x32_form_of(k);
    if (!held || held->x != x || held->cols != w.cols || held->form != form) {
      quantize_x32(x, T, w.cols, ws_.dense_input_x32.q.get<uint8_t>(), ws_.dense_input_x32.scale.get<double>(),
                   ws_.dense_input_x32.sum.get<double>(), stream_, form);
      if (held) *held = {x, w.cols, form};
    }
    matmul_x32(w.type, w.data, w.row_bytes, w.rows, w.cols, ws_.dense_input_x32.q.get<uint8_t>(),
               ws_.dense_input_x32.scale.get<double>(), ws_.dense_input_x32.sum.get<double>(), T, y, stream_, form);
    (*x32_count_)++;
  } else if (k == Kernel::kMatmulBf16) {
    // Split over the columns where the grid is small (the layer stream's launcher: its scratch).
    float* scratch = split_k_ ? ws_.split_k.f() : nullptr;
    matmul_bf16(w.type, w.data, w.row_bytes, w.rows, w.cols, x, T, y, stream_, 0, scratch,
                scratch ? ws_.split_k.bytes() / sizeof(float) : 0);
  } else {
    matmul(w.type, w.data, w.row_bytes, w.rows, w.cols, x, T, y, stream_);
  }
  // An output written over the converted input makes the conversion stale.
  if (held && held->x && y < held->x + (size_t)T * held->cols && held->x < y + (size_t)T * w.rows) *held = {};
}

void Products::project_group(std::initializer_list<Projection> list, int T, const float* moe_input) {
  // On the decode kernels (matvec-q8 on T token columns, matvec a job a column) consecutive
  // products of one type, width and kernel share a launch; other kernels take a launch a product.
  const bool decode_kernels = T <= q8_scratch_.rows && std::all_of(list.begin(), list.end(), [](const Projection& p) {
    return reads_q8_form(p.kernel) || is_matvec(p.kernel);
  });
  if (!decode_kernels) {
    KqHeld held;
    for (const Projection& p : list) project(*p.w, p.kernel, p.x, T, p.y, &held);
    return;
  }
  if (moe_input && T > ws_.q8_moe_input.rows)
    fail("project_group: the MoE input's Q8 form holds {} tokens, not {}", ws_.q8_moe_input.rows, T);
  // A group holds a mixer's few input products, so the storage is fixed (no allocation a call on
  // the synchronous path).
  constexpr size_t kMaxGroup = 4;
  if (list.size() > kMaxGroup) fail("project_group: {} products in one group, at most {}", list.size(), kMaxGroup);
  struct Launch {
    const Projection* first = nullptr;
    MatvecJob jobs[kMaxGroup * kQ8PassTokens];  // matvec-f32: a job a product and token column
    int n = 0;
    bool f32_columns = false;  // matvec-f32 on F32 weights: a job a product, on T columns
  };
  Launch launches[kMaxGroup];
  size_t n_launches = 0;
  const float* converted = nullptr;  // the input held in q8_scratch_
  for (const Projection& p : list) {
    const Projection* f = n_launches ? launches[n_launches - 1].first : nullptr;
    const bool f32_columns = on_f32_columns(*p.w, p.kernel, p.x, T);
    if (!f || p.w->type != f->w->type || p.w->cols != f->w->cols || p.kernel != f->kernel ||
        f32_columns != launches[n_launches - 1].f32_columns) {
      launches[n_launches].first = &p;
      launches[n_launches++].f32_columns = f32_columns;
    }
    Launch& l = launches[n_launches - 1];
    if (f32_columns) {
      l.jobs[l.n++] = column_job(*p.w, p.x, p.y, 0);
      continue;
    }
    if (!reads_q8_form(p.kernel)) {
      for (int t = 0; t < T; t++) l.jobs[l.n++] = column_job(*p.w, p.x, p.y, t);
      continue;
    }
    MatvecJob j = column_job(*p.w, p.x, p.y, 0);  // y [T][rows]: the kernel writes the T columns
    if (p.x == moe_input) {  // converted on this stream, before the side branch forks
      read_q8(j, ws_.q8_moe_input);
    } else {
      if (converted && converted != p.x) fail("project_group: matvec-q8 products of two inputs in one group");
      if (!converted && p.x == q8_held_) converted = p.x;  // a kernel wrote its Q8 form (hold_q8)
      if (!converted) convert_q8(p.x, T, p.w->cols), converted = p.x;
      read_q8(j, q8_scratch_);
    }
    l.jobs[l.n++] = j;
  }
  q8_held_ = nullptr;  // read by this group, or stale after it
  const bool branch = n_launches > 1 && side_;
  if (branch) side_->fork_side();  // where the inputs are ready
  for (size_t i = 0; i < n_launches; i++) {
    const Launch& l = launches[i];
    const cudaStream_t s = branch && i > 0 ? side_->side : stream_;
    if (reads_q8_form(l.first->kernel))
      q8_launch(l.first->kernel, l.first->w->type, l.first->w->cols, l.jobs, l.n, s, T);
    else if (l.f32_columns)
      matvec_f32_columns(l.first->w->cols, l.jobs, l.n, T, s);
    else
      matvec_jobs(l.first->w->type, l.first->w->cols, l.jobs, l.n, s, sums_of(l.first->kernel));
  }
  if (branch) {
    side_->end_side();
    side_->join_side();
  }
}

void Products::project_gate_up(const DMat& gate, const DMat& up, const PairPlan& plan, const float* x, int T,
                               float* act, float* up_out, bool x_in_moe_input) {
  if (plan.fused && (is_matvec(plan.gate) || plan.gate == Kernel::kMatvecQ8)) {
    GateUpJob j;
    j.gate = gate.data;
    j.up = up.data;
    j.row_bytes_gate = gate.row_bytes;
    j.row_bytes_up = up.row_bytes;
    j.rows = gate.rows;
    j.x = x;
    j.act = act;
    if (plan.gate != Kernel::kMatvecQ8) {
      matvec_gate_up(gate.type, gate.cols, &j, 1, stream_, sums_of(plan.gate));
      return;
    }
    if (x_in_moe_input && T > ws_.q8_moe_input.rows)
      fail("Products::project_gate_up: the MoE input's Q8 form holds {} tokens, not {}", ws_.q8_moe_input.rows, T);
    if (!x_in_moe_input) convert_q8(x, T, gate.cols);
    read_q8(j, x_in_moe_input ? ws_.q8_moe_input : q8_scratch_);
    matvec_q8_gate_up(gate.type, gate.cols, &j, 1, stream_, T);
    return;
  }
  if (plan.fused && is_x24(plan.gate)) {
    QuantRows& xq = ws_.moe_input_x24;
    const XForm form = x24_form_of(plan.gate);
    if (!x_in_moe_input) quantize_x24(x, T, gate.cols, xq.q.get<uint8_t>(), xq.scale.get<double>(), stream_, form);
    matmul_x24_gate_up(gate.type, gate.data, up.data, gate.row_bytes, gate.rows, gate.cols, xq.q.get<uint8_t>(),
                       xq.scale.get<double>(), T, act, stream_, form);
    return;
  }
  if (plan.fused && plan.gate == Kernel::kMatmulBf16) {
    matmul_bf16_gate_up(gate.type, gate.data, up.data, gate.row_bytes, gate.rows, gate.cols, x, T, act, stream_);
    return;
  }
  if (plan.fused) {
    matmul_gate_up(gate.type, gate.data, up.data, gate.row_bytes, gate.rows, gate.cols, x, T, act, stream_);
    return;
  }
  KqHeld held;
  project(gate, plan.gate, x, T, act, &held);
  project(up, plan.up, x, T, up_out, &held);
  swiglu(act, up_out, act, (size_t)T * gate.rows, stream_);
}

void Products::expert_products(const MoeDev& moe, const PairPlan& pair, Kernel down, const uint8_t* const* ptr_d,
                               const int* off_d, int n, int max_cnt, size_t row0, size_t rows) {
  const TensorView gv = moe.gate_exps.matrix(0), uv = moe.up_exps.matrix(0), dv = moe.down_exps.matrix(0);
  const int ff = c_.n_ff_exp, n_embd = c_.n_embd;
  float* in = ws_.expert_in.f();
  float* act = ws_.expert_act.f();
  float* up = ws_.expert_up.f();
  // One product: the X24 (X8) form of its input (the gathered rows of the layer's conversion of h2;
  // expert_act_x24 the SwiGLU outputs) for the IQ types, else the fp64 products on the fp32 input.
  const uint8_t* xq = ws_.expert_in_x24.q.get<uint8_t>();
  const double* xs = ws_.expert_in_x24.scale.get<double>();
  uint8_t* aq = ws_.expert_act_x24.q.get<uint8_t>();
  double* as = ws_.expert_act_x24.scale.get<double>();
  auto product = [&](const TensorView& v, Kernel k, size_t offset, int out_rows, int cols, const float* x,
                     const uint8_t* q, const double* qs, float* y) {
    if (is_x24(k))
      matmul_x24_experts(v.type, ptr_d, offset, v.row_bytes, out_rows, cols, q, qs, off_d, off_d + n, n, max_cnt, y,
                         stream_, x24_form_of(k));
    else if (k == Kernel::kMatmulBf16)
      matmul_bf16_experts(v.type, ptr_d, offset, v.row_bytes, out_rows, cols, x, off_d, off_d + n, n, max_cnt, y,
                          stream_);
    else
      matmul_experts(v.type, ptr_d, offset, v.row_bytes, out_rows, cols, x, off_d, off_d + n, n, max_cnt, y, stream_);
  };
  if (pair.fused) {
    if (is_x24(pair.gate))
      matmul_x24_experts_gate_up(gv.type, ptr_d, 0, moe.up_offset, gv.row_bytes, ff, n_embd, xq, xs, off_d,
                                 off_d + n, n, max_cnt, act, stream_, x24_form_of(pair.gate));
    else if (pair.gate == Kernel::kMatmulBf16)
      matmul_bf16_experts_gate_up(gv.type, ptr_d, 0, moe.up_offset, gv.row_bytes, ff, n_embd, in, off_d, off_d + n, n,
                                  max_cnt, act, stream_);
    else
      matmul_experts_gate_up(gv.type, ptr_d, 0, moe.up_offset, gv.row_bytes, ff, n_embd, in, off_d, off_d + n, n,
                             max_cnt, act, stream_);
  } else {
    product(gv, pair.gate, 0, ff, n_embd, in, xq, xs, act);
    product(uv, pair.up, moe.up_offset, ff, n_embd, in, xq, xs, up);
    swiglu(act + row0 * ff, up + row0 * ff, act + row0 * ff, rows * ff, stream_);
  }
  if (is_x24(down)) {
    const XForm form = x24_form_of(down);
    quantize_x24(act + row0 * ff, (int)rows, ff, aq + x24_bytes(row0, ff, form), as + row0 * (ff / 256), stream_,
                 form);
  }
  product(dv, down, moe.down_offset, n_embd, ff, act, aq, as, ws_.expert_out.f());
}

void Products::expert_matvecs(const MoeDev& moe, const PairPlan& pair, Kernel down, const uint8_t* const* ptr_d,
                              const float* x, int n, size_t row0) {
  const TensorView gv = moe.gate_exps.matrix(0), uv = moe.up_exps.matrix(0), dv = moe.down_exps.matrix(0);
  const int ff = c_.n_ff_exp, n_embd = c_.n_embd;
  float* act = ws_.expert_act.f() + row0 * ff;
  if (pair.gate == Kernel::kMatvecQ8)
    matvec_q8_experts_gate_up(gv.type, uv.type, ptr_d, moe.up_offset, gv.row_bytes, uv.row_bytes, ff, n_embd,
                              ws_.q8_moe_input.values(), ws_.q8_moe_input.scales(), act,
                              ws_.expert_up.f() + row0 * ff, n, stream_);
  else
    matvec_experts_gate_up(gv.type, uv.type, ptr_d, moe.up_offset, gv.row_bytes, uv.row_bytes, ff, n_embd, x, act,
                           ws_.expert_up.f() + row0 * ff, n, stream_, sums_of(pair.gate));
  if (down == Kernel::kMatvecQ8) {
    expert_downs_q8(moe, ptr_d, n, row0);
  } else {
    matvec_experts(dv.type, ptr_d, moe.down_offset, dv.row_bytes, n_embd, ff, act, ff,
                   ws_.expert_out.f() + row0 * n_embd, n, stream_, sums_of(down));
  }
}

void Products::expert_pairs(const MoeDev& moe, const PairPlan& pair, Kernel down, const uint8_t* const* ptr_d,
                            int n, bool h2_in_q8) {
  const TensorView gv = moe.gate_exps.matrix(0), uv = moe.up_exps.matrix(0);
  const int ff = c_.n_ff_exp, n_embd = c_.n_embd;
  if (pair.gate != Kernel::kMatvecQ8 || pair.up != Kernel::kMatvecQ8 || down != Kernel::kMatvecQ8)
    fail("Products::expert_pairs: the routed experts' pair runs on matvec-q8 only");
  if (!h2_in_q8) fail("Products::expert_pairs: the layer's plan did not convert h2 to the Q8 form its pairs read");
  const int K = c_.n_expert_used;
  const Q8Rows &xq = ws_.q8_moe_input, &aq = ws_.q8_expert_act;
  if (n % K != 0 || n / K > xq.rows || n > aq.rows)
    fail("Products::expert_pairs: {} pairs of {} tokens, the Q8 buffers hold {} tokens and {} pairs", n, n / K,
         xq.rows, aq.rows);
  float* act = ws_.expert_act.f();
  // Pair i reads token i / K's row of h2's Q8 form (the plan's moe_input_q8).
  matvec_q8_experts_gate_up(gv.type, uv.type, ptr_d, moe.up_offset, gv.row_bytes, uv.row_bytes, ff, n_embd,
                            xq.values(), xq.scales(), act, ws_.expert_up.f(), n, stream_, K);
  expert_downs_q8(moe, ptr_d, n, 0);
}

void Products::expert_downs_q8(const MoeDev& moe, const uint8_t* const* ptr_d, int n, size_t row0) {
  const TensorView dv = moe.down_exps.matrix(0);
  const int ff = c_.n_ff_exp, n_embd = c_.n_embd;
  const float* act = ws_.expert_act.f() + row0 * ff;
  float* out = ws_.expert_out.f() + row0 * n_embd;
  if (q8_f32_input_fits(ff, 1)) {  // each block quantises its expert's row: no quantize_q8 launch
    matvec_q8_experts_f32_input(dv.type, ptr_d, moe.down_offset, dv.row_bytes, n_embd, ff, act, 1, out, n, stream_);
    return;
  }
  const Q8Rows& aq = ws_.q8_expert_act;
  quantize_q8(act, n, ff, aq.values() + row0 * ff, aq.scales() + row0 * (ff / 32), stream_);
  matvec_q8_experts(dv.type, ptr_d, moe.down_offset, dv.row_bytes, n_embd, ff, aq.values() + row0 * ff,
                    aq.scales() + row0 * (ff / 32), 1, out, n, stream_);
}

void Products::gather_expert_inputs(const PairPlan& pair, const float* h2, const int32_t* gather_d, int n) {
  const int n_embd = c_.n_embd;
  const bool gate_x24 = is_x24(pair.gate), up_x24 = is_x24(pair.up);
  if (!gate_x24 || !up_x24) gather_rows(h2, gather_d, ws_.expert_in.f(), n, n_embd, stream_);
  if (gate_x24 || up_x24) {
    const QuantRows &h2q = ws_.moe_input_x24, &rows = ws_.expert_in_x24;
    const XForm form = x24_form_of(gate_x24 ? pair.gate : pair.up);
    gather_words(h2q.q.get(), gather_d, rows.q.get(), n, (int)(x24_bytes(1, n_embd, form) / 4), stream_);
    gather_words(h2q.scale.get(), gather_d, rows.scale.get(), n, n_embd / 256 * 2, stream_);
  }
}

}  // namespace rl::cuda
