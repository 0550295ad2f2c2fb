// The layer plan's choices (host only: runs without a GPU) on hand-made weights of chosen types,
// against the rules of docs/cuda.md written out here case by case: decode is all matvecs; prefill
// takes X32 for Q4_K dense products (forced with x32_always), X24 for the IQ types where the
// activations are whole 256-column blocks (routed experts, a fused shared pair over n_embd), fp64
// otherwise; the routing follows --speculation and the budget.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/plan.h"
#include "quant/quant.h"

namespace rl::cuda {
namespace {

constexpr int kEmbd = 256, kFf = 256, kExperts = 8, kUsed = 2, kVocab = 512;
alignas(16) const uint8_t kBytes[16] = {};  // the views' data: never read, only present and aligned

DMat mat(GgmlType t, int rows, int cols) { return {t, kBytes, row_size(t, cols), rows, cols}; }

TensorView experts(GgmlType t, int rows, int cols) {
  TensorView v;
  v.name = "exps";
  v.type = t;
  v.ne = {cols, rows, kExperts, 1};
  v.data = kBytes;
  v.row_bytes = row_size(t, cols);
  v.nbytes = v.row_bytes * rows * kExperts;
  return v;
}

Config config() {
  Config c;
  c.n_embd = kEmbd;
  c.n_layer = 2;
  c.n_vocab = kVocab;
  c.n_expert = kExperts;
  c.n_expert_used = kUsed;
  c.n_ff_exp = kFf;
  c.n_ff_shexp = kFf;
  return c;
}

// Layer 0: DeltaNet with Q4_K projections except ba (Q8_0), routed experts IQ2_XXS gate/up and
// IQ2_XS down, a Q8_0 shared pair. Layer 1: attention (Q4_K q/k, Q6_K v/o), routed experts of
// two types (IQ1_M gate, IQ2_XXS up), an IQ2_XXS shared pair. LM head Q6_K.
DeviceWeights weights() {
  DeviceWeights w;
  w.output = mat(GgmlType::Q6_K, kVocab, kEmbd);
  w.layers.resize(2);
  LayerDev& dn = w.layers[0];
  dn.recurrent = true;
  dn.ssm.qkv = mat(GgmlType::Q4_K, 768, kEmbd);
  dn.ssm.z = mat(GgmlType::Q4_K, 256, kEmbd);
  dn.ssm.ba = mat(GgmlType::Q8_0, 8, kEmbd);
  dn.ssm.out = mat(GgmlType::Q4_K, kEmbd, 256);
  LayerDev& at = w.layers[1];
  at.attn.q = mat(GgmlType::Q4_K, 512, kEmbd);
  at.attn.k = mat(GgmlType::Q4_K, 128, kEmbd);
  at.attn.v = mat(GgmlType::Q6_K, 128, kEmbd);
  at.attn.o = mat(GgmlType::Q6_K, kEmbd, 256);
  for (LayerDev* d : {&dn, &at}) {
    d->moe.router = mat(GgmlType::F32, kExperts, kEmbd);
    d->moe.shared_gate_inp = mat(GgmlType::F32, 1, kEmbd);
    d->moe.down_sh = mat(GgmlType::Q4_K, kEmbd, kFf);
  }
  dn.moe.gate_sh = dn.moe.up_sh = mat(GgmlType::Q8_0, kFf, kEmbd);
  at.moe.gate_sh = at.moe.up_sh = mat(GgmlType::IQ2_XXS, kFf, kEmbd);
  dn.moe.gate_exps = dn.moe.up_exps = experts(GgmlType::IQ2_XXS, kFf, kEmbd);
  dn.moe.down_exps = experts(GgmlType::IQ2_XS, kEmbd, kFf);
  at.moe.gate_exps = experts(GgmlType::IQ1_M, kFf, kEmbd);
  at.moe.up_exps = experts(GgmlType::IQ2_XXS, kFf, kEmbd);
  at.moe.down_exps = experts(GgmlType::IQ2_XXS, kEmbd, kFf);
  return w;
}

// X24 and X32 allowed, every Q4_K product on X32 (x32_always keeps device_info out of it).
NumericForms both_forms() {
  NumericForms f;
  f.x24 = f.x32 = f.x32_always = true;
  f.x32_cols = 256;
  return f;
}

using K = Kernel;

// Decode runs every product as a matvec of the tier: double sums (exact) or fp32 sums (fast).
TEST(CudaPlan, DecodeIsAllMatvecsOfTheTier) {
  for (bool fast : {false, true}) {
    SCOPED_TRACE(fast ? "fast" : "exact");
    NumericForms forms = both_forms();
    forms.fast = fast;
    const K mv = fast ? K::kMatvecF32 : K::kMatvec;
    const PassPlan p = make_pass_plan(config(), weights(), forms, {}, true, 1);
    ASSERT_EQ(p.layers.size(), 2u);
    for (const LayerPlan& l : p.layers) {
      for (K k : l.mixer_in) EXPECT_EQ(k, mv);
      EXPECT_EQ(l.mixer_out, mv);
      EXPECT_EQ(l.router, mv);
      EXPECT_EQ(l.shared_down, mv);
      EXPECT_TRUE(l.shared.fused);  // one type and width: matvec_gate_up
      EXPECT_EQ(l.shared.gate, mv);
      EXPECT_EQ(l.experts.gate, mv);
      EXPECT_EQ(l.expert_down, mv);
      EXPECT_FALSE(l.moe_input_x24);
      EXPECT_EQ(l.routing, Routing::kGpuRouted);  // every expert resident, --speculation resident
    }
    EXPECT_EQ(p.lm_head_last, mv);
    EXPECT_EQ(p.lm_head_all, mv);
  }
}

// The fast tier's decode takes matvec-q8 for the types with Q8 products (Q4_K, Q5_K, Q6_K, Q8_0,
// IQ2_XXS, IQ2_XS, IQ1_M) and matvec-f32 for the others (here F32, and Q5_0 / IQ2_S put in);
// a routed pair takes one form (IQ2_S gate and IQ2_XXS up: matvec-f32 for both); h2 goes to Q8
// once where a product of it is matvec-q8. --fast-decode f32 (forms.q8 off): matvec-f32 everywhere.
TEST(CudaPlan, FastDecodeTakesQ8ForItsTypes) {
  NumericForms forms = both_forms();
  forms.fast = forms.bf16 = forms.q8 = true;
  DeviceWeights w = weights();
  w.layers[0].ssm.ba = mat(GgmlType::Q5_0, 8, kEmbd);
  w.layers[1].moe.gate_exps = experts(GgmlType::IQ2_S, kFf, kEmbd);
  w.layers[1].moe.gate_sh = w.layers[1].moe.up_sh = mat(GgmlType::Q5_0, kFf, kEmbd);
  const PassPlan p = make_pass_plan(config(), w, forms, {}, true, 1);
  const LayerPlan& dn = p.layers[0];
  EXPECT_EQ(dn.mixer_in[0], K::kMatvecQ8);   // Q4_K qkv
  EXPECT_EQ(dn.mixer_in[1], K::kMatvecQ8);   // Q4_K z
  EXPECT_EQ(dn.mixer_in[2], K::kMatvecF32);  // Q5_0 ba
  EXPECT_EQ(dn.mixer_out, K::kMatvecQ8);
  EXPECT_EQ(dn.router, K::kMatvecF32);       // F32
  EXPECT_EQ(dn.shared_gate_inp, K::kMatvecF32);
  EXPECT_TRUE(dn.shared.fused);              // Q8_0 pair
  EXPECT_EQ(dn.shared.gate, K::kMatvecQ8);
  EXPECT_EQ(dn.shared_down, K::kMatvecQ8);   // Q4_K
  EXPECT_EQ(dn.experts.gate, K::kMatvecQ8);  // IQ2_XXS
  EXPECT_EQ(dn.experts.up, K::kMatvecQ8);
  EXPECT_EQ(dn.expert_down, K::kMatvecQ8);   // IQ2_XS
  EXPECT_TRUE(dn.moe_input_q8);
  EXPECT_FALSE(dn.moe_input_x24);
  const LayerPlan& at = p.layers[1];
  EXPECT_EQ(at.mixer_in[0], K::kMatvecQ8);   // Q4_K q
  EXPECT_EQ(at.mixer_in[2], K::kMatvecQ8);   // Q6_K v
  EXPECT_EQ(at.mixer_out, K::kMatvecQ8);     // Q6_K o
  EXPECT_EQ(at.shared.gate, K::kMatvecF32);  // Q5_0 pair
  EXPECT_EQ(at.experts.gate, K::kMatvecF32); // IQ2_S gate, IQ2_XXS up: one form, f32
  EXPECT_EQ(at.experts.up, K::kMatvecF32);
  EXPECT_EQ(at.expert_down, K::kMatvecQ8);   // IQ2_XXS
  EXPECT_FALSE(at.moe_input_q8);             // nothing reads h2 in Q8
  EXPECT_EQ(p.lm_head_last, K::kMatvecQ8);   // Q6_K
  const std::string text = format_plan(p, w);
  for (const char* part : {"qkv=q4_K matvec-q8", "ba=q5_0 matvec-f32", "(h2 to Q8 once)", "down=iq2_xs matvec-q8"})
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  // An IQ1_M gate with an IQ2_XXS up: both have Q8 products, so the pair takes them, and h2 goes
  // to Q8 for the routed experts alone (the shared pair is Q5_0).
  w.layers[1].moe.gate_exps = experts(GgmlType::IQ1_M, kFf, kEmbd);
  const LayerPlan routed_only = make_pass_plan(config(), w, forms, {}, true, 1).layers[1];
  EXPECT_EQ(routed_only.experts.gate, K::kMatvecQ8);
  EXPECT_EQ(routed_only.experts.up, K::kMatvecQ8);
  EXPECT_TRUE(routed_only.moe_input_q8);
  // Prefill is unchanged by the decode form.
  EXPECT_EQ(make_pass_plan(config(), w, forms, {}, true, 512).layers[0].mixer_in[0], K::kMatmulX8Q4K);
  // --fast-decode f32.
  forms.q8 = false;
  const PassPlan f32 = make_pass_plan(config(), w, forms, {}, true, 1);
  for (const LayerPlan& l : f32.layers) {
    for (K k : l.mixer_in) EXPECT_EQ(k, K::kMatvecF32);
    EXPECT_EQ(l.experts.gate, K::kMatvecF32);
    EXPECT_EQ(l.expert_down, K::kMatvecF32);
    EXPECT_FALSE(l.moe_input_q8);
  }
  EXPECT_EQ(f32.lm_head_last, K::kMatvecF32);
}

// A chunk of 2 to kQ8PassTokens tokens (a short prompt, a batched step) takes the fast tier's
// matvec-q8 for its dense products of Q8 types, each matrix read once for every column, and
// matvec-f32 a column for the others (the F32 router, a Q5_0 ssm_ba); the routed experts, grouped
// on the GPU, run a (token, selection) pair at a time on matvec-q8, and only a host-routed pass
// (a bounded cache) keeps their prefill forms, with h2 in X24 for them. A longer chunk and the
// exact tier are prefill throughout.
TEST(CudaPlan, FewTokensTakeQ8ColumnsForDenseProducts) {
  NumericForms forms = both_forms();
  forms.fast = forms.bf16 = forms.q8 = true;
  DeviceWeights w = weights();
  w.layers[0].ssm.ba = mat(GgmlType::Q5_0, 8, kEmbd);
  for (int T : {2, 3, kQ8PassTokens}) {
    SCOPED_TRACE(T);
    const PassPlan p = make_pass_plan(config(), w, forms, {}, true, T);
    const LayerPlan& dn = p.layers[0];
    EXPECT_EQ(dn.mixer_in[0], K::kMatvecQ8);   // Q4_K qkv
    EXPECT_EQ(dn.mixer_in[1], K::kMatvecQ8);   // Q4_K z
    EXPECT_EQ(dn.mixer_in[2], K::kMatvecF32);  // Q5_0 ba: no Q8 product
    EXPECT_EQ(dn.mixer_out, K::kMatvecQ8);
    EXPECT_EQ(dn.router, K::kMatvecF32);       // F32
    EXPECT_EQ(dn.shared_gate_inp, K::kMatvecF32);
    EXPECT_TRUE(dn.shared.fused);              // Q8_0 pair: one matvec_q8_gate_up
    EXPECT_EQ(dn.shared.gate, K::kMatvecQ8);
    EXPECT_EQ(dn.shared_down, K::kMatvecQ8);
    EXPECT_EQ(dn.experts.gate, K::kMatvecQ8);  // IQ2_XXS routed, grouped on the GPU: pairs on the decode kernels
    EXPECT_EQ(dn.expert_down, K::kMatvecQ8);
    EXPECT_FALSE(dn.moe_input_x24);            // nothing reads h2's X24 form
    EXPECT_TRUE(dn.moe_input_q8);              // the pairs' input rows, the shared pair's input
    EXPECT_EQ(dn.routing, Routing::kGpuGrouped);
    EXPECT_EQ(p.lm_head_all, K::kMatvecQ8);
    // A bounded cache routes on the host: the routed experts keep the prefill form.
    const PassPlan bounded = make_pass_plan(config(), w, forms, {}, false, T);
    const LayerPlan& host = bounded.layers[0];
    EXPECT_EQ(host.routing, Routing::kHostRouted);
    EXPECT_EQ(host.experts.gate, K::kMatmulX8);
    EXPECT_EQ(host.expert_down, K::kMatmulX8);
    EXPECT_TRUE(host.moe_input_x24);           // for the routed experts
    EXPECT_TRUE(host.moe_input_q8);            // for the shared pair
  }
  {
    // A shared pair with no Q8 form (Q5_0: a prefill product): the pairs alone ask for h2's Q8 form.
    DeviceWeights q5 = weights();
    q5.layers[0].moe.gate_sh = q5.layers[0].moe.up_sh = mat(GgmlType::Q5_0, kFf, kEmbd);
    const PassPlan grouped_plan = make_pass_plan(config(), q5, forms, {}, true, 2);
    const LayerPlan& grouped = grouped_plan.layers[0];
    EXPECT_EQ(grouped.shared.gate, K::kMatmulBf16);
    EXPECT_EQ(grouped.experts.gate, K::kMatvecQ8);
    EXPECT_TRUE(grouped.moe_input_q8);
    const PassPlan host_plan = make_pass_plan(config(), q5, forms, {}, false, 2);
    const LayerPlan& host_q5 = host_plan.layers[0];
    EXPECT_EQ(host_q5.experts.gate, K::kMatmulX8);
    EXPECT_FALSE(host_q5.moe_input_q8);  // nothing reads it
  }
  EXPECT_EQ(make_pass_plan(config(), w, forms, {}, true, kQ8PassTokens + 1).layers[0].experts.gate, K::kMatmulX8);
  const PassPlan longer = make_pass_plan(config(), w, forms, {}, true, kQ8PassTokens + 1);
  EXPECT_NE(longer.layers[0].mixer_in[0], K::kMatvecQ8);
  EXPECT_NE(longer.layers[0].shared.gate, K::kMatvecQ8);
  EXPECT_EQ(longer.layers[0].router, K::kMatmulBf16);  // prefill forms from kQ8PassTokens + 1 on
  EXPECT_FALSE(longer.layers[0].moe_input_q8);
  // A shared pair without X24 form and routed experts without one: nothing converts h2 to X24.
  w.layers[0].moe.gate_exps = experts(GgmlType::Q5_0, kFf, kEmbd);
  w.layers[0].moe.up_exps = experts(GgmlType::Q5_0, kFf, kEmbd);
  w.layers[0].moe.down_exps = experts(GgmlType::Q5_0, kEmbd, kFf);
  EXPECT_FALSE(make_pass_plan(config(), w, forms, {}, true, 4).layers[0].moe_input_x24);
  forms.fast = forms.bf16 = forms.q8 = false;
  const PassPlan exact = make_pass_plan(config(), weights(), forms, {}, true, 4);
  for (const LayerPlan& l : exact.layers) {
    for (K k : l.mixer_in) EXPECT_FALSE(k == K::kMatvecQ8 || is_matvec(k));
    EXPECT_FALSE(l.moe_input_q8);
  }
}

// Where the device has the int8 tensor cores (mma_q8), a short pass's Q4_K, Q5_K and Q6_K products
// of whole 256-column blocks take mma-q8 from kMmaQ8FromTokens tokens, the other Q8 types stay on
// matvec-q8 columns, and a decode token keeps matvec-q8.
TEST(CudaPlan, FewTokensOfKQuantsTakeMmaQ8) {
  NumericForms forms = both_forms();
  forms.fast = forms.bf16 = forms.q8 = forms.mma_q8 = true;
  DeviceWeights w = weights();
  w.output = mat(GgmlType::Q5_K, kVocab, kEmbd);
  for (int T : {kMmaQ8FromTokens, 7, kQ8PassTokens}) {
    SCOPED_TRACE(T);
    const PassPlan p = make_pass_plan(config(), w, forms, {}, true, T);
    const LayerPlan &dn = p.layers[0], &at = p.layers[1];
    EXPECT_EQ(dn.mixer_in[0], K::kMatmulQ8);  // Q4_K qkv
    EXPECT_EQ(dn.mixer_in[1], K::kMatmulQ8);  // Q4_K z
    EXPECT_EQ(dn.mixer_in[2], K::kMatvecQ8);  // Q8_0 ba
    EXPECT_EQ(dn.mixer_out, K::kMatmulQ8);
    EXPECT_EQ(at.mixer_in[2], K::kMatmulQ8);  // Q6_K v
    EXPECT_EQ(at.mixer_out, K::kMatmulQ8);    // Q6_K o
    EXPECT_EQ(dn.shared_down, K::kMatmulQ8);  // Q4_K
    EXPECT_TRUE(dn.shared.fused);             // the Q8_0 pair: matvec-q8 with its SwiGLU
    EXPECT_EQ(dn.shared.gate, K::kMatvecQ8);
    EXPECT_EQ(dn.experts.gate, K::kMatvecQ8);  // the routed pairs: one token each
    EXPECT_EQ(p.lm_head_all, K::kMatmulQ8);    // Q5_K
  }
  const PassPlan one = make_pass_plan(config(), w, forms, {}, true, 1);
  EXPECT_EQ(one.layers[0].mixer_in[0], K::kMatvecQ8);
  EXPECT_EQ(one.lm_head_last, K::kMatvecQ8);
  forms.mma_q8 = false;
  EXPECT_EQ(make_pass_plan(config(), w, forms, {}, true, 4).layers[0].mixer_in[0], K::kMatvecQ8);
}

// The fast tier's prefill takes the X8 form where the exact tier takes X24 or X32, and the bf16
// products where it takes fp64 (the same model as PrefillFormsByType).
TEST(CudaPlan, FastPrefillFormsByType) {
  NumericForms forms = both_forms();
  forms.fast = forms.bf16 = true;
  const PassPlan p = make_pass_plan(config(), weights(), forms, {}, true, 512);
  const LayerPlan& dn = p.layers[0];
  EXPECT_EQ(dn.mixer_in[0], K::kMatmulX8Q4K);  // Q4_K qkv
  EXPECT_EQ(dn.mixer_in[1], K::kMatmulX8Q4K);  // Q4_K z
  EXPECT_EQ(dn.mixer_in[2], K::kMatmulBf16);  // Q8_0 ba
  EXPECT_EQ(dn.router, K::kMatmulBf16);       // F32
  EXPECT_TRUE(dn.shared.fused);               // Q8_0 pair: matmul_bf16_gate_up
  EXPECT_EQ(dn.shared.gate, K::kMatmulBf16);
  EXPECT_EQ(dn.experts.gate, K::kMatmulX8);
  EXPECT_EQ(dn.expert_down, K::kMatmulX8);    // IQ2_XS
  EXPECT_TRUE(dn.moe_input_x24);              // h2 converted once (to X8)
  const LayerPlan& at = p.layers[1];
  EXPECT_EQ(at.mixer_in[2], K::kMatmulBf16);  // Q6_K v
  EXPECT_EQ(at.mixer_out, K::kMatmulBf16);
  EXPECT_EQ(at.shared.gate, K::kMatmulX8);
  EXPECT_EQ(at.experts.gate, K::kMatmulX8);   // IQ1_M
  EXPECT_EQ(at.experts.up, K::kMatmulX8);     // IQ2_XXS
  EXPECT_EQ(p.lm_head_last, K::kMatvecF32);
  EXPECT_EQ(p.lm_head_all, K::kMatmulBf16);   // Q6_K
  EXPECT_NE(format_plan(p, weights()).find("down=iq2_xs x8"), std::string::npos);
  // Below compute capability 8.0 the fast tier's other products are fp64.
  forms.bf16 = false;
  EXPECT_EQ(make_pass_plan(config(), weights(), forms, {}, true, 512).layers[0].router, K::kMatmulF64);
}

TEST(CudaPlan, PrefillFormsByType) {
  const PassPlan p = make_pass_plan(config(), weights(), both_forms(), {}, true, 512);
  const LayerPlan& dn = p.layers[0];
  EXPECT_TRUE(dn.recurrent);
  EXPECT_EQ(dn.mixer_in[0], K::kMatmulX32);  // Q4_K qkv
  EXPECT_EQ(dn.mixer_in[1], K::kMatmulX32);  // Q4_K z
  EXPECT_EQ(dn.mixer_in[2], K::kMatmulF64);  // Q8_0 ba
  EXPECT_EQ(dn.mixer_out, K::kMatmulX32);
  EXPECT_EQ(dn.router, K::kMatmulF64);       // F32
  EXPECT_TRUE(dn.shared.fused);              // Q8_0 pair: matmul_gate_up
  EXPECT_EQ(dn.shared.gate, K::kMatmulF64);
  EXPECT_EQ(dn.shared_down, K::kMatmulX32);
  EXPECT_TRUE(dn.experts.fused);
  EXPECT_EQ(dn.experts.gate, K::kMatmulX24);
  EXPECT_EQ(dn.expert_down, K::kMatmulX24);  // IQ2_XS
  EXPECT_TRUE(dn.moe_input_x24);             // the routed gate/up take h2's X24 form
  EXPECT_EQ(dn.routing, Routing::kGpuGrouped);
  const LayerPlan& at = p.layers[1];
  EXPECT_FALSE(at.recurrent);
  EXPECT_EQ(at.mixer_in[0], K::kMatmulX32);
  EXPECT_EQ(at.mixer_in[2], K::kMatmulF64);  // Q6_K v
  EXPECT_EQ(at.mixer_out, K::kMatmulF64);
  EXPECT_TRUE(at.shared.fused);              // IQ2_XXS pair over n_embd: X24
  EXPECT_EQ(at.shared.gate, K::kMatmulX24);
  EXPECT_FALSE(at.experts.fused);            // IQ1_M gate, IQ2_XXS up: two products
  EXPECT_EQ(at.experts.gate, K::kMatmulX24);
  EXPECT_EQ(at.experts.up, K::kMatmulX24);
  EXPECT_EQ(p.lm_head_last, K::kMatvec);
  EXPECT_EQ(p.lm_head_all, K::kMatmulF64);   // Q6_K
  // The printed plan names each layer's products with their types and kernels.
  const std::string text = format_plan(p, weights());
  for (const char* part : {"prefill chunk (512 tokens)", "layer  0 deltanet", "qkv=q4_K x32", "ba=q8_0 f64",
                           "layer  1 attention", "v=q6_K f64", "gpu-grouped", "gate/up=iq2_xxs+iq2_xxs x24 fused",
                           "gate/up=iq1_m x24 / iq2_xxs x24", "down=iq2_xs x24", "lm_head=q6_K matvec"})
    EXPECT_NE(text.find(part), std::string::npos) << part << " not in:\n" << text;
}

TEST(CudaPlan, WithoutTheIntegerFormsEveryPrefillProductIsFp64) {
  NumericForms none;  // a device below compute capability 8.0
  const PassPlan p = make_pass_plan(config(), weights(), none, {}, true, 64);
  for (const LayerPlan& l : p.layers) {
    for (K k : l.mixer_in) EXPECT_EQ(k, K::kMatmulF64);
    EXPECT_EQ(l.shared.gate, K::kMatmulF64);
    EXPECT_EQ(l.experts.gate, K::kMatmulF64);
    EXPECT_EQ(l.experts.up, K::kMatmulF64);
    EXPECT_EQ(l.expert_down, K::kMatmulF64);
    EXPECT_FALSE(l.moe_input_x24);
  }
}

TEST(CudaPlan, RoutingFollowsTheBudgetAndTheOptions) {
  using S = CudaOptions::Speculation;
  auto routing = [](const CudaOptions& o, bool holds_all, int T) {
    return make_pass_plan(config(), weights(), both_forms(), o, holds_all, T).layers[1].routing;
  };
  CudaOptions o;
  EXPECT_EQ(routing(o, false, 512), Routing::kHostRouted);  // bounded cache
  EXPECT_EQ(routing(o, false, 1), Routing::kHostRouted);    // --speculation resident, bounded
  o.speculation = S::kWarmCache;
  EXPECT_EQ(routing(o, false, 1), Routing::kGpuRouted);
  o.speculation = S::kOff;
  EXPECT_EQ(routing(o, true, 1), Routing::kHostRouted);
  o.gpu_grouping = false;
  EXPECT_EQ(routing(o, true, 512), Routing::kHostRouted);
}

}  // namespace
}  // namespace rl::cuda
