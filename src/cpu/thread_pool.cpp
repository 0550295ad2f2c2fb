#include "cpu/thread_pool.h"

#include <algorithm>

#include "common/error.h"

namespace rl::cpu {

int max_threads() {
  const int cores = (int)std::max(1u, std::thread::hardware_concurrency());
  return std::min(kMaxThreadsCap, 4 * cores);
}

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = (int)std::max(1u, std::thread::hardware_concurrency());
  if (n_threads > max_threads())
    fail("--threads {}: at most {} CPU threads (4 per hardware thread of this machine's {}, {} at most)", n_threads,
         max_threads(), std::thread::hardware_concurrency(), kMaxThreadsCap);
  for (int i = 1; i < n_threads; i++) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::drain(const std::function<void(int64_t)>& fn, int64_t n_tasks) {
  for (;;) {
    const int64_t task = next_task_.fetch_add(1);
    if (task >= n_tasks) return;
    try {
      fn(task);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      next_task_.store(n_tasks);  // stop handing out work
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t)>* fn;
    int64_t n_tasks;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      busy_workers_++;
      fn = fn_;
      n_tasks = n_tasks_;
    }
    if (fn) drain(*fn, n_tasks);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_workers_--;
    }
    done_.notify_one();
  }
}

void ThreadPool::run(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  if (workers_.empty() || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; t++) fn(t);
    return;
  }
  {
    // A worker that woke too late for the previous run may still be leaving it.
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return busy_workers_ == 0; });
    fn_ = &fn;
    n_tasks_ = n_tasks;
    next_task_.store(0);
    error_ = nullptr;
    generation_++;
  }
  wake_.notify_all();
  drain(fn, n_tasks);
  std::exception_ptr error;
  {
    // Every task has been handed out; wait for the workers still finishing theirs. A worker
    // that wakes late finds no task left and leaves at once.
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return busy_workers_ == 0; });
    fn_ = nullptr;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace rl::cpu
