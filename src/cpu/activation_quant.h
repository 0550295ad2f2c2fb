// Activations quantised for the fast tier's integer dot products: 8-bit values with one fp32
// scale per 32 values (as ggml's Q8_0), which maps the block's largest magnitude to 127, grouped
// by 256 as ggml's Q8_K, with the sums of every 16 quantised values (bsums) that the K-quants'
// min terms need. One scale per 32
// values rather than Q8_K's one per 256 keeps a large activation from coarsening its neighbours:
// on the fixtures it is what lifts the model-level agreement above llama.cpp's own (docs/cpu-fast.md).
#pragma once
#include <cstdint>
#include <vector>

namespace rl::cpu {

// 256 values: x[i] ≈ d[i / 32] * qs[i]; bsums[i] = sum of qs[16i .. 16i+15].
struct ActivationQ8K {
  float d[8];
  int8_t qs[256];
  int16_t bsums[16];
};

// x: [n], n a multiple of 256; out: [n / 256] blocks.
void quantize_activation_q8k(const float* x, int64_t n, ActivationQ8K* out);

}  // namespace rl::cpu
