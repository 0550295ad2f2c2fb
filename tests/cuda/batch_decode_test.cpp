// The CUDA backend's decode_batch (the server's --parallel step) against the CPU oracle on the
// fixture models: kMaxBatchRows + 1 sequences of different prompt lengths (so different positions
// and states) decode together, a full batched pass and one sequence alone each step, teacher-forced on the oracle's greedy tokens, and each sequence's logits must
// meet the fast tier's bar against the oracle (the bar CudaFastTier.EachPartOnThe80BShape and the
// recipes use: top-1 agreement >= 0.85, mean relative RMS <= 0.075); a sequence decoding on the
// wrong state, cache row or position scores near 1. Then each sequence decodes once more alone
// from where the batch left it. The fast tier runs each step as one batched graph (the stats count
// them); the exact tier decodes the sequences one after another, so its tokens are those each gets
// alone, bit for bit. A batch's graph serves any sessions of its size: one whose sessions change
// (order, a subset, a session destroyed) replays it on tables rewritten for them, bit for bit
// what their own graph would give. Needs a GPU and the fixtures.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "common/error.h"
#include "cuda/cuda_check.h"
#include "cuda/plan.h"
#include "gpu_test_util.h"
#include "model/parity.h"
#include "backend_test_util.h"
#include "test_util.h"

namespace rl {
namespace {

const char* const kModels[] = {"tiny-qwen3next-iq2xxs.gguf", "tiny-qwen3next-q4km.gguf"};

// kSequences sequences decode together for kSteps steps: one more than a batched pass takes, so
// each step is a full pass and a remainder. Sequence i's prompt holds length(i) tokens (1 to 40,
// no two alike up to 40 sequences).
constexpr int kSequences = cuda::kMaxBatchRows + 1;
constexpr int length(int i) { return 1 + (7 + 13 * i) % 40; }
constexpr int kSteps = 12;

// batched_steps: the steps the backend ran as one batched graph.
void run_batch(const std::string& path, Numerics numerics, double* top1, double* mean_rel_rms, bool* identical,
               uint64_t* batched_steps) {
  auto model = Model::open(path);
  const int n_vocab = model->config().n_vocab;
  auto cpu = cpu::make_cpu_backend(model, 0);
  cuda::CudaOptions o;
  o.numerics = numerics;
  auto gpu = cuda::make_cuda_backend(model, o);
  const int n = kSequences;
  std::vector<std::unique_ptr<Session>> oracle, batched, alone;
  std::vector<std::vector<float>> want(n), alone_logits(n);
  std::vector<Session*> ptrs;
  for (int i = 0; i < n; i++) {
    const auto p = test::prompt(length(i), n_vocab, 40 + i);
    oracle.push_back(cpu->new_session(256));
    batched.push_back(gpu->new_session(256));
    alone.push_back(gpu->new_session(256));
    want[i] = oracle[i]->prefill(p, nullptr);
    batched[i]->prefill(p, nullptr);
    alone_logits[i] = alone[i]->prefill(p, nullptr);
    ptrs.push_back(batched[i].get());
  }
  int agree = 0, total = 0;
  double rms = 0, rms_alone = 0;
  *identical = true;
  for (int step = 0; step <= kSteps; step++) {
    std::vector<int32_t> next(n);
    for (int i = 0; i < n; i++) next[i] = argmax(want[i]);
    // The last step: each sequence alone, from where the batch left it.
    std::vector<std::vector<float>> got(n);
    if (step < kSteps) {
      got = gpu->decode_batch(ptrs, next);
    } else {
      for (int i = 0; i < n; i++) got[i] = batched[i]->decode(next[i]);
    }
    for (int i = 0; i < n; i++) {
      want[i] = oracle[i]->decode(next[i]);
      alone_logits[i] = alone[i]->decode(next[i]);
      ASSERT_EQ(got[i].size(), (size_t)n_vocab);
      agree += argmax(got[i]) == argmax(want[i]);
      total++;
      rms += relative_rms(got[i], want[i]);
      rms_alone += relative_rms(got[i], alone_logits[i]);
      *identical = *identical && got[i] == alone_logits[i];
      EXPECT_EQ(batched[i]->position(), length(i) + step + 1) << "sequence " << i;
    }
  }
  *top1 = (double)agree / total;
  *mean_rel_rms = rms / total;
  // Against each sequence decoded alone on the GPU (the same tier): reported, to set a bar from.
  std::printf("[cuda batched decode] %s: mean rel rms %.4e against each sequence alone\n",
              numerics == Numerics::kFast ? "fast" : "exact", rms_alone / total);
  *batched_steps = gpu->stats().batched_steps;
}

TEST(CudaBatchedDecode, EachSequenceMeetsTheFastTierBarAgainstTheOracle) {
  RL_REQUIRE_GPU();
  int ran = 0;
  for (const char* name : kModels) {
    const std::string path = test::fixture(name);
    if (!std::filesystem::exists(path)) continue;
    SCOPED_TRACE(name);
    double top1 = 0, rms = 0;
    bool identical = false;
    uint64_t steps = 0;
    run_batch(path, Numerics::kFast, &top1, &rms, &identical, &steps);
    std::printf("[cuda batched decode] %s: top-1 %.4f, mean rel rms %.4e against the oracle\n", name, top1, rms);
    EXPECT_GE(top1, 0.85);
    EXPECT_LE(rms, 0.075);
    EXPECT_EQ(steps, (uint64_t)kSteps) << "the steps did not run as batched graphs";
    ran++;
  }
  if (!ran) GTEST_SKIP() << "no fixture model found (set REDLITE_FIXTURES)";
}

TEST(CudaBatchedDecode, ExactTierGivesEachSequenceItsOwnTokens) {
  RL_REQUIRE_GPU();
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  double top1 = 0, rms = 0;
  bool identical = false;
  uint64_t steps = 0;
  run_batch(path, Numerics::kExact, &top1, &rms, &identical, &steps);
  EXPECT_TRUE(identical) << "the exact tier's batched logits differ from each sequence's alone";
  EXPECT_EQ(top1, 1.0);
  EXPECT_EQ(steps, 0u) << "the exact tier batched its steps";
}

// Batches whose sessions change between steps: all four; then one decodes alone, a snapshot of
// another is restored into a third, and two decode in the other order; then (a session destroyed,
// leaving the tables that held it, and a new one made, perhaps at its address) the three left and
// the new one. Every row's logits against the oracle's, teacher-forced, by the fast tier's bar (the
// oracle's sessions take the same steps, snapshot and restore); one graph a batch size (4, 2, 3).
TEST(CudaBatchedDecode, ABatchThatChangesReplaysItsSizesGraph) {
  RL_REQUIRE_GPU();
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto model = Model::open(path);
  const int n_vocab = model->config().n_vocab;
  auto cpu = cpu::make_cpu_backend(model, 0);
  cuda::CudaOptions o;
  o.numerics = Numerics::kFast;
  auto gpu = cuda::make_cuda_backend(model, o);
  std::vector<std::unique_ptr<Session>> oracle, dev;
  std::vector<std::vector<float>> want;
  for (int i = 0; i < 4; i++) {
    const auto p = test::prompt(5 + 9 * i, n_vocab, 70 + i);
    oracle.push_back(cpu->new_session(128));
    dev.push_back(gpu->new_session(128));
    want.push_back(oracle[i]->prefill(p, nullptr));
    dev[i]->prefill(p, nullptr);
  }
  int agree = 0, total = 0, steps = 0;
  double rms = 0;
  auto score = [&](int i, const std::vector<float>& got) {
    agree += argmax(got) == argmax(want[i]);
    rms += relative_rms(got, want[i]);
    total++;
  };
  auto step = [&](std::vector<int> rows) {
    std::vector<Session*> batch;
    std::vector<int32_t> next;
    for (int i : rows) batch.push_back(dev[i].get()), next.push_back(argmax(want[i]));
    const auto got = gpu->decode_batch(batch, next);
    ASSERT_EQ(got.size(), rows.size());
    for (size_t r = 0; r < rows.size(); r++) {
      const int i = rows[r];
      want[i] = oracle[i]->decode(next[r]);
      score(i, got[r]);
      EXPECT_EQ(dev[i]->position(), oracle[i]->position()) << "sequence " << i;
    }
    steps++;
  };
  for (int s = 0; s < 3; s++) step({0, 1, 2, 3});
  {  // sequence 0 alone between batched steps
    const int32_t next = argmax(want[0]);
    const auto got = dev[0]->decode(next);
    want[0] = oracle[0]->decode(next);
    score(0, got);
  }
  // Sequence 2's state restored into session 1 (its KV rows and states overwritten in place).
  dev[1]->restore(*dev[2]->snapshot());
  oracle[1]->restore(*oracle[2]->snapshot());
  want[1] = want[2];
  for (int s = 0; s < 2; s++) step({2, 0});
  step({0, 1, 2, 3});
  dev[3].reset();
  oracle[3].reset();
  {
    const auto p = test::prompt(11, n_vocab, 99);
    oracle[3] = cpu->new_session(128);
    dev[3] = gpu->new_session(128);
    want[3] = oracle[3]->prefill(p, nullptr);
    dev[3]->prefill(p, nullptr);
  }
  for (int s = 0; s < 3; s++) step({0, 1, 2});
  // The first batch's size and order again: had its tables not been rewritten for the new
  // session 3, row 3 would replay on the freed buffers.
  for (int s = 0; s < 2; s++) step({0, 1, 2, 3});
  std::printf("[cuda batched decode] changing batches: top-1 %.4f, mean rel rms %.4e against the oracle\n",
              (double)agree / total, rms / total);
  EXPECT_GE((double)agree / total, 0.85);
  EXPECT_LE(rms / total, 0.075);
  EXPECT_EQ(gpu->stats().batched_steps, (uint64_t)steps);
  EXPECT_EQ(gpu->stats().batched_captures, 3u);
}

// One graph serves any sessions of its size, bit for bit: sessions 2 and 3 hold the prompts of 0
// and 1. A step of {0, 1} captures the graph; {2, 3} on it, its tables rewritten, must give 2 the
// logits of 0 and 3 those of 1 exactly (a row's products, recurrence and attention read only its
// own column, state and cache); then {3, 2} and {1, 0}, rows in the other order, likewise; then
// {0, 1} again, on tables last written for {1, 0}.
TEST(CudaBatchedDecode, AGraphServesAnySessionsOfItsSizeBitForBit) {
  RL_REQUIRE_GPU();
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto model = Model::open(path);
  const int n_vocab = model->config().n_vocab;
  cuda::CudaOptions o;
  o.numerics = Numerics::kFast;
  auto gpu = cuda::make_cuda_backend(model, o);
  std::vector<std::unique_ptr<Session>> dev;
  std::vector<std::vector<float>> last(4);
  for (int i = 0; i < 4; i++) {
    dev.push_back(gpu->new_session(128));
    last[i] = dev[i]->prefill(test::prompt(6 + 7 * (i % 2), n_vocab, 80 + i % 2), nullptr);
  }
  ASSERT_EQ(last[2], last[0]);
  ASSERT_EQ(last[3], last[1]);
  auto step = [&](std::vector<int> rows) {
    std::vector<Session*> batch;
    std::vector<int32_t> next;
    for (int i : rows) batch.push_back(dev[i].get()), next.push_back(argmax(last[i]));
    const auto got = gpu->decode_batch(batch, next);
    for (size_t r = 0; r < rows.size(); r++) last[rows[r]] = got[r];
  };
  for (int s = 0; s < 2; s++) {
    step({0, 1});
    step({2, 3});
    EXPECT_EQ(last[2], last[0]) << "step " << s;
    EXPECT_EQ(last[3], last[1]) << "step " << s;
  }
  step({3, 2});
  step({1, 0});
  EXPECT_EQ(last[2], last[0]);
  EXPECT_EQ(last[3], last[1]);
  step({0, 1});
  step({2, 3});
  EXPECT_EQ(last[2], last[0]);
  EXPECT_EQ(last[3], last[1]);
  EXPECT_EQ(dev[0]->position(), dev[2]->position());
  EXPECT_EQ(gpu->stats().batched_steps, 8u);
  EXPECT_EQ(gpu->stats().batched_captures, 1u);
}

// Backend::prefill_batch_into in one pass (run_pass_batch), exact tier, passes of at most 256
// tokens: four sessions at their own positions read pieces of 1, 7, 30 and 200 tokens together;
// each one's last logits, and its next decode step's (which read the DeltaNet states and KV rows
// the piece left), against the oracle's: the same top-1 and relative RMS within the exact tier's
// parity bound (a wrong row offset, state, cache or position is O(1)). Then a piece longer than a
// pass beside a short one: each alone, the same way.
TEST(CudaPrefillBatch, EachSessionsPieceMatchesTheOracle) {
  RL_REQUIRE_GPU();
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto model = Model::open(path);
  const int n_vocab = model->config().n_vocab;
  auto cpu = cpu::make_cpu_backend(model, 0);
  cuda::CudaOptions o;
  o.numerics = Numerics::kExact;
  o.prefill_chunk = 256;
  auto gpu = cuda::make_cuda_backend(model, o);
  const std::vector<int32_t> prompt = test::prompt(700, n_vocab, 123);
  std::vector<std::unique_ptr<Session>> oracle, dev;
  for (int i = 0; i < 4; i++) {
    const auto start = std::span(prompt).subspan(50 * i, 2 + 3 * i);
    oracle.push_back(cpu->new_session(1024));
    dev.push_back(gpu->new_session(1024));
    oracle.back()->prefill(start);
    dev.back()->prefill(start);
  }
  double worst = 0;
  auto check = [&](int i, const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size()) << "session " << i;
    EXPECT_EQ(argmax(got), argmax(want)) << "session " << i;
    worst = std::max(worst, relative_rms(got, want));
  };
  auto batch = [&](std::vector<int> which, std::vector<std::span<const int32_t>> chunks) {
    std::vector<Session*> ss;
    for (int i : which) ss.push_back(dev[i].get());
    std::vector<std::vector<float>> out(which.size());
    gpu->prefill_batch_into(ss, chunks, out);
    for (size_t r = 0; r < which.size(); r++) {
      const int i = which[r];
      check(i, out[r], oracle[i]->prefill(chunks[r]));
      EXPECT_EQ(dev[i]->position(), oracle[i]->position()) << "session " << i;
      const int32_t next = (int32_t)(7 + i);
      check(i, dev[i]->decode(next), oracle[i]->decode(next));
    }
  };
  const int lens[] = {1, 7, 30, 200};
  std::vector<std::span<const int32_t>> pieces;
  for (int i = 0; i < 4; i++) pieces.push_back(std::span(prompt).subspan(300 + 10 * i, lens[i]));
  batch({0, 1, 2, 3}, pieces);
  batch({2, 0}, {std::span(prompt).subspan(20, 300), std::span(prompt).subspan(400, 5)});
  std::printf("[cuda prefill batch] max rel rms %.3e against the oracle\n", worst);
  EXPECT_LE(worst, 1e-3);
}

TEST(CudaBatchedDecode, RefusesAnotherModelsSession) {
  RL_REQUIRE_GPU();
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto model = Model::open(path);
  cuda::CudaOptions o;
  auto a = cuda::make_cuda_backend(model, o), b = cuda::make_cuda_backend(model, o);
  auto sa = a->new_session(64), sb = b->new_session(64);
  sa->prefill(std::vector<int32_t>{1, 2, 3}, nullptr);
  sb->prefill(std::vector<int32_t>{1, 2, 3}, nullptr);
  Session* both[] = {sa.get(), sb.get()};
  const int32_t toks[] = {4, 5};
  EXPECT_THROW(a->decode_batch(both, toks), Error);
  EXPECT_EQ(sa->position(), 3);  // nothing advanced
  EXPECT_EQ(sb->position(), 3);
}

}  // namespace
}  // namespace rl
