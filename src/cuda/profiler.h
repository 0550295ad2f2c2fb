// Per-stage GPU timing (--profile): event marks on the compute stream between stages, folded into
// per-stage totals after each synchronisation. Off, every call returns at once.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"

namespace rl::cuda {

// kBackups: the GPU-routed token's state backups (compute stream). kPrediction: the next layer's
// predicted selections (prefetch). kCopyWait: the compute stream
// idle until a layer's expert copies land (after its resident experts ran). kCopies: expert copies,
// timed on the copy stream and not part of the total; copies minus copy_wait is the copy time that
// overlapped compute.
enum Stage { kNorms, kProjections, kDeltaNet, kAttention, kRouter, kSharedExpert, kExperts, kLmHead, kBackups,
             kCopyWait, kPrediction, kOther, kCopies, kStageCount };

class Profiler {
 public:
  bool on = false;
  // Marks the start of `stage` on the stream; the previous stage ends there.
  void mark(Stage stage, cudaStream_t s) {
    if (!on) return;
    cudaEvent_t e = next_event();
    cudaEventRecord(e, s);
    marks_.push_back({stage, e});
  }
  // After a synchronisation: folds the recorded marks into the totals.
  void collect() {
    if (!on) return;
    for (size_t i = 0; i + 1 < marks_.size(); i++) {
      float ms = 0;
      cudaEventElapsedTime(&ms, marks_[i].second, marks_[i + 1].second);
      total_ms[marks_[i].first] += ms;
    }
    marks_.clear();
    used_ = 0;
  }
  void reset() { std::fill(std::begin(total_ms), std::end(total_ms), 0.0); }
  // Per-stage GPU milliseconds since the last reset, as a table; "" when off.
  std::string report() const;
  ~Profiler() {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }
  double total_ms[kStageCount] = {};

 private:
  cudaEvent_t next_event() {
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      RL_CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    return pool_[used_++];
  }
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::vector<std::pair<Stage, cudaEvent_t>> marks_;
};

}  // namespace rl::cuda
