// Activations quantised for the fast tier's integer dot products: one fp32 scale and 8-bit
// values per block, as llama.cpp's CPU backend forms them (Q8_K for the K and IQ weight types,
// Q8_0 for Q8_0 weights). The scale maps the block's largest magnitude to 127.
#pragma once
#include <cstdint>
#include <vector>

namespace rl::cpu {

// 256 values: x ≈ d * qs; bsums[i] = sum of qs[16i .. 16i+15] (the K-quants' min and offset
// terms need the sums of the activations they multiply, per 16 or 32 values).
struct ActivationQ8K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};

// 32 values: x ≈ d * qs.
struct ActivationQ8_0 {
  float d;
  int8_t qs[32];
};

// x: [n], n a multiple of the block size; out: [n / block size] blocks.
void quantize_activation_q8k(const float* x, int64_t n, ActivationQ8K* out);
void quantize_activation_q8_0(const float* x, int64_t n, ActivationQ8_0* out);

}  // namespace rl::cpu
