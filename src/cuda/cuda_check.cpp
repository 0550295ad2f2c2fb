#include "cuda/cuda_check.h"

#include "common/error.h"

namespace rl::cuda {

void throw_cuda_error(const char* expr, cudaError_t err) {
  fail("CUDA: {} failed: {} ({})", expr, cudaGetErrorString(err), (int)err);
}

void throw_error(const std::string& message) { throw Error(message); }

const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo d;
    int dev = 0;
    RL_CUDA_CHECK(cudaGetDevice(&dev));
    RL_CUDA_CHECK(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, dev));
    RL_CUDA_CHECK(cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    return d;
  }();
  return info;
}

}  // namespace rl::cuda
