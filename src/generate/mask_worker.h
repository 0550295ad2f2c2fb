// The thread that computes a constrained generation's next token mask while the session decodes
// the token just sampled (a GPU backend leaves the host waiting then), so only what is left of
// the mask delays the next sample. One thread serves the whole generation: a start hands it the
// step's budget, and wait() takes the mask back; no thread is made per token.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace rl {

class MaskWorker {
 public:
  // `job(budget)` computes one mask (it runs on the worker's thread, one call at a time).
  explicit MaskWorker(std::function<void(int budget)> job);
  // Waits for a job in flight (what it threw is dropped), then stops the thread.
  ~MaskWorker();
  MaskWorker(const MaskWorker&) = delete;
  MaskWorker& operator=(const MaskWorker&) = delete;

  // Starts job(budget) on the worker. Throws rl::Error when a job is already started and not
  // waited for (one mask at a time).
  void start(int budget);
  // Whether a job was started and not yet waited for.
  bool started() const { return started_; }
  // Blocks until the started job has finished; rethrows what it threw. Returns at once when no
  // job is started.
  void wait();

 private:
  void loop();

  std::function<void(int)> job_;
  bool started_ = false;  // touched by the owner's thread only
  std::mutex m_;
  std::condition_variable cv_;
  // Under m_: a job handed over and not yet taken, a job running, the thread asked to stop.
  bool queued_ = false, running_ = false, stop_ = false;
  int budget_ = 0;
  std::exception_ptr error_;
  std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace rl
