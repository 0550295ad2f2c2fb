// The CUDA backend's KV cache types (--kv-type): store_kv and attention_prep store the CPU
// backend's values of each type bit for bit; snapshots of every type restore into sessions of
// another context length (a q8_0 cache's scales sit after n_ctx rows) and keep the rows they share
// with the session when it overwrites them or goes (model/kv_share.h); a context that does not fit
// is refused with its bytes. The attention kernels over each type: attention_fast_test.cpp; the
// fast tier's bar per type: fast_tier_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"
#include "model/parity.h"
#include "test_util.h"

namespace rl {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;

constexpr KvType kReducedTypes[] = {KvType::kF16, KvType::kBF16, KvType::kQ8_0};

// store_kv and attention_prep into each type's cache: the values the CPU backend's cache holds
// for the fp32 forms' values (cpu::KvRows: fp16.h's roundings, ggml's q8_0), bit for bit, at
// positions pos0 .. pos0 + T - 1 of a cache of n_ctx rows; q and gate as the fp32 form gives them.
// The values span fp16's subnormals (~1e-5) to ~3e3.
TEST(CudaKvTypes, CacheStoresMatchTheCpuBackend) {
  RL_REQUIRE_GPU();
  const int T = 3, n_head = 4, n_kv = 2, hd = 64, n_rot = 32, pos0 = 5, n_ctx = pos0 + T + 2;
  const size_t width = (size_t)n_kv * hd, cache = (size_t)n_ctx * width, qn_floats = (size_t)T * n_head * hd;
  auto k = random_floats(T * width, 51), v = random_floats(T * width, 52);
  for (size_t i = 0; i < k.size(); i++) {
    const float mag = i % 3 == 0 ? 1e-5f : i % 3 == 1 ? 1.0f : 3e3f;
    k[i] *= mag, v[i] *= mag;
  }
  auto qg = random_floats((size_t)T * n_head * 2 * hd, 53, 2.0f), qn = random_floats(hd, 54), kn = random_floats(hd, 55);
  std::vector<int32_t> pos(T);
  for (int t = 0; t < T; t++) pos[t] = pos0 + t;
  auto dk = to_device(k), dv = to_device(v), dqg = to_device(qg), dqn = to_device(qn), dkn = to_device(kn),
       dpos = to_device(pos);
  const float theta_scale = std::pow(10000.0f, -2.0f / (float)n_rot);
  cuda::DeviceBuffer kc32(cache * 4), vc32(cache * 4), q32(qn_floats * 4), g32(qn_floats * 4);
  for (KvType type : kReducedTypes) {
    SCOPED_TRACE(kv_type_name(type));
    cuda::DeviceBuffer kc(kv_bytes(type, cache)), vc(kv_bytes(type, cache)), qx(qn_floats * 4), gx(qn_floats * 4);
    const cuda::KvCacheRef ref{kc.get(), vc.get(), type, n_ctx};
    auto expect_cpu_values = [&](const char* what) {
      const auto k32 = to_host<float>(kc32, cache), v32 = to_host<float>(vc32, cache);
      const std::vector<float> k_rows(k32.begin() + pos0 * width, k32.begin() + (pos0 + T) * width);
      const std::vector<float> v_rows(v32.begin() + pos0 * width, v32.begin() + (pos0 + T) * width);
      const auto want_k = test::kv_values(type, k_rows, width), want_v = test::kv_values(type, v_rows, width);
      const auto got_k = test::device_kv_values(type, kc, n_ctx, width, pos0 + T);
      const auto got_v = test::device_kv_values(type, vc, n_ctx, width, pos0 + T);
      for (size_t i = 0; i < T * width; i++) {
        ASSERT_EQ(got_k[pos0 * width + i], want_k[i]) << what << ": k value " << i;
        ASSERT_EQ(got_v[pos0 * width + i], want_v[i]) << what << ": v value " << i;
      }
    };
    for (auto* b : {&kc32, &vc32, &kc, &vc}) RL_CUDA_CHECK(cudaMemset(b->get(), 0, b->bytes()));
    cuda::store_kv(dk.f(), dv.f(), kc32.f(), vc32.f(), T, n_kv, hd, pos0, nullptr);
    cuda::store_kv(dk.f(), dv.f(), ref, T, n_kv, hd, 0, nullptr, dpos.get<int32_t>());
    expect_cpu_values("store_kv");

    cuda::attention_prep(dqg.f(), dk.f(), dv.f(), q32.f(), g32.f(), dqn.f(), dkn.f(), kc32.f(), vc32.f(), T, n_head,
                         n_kv, hd, 1e-6f, n_rot, theta_scale, dpos.get<int32_t>(), nullptr);
    cuda::attention_prep(dqg.f(), dk.f(), dv.f(), qx.f(), gx.f(), dqn.f(), dkn.f(), ref, T, n_head, n_kv, hd, 1e-6f,
                         n_rot, theta_scale, dpos.get<int32_t>(), nullptr);
    expect_cpu_values("attention_prep");
    EXPECT_EQ(to_host<float>(qx, qn_floats), to_host<float>(q32, qn_floats)) << "q";
    EXPECT_EQ(to_host<float>(gx, qn_floats), to_host<float>(g32, qn_floats)) << "gate";
  }
}

// A head dim that is not whole q8_0 blocks is refused by the launchers (no GPU needed).
TEST(CudaKvTypes, Q8NeedsWholeBlocksAHead) {
  const cuda::KvCacheRef ref{nullptr, nullptr, KvType::kQ8_0, 16};
  try {
    cuda::store_kv(nullptr, nullptr, ref, 1, 2, 48, 0, nullptr);
    ADD_FAILURE() << "head dim 48 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
  }
}

class CudaKvSessions : public ::testing::Test {
 protected:
  void SetUp() override {
    RL_REQUIRE_GPU();
    path_ = test::fixture("tiny-qwen3next-q4km.gguf");
    RL_REQUIRE_FIXTURE(path_);
    model_ = Model::open(path_);
  }
  std::unique_ptr<cuda::CudaBackend> backend(KvType type) {
    cuda::CudaOptions o;
    o.numerics = Numerics::kFast;
    o.kv_type = type;
    return cuda::make_cuda_backend(model_, o);
  }
  static std::vector<int32_t> test_tokens(int n_vocab) {
    std::vector<int32_t> toks(800);
    for (size_t i = 0; i < toks.size(); i++) toks[i] = (int32_t)((i * 7919 + 13) % n_vocab);
    return toks;
  }
  std::string path_;
  std::shared_ptr<const Model> model_;
};

// For each type: a snapshot at 300 tokens holds the recurrent states (its KV rows are the
// session's, model/kv_share.h). Restored into a session of another context length (the rows
// copied into that layout; a q8_0 cache's scales sit after n_ctx rows), it continues as the
// original did, bit for bit; when that session goes, the snapshot holds its 300 rows alone and
// restores from them into a third session, again bit for bit.
TEST_F(CudaKvSessions, SnapshotsRestoreIntoAnotherContext) {
  const Config& c = model_->config();
  const auto toks = test_tokens(c.n_vocab);
  for (KvType type : {KvType::kF32, KvType::kF16, KvType::kBF16, KvType::kQ8_0}) {
    SCOPED_TRACE(kv_type_name(type));
    auto gpu = backend(type);
    auto s = gpu->new_session(1200);
    s->prefill(std::span(toks).subspan(0, 300));
    auto snap = s->snapshot();
    EXPECT_EQ(snap->bytes(), c.recurrent_state_bytes());
    const auto rest = s->prefill(std::span(toks).subspan(300, 100));
    auto other = gpu->new_session(500);
    other->restore(*snap);
    EXPECT_EQ(other->prefill(std::span(toks).subspan(300, 100)), rest);
    other.reset();
    EXPECT_EQ(snap->bytes(), c.recurrent_state_bytes() + 300 * c.kv_bytes_per_token(type)) << "outlived its session";
    auto third = gpu->new_session(700);
    third->restore(*snap);
    EXPECT_EQ(snap->bytes(), c.recurrent_state_bytes()) << "restored: it references the third session's rows";
    EXPECT_EQ(third->prefill(std::span(toks).subspan(300, 100)), rest);
  }
}

// For each type: snapshots A at 300 and B at 400 share the session's rows. Rewound to A (rows
// intact: nothing copied) and diverging by a GPU-routed decode token, the session first gives B its
// own copy of rows 300..399 (in a buffer of 100 rows: a q8_0 cache's scales move); a reset and
// another prompt then freeze A's rows once for both. B and A each continue as the session did
// before any of it, bit for bit, by prefill and by decode.
TEST_F(CudaKvSessions, SnapshotsKeepTheirRowsWhenTheSessionOverwritesThem) {
  const Config& c = model_->config();
  const auto toks = test_tokens(c.n_vocab);
  for (KvType type : {KvType::kF32, KvType::kF16, KvType::kBF16, KvType::kQ8_0}) {
    SCOPED_TRACE(kv_type_name(type));
    const size_t recurrent = c.recurrent_state_bytes(), per_token = c.kv_bytes_per_token(type);
    auto gpu = backend(type);
    auto s = gpu->new_session(1200);
    s->prefill(std::span(toks).subspan(0, 300));
    const auto a = s->snapshot();
    const auto a_next = s->decode(toks[300]);
    s->prefill(std::span(toks).subspan(301, 99));
    const auto b = s->snapshot();
    const auto b_rest = s->prefill(std::span(toks).subspan(400, 50));
    EXPECT_EQ(a->bytes(), recurrent);
    EXPECT_EQ(b->bytes(), recurrent);

    s->restore(*a);
    EXPECT_EQ(b->bytes(), recurrent) << "a restore into the session that holds the rows copies none";
    s->decode(17);  // row 300 now holds another token
    EXPECT_EQ(b->bytes(), recurrent + 100 * per_token) << "B copies its rows 300..399, no more";
    s->prefill(std::span(toks).subspan(600, 40));
    s->restore(*b);
    EXPECT_EQ(s->prefill(std::span(toks).subspan(400, 50)), b_rest) << "B after the divergence";

    s->reset();
    s->prefill(std::span(toks).subspan(700, 20));
    EXPECT_EQ(a->bytes() + b->bytes(), 2 * recurrent + 400 * per_token) << "one copy of rows 0..399 for both";
    s->restore(*a);
    EXPECT_EQ(s->decode(toks[300]), a_next) << "A after a reset and another prompt";
    s->restore(*b);
    EXPECT_EQ(s->prefill(std::span(toks).subspan(400, 50)), b_rest) << "B after a reset and another prompt";
  }
}

// A context whose session does not fit in device memory is refused, naming --ctx and the KV
// cache's bytes in the type (model B: 1,024 bytes a token in f32, 512 in f16 and bf16, 272 in q8_0).
TEST_F(CudaKvSessions, ContextBeyondMemoryIsRefusedWithItsBytes) {
  const int n_ctx = 2000000000;
  for (auto [type, per_token] :
       {std::pair{KvType::kF32, 1024ull}, {KvType::kF16, 512ull}, {KvType::kBF16, 512ull}, {KvType::kQ8_0, 272ull}}) {
    auto gpu = backend(type);
    try {
      gpu->check_session_fits(n_ctx);
      ADD_FAILURE() << kv_type_name(type) << ": " << n_ctx << " tokens accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--ctx 2000000000"), std::string::npos) << m;
      EXPECT_NE(m.find(fmt::format("KV cache {} in {}: {} bytes a token", per_token * n_ctx, kv_type_name(type),
                                   per_token)),
                std::string::npos)
          << m;
    }
    EXPECT_THROW(gpu->new_session(n_ctx), Error);
    EXPECT_NO_THROW(gpu->check_session_fits(4096));
  }
}

// The exact tier's kernels read f32 only: another type is refused at load.
TEST_F(CudaKvSessions, ExactTierRefusesReducedTypes) {
  for (KvType type : kReducedTypes) {
    cuda::CudaOptions o;
    o.numerics = Numerics::kExact;
    o.kv_type = type;
    EXPECT_THROW(cuda::make_cuda_backend(model_, o), Error) << kv_type_name(type);
  }
}

}  // namespace
}  // namespace rl
