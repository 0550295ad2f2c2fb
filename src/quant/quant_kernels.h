// Reference (scalar, bit-exact with ggml) dequantisation and dot products, one pair per type.
// Block layouts: quant/blocks.h. Codebook grids of the IQ types: quant/iq_grids.h.
#pragma once
#include <cstdint>

namespace rl {

#define RL_DECLARE_QUANT(name)                                      \
  void dequantize_row_##name(const void* src, float* dst, int64_t n); \
  float dot_row_##name(const void* src, const float* x, int64_t n);

RL_DECLARE_QUANT(f32)
RL_DECLARE_QUANT(f16)
RL_DECLARE_QUANT(bf16)
RL_DECLARE_QUANT(q4_0)
RL_DECLARE_QUANT(q4_1)
RL_DECLARE_QUANT(q5_0)
RL_DECLARE_QUANT(q5_1)
RL_DECLARE_QUANT(q8_0)
RL_DECLARE_QUANT(q2_K)
RL_DECLARE_QUANT(q3_K)
RL_DECLARE_QUANT(q4_K)
RL_DECLARE_QUANT(q5_K)
RL_DECLARE_QUANT(q6_K)
RL_DECLARE_QUANT(iq2_xxs)
RL_DECLARE_QUANT(iq2_xs)
RL_DECLARE_QUANT(iq2_s)
RL_DECLARE_QUANT(iq3_xxs)
RL_DECLARE_QUANT(iq3_s)
RL_DECLARE_QUANT(iq1_s)
RL_DECLARE_QUANT(iq1_m)
RL_DECLARE_QUANT(iq4_nl)
RL_DECLARE_QUANT(iq4_xs)
RL_DECLARE_QUANT(mxfp4)

#undef RL_DECLARE_QUANT

}  // namespace rl
