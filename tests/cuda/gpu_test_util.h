// Helpers of the CUDA kernel tests: skip visibly without a GPU, device buffers from host vectors,
// random inputs and random-but-valid quantised rows.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "common/fp16.h"
#include "cuda/cuda_check.h"
#include "quant/quant.h"

#define RL_REQUIRE_GPU()                                                                  \
  do {                                                                                    \
    if (!::rl::cuda::device_available())                                                  \
      GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped (run it on the GPU host)"; \
  } while (0)

namespace rl::test {

// Every ggml type with a float view (quant/quant.h), all of which the backend runs: the tuned
// forms and the generic path.
inline constexpr GgmlType kWeightTypes[] = {
    GgmlType::F32,    GgmlType::F16,    GgmlType::BF16,    GgmlType::Q4_0,   GgmlType::Q4_1,   GgmlType::Q5_0,
    GgmlType::Q5_1,   GgmlType::Q8_0,   GgmlType::IQ4_NL,  GgmlType::MXFP4,  GgmlType::Q2_K,   GgmlType::Q3_K,
    GgmlType::Q4_K,   GgmlType::Q5_K,   GgmlType::Q6_K,    GgmlType::IQ4_XS, GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
    GgmlType::IQ2_S,  GgmlType::IQ3_XXS, GgmlType::IQ3_S,  GgmlType::IQ1_S,  GgmlType::IQ1_M};
static_assert(std::size(kWeightTypes) == 23);

template <class T>
cuda::DeviceBuffer to_device(const std::vector<T>& v) {
  cuda::DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 4));
  if (!v.empty()) RL_CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}

template <class T>
std::vector<T> to_host(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  RL_CUDA_CHECK(cudaDeviceSynchronize());
  RL_CUDA_CHECK(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

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

// Σ w_i·v_i in double (each product exact: fp32 × fp32, or fp32 × a value of at most 29
// significant bits) and the magnitude Σ |w_i·v_i| that bounds the sum's rounding.
template <class V>
std::pair<double, double> exact_dot(const float* w, const V* v, size_t n) {
  double s = 0, mag = 0;
  for (size_t i = 0; i < n; i++) {
    s += (double)w[i] * (double)v[i];
    mag += std::fabs((double)w[i] * (double)v[i]);
  }
  return {s, mag};
}

// |a - b| within rel * scale + abs, where scale is the magnitude the sum was formed from.
inline void expect_close(float got, double want, double magnitude, double rel, const char* what, int i) {
  EXPECT_LE(std::fabs(got - want), rel * magnitude + 1e-6)
      << what << " [" << i << "]: got " << got << ", reference " << want;
}

// got is the fp32 rounding of the exact sum `want` (a double sum of exact products): within half an
// fp32 ulp of it, plus what double sums of that magnitude can round (1e-13 of it). The decode and
// prefill products claim this; a value rounded once more in fp32 anywhere on the way misses it.
inline void expect_fp32_rounding(float got, double want, double magnitude, const char* what, int i) {
  const float w = (float)want;
  const double half_ulp = w == 0.0f || !std::isnormal(w) ? std::ldexp(1.0, -150) : std::ldexp(1.0, std::ilogb(w) - 24);
  EXPECT_LE(std::fabs(got - want), half_ulp + 1e-13 * magnitude)
      << what << " [" << i << "]: got " << got << ", reference " << want << " (rounds to " << w << ")";
}

}  // namespace rl::test
