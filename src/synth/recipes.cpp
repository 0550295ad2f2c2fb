#include "synth/recipes.h"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

#include "common/error.h"
#include "synth/synth.h"

namespace rl::synth {

bool is_matrix(Role role) {
  switch (role) {
    case Role::Norm:
    case Role::SsmConv:
    case Role::SsmDtBias:
    case Role::SsmA:
    case Role::Router:
    case Role::SharedGateInp: return false;
    default: return true;
  }
}

bool is_attn_v_like(Role role) { return role == Role::AttnV || role == Role::AttnQkv; }
bool is_ffn_down(Role role) { return role == Role::DownExps || role == Role::DownShexp; }

namespace {

bool is_expert(Role role) { return role == Role::GateExps || role == Role::UpExps || role == Role::DownExps; }

// llama.cpp's layer-position rules ("the first n_layer/8 layers"), with at least one layer, so
// that the tiny preset's 4 layers hold the promoted type as the 80B's 48 do.
bool in_first(int index, int count, int divisor) { return index < std::max(1, count / divisor); }

// ---- the project's own mixes ----

GgmlType seed_mix_type(const TensorPlace& p) {
  switch (p.role) {
    case Role::GateExps:
    case Role::UpExps:
      // IQ1_M in the second quarter of the layers (12-23 of 48).
      return (p.layer >= p.n_layer / 4 && p.layer < p.n_layer / 2) ? GgmlType::IQ1_M : GgmlType::IQ2_XS;
    case Role::DownExps: return GgmlType::IQ2_XS;
    case Role::SsmIn:
    case Role::AttnQkv:
    case Role::AttnGate:
    case Role::SsmOut:
    case Role::AttnQ:
    case Role::AttnK:
    case Role::AttnOutput:
    case Role::TokenEmbd: return GgmlType::Q4_K;
    case Role::AttnV:
    case Role::DownShexp: return GgmlType::Q6_K;
    case Role::SsmBa: return GgmlType::Q8_0;
    case Role::GateShexp:
    case Role::UpShexp: return GgmlType::IQ2_XXS;
    case Role::Output: return GgmlType::Q5_K;
    default: return GgmlType::F32;  // norms, ssm_a, ssm_dt.bias, ssm_conv1d, routers
  }
}

GgmlType q4km_type(const TensorPlace& p) {
  switch (p.role) {
    case Role::AttnV:
    case Role::DownShexp:
    case Role::Output: return GgmlType::Q6_K;
    default: return is_matrix(p.role) ? GgmlType::Q4_K : GgmlType::F32;
  }
}

// As q4km, with the shared-expert gate in F16 as the published Qwen3-Next GGUFs store it.
GgmlType q4km_shexp_f16_type(const TensorPlace& p) {
  return p.role == Role::SharedGateInp ? GgmlType::F16 : q4km_type(p);
}

// all-types: the weight matrices, in file order, cycle through every ggml type with a float view
// except F32 (which the norms, routers and the DeltaNet's small tensors keep, as in every recipe);
// up matrices take their gate's type. A model of at least 22 such places (the tiny preset has 31)
// holds all 23 types, each in the products it would take in a real file.
constexpr GgmlType kAllTypesCycle[] = {
    GgmlType::IQ3_XXS, GgmlType::Q3_K,   GgmlType::IQ4_XS, GgmlType::IQ2_S,   GgmlType::Q4_0,   GgmlType::IQ3_S,
    GgmlType::Q5_0,    GgmlType::IQ4_NL, GgmlType::MXFP4,  GgmlType::Q4_1,    GgmlType::IQ1_S,  GgmlType::Q5_1,
    GgmlType::F16,     GgmlType::BF16,   GgmlType::Q8_0,   GgmlType::Q2_K,    GgmlType::Q4_K,   GgmlType::Q5_K,
    GgmlType::Q6_K,    GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ1_M};

GgmlType all_types_type(const TensorPlace& p) {
  return is_matrix(p.role) ? kAllTypesCycle[p.matrix_index % (int)std::size(kAllTypesCycle)] : GgmlType::F32;
}

GgmlType f32_type(const TensorPlace&) { return GgmlType::F32; }

// ---- mixes of llama.cpp's quantizer (llama_tensor_get_type) ----
//
// The types llama-quantize picks for a qwen3next file of the 80B's shape: 8 query heads per KV
// head, 512 experts (so none of its 8-expert rules), an importance matrix (which the IQ types
// need), no overrides. Tensors it does not quantize keep the conversion's type: F32 for norms,
// routers and the DeltaNet's small tensors, F16 for ffn_gate_inp_shexp (the published files).
// In file order its DeltaNet projections (ssm_in, ssm_ba, ssm_out, attn_gate) fall in no category
// and take the file type's base type; attn_qkv counts as attention V.

// Tensors llama.cpp leaves as converted.
GgmlType unquantized(Role role) { return role == Role::SharedGateInp ? GgmlType::F16 : GgmlType::F32; }

// MOSTLY_IQ3_XXS: attention V in Q4_K, Q and K in IQ2_S, attention output and the embedding in
// IQ3_S, the LM head in Q5_K.
GgmlType iq3xxs_type(const TensorPlace& p) {
  if (!is_matrix(p.role)) return unquantized(p.role);
  if (is_attn_v_like(p.role)) return GgmlType::Q4_K;
  switch (p.role) {
    case Role::Output: return GgmlType::Q5_K;
    case Role::TokenEmbd:
    case Role::AttnOutput: return GgmlType::IQ3_S;
    case Role::AttnQ:
    case Role::AttnK: return GgmlType::IQ2_S;
    default: return GgmlType::IQ3_XXS;
  }
}

// MOSTLY_Q3_K_M: Q3_K with the first two attention V in Q5_K and the rest in Q4_K, ffn_down in
// Q5_K in the first 1/16 of the layers and Q4_K after, attention output Q4_K, the head Q6_K.
GgmlType q3km_type(const TensorPlace& p) {
  if (!is_matrix(p.role)) return unquantized(p.role);
  if (is_attn_v_like(p.role)) return p.attn_v_index < 2 ? GgmlType::Q5_K : GgmlType::Q4_K;
  if (is_ffn_down(p.role)) return in_first(p.layer, p.n_layer, 16) ? GgmlType::Q5_K : GgmlType::Q4_K;
  switch (p.role) {
    case Role::Output: return GgmlType::Q6_K;
    case Role::AttnOutput: return GgmlType::Q4_K;
    default: return GgmlType::Q3_K;
  }
}

// MOSTLY_IQ4_XS / MOSTLY_IQ4_NL: the base type everywhere but attention V (Q5_K) and the head
// (Q6_K); with an importance matrix ffn_down keeps the base type.
GgmlType iq4_type(const TensorPlace& p, GgmlType base) {
  if (!is_matrix(p.role)) return unquantized(p.role);
  if (is_attn_v_like(p.role)) return GgmlType::Q5_K;
  return p.role == Role::Output ? GgmlType::Q6_K : base;
}
GgmlType iq4xs_type(const TensorPlace& p) { return iq4_type(p, GgmlType::IQ4_XS); }
GgmlType iq4nl_type(const TensorPlace& p) { return iq4_type(p, GgmlType::IQ4_NL); }

// A Q4_0 file with --tensor-type overrides: routed experts as llama.cpp's MOSTLY_Q4_0 stores them
// (with an importance matrix ffn_down of the first 1/8 of the layers in Q4_1), attention, DeltaNet
// and the shared expert as its MOSTLY_Q5_0 does (Q5_1 in the same place), embedding and head Q8_0.
GgmlType legacy_type(const TensorPlace& p) {
  if (!is_matrix(p.role)) return unquantized(p.role);
  const bool early = in_first(p.layer, p.n_layer, 8);
  switch (p.role) {
    case Role::TokenEmbd:
    case Role::Output: return GgmlType::Q8_0;
    case Role::GateExps:
    case Role::UpExps: return GgmlType::Q4_0;
    case Role::DownExps: return early ? GgmlType::Q4_1 : GgmlType::Q4_0;
    case Role::DownShexp: return early ? GgmlType::Q5_1 : GgmlType::Q5_0;
    default: return GgmlType::Q5_0;
  }
}

// MOSTLY_MXFP4_MOE (gpt-oss-style): the routed experts (3-D tensors) MXFP4, every other quantised
// tensor Q8_0, the head too. Made from a BF16 conversion, so the shared-expert gate stays BF16.
GgmlType mxfp4_type(const TensorPlace& p) {
  if (p.role == Role::SharedGateInp) return GgmlType::BF16;
  if (!is_matrix(p.role)) return GgmlType::F32;
  return is_expert(p.role) ? GgmlType::MXFP4 : GgmlType::Q8_0;
}

// MOSTLY_IQ1_S (llama.cpp's IQ1/IQ2 family rules): attention V in Q4_K, the first 1/8 of the
// ffn_down tensors in file order (exps and shexp alternate, so the first 1/16 of the layers) and
// the embedding in Q2_K, attention output IQ2_XXS, the head Q5_K.
GgmlType iq1s_type(const TensorPlace& p) {
  if (!is_matrix(p.role)) return unquantized(p.role);
  if (is_attn_v_like(p.role)) return GgmlType::Q4_K;
  if (is_ffn_down(p.role)) return in_first(p.ffn_down_index, p.n_layer, 8) ? GgmlType::Q2_K : GgmlType::IQ1_S;
  switch (p.role) {
    case Role::Output: return GgmlType::Q5_K;
    case Role::TokenEmbd: return GgmlType::Q2_K;
    case Role::AttnOutput: return GgmlType::IQ2_XXS;
    default: return GgmlType::IQ1_S;
  }
}

struct Recipe {
  const char* name;
  uint32_t file_type;  // LLAMA_FTYPE_*
  GgmlType (*type_of)(const TensorPlace&);
  const char* help;
};

// LLAMA_FTYPE_* ids from llama.h: ALL_F32 0, MOSTLY_Q4_0 2, Q3_K_M 12, Q4_K_M 15, IQ2_XS 20,
// IQ3_XXS 23, IQ1_S 24, IQ4_NL 25, IQ4_XS 30, MXFP4_MOE 38, GUESSED 1024.
const Recipe kRecipes[] = {
    {"seed-mix", 20, seed_mix_type, "IQ2_XS/IQ1_M experts, the project's 80B measurement file"},
    {"q4km", 15, q4km_type, "Q4_K with Q6_K attention V, shared-expert down and head"},
    {"q4km-shexp-f16", 15, q4km_shexp_f16_type, "q4km with ffn_gate_inp_shexp in F16, as the published files"},
    {"iq3xxs", 23, iq3xxs_type, "llama.cpp's IQ3_XXS mix (IQ3_S, IQ2_S, Q4_K, Q5_K)"},
    {"q3km", 12, q3km_type, "llama.cpp's Q3_K_M mix (Q4_K, Q5_K, Q6_K)"},
    {"iq4xs", 30, iq4xs_type, "llama.cpp's IQ4_XS mix (Q5_K, Q6_K)"},
    {"iq4nl", 25, iq4nl_type, "llama.cpp's IQ4_NL mix (Q5_K, Q6_K)"},
    {"legacy", 2, legacy_type, "Q4_0/Q4_1 experts, Q5_0/Q5_1 dense, Q8_0 embedding and head"},
    {"mxfp4", 38, mxfp4_type, "llama.cpp's MXFP4_MOE mix: MXFP4 experts, Q8_0 rest, BF16 shared gate"},
    {"iq1s", 24, iq1s_type, "llama.cpp's IQ1_S mix (IQ2_XXS, Q2_K, Q4_K, Q5_K)"},
    {"all-types", 1024, all_types_type, "matrices cycle through all 23 types (file type: guessed)"},
    {"f32", 0, f32_type, "every tensor F32"},
};

const Recipe& find_recipe(const std::string& name) {
  for (const Recipe& r : kRecipes)
    if (name == r.name) return r;
  fail("--recipe {}: unknown recipe (known: {})", name, fmt::join(recipe_names(), ", "));
}

}  // namespace

const std::vector<std::string>& recipe_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const Recipe& r : kRecipes) n.push_back(r.name);
    return n;
  }();
  return names;
}

GgmlType recipe_type(const std::string& recipe, const TensorPlace& place) { return find_recipe(recipe).type_of(place); }

uint32_t recipe_file_type(const std::string& recipe) { return find_recipe(recipe).file_type; }

std::string recipe_help() {
  std::string s = "tensor types (default seed-mix):";
  for (const Recipe& r : kRecipes) s += fmt::format("\n  {}: {}", r.name, r.help);
  return s;
}

}  // namespace rl::synth
