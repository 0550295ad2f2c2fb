// The fast tier's gated attention (attention_fast.cu) against a CPU reference in double, for
// decode steps and prefill chunks at cache lengths 1 .. 262,144 and the head shapes of the
// fixtures and the 80B (query/KV heads 4/2 at hd 64, 8/2 at hd 128, 16/2 at hd 256).
//
// The bounds follow from the operand rounding (attention_fast.cu's header). The test data have
// keys of unit scale and queries of scale 2, so the scores q·k·scale spread with σ = 2.
// - Prefill: q, k, v, p in fp16 (u = 2^-11). Score error RMS u·√(2/3)·σ = 8.0e-4, which is the
//   output's relative error, plus u/√3 = 2.8e-4 from each of p and v: 8.9e-4 relative RMS. Bound
//   2e-3 over a case's checked outputs.
// - Decode: the same operand rounding (q, k, v, p in fp16 for the tensor cores, fp32 sums), so the
//   same 8.9e-4 and the same bound.
// Per head (a wrong mask, row or split shows there first) the relative error may be at most
// 10× the case's bound, measured against max(|o_h|, a quarter of the case's RMS head norm) so
// that a head whose weighted values cancel does not inflate it.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"

namespace rl {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;

constexpr double kPrefillBound = 2e-3;
constexpr double kDecodeBound = kPrefillBound;
constexpr double kHeadFactor = 10.0;

class CudaFastAttention : public ::testing::Test {
 protected:
  void SetUp() override { RL_REQUIRE_GPU(); }
};

struct Heads {
  int n_head, n_kv, hd;
};

// The fixtures' and the 80B's head shapes.
// Then two head dims that are multiples of 16 but not of 32 or 64 (the kernels' padded tiers), for
// OddShapes only.
const Heads kShapes[] = {{4, 2, 64}, {8, 2, 128}, {16, 2, 256}, {4, 2, 48}, {4, 2, 80}};
constexpr int kShapeCount = sizeof kShapes / sizeof kShapes[0];

// Random KV caches [n_ctx][n_kv][hd] on the device in a --kv-type, and on the host the values they
// hold, for shape kShapes[shape] (or any head count over its n_kv and hd). A cache of another type
// than f32 is written by store_kv from the fp32 values, and its host values are what the CPU
// backend's cache of that type holds for them (cpu::KvRows), so the kernels are checked against
// the CPU backend's values (and CacheStoresMatchTheCpuBackend checks store_kv's bits).
struct Caches {
  int n_kv = 0, hd = 0, n_ctx = 0;
  KvType type = KvType::kF32;
  std::vector<float> k, v;
  cuda::DeviceBuffer dk, dv;
  cuda::KvCacheRef ref() const { return {dk.get(), dv.get(), type, n_ctx}; }
};

// The caches are the tests' largest inputs: made once per shape and type for the whole binary.
const Caches& caches(int shape, KvType type = KvType::kF32) {
  static const int kCtx[] = {262144, 70100, 70100, 5000, 5000};  // 4/2 reaches the 80B's full context
  static_assert(sizeof kCtx / sizeof kCtx[0] == kShapeCount);
  static std::array<std::array<Caches, kShapeCount>, 4> made;  // by KvType, then shape
  Caches& c = made.at((size_t)type).at((size_t)shape);
  if (c.n_ctx == 0) {
    c.n_kv = kShapes[shape].n_kv;
    c.hd = kShapes[shape].hd;
    c.n_ctx = type != KvType::kF32 ? 70100 : kCtx[shape];
    c.type = type;
    const size_t width = (size_t)c.n_kv * c.hd, n = (size_t)c.n_ctx * width;
    c.k = random_floats(n, 100 + shape);
    c.v = random_floats(n, 200 + shape);
    if (type == KvType::kF32) {
      c.dk = to_device(c.k);
      c.dv = to_device(c.v);
    } else {
      c.dk.allocate(kv_bytes(type, n));
      c.dv.allocate(kv_bytes(type, n));
      const auto dk32 = to_device(c.k), dv32 = to_device(c.v);
      for (int pos = 0; pos < c.n_ctx; pos += 8192)
        cuda::store_kv(dk32.f() + pos * width, dv32.f() + pos * width, c.ref(), std::min(8192, c.n_ctx - pos), c.n_kv,
                       c.hd, pos, nullptr);
      RL_CUDA_CHECK(cudaDeviceSynchronize());
      c.k = test::kv_values(type, c.k, width);
      c.v = test::kv_values(type, c.v, width);
    }
  }
  return c;
}

float scale_of(const Heads& h) { return 1.0f / std::sqrt((float)h.hd); }

// gated_attention_fast over the caches, of their type.
void attend(const Caches& c, const Heads& h, const float* q, const float* g, float* out, int T, int pos0,
            cudaStream_t stream, const int32_t* pos_dev, const cuda::AttentionSplitsF* splits) {
  cuda::gated_attention_fast(q, g, c.ref(), out, T, h.n_head, h.n_kv, h.hd, pos0, scale_of(h), stream, pos_dev,
                             splits);
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// out[0 .. hd) of query head h for a query at position pos (q, g: that head's rows): the
// softmax in double, two passes, as the oracle forms it.
void reference_head(const Caches& c, int n_head, const float* q, const float* g, int pos, int h, double scale,
                    double* out) {
  const int hd = c.hd, kv = c.n_kv * hd, kh = h / (n_head / c.n_kv), n = pos + 1;
  std::vector<double> p(n), acc(hd, 0.0);
  double mx = -INFINITY, sum = 0.0;
  for (int j = 0; j < n; j++) {
    const float* kj = c.k.data() + (size_t)j * kv + kh * hd;
    double s = 0.0;
    for (int i = 0; i < hd; i++) s += (double)q[i] * kj[i];
    p[j] = s * scale;
    mx = std::max(mx, p[j]);
  }
  for (double& x : p) sum += (x = std::exp(x - mx));
  for (int j = 0; j < n; j++) {
    const float* vj = c.v.data() + (size_t)j * kv + kh * hd;
    for (int i = 0; i < hd; i++) acc[i] += p[j] * vj[i];
  }
  for (int i = 0; i < hd; i++) out[i] = acc[i] / sum * sigmoid(g[i]);
}

// Relative errors of checked heads: the case's aggregate relative RMS and the worst head.
struct Errors {
  std::vector<double> err2, ref2;  // per checked head
  void add(const float* got, const double* want, int hd) {
    double e = 0.0, r = 0.0;
    for (int i = 0; i < hd; i++) {
      e += (got[i] - want[i]) * (got[i] - want[i]);
      r += want[i] * want[i];
    }
    err2.push_back(e);
    ref2.push_back(r);
  }
  double rel_rms() const {
    double e = 0.0, r = 0.0;
    for (size_t i = 0; i < err2.size(); i++) e += err2[i], r += ref2[i];
    return std::sqrt(e / r);
  }
  double worst_head() const {
    double r = 0.0, worst = 0.0;
    for (double x : ref2) r += x;
    const double floor2 = r / (double)ref2.size() / 16.0;  // (a quarter of the RMS head norm)²
    for (size_t i = 0; i < err2.size(); i++) worst = std::max(worst, std::sqrt(err2[i] / std::max(ref2[i], floor2)));
    return worst;
  }
  void expect_within(double bound, const std::string& what) const {
    ASSERT_FALSE(err2.empty()) << what;
    EXPECT_LE(rel_rms(), bound) << what << ": relative RMS error over " << err2.size() << " heads";
    EXPECT_LE(worst_head(), kHeadFactor * bound) << what << ": worst head";
  }
};

// The reference for tokens `tokens` of a chunk at pos0 (all heads), on all cores.
std::vector<double> reference(const Caches& c, int n_head, const std::vector<float>& q, const std::vector<float>& g,
                              int pos0, const std::vector<int>& tokens, double scale) {
  const int hd = c.hd, jobs = (int)tokens.size() * n_head;
  std::vector<double> ref((size_t)jobs * hd);
  std::atomic<int> next{0};
  auto work = [&] {
    for (int j; (j = next++) < jobs;) {
      const int t = tokens[j / n_head], h = j % n_head;
      const size_t row = ((size_t)t * n_head + h) * hd;
      reference_head(c, n_head, q.data() + row, g.data() + row, pos0 + t, h, scale, ref.data() + (size_t)j * hd);
    }
  };
  std::vector<std::thread> pool(std::max(1u, std::thread::hardware_concurrency()));
  for (auto& th : pool) th = std::thread(work);
  for (auto& th : pool) th.join();
  return ref;
}

// Every token of a small chunk; of a large one every 37th (prime to the block and tile sizes) and
// the last, so that the double reference stays within seconds.
std::vector<int> checked_tokens(const Heads& h, int pos0, int T) {
  std::vector<int> tokens;
  const bool all = (double)T * (pos0 + T) * h.n_head * h.hd <= 2e9;
  for (int t = 0; t < T; t++)
    if (all || t % 37 == 0 || t == T - 1) tokens.push_back(t);
  return tokens;
}

struct Step {
  cuda::DeviceBuffer split_storage;
  cuda::AttentionSplitsF splits;
  Step(const Caches& c, const Heads& h)
      : split_storage(cuda::AttentionSplitsF::bytes(c.n_ctx, h.n_head, h.hd)),
        splits(cuda::AttentionSplitsF::within(split_storage.get(), c.n_ctx, h.n_head, h.hd)) {}
};

// A decode step at position pos (query q, gate g on the device), by pos0 or by pos_dev.
std::vector<float> decode(const Caches& c, const Heads& h, Step& st, const cuda::DeviceBuffer& dq,
                          const cuda::DeviceBuffer& dg, int pos, bool on_device) {
  const size_t row = (size_t)h.n_head * h.hd;
  cuda::DeviceBuffer dout(row * 4), dpos(sizeof(int32_t));
  const int32_t p = pos;
  RL_CUDA_CHECK(cudaMemcpy(dpos.get(), &p, sizeof p, cudaMemcpyHostToDevice));
  attend(c, h, dq.f(), dg.f(), dout.f(), 1, on_device ? 0 : pos, nullptr, on_device ? dpos.get<int32_t>() : nullptr,
         &st.splits);
  return to_host<float>(dout, row);
}

// A decode step of query heads h over caches(shape, type) at `length` keys.
void check_decode(int shape, Heads h, int length, uint32_t seed, KvType type = KvType::kF32) {
  const Caches& c = caches(shape, type);
  SCOPED_TRACE(::testing::Message() << h.n_head << "/" << h.n_kv << " heads, hd " << h.hd << ", " << length
                                    << " keys, " << kv_type_name(type) << " cache");
  const int pos = length - 1, row = h.n_head * h.hd;
  auto q = random_floats(row, seed, 2.0f), g = random_floats(row, seed + 1);
  auto dq = to_device(q), dg = to_device(g);
  Step st(c, h);
  const auto got = decode(c, h, st, dq, dg, pos, false);
  const auto ref = reference(c, h.n_head, q, g, pos, {0}, scale_of(h));
  Errors e;
  for (int i = 0; i < h.n_head; i++) e.add(got.data() + i * h.hd, ref.data() + i * h.hd, h.hd);
  e.expect_within(kDecodeBound, "decode");
  // The position read from device memory (a captured graph's path) gives the same bits.
  const auto dev = decode(c, h, st, dq, dg, pos, true);
  for (int i = 0; i < row; i++) ASSERT_EQ(dev[i], got[i]) << "pos_dev path, value " << i;
}

// Decode at lengths 1, 31, 32, 33 (one split), 64 and 65 (the first split boundary), 4,095 (64
// splits of ~64 keys), 8,193 (past the 128-split cap) and 70,001 (128 splits of ~547 keys, each
// over several score tiles); 262,144 (the 80B's context) for the 4/2 shape.
TEST_F(CudaFastAttention, DecodeAtDepth) {
  for (int shape = 0; shape < 3; shape++)
    for (int length : {1, 31, 32, 33, 64, 65, 4095, 8193, 70001})
      check_decode(shape, kShapes[shape], length, 10 + length);
  check_decode(0, kShapes[0], 262144, 7);
}

// A chunk of T queries at pos0 (keys through pos0 + T - 1 in the cache): against the reference,
// the pos_dev path bit for bit, and the decode step of its last token within the prefill bound.
// With split buffers given, a short chunk splits its keys (fast_chunk_key_splits).
void check_prefill(int shape, Heads h, int pos0, int T, uint32_t seed, KvType type = KvType::kF32,
                   bool with_splits = false) {
  const Caches& c = caches(shape, type);
  SCOPED_TRACE(::testing::Message() << h.n_head << "/" << h.n_kv << " heads, hd " << h.hd << ", pos0 " << pos0
                                    << ", T " << T << ", " << kv_type_name(type) << " cache"
                                    << (with_splits ? ", split buffers" : ""));
  ASSERT_LE(pos0 + T, c.n_ctx);
  const int n_head = h.n_head, hd = h.hd;
  const size_t row = (size_t)n_head * hd;
  auto q = random_floats(T * row, seed, 2.0f), g = random_floats(T * row, seed + 1);
  auto dq = to_device(q), dg = to_device(g);
  cuda::DeviceBuffer dout(T * row * 4), dpos(sizeof(int32_t));
  Step st(c, h);
  const cuda::AttentionSplitsF* chunk_splits = with_splits ? &st.splits : nullptr;
  attend(c, h, dq.f(), dg.f(), dout.f(), T, pos0, nullptr, nullptr, chunk_splits);
  const auto got = to_host<float>(dout, T * row);

  const auto tokens = checked_tokens(h, pos0, T);
  const auto ref = reference(c, n_head, q, g, pos0, tokens, scale_of(h));
  Errors e;
  for (size_t i = 0; i < tokens.size(); i++)
    for (int j = 0; j < n_head; j++)
      e.add(got.data() + tokens[i] * row + j * hd, ref.data() + (i * n_head + j) * hd, hd);
  e.expect_within(kPrefillBound, "prefill");

  const int32_t p = pos0;
  RL_CUDA_CHECK(cudaMemcpy(dpos.get(), &p, sizeof p, cudaMemcpyHostToDevice));
  attend(c, h, dq.f(), dg.f(), dout.f(), T, 0, nullptr, dpos.get<int32_t>(), chunk_splits);
  const auto dev = to_host<float>(dout, T * row);
  for (size_t i = 0; i < dev.size(); i++) ASSERT_EQ(dev[i], got[i]) << "pos_dev path, value " << i;

  // The last query by a decode step differs from the chunk's by about the two kernels' errors.
  const size_t last = (size_t)(T - 1) * row;
  auto dq1 = to_device(std::vector<float>(q.begin() + last, q.begin() + last + row));
  auto dg1 = to_device(std::vector<float>(g.begin() + last, g.begin() + last + row));
  const auto one = decode(c, h, st, dq1, dg1, pos0 + T - 1, true);
  Errors d;
  for (int j = 0; j < n_head; j++) {
    const std::vector<double> want(one.begin() + j * hd, one.begin() + (j + 1) * hd);
    d.add(got.data() + last + j * hd, want.data(), hd);
  }
  d.expect_within(kPrefillBound, "last query of the chunk vs its decode step");
}

// Chunks ending at cache lengths 2, 31, 32, 33 (from position 0 and 1: the causal triangle in
// one key tile and across two), 4,095 and 70,001 (77 and 512 queries at nonzero pos0; 2,048, the
// default --prefill-chunk, at 70,001), for each head shape. (Length 1 has no chunk: one token is a
// decode step.)
TEST_F(CudaFastAttention, PrefillChunks) {
  struct Chunk {
    int pos0, T;
  };
  for (int shape = 0; shape < 3; shape++)
    for (Chunk ch : {Chunk{0, 2}, Chunk{0, 31}, Chunk{0, 32}, Chunk{1, 32}, Chunk{4095 - 77, 77},
                     Chunk{4095 - 512, 512}, Chunk{70001 - 77, 77}, Chunk{70001 - 512, 512},
                     Chunk{70001 - 2048, 2048}})
      check_prefill(shape, kShapes[shape], ch.pos0, ch.T, 1000 + ch.pos0 + ch.T);
}

// Chunks given the split buffers split their keys over blocks, folded by the decode combine:
// 2, 16 and 76 tokens (speculative verification, a prompt's last chunk; split however many SMs)
// and 512 (split 2 ways on the H200's 132 SMs) at depths 4,095 and 70,001, and 16 tokens from
// position 0 (most splits empty), for the 4/2 and 16/2 shapes.
TEST_F(CudaFastAttention, ChunksSplitTheirKeys) {
  for (int shape : {0, 2}) {
    const Heads& h = kShapes[shape];
    Step st(caches(shape), h);
    for (int T : {2, 16, 76, 512}) {
      if (T < 512) {
        ASSERT_GT(cuda::fast_chunk_key_splits(T, h.n_head, h.n_kv, &st.splits), 1) << "T " << T;
      }
      for (int end : {4095, 70001}) check_prefill(shape, h, end - T, T, 60 + T, KvType::kF32, true);
    }
    check_prefill(shape, h, 0, 16, 61, KvType::kF32, true);
  }
  EXPECT_EQ(cuda::fast_chunk_key_splits(16, 16, 2, nullptr), 1);
}

// A group of 3 query heads a KV head (no power of two: one head a decode block, prefill rows that
// straddle tokens) on the 4/2 caches read as 6/2.
TEST_F(CudaFastAttention, OddGroup) {
  check_prefill(0, {6, 2, 64}, 300, 45, 77);
  check_decode(0, {6, 2, 64}, 4000, 78);
}

// Decode blocks of other head counts than 8 (groups of 16: two blocks a KV head; 5: five heads a
// block, three padding rows) and head dims inside a padded tier (48 in 64, 80 in 128), and
// prefill chunks at those dims.
// A batched decode step's attention (attention_prep_rows, gated_attention_fast_rows): three
// sessions of different contexts (so different split counts) at different positions, each row
// against its own one-token calls on a copy of its cache: q, gate, output and the whole caches
// equal bit for bit (the same kernels' arithmetic per row; a row reading another's cache, splits or
// position differs). The fixtures' and the 80B's head shapes, f32, f16 and q8_0 caches.
TEST_F(CudaFastAttention, BatchedRowsEqualEachRowsOwnStep) {
  const int kCtx[] = {600, 64, 4000}, kPos[] = {599, 0, 3000};
  constexpr int B = 3;
  for (int shape : {0, 2})
    for (KvType type : {KvType::kF32, KvType::kF16, KvType::kQ8_0}) {
      const Heads h = kShapes[shape];
      SCOPED_TRACE(std::to_string(h.n_head) + "/" + std::to_string(h.n_kv) + " heads of " + std::to_string(h.hd) +
                   ", " + kv_type_name(type));
      const size_t width = (size_t)h.n_kv * h.hd, qrow = (size_t)h.n_head * h.hd;
      const int n_rot = h.hd / 4;
      const float theta = std::pow(10000.0f, -2.0f / (float)n_rot);
      // Each row's cache twice (own: its one-token calls; rows: the batched launches), the same bits.
      std::vector<cuda::DeviceBuffer> own_k, own_v, rows_k, rows_v, own_split, rows_split;
      std::vector<cuda::AttentionRow> table;
      std::vector<cuda::AttentionSplitsF> own_sp;
      int max_splits = 0;
      for (int r = 0; r < B; r++) {
        const size_t n = (size_t)kCtx[r] * width;
        for (auto* list : {&own_k, &own_v, &rows_k, &rows_v}) list->emplace_back(kv_bytes(type, n));
        const auto k32 = to_device(random_floats(n, 900 + r)), v32 = to_device(random_floats(n, 910 + r));
        for (int i = 0; i < 2; i++) {
          const cuda::KvCacheRef c{(i ? rows_k : own_k)[r].get(), (i ? rows_v : own_v)[r].get(), type, kCtx[r]};
          cuda::store_kv(k32.f(), v32.f(), c, kCtx[r], h.n_kv, h.hd, 0, nullptr);
        }
        const size_t sb = cuda::AttentionSplitsF::bytes(kCtx[r], h.n_head, h.hd);
        own_split.emplace_back(sb);
        rows_split.emplace_back(sb);
        own_sp.push_back(cuda::AttentionSplitsF::within(own_split[r].get(), kCtx[r], h.n_head, h.hd));
        table.push_back({{rows_k[r].get(), rows_v[r].get(), type, kCtx[r]},
                         cuda::AttentionSplitsF::within(rows_split[r].get(), kCtx[r], h.n_head, h.hd)});
        max_splits = std::max(max_splits, table[r].splits.max_splits);
      }
      const auto dtable = to_device(table);
      const auto dpos = to_device(std::vector<int32_t>(kPos, kPos + B));
      const auto dqg = to_device(random_floats(B * 2 * qrow, 920, 2.0f)), dk = to_device(random_floats(B * width, 921));
      const auto dv = to_device(random_floats(B * width, 922)), dqn = to_device(random_floats(h.hd, 923));
      const auto dkn = to_device(random_floats(h.hd, 924));
      cuda::DeviceBuffer q_a(B * qrow * 4), q_b(B * qrow * 4), g_a(B * qrow * 4), g_b(B * qrow * 4),
          out_a(B * qrow * 4), out_b(B * qrow * 4);
      for (int r = 0; r < B; r++) {
        const cuda::KvCacheRef c{own_k[r].get(), own_v[r].get(), type, kCtx[r]};
        cuda::attention_prep(dqg.f() + r * 2 * qrow, dk.f() + r * width, dv.f() + r * width, q_a.f() + r * qrow,
                             g_a.f() + r * qrow, dqn.f(), dkn.f(), c, 1, h.n_head, h.n_kv, h.hd, 1e-6f, n_rot, theta,
                             dpos.get<int32_t>() + r, nullptr);
        cuda::gated_attention_fast(q_a.f() + r * qrow, g_a.f() + r * qrow, c, out_a.f() + r * qrow, 1, h.n_head,
                                   h.n_kv, h.hd, 0, scale_of(h), nullptr, dpos.get<int32_t>() + r, &own_sp[r]);
      }
      const auto* rows = dtable.get<cuda::AttentionRow>();
      cuda::attention_prep_rows(dqg.f(), dk.f(), dv.f(), q_b.f(), g_b.f(), dqn.f(), dkn.f(), rows, type, B, h.n_head,
                                h.n_kv, h.hd, 1e-6f, n_rot, theta, dpos.get<int32_t>(), nullptr);
      cuda::gated_attention_fast_rows(q_b.f(), g_b.f(), rows, type, max_splits, out_b.f(), B, h.n_head, h.n_kv, h.hd,
                                      scale_of(h), dpos.get<int32_t>(), nullptr);
      EXPECT_EQ(to_host<uint32_t>(q_b, B * qrow), to_host<uint32_t>(q_a, B * qrow)) << "q";
      EXPECT_EQ(to_host<uint32_t>(g_b, B * qrow), to_host<uint32_t>(g_a, B * qrow)) << "gate";
      const auto oa = to_host<float>(out_a, B * qrow);
      EXPECT_EQ(to_host<uint32_t>(out_b, B * qrow), to_host<uint32_t>(out_a, B * qrow)) << "outputs";
      // Finite, and no row all zero (a row that attended to nothing). Single outputs may be 0: the
      // row at position 0 attends to one key, so its output is that value times the gate, and a
      // q8_0 value rounds to 0 (the H200's run: 24 such in the 16/2×256 q8_0 case).
      EXPECT_TRUE(std::all_of(oa.begin(), oa.end(), [](float x) { return std::isfinite(x); })) << "outputs not finite";
      for (int r = 0; r < B; r++)
        EXPECT_TRUE(std::any_of(oa.begin() + r * qrow, oa.begin() + (r + 1) * qrow, [](float x) { return x != 0.0f; }))
            << "row " << r << "'s outputs are all zero";
      for (int r = 0; r < B; r++) {
        const size_t bytes = kv_bytes(type, (size_t)kCtx[r] * width);
        EXPECT_EQ(to_host<uint8_t>(rows_k[r], bytes), to_host<uint8_t>(own_k[r], bytes)) << "K cache of row " << r;
        EXPECT_EQ(to_host<uint8_t>(rows_v[r], bytes), to_host<uint8_t>(own_v[r], bytes)) << "V cache of row " << r;
      }
    }
}

TEST_F(CudaFastAttention, OddShapes) {
  for (int length : {33, 4000}) {
    check_decode(0, {32, 2, 64}, length, 81 + length);
    check_decode(0, {10, 2, 64}, length, 82 + length);
    check_decode(3, kShapes[3], length, 83 + length);
    check_decode(4, kShapes[4], length, 84 + length);
  }
  check_prefill(3, kShapes[3], 4000 - 77, 77, 85);
  check_prefill(4, kShapes[4], 4000 - 77, 77, 86);
}

// The decode kernels captured in a CUDA graph once, replayed at several positions written to
// device memory: each replay equals a direct call at that position.
TEST_F(CudaFastAttention, CapturedDecodeReplaysAtAnyDepth) {
  const Caches& c = caches(2);
  const Heads& h = kShapes[2];
  const size_t row = (size_t)h.n_head * h.hd;
  auto q = random_floats(row, 5, 2.0f), g = random_floats(row, 6);
  auto dq = to_device(q), dg = to_device(g);
  Step st(c, h);
  cuda::DeviceBuffer dout(row * 4), dpos(sizeof(int32_t));
  cudaStream_t stream;
  RL_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  RL_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  attend(c, h, dq.f(), dg.f(), dout.f(), 1, 0, stream, dpos.get<int32_t>(), &st.splits);
  RL_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  RL_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int pos : {0, 100, 70000, 31}) {
    const int32_t p = pos;
    RL_CUDA_CHECK(cudaMemcpy(dpos.get(), &p, sizeof p, cudaMemcpyHostToDevice));
    RL_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    RL_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto replay = to_host<float>(dout, row);
    const auto direct = decode(c, h, st, dq, dg, pos, false);
    for (size_t i = 0; i < row; i++) ASSERT_EQ(replay[i], direct[i]) << "position " << pos << ", value " << i;
  }
  RL_CUDA_CHECK(cudaGraphExecDestroy(exec));
  RL_CUDA_CHECK(cudaGraphDestroy(graph));
  RL_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Caches of every --kv-type but f32 (f16, bf16, q8_0): the same kernels reading each type,
// against the reference over the values the CPU backend's cache of that type holds. The bounds
// are the fp32 caches': both kernels round k and v to fp16 as they do an fp32 cache's (bf16 and
// q8_0 values round once, f16 values not at all). A split chunk too (its fold reads the partials
// only).
TEST_F(CudaFastAttention, DecodeOverEachKvType) {
  for (KvType type : {KvType::kF16, KvType::kBF16, KvType::kQ8_0})
    for (int shape = 0; shape < 3; shape++)
      for (int length : {1, 33, 4095, 70001}) check_decode(shape, kShapes[shape], length, 30 + length, type);
}

TEST_F(CudaFastAttention, PrefillOverEachKvType) {
  for (KvType type : {KvType::kF16, KvType::kBF16, KvType::kQ8_0}) {
    for (int shape = 0; shape < 3; shape++) {
      check_prefill(shape, kShapes[shape], 0, 31, 41, type);
      check_prefill(shape, kShapes[shape], 4095 - 77, 77, 42, type);
      check_prefill(shape, kShapes[shape], 70001 - 512, 512, 43, type);
    }
    check_prefill(2, kShapes[2], 4095 - 16, 16, 44, type, true);
  }
}

// Bad arguments are refused before anything is launched, naming what is wrong (no GPU needed).
TEST(FastAttentionArguments, RefusedWithTheReason) {
  auto message = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  auto attend = [](int T, int n_head, int n_kv, int hd, int pos0, const cuda::AttentionSplitsF* sp) {
    const float* none = nullptr;
    cuda::gated_attention_fast(none, none, none, none, nullptr, T, n_head, n_kv, hd, pos0, 0.125f, nullptr, nullptr,
                               sp);
  };
  EXPECT_NE(message([&] { attend(4, 4, 2, 72, 0, nullptr); }).find("head dim 72"), std::string::npos);
  EXPECT_NE(message([&] { attend(4, 4, 2, 272, 0, nullptr); }).find("head dim 272"), std::string::npos);
  EXPECT_NE(message([&] { attend(4, 4, 2, 0, 0, nullptr); }).find("head dim 0"), std::string::npos);
  EXPECT_NE(message([&] { attend(4, 5, 2, 64, 0, nullptr); }).find("5 query heads do not group over 2"),
            std::string::npos);
  EXPECT_NE(message([&] { attend(4, 4, 0, 64, 0, nullptr); }).find("over 0 KV heads"), std::string::npos);
  EXPECT_NE(message([&] { attend(4, 4, 2, 64, -3, nullptr); }).find("position -3"), std::string::npos);
  EXPECT_NE(message([&] { attend(1, 4, 2, 64, 0, nullptr); }).find("split buffers"), std::string::npos);
  cuda::AttentionSplitsF small;
  small.acc = small.ml = reinterpret_cast<float*>(16);
  small.max_splits = 4, small.n_head = 2, small.hd = 64;
  EXPECT_NE(message([&] { attend(1, 4, 2, 64, 0, &small); }).find("hold 2 heads of 64 dims, the step has 4 of 64"),
            std::string::npos);
}

// The split buffers: 1,024 partials of (hd + 2) floats a head; a decode step uses
// min(128, ceil(n_ctx / 64)) of them.
TEST(FastAttentionArguments, SplitBufferSize) {
  EXPECT_EQ(cuda::AttentionSplitsF::bytes(262144, 16, 256), (size_t)1024 * 16 * 258 * 4);
  EXPECT_EQ(cuda::AttentionSplitsF::bytes(100, 4, 64), (size_t)1024 * 4 * 66 * 4);
  EXPECT_EQ(cuda::AttentionSplitsF::within(reinterpret_cast<void*>(4096), 100, 4, 64).max_splits, 2);
  EXPECT_EQ(cuda::AttentionSplitsF::within(reinterpret_cast<void*>(4096), 1, 4, 64).max_splits, 1);
  const auto s = cuda::AttentionSplitsF::within(reinterpret_cast<void*>(4096), 8192, 16, 256);
  EXPECT_EQ(s.max_splits, 128);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.ml) - reinterpret_cast<uintptr_t>(s.acc), (size_t)1024 * 16 * 256 * 4);
}

}  // namespace
}  // namespace rl
