#include "cpu/activation_quant.h"

#include <cmath>

namespace rl::cpu {
namespace {

// qs[i] = round(x[i] / d) with d = max |x| / 127 (all zero when the block is); returns d.
float quantize_block(const float* x, int n, int8_t* qs) {
  float amax = 0.0f;
  for (int i = 0; i < n; i++) amax = std::fmax(amax, std::fabs(x[i]));
  if (amax == 0.0f) {
    for (int i = 0; i < n; i++) qs[i] = 0;
    return 0.0f;
  }
  const float inverse = 127.0f / amax;
  for (int i = 0; i < n; i++) qs[i] = (int8_t)std::lrint(x[i] * inverse);
  return amax / 127.0f;
}

}  // namespace

void quantize_activation_q8k(const float* x, int64_t n, ActivationQ8K* out) {
  for (int64_t b = 0; b < n / 256; b++, x += 256) {
    ActivationQ8K& blk = out[b];
    for (int i = 0; i < 8; i++) blk.d[i] = quantize_block(x + 32 * i, 32, blk.qs + 32 * i);
    for (int i = 0; i < 16; i++) {
      int sum = 0;
      for (int j = 0; j < 16; j++) sum += blk.qs[16 * i + j];
      blk.bsums[i] = (int16_t)sum;
    }
  }
}

void quantize_activation_q8_0(const float* x, int64_t n, ActivationQ8_0* out) {
  for (int64_t b = 0; b < n / 32; b++, x += 32) out[b].d = quantize_block(x, 32, out[b].qs);
}

}  // namespace rl::cpu
