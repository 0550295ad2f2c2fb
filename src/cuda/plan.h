// The layer plan: for a pass of T tokens, which kernel and numeric form each matrix's product
// uses and how each layer's experts are routed. Computed once per model and chunk size
// (Engine::plan) from the weights' types and shapes, the device and the options; the forward pass
// runs what it says, and `redlite inspect MODEL --plan --backend cuda` prints it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/cuda_options.h"
#include "cuda/device_weights.h"
#include "cuda/kernels.h"
#include "model/model.h"

namespace rl::cuda {

enum class Kernel : uint8_t {
  kMatvec,     // one row: matvec family, fp32 activations, double sums
  kMatvecF32,  // one row, fast tier: the matvec family with fp32 sums (Sums::kFast)
  kMatvecQ8,   // fast tier, 1 to kQ8PassTokens rows: dp4a products on the Q8 form of the input (matvec_q8 family)
  kMatmulF64,  // prefill: fp64 tensor cores on the fp32 activations (matmul family)
  kMatmulX24,  // prefill: 8-bit tensor cores on X24 activations (matmul_x24 family)
  kMatmulX8,   // prefill, fast tier: the X24 kernels on X8 activations (int8 per value; XForm::kX8)
  kMatmulX8Q4K,  // prefill, fast tier: the X32 kernel (Q4_K) on X8 activations
  kMatmulX32,  // prefill: 8-bit tensor cores on X32 activations (matmul_x32)
  kMatmulBf16, // prefill, fast tier: bf16 tensor cores on dequantised tiles, fp32 sums (matmul_bf16)
  kMatmulQ8,   // fast tier, 2 to kQ8PassTokens rows of Q4_K / Q5_K / Q6_K: int8 tensor cores on the Q8 form (matmul_q8)
};
const char* kernel_name(Kernel k);
// The kernels that read their input in the Q8 form (quantize_q8, or written by the kernel before).
constexpr bool reads_q8_form(Kernel k) { return k == Kernel::kMatvecQ8 || k == Kernel::kMatmulQ8; }
// A pass of up to this many tokens takes the fast tier's matvec-q8 on token columns for its dense
// products of Q8 types (each matrix read once for up to 8 columns) and its routed experts a
// (token, selection) pair at a time on the decode kernels; longer ones take the prefill forms.
// Measured per product before the columns shared a unit's decoding (H200, 2026-12-01, PERF.md
// "matvec-q8 token columns"): ssm_in Q4_K 2048 -> 12288 at 2 / 4 / 8 / 16 tokens 13.6 / 22.9 /
// 40.3 / 78.8 µs on columns against 20.4 / 23.9 (16) on the X8 prefill product, ssm_out 4096 ->
// 2048 6.7 / 9.2 / 14.7 / 32.9 against 35.6 / 43.5. Whole steps decide it (H200, 2026-12-02,
// `serve --parallel N`, 128 tokens a stream, one call, docs/PERF.md): 16 streams in one step of
// 16 run 479.8 tok/s in all against 461.5 in two steps of 8 (another call: 504.5 against 466.9),
// 8 streams 477.2 against 465.4 (the call before, in steps of 4: 426.8), 4 streams 435.6 against
// 426.0.
constexpr int kQ8PassTokens = 16;
// From this many tokens a short pass's Q4_K / Q5_K / Q6_K dense products take mma-q8 (the int8 tensor
// cores on the same Q8 form) instead of matvec-q8 columns, where the device has them. A 16-row
// batched step's graph 16.71 ms against 20.61 on matvec-q8 columns (H100, 2026-12-06, 05ab62b with
// the mma-q8 patch; PERF.md's row at 3bacc40);
// the threshold itself is not measured: `bench_cuda_kernels --filter columns` times fast-mma
// against fast-q8 at 2, 4, 8 and 16 columns.
constexpr int kMmaQ8FromTokens = 2;
static_assert(kQ8PassTokens <= kMaxQ8Columns);
// A batched decode step takes at most this many sessions (a larger decode_batch runs in steps):
// the passes whose products are decode launches with token columns.
constexpr int kMaxBatchRows = kQ8PassTokens;
// kMatvec or kMatvecF32, and the sums it forms.
inline bool is_matvec(Kernel k) { return k == Kernel::kMatvec || k == Kernel::kMatvecF32; }
// kMatmulX24 or kMatmulX8, and the activations' form it reads.
inline bool is_x24(Kernel k) { return k == Kernel::kMatmulX24 || k == Kernel::kMatmulX8; }
inline XForm x24_form_of(Kernel k) { return k == Kernel::kMatmulX8 ? XForm::kX8 : XForm::kX24; }
// kMatmulX32 or kMatmulX8Q4K, and its activations' form.
inline bool is_x32(Kernel k) { return k == Kernel::kMatmulX32 || k == Kernel::kMatmulX8Q4K; }
inline XForm x32_form_of(Kernel k) { return k == Kernel::kMatmulX8Q4K ? XForm::kX8 : XForm::kX32; }

// Which numeric forms this device and these weights allow. Decode (one token) runs every product
// as a matvec (the fast tier: matvec-q8 for the types with Q8 products, matvec-f32 for the rest);
// prefill runs the fp64 tensor-core products except:
//   X24: IQ2_XXS / IQ2_XS / IQ1_M weights (routed experts, a shared expert's SwiGLU pair) on the
//        8-bit tensor cores with 24-bit activations per 256-column block (kernels.h, matmul_x24);
//   X32: dense Q4_K products whose grid (the X32 form's, x32_blocks: the fast tier's X8 form takes
//        32 tokens a block, not 24, so fewer) has a block for every SM (or all of them, x32_always)
//        on the 8-bit tensor cores with 32-bit activations (matmul_x32; compute capability 9.0).
// docs/cuda.md states each form's exactness bound.
struct NumericForms {
  bool x24 = false;         // X24 allowed: compute capability 8.0, n_embd and n_ff_exp whole 256-column blocks
  bool x32 = false;         // X32 allowed: x24 and compute capability 9.0
  bool fast = false;        // the fast tier (CudaOptions::numerics): fp32-sum kernels where it has them
  bool bf16 = false;        // the fast tier's bf16 prefill products allowed: compute capability 8.0
  bool q8 = false;          // the fast tier's Q8 decode products allowed (--fast-decode q8): compute capability 7.0
  bool mma_q8 = false;      // and their int8 tensor-core form for a few tokens (mma-q8): compute capability 8.0
  // The fast tier's routing, attention and DeltaNet kernels (fp32; CudaOptions::fast_*): the
  // plan's, the session's split buffers and the forward pass's one choice.
  bool fast_routing = false, fast_attention = false, fast_deltanet = false;
  // The sessions' KV cache type (CudaOptions::kv_type): f32 for the exact kernels, any type for
  // the fast tier's attention.
  KvType kv_type = KvType::kF32;
  bool x32_always = false;  // X32 also for products whose grid does not fill the GPU
  int x32_cols = 0;         // the widest input an X32 product takes (its buffer's width; 0: none)
  bool routed_x24 = false;  // some routed expert matrix runs on X24 (expert_in_x24, expert_act_x24)
  bool h2_x24 = false;      // some layer converts its MoE input to X24 (moe_input_x24)

  // On the current device for these weights.
  static NumericForms choose(const Config& c, const DeviceWeights& w, const CudaOptions& opts);
  // The decode product of the tier: kMatvec or kMatvecF32.
  Kernel matvec() const;
  // The decode product of a matrix of type t: kMatvecQ8 in the fast tier for the types with Q8
  // products (q8_supported), else matvec().
  Kernel matvec(GgmlType t) const;
  // A prefill product without an X24 / X32 form: kMatmulBf16 in the fast tier (from compute
  // capability 8.0), else kMatmulF64. (bf16 products everywhere prefilled the 80B seed-mix at 2,298
  // tok/s where the exact tier's X24 / X32 did 3,175; the fast tier keeps those kernels where they
  // apply, on its X8 form: 3,949. H200, 2026-12-01, PERF.md's fast prefill row.)
  Kernel prefill_matmul() const;
  bool use_x24(GgmlType t) const;
  // The kernel of a product that use_x24: the X24 form, or X8 in the fast tier — one byte plane
  // instead of three (bench_cuda_kernels, PERF.md: the experts' gate/up 900 -> 735 us a chunk).
  Kernel x24_kernel() const { return fast ? Kernel::kMatmulX8 : Kernel::kMatmulX24; }
  // The kernel of a product that use_x32: X32, or X8 in the fast tier (ssm_qkv 278 -> 187 us a chunk).
  Kernel x32_kernel() const { return fast ? Kernel::kMatmulX8Q4K : Kernel::kMatmulX32; }
  // A dense prefill product of T tokens on X32: the type, whole blocks, a held width, 16-byte
  // aligned rows, and a grid of a block per SM unless x32_always.
  bool use_x32(const DMat& w, int T) const;
  // Whether a layer's prefill converts its MoE input to X24 (shared pair or routed gate/up).
  bool moe_input_x24(const MoeDev& m) const;
};


// A SwiGLU pair (gate, up) on one input: one fused launch (gate's kernel), or two products and
// a swiglu.
struct PairPlan {
  Kernel gate = Kernel::kMatvec, up = Kernel::kMatvec;
  bool fused = false;
};

enum class Routing : uint8_t {
  kHostRouted,  // the host reads the selections, reserves the experts (copies misses), groups them
  kGpuGrouped,  // prefill with every expert resident: group_by_expert on the GPU, no host wait
  kGpuRouted,   // the decode graph: route_topk with the residency table; a miss recomputes the token
};
const char* routing_name(Routing r);

struct LayerPlan {
  bool recurrent = false;
  // The mixer's products in the order they run: DeltaNet ssm_qkv, ssm_z (gate), ssm_ba, ssm_out;
  // attention attn_q, attn_k, attn_v, attn_output.
  Kernel mixer_in[3] = {};
  Kernel mixer_out = Kernel::kMatvec;
  Kernel router = Kernel::kMatvec, shared_gate_inp = Kernel::kMatvec;
  PairPlan shared;  // ffn_gate_shexp, ffn_up_shexp
  Kernel shared_down = Kernel::kMatvec;
  bool moe_input_x24 = false;  // h2 converted to X24 once, for the shared pair and the routed gate/up
  bool moe_input_q8 = false;   // decode, short passes: h2 converted to Q8 once, for every matvec-q8 product of it
  PairPlan experts;            // ffn_gate_exps, ffn_up_exps
  Kernel expert_down = Kernel::kMatvec;
  Routing routing = Routing::kHostRouted;
};

struct PassPlan {
  int T = 0;
  std::vector<LayerPlan> layers;
  Kernel lm_head_last = Kernel::kMatvec;  // the last position's logits only
  Kernel lm_head_all = Kernel::kMatvec;   // every position's logits
};

// The dense product y [rows][w.rows] = x · wᵀ: kMatvec for one row, X32 where forms.use_x32,
// else the fp64 products.
Kernel dense_kernel(const NumericForms& forms, const DMat& w, int rows);
// What a pass of T tokens runs. cache_holds_all: the budget holds every expert (GPU grouping is
// then planned; it runs once every expert is resident).
PassPlan make_pass_plan(const Config& c, const DeviceWeights& w, const NumericForms& forms, const CudaOptions& opts,
                        bool cache_holds_all, int T);
// One line per layer, with the matrices' types.
std::string format_plan(const PassPlan& plan, const DeviceWeights& w);

}  // namespace rl::cuda
