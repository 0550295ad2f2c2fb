#include "cuda/cuda_check.h"

#include "common/error.h"

namespace rl::cuda {

void throw_cuda_error(const char* expr, cudaError_t err) {
  fail("CUDA: {} failed: {} ({})", expr, cudaGetErrorString(err), (int)err);
}

void throw_error(const std::string& message) { throw Error(message); }

}  // namespace rl::cuda
