// Backend::decode_batch on the CPU backend: several sessions, each at its own position, advance by
// one token each in one pass. Each one's logits are bit-identical to decoding it alone, in both
// tiers: every product keeps each row's sum order whatever the other columns are. The same holds
// for Backend::prefill_batch_into, several sessions' prompt pieces in passes of up to 512 tokens.
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

// prefill_batch_into against each session's own prefill of the same piece, bit for bit (logits,
// and the next decode step's logits, which read the state and KV rows the piece left): pieces of
// 1 to 200 tokens, 5 sessions (in passes of up to 512 tokens: 200 + 150 + 120 take two), then one
// piece longer than a pass (alone, through its session's prefill).
double prefill_batched_vs_alone(const std::shared_ptr<const Model>& model, const std::vector<int32_t>& tokens,
                                Numerics numerics) {
  auto backend = cpu::make_cpu_backend(model, 2, numerics);
  const int lens[] = {1, 200, 150, 120, 9};
  const int n = std::size(lens);
  std::vector<std::unique_ptr<Session>> batched, alone;
  std::vector<Session*> ptrs;
  std::vector<std::span<const int32_t>> chunks;
  std::vector<int32_t> prompt;
  for (size_t i = 0; i < 800; i++) prompt.push_back(tokens[(7 * i) % tokens.size()]);
  for (int i = 0; i < n; i++) {
    batched.push_back(backend->new_session(1024));
    alone.push_back(backend->new_session(1024));
    const auto start = std::span(tokens).first(3 + i);  // each at its own position
    batched.back()->prefill(start);
    alone.back()->prefill(start);
    ptrs.push_back(batched.back().get());
    chunks.push_back(std::span(prompt).subspan(10 * i, lens[i]));
  }
  double worst = 0;
  auto compare = [&](const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return (double)INFINITY;
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0 ? 0.0 : relative_rms(a, b);
  };
  std::vector<std::vector<float>> out(n);
  backend->prefill_batch_into(ptrs, chunks, out);
  for (int i = 0; i < n; i++) {
    worst = std::max(worst, compare(out[i], alone[i]->prefill(chunks[i])));
    EXPECT_EQ(batched[i]->position(), alone[i]->position());
    worst = std::max(worst, compare(batched[i]->decode(5), alone[i]->decode(5)));
  }
  Session* first[] = {ptrs[0], ptrs[1]};
  const std::span<const int32_t> long_chunks[] = {std::span(prompt).first(600), chunks[1].first(4)};
  std::vector<std::vector<float>> two(2);
  backend->prefill_batch_into(first, long_chunks, two);
  worst = std::max(worst, compare(two[0], alone[0]->prefill(long_chunks[0])));
  worst = std::max(worst, compare(two[1], alone[1]->prefill(long_chunks[1])));
  return worst;
}

TEST_F(BatchDecodeTest, PrefillBatchIsBitIdenticalToEachSessionsOwnPrefill) {
  EXPECT_EQ(prefill_batched_vs_alone(model_, tokens_, Numerics::kExact), 0.0);
  EXPECT_EQ(prefill_batched_vs_alone(model_, tokens_, Numerics::kFast), 0.0);
}

TEST_F(BatchDecodeTest, BadPrefillBatchesAreRefusedWithNoSessionChanged) {
  auto backend = cpu::make_cpu_backend(model_, 2);
  auto s = start(*backend, 2);
  auto other = cpu::make_cpu_backend(model_, 1)->new_session(16);
  const int p0 = s[0]->position(), p1 = s[1]->position();
  const int32_t ok[] = {1, 2, 3}, bad[] = {1, 1 << 20};
  std::vector<int32_t> too_long(200, 1);
  Session* pair[] = {s[0].get(), s[1].get()};
  Session* twice[] = {s[0].get(), s[0].get()};
  Session* foreign[] = {s[0].get(), other.get()};
  std::vector<std::vector<float>> out(2), three(3);
  auto call = [&](std::span<Session* const> ss, std::span<const int32_t> a, std::span<const int32_t> b,
                  std::span<std::vector<float>> o) {
    const std::span<const int32_t> chunks[] = {a, b};
    backend->prefill_batch_into(ss, chunks, o);
  };
  EXPECT_THROW(call(twice, ok, ok, out), Error);
  EXPECT_THROW(call(foreign, ok, ok, out), Error);
  EXPECT_THROW(call(pair, ok, bad, out), Error);                    // an id out of range
  EXPECT_THROW(call(pair, ok, {}, out), Error);                     // an empty chunk
  EXPECT_THROW(call(pair, ok, too_long, out), Error);               // past session 1's context of 128
  EXPECT_THROW(call(pair, ok, ok, three), Error);                   // an output buffer a session
  EXPECT_EQ(s[0]->position(), p0);
  EXPECT_EQ(s[1]->position(), p1);
  call(pair, ok, ok, out);
  EXPECT_EQ(s[0]->position(), p0 + 3);
  EXPECT_EQ(s[1]->position(), p1 + 3);
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
