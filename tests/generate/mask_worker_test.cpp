// MaskWorker: one thread runs every job handed to it, a job's result is there after wait(), what
// it throws comes back from wait(), and destruction waits for a job in flight. Events, not
// sleeps: a job blocks on a latch the test opens.
#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <set>
#include <thread>
#include <vector>

#include "common/error.h"
#include "generate/mask_worker.h"

using namespace rl;

TEST(MaskWorker, OneThreadRunsEveryJobInOrder) {
  std::vector<int> budgets;
  std::set<std::thread::id> threads;
  MaskWorker w([&](int budget) {
    budgets.push_back(budget);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_FALSE(w.started());
  w.wait();  // nothing started: returns at once
  for (int i = 0; i < 100; ++i) {
    w.start(i);
    EXPECT_TRUE(w.started());
    w.wait();
    EXPECT_FALSE(w.started());
    ASSERT_EQ(budgets.size(), (size_t)i + 1);  // the job's writes are seen after wait()
    EXPECT_EQ(budgets.back(), i);
  }
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

TEST(MaskWorker, WaitRethrowsWhatTheJobThrewAndTheWorkerGoesOn) {
  MaskWorker w([](int budget) {
    if (budget == 1) fail("no token can continue");
  });
  w.start(1);
  EXPECT_THROW(w.wait(), Error);
  w.start(2);
  EXPECT_NO_THROW(w.wait());  // the error was taken once, and the thread still runs jobs
}

TEST(MaskWorker, OneJobAtATime) {
  std::latch release(1);
  MaskWorker w([&](int) { release.wait(); });
  w.start(1);
  EXPECT_THROW(w.start(2), Error);
  release.count_down();
  w.wait();
}

TEST(MaskWorker, DestructionWaitsForTheJobInFlight) {
  std::latch entered(1), release(1);
  std::atomic<bool> finished{false};
  std::thread opener;
  {
    MaskWorker w([&](int) {
      entered.count_down();
      release.wait();
      finished = true;
    });
    w.start(0);
    entered.wait();  // the job is running
    opener = std::thread([&] { release.count_down(); });
  }  // ~MaskWorker returns only once the job has finished
  EXPECT_TRUE(finished.load());
  opener.join();
}
