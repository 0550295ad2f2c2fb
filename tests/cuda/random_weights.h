// Random inputs and random-but-valid quantised rows of every ggml type, for the CUDA kernel tests,
// bench/cuda_kernels (which times the kernels on the same data the tests check them on) and the
// CPU kernel tests that need random inputs (plain C++: no CUDA in it).
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/fp16.h"
#include "quant/quant.h"

namespace rl::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The fp16 fields of a block (byte offsets) that random bytes must not turn into inf/NaN.
inline std::vector<int> half_fields(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::IQ4_NL: return {0};
    case GgmlType::Q4_1: case GgmlType::Q5_1: return {0, 2};
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q6_K: return {208};
    case GgmlType::IQ4_XS: case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS: case GgmlType::IQ2_S:
    case GgmlType::IQ3_XXS: case GgmlType::IQ3_S: case GgmlType::IQ1_S: return {0};
    default: return {};
  }
}

// rows × cols values of type t: random bytes with every scale a finite, modest fp16 value.
inline std::vector<uint8_t> random_rows(GgmlType t, int rows, int cols, uint32_t seed) {
  const QuantType& q = quant_type(t);
  const size_t row_bytes = row_size(t, cols);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint8_t> data(row_bytes * rows);
  for (auto& b : data) b = (uint8_t)byte(rng);
  const size_t n_blocks = data.size() / q.type_size;
  for (size_t i = 0; i < n_blocks; i++) {
    uint8_t* blk = data.data() + i * q.type_size;
    if (t == GgmlType::F32) {
      const float v = normal(rng);
      std::memcpy(blk, &v, 4);
    } else if (t == GgmlType::F16) {
      const uint16_t h = f32_to_fp16(normal(rng));
      std::memcpy(blk, &h, 2);
    } else if (t == GgmlType::BF16) {
      const float v = normal(rng);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const uint16_t h = (uint16_t)(bits >> 16);
      std::memcpy(blk, &h, 2);
    } else if (t == GgmlType::MXFP4) {
      // The E8M0 exponent: 2^(e - 128) * 12 stays finite for e < 254; e = 0 and 1 (subnormal
      // scales) are drawn too, one block in eight, so their exact product is covered.
      blk[0] = (uint8_t)(byte(rng) % 8 == 0 ? byte(rng) % 2 : 100 + byte(rng) % 40);
    } else if (t == GgmlType::IQ1_M) {
      // The fp16 super-scale lives in the top nibbles of the four 16-bit scale words.
      const uint16_t h = f32_to_fp16(scale(rng));
      for (int w = 0; w < 4; w++) {
        uint16_t sc;
        std::memcpy(&sc, blk + 48 + 2 * w, 2);
        sc = (uint16_t)((sc & 0x0FFF) | (((h >> (4 * w)) & 0xF) << 12));
        std::memcpy(blk + 48 + 2 * w, &sc, 2);
      }
    } else {
      for (int off : half_fields(t)) {
        const uint16_t h = f32_to_fp16(scale(rng));
        std::memcpy(blk + off, &h, 2);
      }
    }
  }
  return data;
}

}  // namespace rl::test
