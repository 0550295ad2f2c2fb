// The backend's streams and the events that order them: kernels on `compute`, expert copies on
// `copy`, and on `side` the decode graph's shared expert, a branch beside the routing and the
// routed experts. slots_free: recorded after the kernels that last read the slots a copy may
// overwrite; copies_done: after a layer's copies; router_ready: after a layer's selections reach
// the host; side_fork / side_join: where the side branch starts (the MoE input is ready) and ends;
// prediction_ready: after a predicted layer's selections reach the host; prefetch_done: after the
// copies of a prefetch (expert_prefetch.cpp); predict_fork, predict_marked[2], predict_staged[2]:
// the decode graph's prediction branch on `predict` (--miss-reads host: the next layer's predicted
// misses staged from host memory beside this layer's experts, expert_prefetch.cpp), where it
// starts, where layer M's predicted experts are known (index M % 2) and where they are copied.
// step_begin / step_graph_end / step_end (timing): a batched decode step's graph and its logits'
// copy to the host, for EngineStats.
#pragma once
#include <cuda_runtime.h>

#include "cuda/cuda_check.h"

namespace rl::cuda {

struct Streams {
  Streams() {
    RL_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    RL_CUDA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
    RL_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    RL_CUDA_CHECK(cudaStreamCreateWithFlags(&predict, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&predict_fork, &predict_marked[0], &predict_marked[1], &predict_staged[0], &predict_staged[1]})
      RL_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    RL_CUDA_CHECK(cudaEventCreateWithFlags(&side_fork, cudaEventDisableTiming));
    RL_CUDA_CHECK(cudaEventCreateWithFlags(&side_join, cudaEventDisableTiming));
    RL_CUDA_CHECK(cudaEventCreateWithFlags(&slots_free, cudaEventDisableTiming));
    RL_CUDA_CHECK(cudaEventCreateWithFlags(&copies_done, cudaEventDisableTiming));
    RL_CUDA_CHECK(cudaEventCreateWithFlags(&router_ready, cudaEventDisableTiming));
    RL_CUDA_CHECK(cudaEventCreateWithFlags(&prediction_ready, cudaEventDisableTiming));
    RL_CUDA_CHECK(cudaEventCreateWithFlags(&prefetch_done, cudaEventDisableTiming));
    for (cudaEvent_t* e : {&step_begin, &step_graph_end, &step_end}) RL_CUDA_CHECK(cudaEventCreate(e));
    RL_CUDA_CHECK(cudaEventRecord(slots_free, compute));
  }
  ~Streams() {
    if (compute) cudaStreamSynchronize(compute);
    if (copy) cudaStreamSynchronize(copy);
    if (side) cudaStreamSynchronize(side);
    if (predict) cudaStreamSynchronize(predict);
    for (cudaEvent_t e : {slots_free, copies_done, router_ready, side_fork, side_join, prediction_ready, prefetch_done,
                          predict_fork, predict_marked[0], predict_marked[1], predict_staged[0], predict_staged[1],
                          step_begin, step_graph_end, step_end})
      if (e) cudaEventDestroy(e);
    for (cudaStream_t s : {compute, copy, side, predict})
      if (s) cudaStreamDestroy(s);
  }
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;

  // The side branch: fork_side() starts it where `compute` is (what it enqueues on `side` next
  // waits for that), end_side() marks its end, join_side() makes `compute` wait for that end.
  void fork_side() {
    RL_CUDA_CHECK(cudaEventRecord(side_fork, compute));
    RL_CUDA_CHECK(cudaStreamWaitEvent(side, side_fork));
  }
  void end_side() { RL_CUDA_CHECK(cudaEventRecord(side_join, side)); }
  void join_side() { RL_CUDA_CHECK(cudaStreamWaitEvent(compute, side_join)); }
  // The prediction branch of layer M (predicting M from layer M - 1): fork_predict() starts it
  // where `compute` is; mark_predicted(M) / staged_predicted(M) record where it has named and where
  // it has copied M's predicted experts; wait_marked(M) / wait_staged(M) make `compute` wait there
  // (M's routing, M's expert kernels). Two sets, by M % 2, since M + 1's branch starts before M's
  // expert kernels wait for M's copies.
  void fork_predict() {
    RL_CUDA_CHECK(cudaEventRecord(predict_fork, compute));
    RL_CUDA_CHECK(cudaStreamWaitEvent(predict, predict_fork));
  }
  void mark_predicted(int M) { RL_CUDA_CHECK(cudaEventRecord(predict_marked[M % 2], predict)); }
  void staged_predicted(int M) { RL_CUDA_CHECK(cudaEventRecord(predict_staged[M % 2], predict)); }
  void wait_marked(int M) { RL_CUDA_CHECK(cudaStreamWaitEvent(compute, predict_marked[M % 2])); }
  void wait_staged(int M) { RL_CUDA_CHECK(cudaStreamWaitEvent(compute, predict_staged[M % 2])); }

  cudaStream_t compute = nullptr, copy = nullptr, side = nullptr, predict = nullptr;
  cudaEvent_t slots_free = nullptr, copies_done = nullptr, router_ready = nullptr;
  cudaEvent_t side_fork = nullptr, side_join = nullptr;
  cudaEvent_t prediction_ready = nullptr, prefetch_done = nullptr;
  cudaEvent_t predict_fork = nullptr, predict_marked[2] = {}, predict_staged[2] = {};
  cudaEvent_t step_begin = nullptr, step_graph_end = nullptr, step_end = nullptr;
};

}  // namespace rl::cuda
