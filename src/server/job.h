// One generation request as the server's HTTP thread and its scheduler share it: the HTTP thread
// fills the request part and waits on `cv`; the scheduler streams text and logprobs into it and
// sets the result or an error.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "generate/generator.h"
#include "server/api.h"

namespace rl {

struct TokenLogprob {
  int32_t token;
  float logprob;
  std::vector<std::pair<int32_t, float>> top;  // most probable first
};

// log-softmax of the model's logits for `token` and the `top_n` most probable alternatives.
TokenLogprob token_logprob(int32_t token, std::span<const float> logits, int top_n);

struct Job {
  using Clock = std::chrono::steady_clock;
  std::vector<int32_t> prompt;
  GenerationConfig gen;
  int top_logprobs = -1;
  Clock::time_point deadline;
  std::atomic<bool> cancel{false};

  std::mutex m;
  std::condition_variable cv;
  std::string text;                    // streamed text not yet taken by the HTTP thread
  std::vector<TokenLogprob> logprobs;  // per generated token, not yet taken
  bool started = false;
  bool done = false;
  std::optional<GenerationResult> result;
  std::optional<api::ApiError> error;

  // Ends the job with an error (under m) and wakes its HTTP thread.
  void fail_with(api::ApiError e) {
    std::lock_guard<std::mutex> l(m);
    error = std::move(e);
    done = true;
    cv.notify_all();
  }
};

}  // namespace rl
