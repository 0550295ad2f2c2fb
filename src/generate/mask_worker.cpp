#include "generate/mask_worker.h"

#include "common/error.h"

namespace rl {

MaskWorker::MaskWorker(std::function<void(int)> job) : job_(std::move(job)), thread_([this] { loop(); }) {}

MaskWorker::~MaskWorker() {
  {
    std::unique_lock l(m_);
    cv_.wait(l, [&] { return !queued_ && !running_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void MaskWorker::start(int budget) {
  if (started_) fail("MaskWorker: a mask was started before the last one was waited for");
  {
    std::lock_guard l(m_);
    budget_ = budget;
    error_ = nullptr;
    queued_ = true;
  }
  started_ = true;
  cv_.notify_all();
}

void MaskWorker::wait() {
  if (!started_) return;
  started_ = false;
  std::exception_ptr error;
  {
    std::unique_lock l(m_);
    cv_.wait(l, [&] { return !queued_ && !running_; });
    error = std::exchange(error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void MaskWorker::loop() {
  std::unique_lock l(m_);
  for (;;) {
    cv_.wait(l, [&] { return queued_ || stop_; });
    if (!queued_) return;  // stop_, and nothing left to run
    queued_ = false;
    running_ = true;
    const int budget = budget_;
    l.unlock();
    std::exception_ptr error;
    try {
      job_(budget);
    } catch (...) {
      error = std::current_exception();
    }
    l.lock();
    running_ = false;
    error_ = error;
    cv_.notify_all();
  }
}

}  // namespace rl
