// The scheduler's order of work, seen through a backend that records every call (over the CPU
// backend of fixture model B): a long prompt arriving while another sequence generates is
// prefilled in chunks of the session's pass size (Session::prefill_chunk: 512 on the CPU, or what
// the recording session reports in its place) with a decode step of the running sequence between
// every two chunks, and decode passes never hold more sequences than --parallel; with
// --step-prefill-tokens a burst of short prompts is prefilled in one step.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "common/error.h"
#include "model/session.h"
#include "server/scheduler.h"
#include "server_test_util.h"

using namespace rl;
using namespace rl::test;

namespace {

// One call the scheduler made: a prefill of `tokens` tokens of `sequences` sequences
// (Backend::prefill_batch_into), or a decode pass of `tokens` sequences.
struct Call {
  bool prefill;
  int tokens;
  int sequences = 1;
};

// Holds the worker inside a prefill while closed (the test then queues more requests).
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  bool closed = false, entered = false;
  void pass() {
    std::unique_lock<std::mutex> l(m);
    entered = true;
    cv.notify_all();
    cv.wait(l, [&] { return !closed; });
  }
  bool wait_entered() {
    std::unique_lock<std::mutex> l(m);
    return cv.wait_for(l, std::chrono::seconds(60), [&] { return entered; });
  }
  void open() {
    std::lock_guard<std::mutex> l(m);
    closed = false;
    cv.notify_all();
  }
};

class RecordingSession final : public Session {
 public:
  // The scheduler prefills through the backend's prefill_batch_into, which records the call.
  RecordingSession(std::unique_ptr<Session> inner, int chunk) : inner_(std::move(inner)), chunk_(chunk) {}
  int prefill_chunk() const override { return chunk_ > 0 ? chunk_ : inner_->prefill_chunk(); }
  std::vector<float> prefill(std::span<const int32_t> tokens, std::vector<float>* all) override {
    return inner_->prefill(tokens, all);
  }
  std::vector<float> decode(int32_t token) override { return inner_->decode(token); }
  int position() const override { return inner_->position(); }
  int n_ctx() const override { return inner_->n_ctx(); }
  int n_vocab() const override { return inner_->n_vocab(); }
  std::unique_ptr<SessionSnapshot> snapshot() const override { return inner_->snapshot(); }
  void restore(const SessionSnapshot& s) override { inner_->restore(s); }
  void reset() override { inner_->reset(); }
  void set_trace(TraceSink* t) override { inner_->set_trace(t); }
  void reserve_context() override { inner_->reserve_context(); }
  Session* inner() { return inner_.get(); }

 private:
  std::unique_ptr<Session> inner_;
  int chunk_;
};

class RecordingBackend final : public Backend {
 public:
  // chunk > 0: the pass size its sessions report instead of the inner backend's.
  RecordingBackend(Backend& inner, int chunk) : inner_(inner), chunk_(chunk) {}
  std::string name() const override { return "recording"; }
  std::unique_ptr<Session> new_session(int n_ctx) override {
    return std::make_unique<RecordingSession>(inner_.new_session(n_ctx), chunk_);
  }
  size_t session_bytes(int n_ctx) const override { return inner_.session_bytes(n_ctx); }
  void decode_batch_into(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                         std::span<std::vector<float>> out) override {
    std::vector<Session*> inner;
    for (Session* s : sessions) inner.push_back(static_cast<RecordingSession*>(s)->inner());
    {
      std::lock_guard<std::mutex> l(m);
      log.push_back({false, (int)sessions.size()});
    }
    inner_.decode_batch_into(inner, tokens, out);
  }
  void prefill_batch_into(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> chunks,
                          std::span<std::vector<float>> out) override {
    gate.pass();
    std::vector<Session*> inner;
    int tokens = 0;
    for (size_t i = 0; i < sessions.size(); i++) {
      inner.push_back(static_cast<RecordingSession*>(sessions[i])->inner());
      tokens += (int)chunks[i].size();
    }
    {
      std::lock_guard<std::mutex> l(m);
      log.push_back({true, tokens, (int)sessions.size()});
    }
    inner_.prefill_batch_into(inner, chunks, out);
  }
  std::vector<Call> calls() {
    std::lock_guard<std::mutex> l(m);
    return log;
  }

  std::vector<Call> log;
  std::mutex m;
  Gate gate;

 private:
  Backend& inner_;
  int chunk_;
};

std::shared_ptr<Job> greedy_job(std::vector<int32_t> prompt, int max_tokens) {
  auto job = std::make_shared<Job>();
  job->prompt = std::move(prompt);
  job->gen.sampling.temperature = 0;
  job->gen.max_tokens = max_tokens;
  job->gen.stop_at_eog = false;  // random weights may pick the end token early; the lengths matter here
  return job;
}

bool wait_done(Job& job) {
  std::unique_lock<std::mutex> l(job.m);
  return job.cv.wait_for(l, std::chrono::seconds(120), [&] { return job.done; });
}

class SchedulerTest : public ServerModelTest {};

// A 1,500-token prompt arriving while another sequence generates 200 tokens, through sessions
// that report `chunk` (0: the CPU backend's 512): its prefill calls must be `expected`.
void check_chunked_prefill(const ServedModel& model, int chunk, const std::vector<int>& expected) {
  RecordingBackend backend(*model.backend, chunk);
  SchedulerConfig cfg;
  cfg.parallel = 2;
  Scheduler scheduler(backend, *model.tokenizer, cfg);

  auto running = greedy_job({1, 2, 3, 4, 5, 6, 7, 8}, 200);
  scheduler.submit(running);
  for (int i = 0; i < 6000; i++) {  // until it generates
    {
      std::lock_guard<std::mutex> l(running->m);
      if (!running->text.empty() || running->done) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::vector<int32_t> long_prompt(1500);
  for (size_t i = 0; i < long_prompt.size(); i++) long_prompt[i] = (int32_t)(10 + (i * 37) % 4000);
  auto arriving = greedy_job(long_prompt, 4);
  scheduler.submit(arriving);
  ASSERT_TRUE(wait_done(*arriving));
  ASSERT_TRUE(wait_done(*running));
  ASSERT_TRUE(arriving->result && running->result);
  EXPECT_EQ(arriving->result->prefill_tokens, 1500);
  EXPECT_EQ((int)running->result->tokens.size(), 200);

  const std::vector<Call> calls = backend.calls();
  std::vector<size_t> long_chunks;  // indices of the long prompt's chunks (every prefill after the first)
  for (size_t i = 1; i < calls.size(); i++)
    if (calls[i].prefill) long_chunks.push_back(i);
  ASSERT_EQ(long_chunks.size(), expected.size()) << "1500 tokens in chunks of at most " << expected[0];
  for (size_t k = 0; k < expected.size(); k++) EXPECT_EQ(calls[long_chunks[k]].tokens, expected[k]) << "chunk " << k;
  // Between two chunks the running sequence made its decode step, alone in the pass.
  for (size_t k = 0; k + 1 < long_chunks.size(); k++) {
    ASSERT_EQ(long_chunks[k + 1], long_chunks[k] + 2) << "chunk " << k;
    EXPECT_FALSE(calls[long_chunks[k] + 1].prefill);
    EXPECT_EQ(calls[long_chunks[k] + 1].tokens, 1);
  }
  // After its prompt the arriving sequence decodes in the same passes as the running one.
  ASSERT_LT(long_chunks.back() + 1, calls.size());
  EXPECT_EQ(calls[long_chunks.back() + 1].tokens, 2);
  for (const Call& c : calls) EXPECT_LE(c.tokens, c.prefill ? expected[0] : cfg.parallel);
}

TEST_F(SchedulerTest, ALongPromptIsPrefilledAChunkPerStepBetweenTheOthersDecodeSteps) {
  const ServedModel model = fixture_loader(server_model())([](float) {});
  check_chunked_prefill(model, 0, {512, 512, 476});
}

// The chunk is the session's pass size, whatever it is (the CUDA backend's --prefill-chunk).
TEST_F(SchedulerTest, ThePrefillChunkIsTheSessionsPassSize) {
  const ServedModel model = fixture_loader(server_model())([](float) {});
  check_chunked_prefill(model, 300, {300, 300, 300, 300, 300});
  check_chunked_prefill(model, 1024, {1024, 476});
}

// Three requests queued while the worker is inside the first one's prefill are admitted together
// at the next step: with --step-prefill-tokens 64 their three 6-token prompts are prefilled in that
// step, in one Backend::prefill_batch_into call (one pass on the CPU backend), then the four decode
// in one pass; with 0 a prompt takes a step, a decode pass of the sequences already past theirs
// between every two.
void check_burst(const ServedModel& model, int step_prefill_tokens, const std::vector<Call>& want) {
  RecordingBackend backend(*model.backend, 0);
  backend.gate.closed = true;
  SchedulerConfig cfg;
  cfg.parallel = 4;
  cfg.step_prefill_tokens = step_prefill_tokens;
  Scheduler scheduler(backend, *model.tokenizer, cfg);
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 4; i++) jobs.push_back(greedy_job({(int32_t)(50 + i), 6, 7, 8, 9, 10}, 8));
  scheduler.submit(jobs[0]);
  ASSERT_TRUE(backend.gate.wait_entered());
  for (int i = 1; i < 4; i++) scheduler.submit(jobs[i]);
  backend.gate.open();
  for (auto& j : jobs) ASSERT_TRUE(wait_done(*j));
  for (auto& j : jobs) ASSERT_TRUE(j->result && (int)j->result->tokens.size() == 8);
  const std::vector<Call> calls = backend.calls();
  ASSERT_GE(calls.size(), want.size());
  for (size_t i = 0; i < want.size(); i++) {
    EXPECT_EQ(calls[i].prefill, want[i].prefill) << "call " << i;
    EXPECT_EQ(calls[i].tokens, want[i].tokens) << "call " << i;
    EXPECT_EQ(calls[i].sequences, want[i].sequences) << "call " << i;
  }
}

TEST_F(SchedulerTest, StepPrefillTokensPrefillsABurstOfPromptsInOneStep) {
  const ServedModel model = fixture_loader(server_model())([](float) {});
  check_burst(model, 64, {{true, 6}, {false, 1}, {true, 18, 3}, {false, 4}, {false, 4}});
}

TEST_F(SchedulerTest, WithoutStepPrefillTokensAPromptTakesAStep) {
  const ServedModel model = fixture_loader(server_model())([](float) {});
  check_burst(model, 0, {{true, 6}, {false, 1}, {true, 6}, {false, 2}, {true, 6}, {false, 3}, {true, 6}, {false, 4}});
}

TEST_F(SchedulerTest, StepPrefillTokensOutOfRangeIsRefused) {
  const ServedModel model = fixture_loader(server_model())([](float) {});
  SchedulerConfig cfg;
  cfg.step_prefill_tokens = -1;
  EXPECT_THROW(Scheduler(*model.backend, *model.tokenizer, cfg), Error);
  cfg.step_prefill_tokens = SchedulerConfig::kMaxStepPrefillTokens + 1;
  EXPECT_THROW(Scheduler(*model.backend, *model.tokenizer, cfg), Error);
}

}  // namespace
