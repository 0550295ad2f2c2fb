// Helpers of the CUDA kernel tests: skip visibly without a GPU, device buffers from host vectors,
// random inputs and random-but-valid quantised rows (random_weights.h), reference sums.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "common/fp16.h"
#include "cpu/kv_cache.h"
#include "cuda/cuda_check.h"
#include "model/kv_type.h"
#include "quant/quant.h"
#include "random_weights.h"

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

// The values the CPU backend's KV cache of `type` holds for rows x [rows][width] (cpu::KvRows).
inline std::vector<float> kv_values(KvType type, const std::vector<float>& x, size_t width) {
  const size_t rows = x.size() / width;
  cpu::KvRows cache(type, (int)width);
  cache.write(0, x.data(), rows);
  std::vector<float> out(x.size()), scratch(width);
  for (size_t r = 0; r < rows; r++) {
    const float* got = cache.read(r, 0, (int)width, scratch.data());
    std::copy(got, got + width, out.begin() + r * width);
  }
  return out;
}

// Rows [0, rows) of a device KV cache (cuda::KvCacheRef's layout: n_ctx rows of width values;
// q8_0 the int8 values, then the fp16 scales), decoded on the host.
inline std::vector<float> device_kv_values(KvType type, const cuda::DeviceBuffer& b, int n_ctx, size_t width,
                                           size_t rows) {
  const size_t n = rows * width;
  std::vector<float> out(n);
  if (type == KvType::kF32) return to_host<float>(b, n);
  if (type != KvType::kQ8_0) {
    const auto bits = to_host<uint16_t>(b, n);
    for (size_t i = 0; i < n; i++) out[i] = type == KvType::kF16 ? fp16_to_f32(bits[i]) : bf16_to_f32(bits[i]);
    return out;
  }
  const auto all = to_host<uint8_t>(b, kv_bytes(type, (size_t)n_ctx * width));
  const uint8_t* scales = all.data() + (size_t)n_ctx * width;
  for (size_t i = 0; i < n; i++) {
    uint16_t d;
    std::memcpy(&d, scales + 2 * (i / kKvQ8Block), 2);
    out[i] = (float)(int8_t)all[i] * fp16_to_f32(d);
  }
  return out;
}

}  // namespace rl::test
