// round_to_fp32 (math_device.cuh) against the conversions it replaces, (double)(float)x, on every
// binade from below fp32's subnormals to past its largest value: mantissas with the 29 dropped bits
// exactly half (ties, both parities), just below and above half, all ones (carries into the next
// binade), zero and random, both signs.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/math_device.cuh"
#include "gpu_test_util.h"

namespace rl {
namespace {

__global__ void round_kernel(const double* in, double* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = cuda::round_to_fp32(in[i]);
}

TEST(CudaMath, RoundToFp32EqualsTheConversions) {
  if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped (run it on the GPU host)";
  std::vector<double> xs = {0.0, -0.0};
  std::mt19937_64 rng(5);
  const uint64_t low29[] = {0, 1, 0x0FFFFFFF, 0x10000000, 0x10000001, 0x1FFFFFFF, 0x0FFFFFFE};
  for (int e = -160; e <= 130; e++)
    for (uint64_t top : {uint64_t{0}, uint64_t{1}, uint64_t{0x7FFFFF}, uint64_t{0x7FFFFE}, uint64_t{0x400000}})
      for (int k = 0; k < 10; k++)
        for (int sign = 0; sign < 2; sign++) {
          const uint64_t m23 = k < 7 ? top : (rng() & 0x7FFFFF);
          const uint64_t l29 = k < 7 ? low29[k] : (rng() & 0x1FFFFFFF);
          const uint64_t bits = ((uint64_t)sign << 63) | ((uint64_t)(1023 + e) << 52) | (m23 << 29) | l29;
          double x;
          std::memcpy(&x, &bits, 8);
          xs.push_back(x);
        }
  auto din = test::to_device(xs);
  cuda::DeviceBuffer dout(xs.size() * sizeof(double));
  round_kernel<<<(unsigned)(xs.size() + 255) / 256, 256>>>(din.get<double>(), dout.get<double>(), (int)xs.size());
  RL_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = test::to_host<double>(dout, xs.size());
  int bad = 0;
  for (size_t i = 0; i < xs.size(); i++) {
    const double want = (double)(float)xs[i];
    const bool same = std::isinf(want) ? got[i] == want : std::memcmp(&got[i], &want, 8) == 0;
    if (!same && ++bad <= 10) ADD_FAILURE() << std::hexfloat << "x = " << xs[i] << ": got " << got[i] << ", want " << want;
  }
  EXPECT_EQ(bad, 0) << "of " << xs.size();
}

}  // namespace
}  // namespace rl
