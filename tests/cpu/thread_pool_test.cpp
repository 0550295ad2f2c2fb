// cpu::ThreadPool: every task of a run done exactly once and finished when run() returns, over many
// short runs (a decode step's pattern); a task's exception reaches the caller and the pool stays
// usable; runs from two threads at once are serialised; a count beyond the machine's is refused.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/error.h"
#include "cpu/thread_pool.h"

namespace rl::cpu {
namespace {

// Busy for about a microsecond, so the workers take part in the runs.
void brief_work() {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(1);
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(ThreadPool, EveryTaskOnceAndFinishedWhenRunReturns) {
  for (int threads : {2, 4}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> done(200);
    for (int r = 0; r < 2000; r++) {
      const int n = 1 + r % 200;
      for (int i = 0; i < n; i++) done[i].store(0);
      pool.run(n, [&](int64_t t) {
        brief_work();
        done[t].fetch_add(1);
      });
      for (int i = 0; i < n; i++) ASSERT_EQ(done[i].load(), 1) << threads << " threads, run " << r << ", task " << i;
    }
  }
}

TEST(ThreadPool, ExceptionReachesTheCallerAndThePoolStaysUsable) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.run(64,
                        [&](int64_t t) {
                          brief_work();
                          if (t == 40) throw std::runtime_error("task 40");
                        }),
               std::runtime_error);
  std::atomic<int> count{0};
  pool.run(64, [&](int64_t) { count.fetch_add(1); });
  EXPECT_EQ(count.load(), 64);
}

TEST(ThreadPool, RunsFromTwoThreadsAreSerialised) {
  ThreadPool pool(3);
  std::atomic<int> in_run{0}, overlaps{0}, total{0};
  auto caller = [&] {
    for (int r = 0; r < 300; r++)
      pool.run(16, [&](int64_t t) {
        if (t == 0 && in_run.fetch_add(1) != 0) overlaps.fetch_add(1);
        brief_work();
        total.fetch_add(1);
        if (t == 0) in_run.fetch_sub(1);
      });
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 300 * 16);
  EXPECT_EQ(overlaps.load(), 0);
}

TEST(ThreadPool, TooManyThreadsAreRefused) { EXPECT_THROW(ThreadPool(max_threads() + 1), Error); }

}  // namespace
}  // namespace rl::cpu
