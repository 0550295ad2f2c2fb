// bench_cuda_kernels: each CUDA kernel family timed alone at the shapes of Qwen3-Next-80B-A3B, on
// random weights of the 80B seed-mix recipe's types (made as the kernel tests make them). A case
// is one call of a launcher as the forward pass makes it (kernels.h); main.cpp times it with CUDA
// events over many calls after a warm-up and prints the time, the bytes a call must move at
// least, and the rate against the H200's memory bandwidth (FLOP/s for the prefill products).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "quant/quant.h"

namespace rl::bench {

// The 80B's dimensions (fixtures/80b-seed-mix.tensors.json: `redlite synth --preset 80b`).
struct Shapes80B {
  static constexpr int n_embd = 2048, n_vocab = 151936;
  static constexpr int n_head = 16, n_kv = 2, head_dim = 256, rope_dims = 64;
  static constexpr int ssm_k_heads = 16, ssm_v_heads = 32, ssm_head_dim = 128, conv_kernel = 4;
  static constexpr int key_dim = ssm_k_heads * ssm_head_dim;                // 2048
  static constexpr int value_dim = ssm_v_heads * ssm_head_dim;              // 4096
  static constexpr int conv_dim = 2 * key_dim + value_dim;                  // 8192: q | k | v
  static constexpr int n_expert = 512, n_expert_used = 10, n_ff_exp = 512, n_ff_shexp = 512;
  static constexpr int chunk = 512;  // prefill tokens a pass (kMaxChunk)
  static constexpr float rms_eps = 1e-6f;
};

// One timed call. `run(copy, stream)` enqueues the call on copy `copy` (0 .. copies - 1) of the
// case's large inputs: calls rotate over copies whose total exceeds the L2 cache, so that
// repeated calls read memory as a forward pass does (each layer its own weights) rather than L2.
struct Case {
  double bytes = 0;  // bytes a call reads and writes at least (weights, inputs, outputs, state)
  double flops = 0;  // the products' multiply-adds times 2 (prefill products), else 0
  int copies = 1;
  int launches = 1;  // kernel launches a call makes (bounds how many calls are enqueued at once)
  std::function<void(int copy, cudaStream_t stream)> run;
  std::vector<std::shared_ptr<void>> keep;  // the buffers `run` uses
};

// A case by name, made only when selected (making one allocates and fills its buffers).
struct CaseDef {
  std::string name;
  std::function<Case()> make;
};

// The decode (one token) and prefill (one 512-token chunk) cases, in forward-pass order.
std::vector<CaseDef> decode_cases();
std::vector<CaseDef> prefill_cases();

// ---- buffers (cases.cpp) -------------------------------------------------------------------------

// How many copies of a set of `bytes` make up at least four times the L2 cache (1 to 64).
int copies_for(size_t bytes);

// A host image of several arrays, each at a 256-byte aligned offset (one copy's inputs).
struct Image {
  std::vector<uint8_t> bytes;
  template <class T>
  size_t add(const std::vector<T>& v) {
    const size_t off = (bytes.size() + 255) / 256 * 256;
    bytes.resize(off + v.size() * sizeof(T));
    std::memcpy(bytes.data() + off, v.data(), v.size() * sizeof(T));
    return off;
  }
};

// `n` copies of a host image on the device, each starting 256 bytes aligned.
class Copies {
 public:
  Copies(const void* host, size_t bytes, int n);
  const uint8_t* at(int i) const { return buf_.get<uint8_t>() + (size_t)(i % n_) * stride_; }
  float* f(int i) const { return reinterpret_cast<float*>(buf_.get<uint8_t>() + (size_t)(i % n_) * stride_); }
  int n() const { return n_; }

 private:
  cuda::DeviceBuffer buf_;
  size_t stride_;
  int n_;
};

// Device buffers owned by a case: `make_copies` and `device_buffer` return shared pointers for
// Case::keep.
std::shared_ptr<Copies> make_copies(const void* host, size_t bytes, int n);
std::shared_ptr<cuda::DeviceBuffer> device_buffer(size_t bytes);
// A device buffer holding v.
template <class T>
std::shared_ptr<cuda::DeviceBuffer> device_vector(const std::vector<T>& v) {
  auto b = device_buffer(v.size() * sizeof(T));
  RL_CUDA_CHECK(cudaMemcpy(b->get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}
// rows × cols random normal floats (scale: their deviation) / random valid rows of type t.
std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f);
std::vector<uint8_t> random_weights(GgmlType t, int rows, int cols, uint32_t seed);

}  // namespace rl::bench
