// Recipes of `redlite synth`: which ggml type each tensor of a synthetic model is stored in, and
// the llama.cpp file type (`general.file_type`) the file declares. docs/synth.md has the tables.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "quant/quant.h"

namespace rl::synth {

// What a tensor is, independent of its layer: the recipe maps it to a type.
enum class Role {
  TokenEmbd, Output, Norm, SsmIn, AttnQkv, AttnGate, SsmConv, SsmDtBias, SsmA, SsmBa, SsmOut,
  AttnQ, AttnK, AttnV, AttnOutput, Router, GateExps, UpExps, DownExps, SharedGateInp,
  GateShexp, UpShexp, DownShexp,
};

// Where a tensor sits in the file, as llama.cpp's quantizer sees it when it picks a type.
struct TensorPlace {
  Role role = Role::Norm;
  int layer = -1;          // -1 for token_embd, output_norm, output
  int n_layer = 0;
  int matrix_index = 0;    // position among the file's weight matrices (all-types' cycle)
  int attn_v_index = 0;    // attn_v / attn_qkv tensors before this one (llama.cpp's i_attention_wv)
  int ffn_down_index = 0;  // ffn_down_exps / ffn_down_shexp tensors before this one (i_ffn_down)
};

// A weight matrix (quantised in the low-bit recipes), not a norm, router or DeltaNet vector.
bool is_matrix(Role role);
bool is_attn_v_like(Role role);  // attn_v, attn_qkv: llama.cpp's "attention V" category
bool is_ffn_down(Role role);     // ffn_down_exps, ffn_down_shexp

// The recipe's type for a tensor; the recipe must be one of recipe_names() (synth.h).
GgmlType recipe_type(const std::string& recipe, const TensorPlace& place);
// llama.cpp's LLAMA_FTYPE_* id the recipe's file declares.
uint32_t recipe_file_type(const std::string& recipe);
// One line per recipe for --help.
std::string recipe_help();

}  // namespace rl::synth
