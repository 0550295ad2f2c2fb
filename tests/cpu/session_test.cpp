// Session state of the CPU oracle: incremental decoding equals one long prefill, snapshots
// round-trip bit for bit, sessions are independent, and refused calls leave the state intact.
// Model B (4,099-token vocabulary) keeps these fast.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "cpu/cpu_backend.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/parity.h"
#include "model_b_test.h"
#include "test_util.h"

namespace rl {
namespace {

class SessionTest : public test::ModelBBackendTest {
 protected:
  SessionTest() : ModelBBackendTest(0) {}
  std::span<const int32_t> first(size_t n) const { return span(0, n); }
};

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(SessionTest, PrefillThenDecodeEqualsOneLongerPrefill) {
  for (size_t n : {1u, 7u, 40u}) {
    auto a = backend_->new_session(256);
    a->prefill(first(n));
    const std::vector<float> decoded = a->decode(tokens_[n]);
    auto b = backend_->new_session(256);
    const std::vector<float> prefilled = b->prefill(first(n + 1));
    EXPECT_TRUE(bit_identical(decoded, prefilled)) << "n = " << n << ", rel rms "
                                                   << relative_rms(decoded, prefilled);
    EXPECT_EQ(a->position(), (int)n + 1);
  }
}

TEST_F(SessionTest, AllPositionLogitsEqualTokenByTokenDecoding) {
  auto a = backend_->new_session(64);
  std::vector<float> all;
  a->prefill(first(12), &all);
  auto b = backend_->new_session(64);
  const size_t V = (size_t)b->n_vocab();
  ASSERT_EQ(all.size(), 12 * V);
  for (size_t i = 0; i < 12; i++) {
    const std::vector<float> one = b->decode(tokens_[i]);
    EXPECT_EQ(std::memcmp(one.data(), all.data() + i * V, V * sizeof(float)), 0) << "position " << i;
  }
}

TEST_F(SessionTest, PrefillLongerThanOneBatchEqualsChunkedPrefill) {
  // 174 tokens repeated past the 512-token internal batch: the split inside prefill() must not
  // change a bit compared with chunks chosen by the caller.
  std::vector<int32_t> long_prompt;
  while (long_prompt.size() < 530) long_prompt.insert(long_prompt.end(), tokens_.begin(), tokens_.end());
  long_prompt.resize(530);
  auto a = backend_->new_session(1024);
  const std::vector<float> whole = a->prefill(long_prompt);
  auto b = backend_->new_session(1024);
  std::vector<float> last;
  for (size_t i = 0; i < long_prompt.size(); i += 100)
    last = b->prefill(std::span(long_prompt).subspan(i, std::min<size_t>(100, long_prompt.size() - i)));
  EXPECT_TRUE(bit_identical(whole, last)) << relative_rms(whole, last);
}

TEST_F(SessionTest, ThreadCountDoesNotChangeResults) {
  auto one_thread = cpu::make_cpu_backend(model_, 1);
  auto s1 = one_thread->new_session(256);
  auto s2 = backend_->new_session(256);
  EXPECT_TRUE(bit_identical(s1->prefill(first(30)), s2->prefill(first(30))));
  EXPECT_TRUE(bit_identical(s1->decode(5), s2->decode(5)));
}

TEST_F(SessionTest, SnapshotRestoreRoundTripsBitForBit) {
  auto s = backend_->new_session(256);
  s->prefill(first(20));
  const auto snap = s->snapshot();
  EXPECT_EQ(snap->position(), 20);
  EXPECT_GT(snap->bytes(), 0u);
  std::vector<std::vector<float>> before;
  for (int i = 20; i < 25; i++) before.push_back(s->decode(tokens_[i]));
  EXPECT_EQ(s->position(), 25);

  s->restore(*snap);
  EXPECT_EQ(s->position(), 20);
  for (int i = 20; i < 25; i++) EXPECT_TRUE(bit_identical(s->decode(tokens_[i]), before[i - 20])) << i;

  // The snapshot also restores into another session of the same backend, and stays valid.
  auto other = backend_->new_session(256);
  other->restore(*snap);
  EXPECT_TRUE(bit_identical(other->decode(tokens_[20]), before[0]));
  // A second snapshot of the restored state equals the first one's continuation as well.
  s->restore(*snap);
  const auto snap2 = s->snapshot();
  EXPECT_EQ(snap2->bytes(), snap->bytes());
}

TEST_F(SessionTest, ResetStartsOver) {
  auto s = backend_->new_session(256);
  const std::vector<float> fresh = s->prefill(first(9));
  s->decode(3);
  s->reset();
  EXPECT_EQ(s->position(), 0);
  EXPECT_TRUE(bit_identical(s->prefill(first(9)), fresh));
}

TEST_F(SessionTest, TwoSessionsDoNotInterfere) {
  auto alone = backend_->new_session(256);
  const std::vector<float> a_ref = alone->prefill(first(15));
  const std::vector<float> a_ref2 = alone->decode(tokens_[15]);

  auto s1 = backend_->new_session(256);
  auto s2 = backend_->new_session(256);
  const std::vector<float> a1 = s1->prefill(first(15));
  s2->prefill(std::span(tokens_).subspan(50, 30));  // other content, other position
  s2->decode(7);
  const std::vector<float> a2 = s1->decode(tokens_[15]);
  EXPECT_TRUE(bit_identical(a1, a_ref));
  EXPECT_TRUE(bit_identical(a2, a_ref2));
  EXPECT_EQ(s2->position(), 31);
}

TEST_F(SessionTest, RunningPastContextThrowsAndLeavesStateIntact) {
  auto s = backend_->new_session(8);
  EXPECT_EQ(s->n_ctx(), 8);
  s->prefill(first(6));
  EXPECT_THROW(s->prefill(std::span(tokens_).subspan(6, 3)), Error);
  EXPECT_EQ(s->position(), 6);
  // The refused call changed nothing: the next tokens give the same logits as on a fresh run.
  auto fresh = backend_->new_session(8);
  fresh->prefill(first(6));
  EXPECT_TRUE(bit_identical(s->decode(tokens_[6]), fresh->decode(tokens_[6])));
  EXPECT_TRUE(bit_identical(s->decode(tokens_[7]), fresh->decode(tokens_[7])));
  EXPECT_EQ(s->position(), 8);
  try {
    s->decode(tokens_[8]);
    FAIL() << "decode past n_ctx did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s->position(), 8);
}

TEST_F(SessionTest, OutOfRangeTokenIdsThrowAndLeaveStateIntact) {
  auto s = backend_->new_session(64);
  s->prefill(first(4));
  const int V = s->n_vocab();
  const std::vector<int32_t> bad_high = {tokens_[4], V};
  const std::vector<int32_t> bad_low = {-1};
  try {
    s->prefill(bad_high);
    FAIL() << "token id n_vocab accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(V)), std::string::npos) << e.what();
  }
  EXPECT_THROW(s->prefill(bad_low), Error);
  EXPECT_THROW(s->prefill(std::span<const int32_t>()), Error);
  EXPECT_EQ(s->position(), 4);
  auto fresh = backend_->new_session(64);
  fresh->prefill(first(4));
  EXPECT_TRUE(bit_identical(s->decode(tokens_[4]), fresh->decode(tokens_[4])));
}

TEST_F(SessionTest, RestoreRejectsSnapshotsOfAnotherModelAndOversizedOnes) {
  auto s = backend_->new_session(64);
  s->prefill(first(10));
  const auto snap = s->snapshot();
  auto small = backend_->new_session(8);
  EXPECT_THROW(small->restore(*snap), Error);
  EXPECT_EQ(small->position(), 0);

  auto other_backend = cpu::make_cpu_backend(Model::open(test::model_b_gguf()), 1);
  auto foreign = other_backend->new_session(64);
  EXPECT_THROW(foreign->restore(*snap), Error);
}

TEST_F(SessionTest, NonPositiveContextIsRefused) {
  EXPECT_THROW(backend_->new_session(0), Error);
}

}  // namespace
}  // namespace rl

namespace rl {
namespace {

// A model file truncated under a running backend: the next pass that reads a lost page ends with
// an error naming the file (mapped_file.h) instead of SIGBUS; a session of another, intact model
// in the same process still works.
TEST(TruncatedModel, APassOverATruncatedFileFailsNamingTheFile) {
  const std::string fixture = test::model_b_gguf();
  RL_REQUIRE_FIXTURE(fixture);
  const std::string copy = (std::filesystem::temp_directory_path() /
                            ("redlite-truncated-" + std::to_string(::getpid()) + ".gguf")).string();
  std::filesystem::copy_file(fixture, copy, std::filesystem::copy_options::overwrite_existing);
  auto model = Model::open(copy);
  auto backend = cpu::make_cpu_backend(model, 2);
  auto session = backend->new_session(64);
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  const std::vector<float> before = session->prefill(prompt);
  // Keep the header and metadata: the tensor data is gone.
  ASSERT_EQ(::truncate(copy.c_str(), (off_t)model->gguf().data_offset()), 0);
  session->reset();
  try {
    session->prefill(prompt);
    ADD_FAILURE() << "a pass over a truncated file succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(copy + ": the file was truncated"), std::string::npos) << e.what();
  }
  std::filesystem::remove(copy);
  // The fixture itself is untouched and still gives the same logits.
  auto intact = Model::open(fixture);
  auto other = cpu::make_cpu_backend(intact, 2)->new_session(64);
  EXPECT_EQ(other->prefill(prompt), before);
}

}  // namespace
}  // namespace rl
