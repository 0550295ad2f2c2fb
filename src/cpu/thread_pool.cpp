#include "cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

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
  spin_ = n_threads <= (int)std::thread::hardware_concurrency();
  for (int i = 1; i < n_threads; i++) workers_.emplace_back([this] { worker_loop(); });
}

template <class T>
void ThreadPool::spin_while_equal(const std::atomic<T>& v, T old) const {
  if (!spin_) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
  for (int i = 1; v.load(std::memory_order_relaxed) == old; i++) {
    _mm_pause();
    // Now and then the clock, and a yield: another program's thread that wants this core gets it.
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() > until) return;
      std::this_thread::yield();
    }
  }
}

ThreadPool::~ThreadPool() {
  stopping_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::drain(const std::function<void(int64_t)>& fn, int64_t n_tasks) {
  for (;;) {
    const int64_t task = next_task_.fetch_add(1);
    if (task >= n_tasks) return;
    try {
      fn(task);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
      next_task_.store(n_tasks);  // stop handing out work
    }
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  for (;;) {
    spin_while_equal(generation_, seen);
    generation_.wait(seen);  // returns once it differs from seen
    if (stopping_.load()) return;
    seen = generation_.load();
    // Sequentially consistent: either the caller's close comes after this join, and it waits for
    // us, or we find the run closed and touch nothing. A worker late for one run that finds the
    // next one open takes that one's tasks, which is as good.
    active_.fetch_add(1);
    if (open_.load()) drain(*fn_, n_tasks_);
    if (active_.fetch_sub(1) == 1) active_.notify_all();
  }
}

void ThreadPool::run(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  if (workers_.empty() || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; t++) fn(t);
    return;
  }
  // No worker is in a run here (the last one waited for them), so these writes race with nothing.
  fn_ = &fn;
  n_tasks_ = n_tasks;
  next_task_.store(0);
  error_ = nullptr;
  open_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  drain(fn, n_tasks);
  // Every task has been handed out: close the run and wait for the workers still in it (one that
  // joined late finds no task left and leaves at once).
  open_.store(false);
  for (int active = active_.load(); active != 0; active = active_.load()) {
    spin_while_equal(active_, active);
    active_.wait(active);  // returns at once when the count has moved on
  }
  fn_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

}  // namespace rl::cpu
