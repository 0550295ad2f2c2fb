// A small fixed pool of worker threads for the CPU oracle: run(n, fn) spreads n independent tasks
// over the workers and the calling thread and returns when all are done.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rl::cpu {

// The most threads a pool may have: 4 per hardware thread, never more than kMaxThreadsCap. More
// only adds scheduling cost, and a mistyped count must not start thousands of threads.
constexpr int kMaxThreadsCap = 512;
int max_threads();

class ThreadPool {
 public:
  // n_threads counts the caller; <= 0 means every hardware thread. More than max_threads() is
  // refused (rl::Error naming both numbers).
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return (int)workers_.size() + 1; }

  // Calls fn(task) for every task in [0, n_tasks), each exactly once, on any thread. Calls from
  // several threads (two sessions on one backend) are serialised. Exceptions thrown by fn are
  // rethrown here (the first one).
  void run(int64_t n_tasks, const std::function<void(int64_t task)>& fn);

 private:
  void worker_loop();
  void drain(const std::function<void(int64_t)>& fn, int64_t n_tasks);  // takes tasks until none are left

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one run() at a time

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;  // bumped by every run(); workers wake on change
  bool stopping_ = false;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  int busy_workers_ = 0;
  std::exception_ptr error_;
};

}  // namespace rl::cpu
