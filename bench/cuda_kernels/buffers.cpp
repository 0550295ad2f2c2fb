// Device buffers of the bench's cases: copies of an input rotated past the L2 cache, random data
// made as the kernel tests make it (tests/cuda/random_weights.h).
#include <algorithm>
#include <vector>

#include "bench.h"
#include "cuda/random_weights.h"

namespace rl::bench {

namespace {
constexpr size_t kAlign = 256;
constexpr int kMaxCopies = 64;
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

int copies_for(size_t bytes) {
  static const size_t l2 = [] {
    int dev = 0, l2_bytes = 0;
    RL_CUDA_CHECK(cudaGetDevice(&dev));
    RL_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, dev));
    return (size_t)l2_bytes;
  }();
  if (bytes == 0) return 1;
  return (int)std::clamp<size_t>((4 * l2 + bytes - 1) / bytes, 1, kMaxCopies);
}

Copies::Copies(const void* host, size_t bytes, int n) : stride_(aligned(std::max<size_t>(bytes, 1))), n_(n) {
  buf_.allocate(stride_ * n);
  RL_CUDA_CHECK(cudaMemcpy(buf_.get(), host, bytes, cudaMemcpyHostToDevice));
  for (int i = 1; i < n; i++)
    RL_CUDA_CHECK(cudaMemcpy(buf_.get<uint8_t>() + i * stride_, buf_.get(), bytes, cudaMemcpyDeviceToDevice));
}

std::shared_ptr<Copies> make_copies(const void* host, size_t bytes, int n) {
  return std::make_shared<Copies>(host, bytes, n);
}

std::shared_ptr<cuda::DeviceBuffer> device_buffer(size_t bytes) {
  auto b = std::make_shared<cuda::DeviceBuffer>(std::max<size_t>(bytes, 4));
  RL_CUDA_CHECK(cudaMemset(b->get(), 0, b->bytes()));
  return b;
}

std::vector<float> random_values(size_t n, uint32_t seed, float scale) { return test::random_floats(n, seed, scale); }

std::vector<uint8_t> random_weights(GgmlType t, int rows, int cols, uint32_t seed) {
  // Past 4096 rows the first 4096 repeat: the values do not change a kernel's time, and making
  // the LM head's 151936 rows byte by byte would take longer than timing it.
  constexpr int kDistinctRows = 4096;
  if (rows <= kDistinctRows) return test::random_rows(t, rows, cols, seed);
  const std::vector<uint8_t> part = test::random_rows(t, kDistinctRows, cols, seed);
  std::vector<uint8_t> all(row_size(t, cols) * rows);
  for (size_t off = 0; off < all.size(); off += part.size())
    std::copy_n(part.begin(), std::min(part.size(), all.size() - off), all.begin() + off);
  return all;
}

}  // namespace rl::bench
