// A small fixed pool of worker threads for the CPU backend: run(n, fn) spreads n independent tasks
// over the workers and the calling thread and returns when all are done. A decode step runs a few
// hundred short runs, so a run touches no mutex: workers sleep on the generation counter itself
// (C++20 atomic wait, a futex) and join and leave a run through atomics, instead of each one
// taking a shared lock on waking and again on leaving, one after another. Between runs a worker
// first spins for a while (kSpinMicros): the runs of a decode step come microseconds apart, and
// waking a sleeping core through the futex takes tens of microseconds, much of a short run.
#pragma once
#include <atomic>
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

// How long a worker (and the caller waiting for the workers) spins before it sleeps. Only a pool
// of at most one thread per hardware thread spins: one with more would take the cores its own
// threads need.
constexpr int kSpinMicros = 200;

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
  // Spins until v differs from old or kSpinMicros have passed (the caller then sleeps in v.wait).
  template <class T>
  void spin_while_equal(const std::atomic<T>& v, T old) const;

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one run() at a time
  bool spin_ = false;     // at most one thread per hardware thread

  // fn_ and n_tasks_ are written before open_ is set and read after it is seen set.
  std::atomic<uint32_t> generation_{0};  // bumped by every run() (and to stop); workers wait on it
  std::atomic<bool> stopping_{false};
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  // A worker joins a run by counting itself in active_ and then finding the run open; the caller
  // closes it once every task is handed out and waits for the joined workers only, so a worker the
  // OS has not scheduled yet (a loaded machine) holds nothing up.
  std::atomic<bool> open_{false};
  std::atomic<int> active_{0};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace rl::cpu
