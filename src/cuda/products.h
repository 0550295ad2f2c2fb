// The matrix products of a forward pass: which kernel and numeric form each product uses, and
// the launches. Decode (T == 1) runs every product as a matvec in fp32 activations with double
// sums; prefill runs the fp64 tensor-core products (matmul) except where NumericForms says:
//   X24: IQ2_XXS / IQ2_XS / IQ1_M weights (routed experts, a shared expert's SwiGLU pair) on the
//        8-bit tensor cores with 24-bit activations per 256-column block (kernels.h, matmul_x24);
//   X32: dense Q4_K products whose grid has a block for every SM (or all of them, x32_always) on
//        the 8-bit tensor cores with 32-bit activations (matmul_x32; compute capability 9.0).
// docs/cuda.md states each form's exactness bound.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "cuda/device_weights.h"
#include "cuda/workspace.h"
#include "model/model.h"

namespace rl::cuda {

struct NumericForms {
  bool x24 = false;         // X24 allowed: compute capability 8.0, n_embd and n_ff_exp whole 256-column blocks
  bool x32 = false;         // X32 allowed: x24 and compute capability 9.0
  bool x32_always = false;  // X32 also for products whose grid does not fill the GPU
  int x32_cols = 0;         // the widest input an X32 product takes (its buffer's width; 0: none)
  bool routed_x24 = false;  // some routed expert matrix runs on X24 (expert_in_x24, expert_act_x24)
  bool h2_x24 = false;      // some layer converts its MoE input to X24 (moe_input_x24)

  // On the current device for these weights.
  static NumericForms choose(const Config& c, const DeviceWeights& w, bool x32_always);
  bool use_x24(GgmlType t) const;
  // A dense prefill product of T tokens on X32: the type, whole blocks, a held width, 16-byte
  // aligned rows, and a grid of a block per SM unless x32_always.
  bool use_x32(const DMat& w, int T) const;
  // Whether a layer's prefill converts its MoE input to X24 (shared pair or routed gate/up).
  bool moe_input_x24(const MoeDev& m) const;
};

class Products {
 public:
  Products(const Config& c, const NumericForms& forms, Workspace& ws, cudaStream_t stream, uint64_t* x32_count)
      : c_(c), forms_(forms), ws_(ws), stream_(stream), x32_count_(x32_count) {}

  // What dense_input_x32 holds: the conversion of input x of `cols` columns (x null: nothing).
  struct KqHeld {
    const float* x = nullptr;
    int cols = 0;
  };
  // y [T][w.rows] = x [T][w.cols] · wᵀ. held (optional): what dense_input_x32 holds, kept up to
  // date, so that products of one input in a row convert it once (start from an empty KqHeld).
  void project(const DMat& w, const float* x, int T, float* y, KqHeld* held = nullptr);
  struct Projection {
    const DMat* w;
    const float* x;
    float* y;
  };
  // Several products of T tokens (an input shared by X32 products converted once); for one token,
  // consecutive products of one type and width are one launch (matvec_jobs).
  void project_group(std::initializer_list<Projection> list, int T);
  // act = SiLU(gate · x) * (up · x) for T tokens (act [T][rows]; `up_out` holds up · x where the
  // two products are separate launches). x_in_x24: moe_input_x24 already holds x.
  void project_gate_up(const DMat& gate, const DMat& up, const float* x, int T, float* act, float* up_out,
                       bool x_in_x24 = false);
  // The prefill products of a layer's routed experts on the gathered rows (expert_in and its X24
  // form): group g (slot ptr_d[g]) over rows [off_d[g], + off_d[n + g]) (at most max_cnt), the
  // groups' rows being [row0, row0 + rows); gate/up into expert_act, down into expert_out.
  void expert_products(const MoeDev& moe, const uint8_t* const* ptr_d, const int* off_d, int n, int max_cnt,
                       size_t row0, size_t rows);
  // The decode products of n experts (slot addresses ptr_d) on one token's input x: expert g's
  // rows are expert_act / expert_out row row0 + g.
  void expert_matvecs(const MoeDev& moe, const uint8_t* const* ptr_d, const float* x, int n, size_t row0);
  // The gathered rows of the routed experts' input (row a = token gather_d[a] of h2): of h2's X24
  // form for X24 gate/up products (bit copies: the same as converting the gathered rows), of h2
  // itself for the others.
  void gather_expert_inputs(const MoeDev& moe, const float* h2, const int32_t* gather_d, int n);

 private:
  const Config& c_;
  const NumericForms& forms_;
  Workspace& ws_;
  cudaStream_t stream_;
  uint64_t* x32_count_;  // EngineStats::x32_products
};

}  // namespace rl::cuda
