// Backend::decode_batch on the CPU backend: several sessions, each at its own position, advance by
// one token each in one pass. Each one's logits are bit-identical to decoding it alone, in both
// tiers: every product keeps each row's sum order whatever the other columns are.
#include <gtest/gtest.h>

#include <cstring>

#include "common/error.h"
#include "cpu/cpu_backend.h"
#include "cpu/forward.h"
#include "model/model.h"
#include "model/parity.h"
#include "model_b_test.h"

namespace rl {
namespace {

class BatchDecodeTest : public test::ModelBTest {
 protected:
  // n_seqs sessions holding prompts of different lengths (different KV rows, states, positions),
  // each started from a different offset of the prompt so no two hold the same tokens.
  std::vector<std::unique_ptr<Session>> start(Backend& backend, int n_seqs) const {
    std::vector<std::unique_ptr<Session>> sessions;
    for (int i = 0; i < n_seqs; i++) {
      sessions.push_back(backend.new_session(128));
      sessions.back()->prefill(std::span(tokens_).subspan(3 * i, 5 + 7 * i));
    }
    return sessions;
  }
  // Token fed to sequence i at step k (teacher-forced, so the runs compare the same inputs).
  int32_t feed(int i, int k) const { return tokens_[(40 + 11 * i + k) % tokens_.size()]; }

  // Decodes `steps` tokens into every sequence, batched and one by one, and returns the largest
  // relative RMS error between the two (0 when bit-identical: compared with memcmp first).
  // kept: through decode_batch_into on buffers kept from step to step (as the server's scheduler
  // keeps them), each written in place after the first step.
  double batched_vs_alone(Numerics numerics, int n_seqs, int steps, bool kept = false) const {
    auto backend = cpu::make_cpu_backend(model_, 2, numerics);
    auto batched = start(*backend, n_seqs), alone = start(*backend, n_seqs);
    std::vector<std::vector<float>> kept_out(n_seqs);
    std::vector<const float*> where(n_seqs);
    double worst = 0;
    for (int k = 0; k < steps; k++) {
      std::vector<Session*> ptrs;
      std::vector<int32_t> toks;
      for (int i = 0; i < n_seqs; i++) {
        ptrs.push_back(batched[i].get());
        toks.push_back(feed(i, k));
      }
      std::vector<std::vector<float>> fresh;
      if (kept) {
        backend->decode_batch_into(ptrs, toks, kept_out);
        for (int i = 0; i < n_seqs; i++) {
          if (k > 0) EXPECT_EQ(kept_out[i].data(), where[i]) << "sequence " << i << "'s buffer reallocated";
          where[i] = kept_out[i].data();
        }
      } else {
        fresh = backend->decode_batch(ptrs, toks);
      }
      const std::vector<std::vector<float>>& out = kept ? kept_out : fresh;
      EXPECT_EQ(out.size(), (size_t)n_seqs);
      for (int i = 0; i < n_seqs; i++) {
        const std::vector<float> one = alone[i]->decode(feed(i, k));
        EXPECT_EQ(batched[i]->position(), alone[i]->position());
        if (out[i].size() != one.size()) return INFINITY;
        if (std::memcmp(out[i].data(), one.data(), one.size() * sizeof(float)) != 0)
          worst = std::max(worst, relative_rms(out[i], one));
      }
    }
    return worst;
  }

};

TEST_F(BatchDecodeTest, ExactTierIsBitIdenticalToDecodingAlone) {
  for (int n : {1, 4, 7}) EXPECT_EQ(batched_vs_alone(Numerics::kExact, n, 3), 0.0) << n << " sequences";
}

TEST_F(BatchDecodeTest, FastTierIsBitIdenticalToDecodingAloneToo) {
  // The fast tier quantises each token's activations alone and its dot kernel sums a token's
  // products in the same order whatever the other tokens of the call (fast_dot_basic.cpp).
  for (int n : {2, 5}) EXPECT_EQ(batched_vs_alone(Numerics::kFast, n, 3), 0.0) << n << " sequences";
}

TEST_F(BatchDecodeTest, KeptBuffersAreWrittenInPlace) {
  EXPECT_EQ(batched_vs_alone(Numerics::kFast, 3, 3, true), 0.0);
  EXPECT_EQ(batched_vs_alone(Numerics::kExact, 1, 2, true), 0.0);
}

TEST_F(BatchDecodeTest, BadBatchesAreRefusedWithNoSessionChanged) {
  auto backend = cpu::make_cpu_backend(model_, 2);
  auto s = start(*backend, 2);
  auto full = backend->new_session(4);
  full->prefill(std::span(tokens_).first(4));
  auto other = cpu::make_cpu_backend(model_, 1)->new_session(16);
  const int p0 = s[0]->position(), p1 = s[1]->position();
  Session* twice[] = {s[0].get(), s[0].get()};
  Session* with_full[] = {s[0].get(), full.get()};
  Session* foreign[] = {s[0].get(), other.get()};
  Session* pair[] = {s[0].get(), s[1].get()};
  const int32_t two[] = {1, 2}, bad[] = {1, 1 << 20}, one[] = {1};
  EXPECT_THROW(backend->decode_batch(twice, two), Error);
  EXPECT_THROW(backend->decode_batch(with_full, two), Error);
  EXPECT_THROW(backend->decode_batch(foreign, two), Error);
  EXPECT_THROW(backend->decode_batch(pair, bad), Error);
  EXPECT_THROW(backend->decode_batch(pair, one), Error);
  std::vector<std::vector<float>> three(3);
  EXPECT_THROW(backend->decode_batch_into(pair, two, three), Error);  // an output buffer a session
  EXPECT_EQ(s[0]->position(), p0);
  EXPECT_EQ(s[1]->position(), p1);
  EXPECT_EQ(full->position(), 4);
}

TEST_F(BatchDecodeTest, SessionBytesIsWhatAReservedFullSessionHolds) {
  auto backend = cpu::make_cpu_backend(model_, 1);
  auto s = backend->new_session(20);
  s->reserve_context();
  s->prefill(std::span(tokens_).first(20));
  // A snapshot that outlives its session holds every row it had (kv_share.h): the session's
  // n_ctx rows and recurrent states, without the session's own bookkeeping.
  auto snap = s->snapshot();
  s.reset();
  EXPECT_EQ(snap->bytes() + sizeof(cpu::State), backend->session_bytes(20));
  EXPECT_GT(backend->session_bytes(20), backend->session_bytes(10));
}

}  // namespace
}  // namespace rl
