// The backend's two streams and the events that order them: kernels on `compute`, expert copies
// on `copy`. slots_free: recorded after the kernels that last read the slots a copy may overwrite;
// copies_done: after a layer's copies; router_ready: after a layer's selections reach the host.
#pragma once
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"

namespace rl::cuda {

struct Streams {
  Streams() {
    RL_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    RL_CUDA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
    RL_CUDA_CHECK(cudaEventCreateWithFlags(&slots_free, cudaEventDisableTiming));
    RL_CUDA_CHECK(cudaEventCreateWithFlags(&copies_done, cudaEventDisableTiming));
    RL_CUDA_CHECK(cudaEventCreateWithFlags(&router_ready, cudaEventDisableTiming));
    RL_CUDA_CHECK(cudaEventRecord(slots_free, compute));
  }
  ~Streams() {
    if (compute) cudaStreamSynchronize(compute);
    if (copy) cudaStreamSynchronize(copy);
    for (cudaEvent_t e : {slots_free, copies_done, router_ready})
      if (e) cudaEventDestroy(e);
    if (compute) cudaStreamDestroy(compute);
    if (copy) cudaStreamDestroy(copy);
  }
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;

  cudaStream_t compute = nullptr, copy = nullptr;
  cudaEvent_t slots_free = nullptr, copies_done = nullptr, router_ready = nullptr;
};

}  // namespace rl::cuda
