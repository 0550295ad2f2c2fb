// The matrix products of a forward pass: each launches the kernel the layer plan (plan.h) chose
// for its matrix, converting the activations to the plan's integer form where it says so.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "cuda/device_weights.h"
#include "cuda/plan.h"
#include "cuda/streams.h"
#include "cuda/workspace.h"
#include "model/model.h"

namespace rl::cuda {

class Products {
 public:
  // q8_scratch: where this launcher converts a matvec-q8 product's input (Workspace::q8_input, or
  // q8_side_input for the side branch's launcher).
  Products(const Config& c, Workspace& ws, Q8Rows& q8_scratch, cudaStream_t stream, uint64_t* x32_count)
      : c_(c), ws_(ws), q8_scratch_(q8_scratch), stream_(stream), x32_count_(x32_count) {}

  // What dense_input_x32 holds: the conversion of input x of `cols` columns (x null: nothing).
  struct KqHeld {
    const float* x = nullptr;
    int cols = 0;
    XForm form = XForm::kX32;
  };
  // y [rows][w.rows] = x [rows][w.cols] · wᵀ with the plan's kernel k (dense_kernel). held
  // (optional): what dense_input_x32 holds, kept up to date, so that X32 products of one input in
  // a row convert it once (start from an empty KqHeld).
  void project(const DMat& w, Kernel k, const float* x, int rows, float* y, KqHeld* held = nullptr);
  struct Projection {
    const DMat* w;
    Kernel kernel;
    const float* x;
    float* y;
  };
  // Several products of T tokens (an input shared by X32 products converted once); on the decode
  // kernels (matvec-q8 on T token columns, matvec-f32 a job a column, one token's matvec)
  // consecutive products of one type and width are one launch, and with a side branch (set_side)
  // the launches after the first run on it, beside the first, joined before the call returns.
  // moe_input: the input held in Workspace::q8_moe_input (LayerPlan::moe_input_q8), read by the
  // matvec-q8 products of it; the others' one input is converted once.
  void project_group(std::initializer_list<Projection> list, int T, const float* moe_input = nullptr);
  // The side branch (Streams::side, forked from and joined into Streams::compute, which must be
  // this launcher's stream; none: one launch after another).
  void set_side(Streams* streams) { side_ = streams; }
  // Dense bf16 products may split over their columns into Workspace::split_k (matmul_bf16): for
  // one launcher only, the layer stream's, so that no two streams share the scratch.
  void allow_split_k() { split_k_ = true; }
  // act = SiLU(gate · x) * (up · x) for T tokens as the plan's pair says (act [T][rows]; `up_out`
  // holds up · x where the two products are separate launches). x_in_moe_input: the layer's MoE
  // input conversion (moe_input_x24, or q8_moe_input for matvec-q8) already holds x.
  void project_gate_up(const DMat& gate, const DMat& up, const PairPlan& plan, const float* x, int T, float* act,
                       float* up_out, bool x_in_moe_input = false);
  // Converts the MoE input h2 of T tokens (a decode token, a short pass) to the Q8 form
  // (Workspace::q8_moe_input).
  void convert_moe_input_q8(const float* h2, int T);
  // The Q8 scratch (Workspace::q8_input) where a kernel may write its output's Q8 form, and the
  // declaration that it did for x: the next one-token project_group or project on x reads it
  // instead of converting x. Any conversion into the scratch, and that product, end the
  // declaration.
  Q8Target q8_target() { return {q8_scratch_.values(), q8_scratch_.scales()}; }
  void hold_q8(const float* x) { q8_held_ = x; }
  // The prefill products of a layer's routed experts on the gathered rows (expert_in and its X24
  // form), gate/up as `pair` says and down with `down`: group g (slot ptr_d[g]) over rows
  // [off_d[g], + off_d[n + g]) (at most max_cnt), the groups' rows being [row0, row0 + rows);
  // gate/up into expert_act, down into expert_out.
  void expert_products(const MoeDev& moe, const PairPlan& pair, Kernel down, const uint8_t* const* ptr_d,
                       const int* off_d, int n, int max_cnt, size_t row0, size_t rows);
  // The decode products of n experts (slot addresses ptr_d) on one token's input x: expert g's
  // rows are expert_act / expert_out row row0 + g. matvec-q8 gate/up read q8_moe_input (the plan's
  // moe_input_q8); a matvec-q8 down reads expert_act's fp32 rows, each block converting its row
  // (q8_f32_input_fits; a wider one converts them to q8_expert_act first).
  void expert_matvecs(const MoeDev& moe, const PairPlan& pair, Kernel down, const uint8_t* const* ptr_d,
                      const float* x, int n, size_t row0);
  // A short pass's (2 to kQ8PassTokens tokens) routed experts on the decode kernels, a pair at a
  // time: pair i (token i / K, selection i % K; n = T·K) reads the expert in slot ptr_d[i] on row
  // i / K of h2's Q8 form in q8_moe_input (the plan's moe_input_q8), and writes expert_act /
  // expert_out row i. The plan's matvec-q8 pair; h2_in_q8: the layer wrote that form (fails if not).
  void expert_pairs(const MoeDev& moe, const PairPlan& pair, Kernel down, const uint8_t* const* ptr_d, int n,
                    bool h2_in_q8);
  // The gathered rows of the routed experts' input (row a = token gather_d[a] of h2): of h2's X24
  // form for X24 gate/up products (bit copies: the same as converting the gathered rows), of h2
  // itself for the others.
  void gather_expert_inputs(const PairPlan& pair, const float* h2, const int32_t* gather_d, int n);

 private:
  // x [T][cols] (T ≤ q8_scratch_.rows) in the Q8 form in q8_scratch_ (one input at a time).
  void convert_q8(const float* x, int T, int cols);
  // The matvec-q8 down products of n experts (slots ptr_d) on expert_act rows row0 .. row0 + n - 1
  // into expert_out's: on the fp32 rows where each block can quantise its row
  // (q8_f32_input_fits), else through q8_expert_act.
  void expert_downs_q8(const MoeDev& moe, const uint8_t* const* ptr_d, int n, size_t row0);
  const Config& c_;
  Workspace& ws_;
  Q8Rows& q8_scratch_;
  cudaStream_t stream_;
  Streams* side_ = nullptr;
  bool split_k_ = false;  // allow_split_k
  uint64_t* x32_count_;  // EngineStats::x32_products
  const float* q8_held_ = nullptr;  // the input whose Q8 form a kernel wrote into q8_scratch_ (hold_q8)
};

}  // namespace rl::cuda
