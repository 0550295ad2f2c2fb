// The fast tier's attention core (cpu/attention_fast.h) against a double reference over the same
// cache values (what KvRows::read gives back, so each --kv-type is checked on what it stores), at
// key counts 1 .. 20,000, the head shapes of the fixtures and the 80B (4/2 at hd 64, 16/2 at 256,
// and the odd group 6/2), with pools of 1, 2 and 8 threads (so a row's keys go in 1 to 32 splits),
// and a pass of rows from two sequences of different lengths.
//
// Bound: fp32 operations (u = 2^-24). The test's queries of scale 2 and unit keys spread the scores
// over σ ≈ 2·√hd/√hd = 2; a score's dot product of hd terms is off by ~u·√hd·σ ≤ 1e-6, which is the
// output's relative error, and a split's sums over n ≤ 20,000 keys by ~u·√n ≤ 1e-5 relative: bound
// 2e-5 on a case's relative RMS, and 10× that for its worst head. A key read wrongly, a split left
// out or a head on the wrong KV head moves the output by ≥ 1e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "cpu/attention_fast.h"
#include "cpu/thread_pool.h"
#include "cuda/random_weights.h"

namespace rl::cpu {
namespace {

constexpr double kBound = 2e-5;

using test::random_floats;

struct Cache {
  KvRows k, v;
  Cache(KvType type, int width, int n, uint32_t seed) : k(type, width), v(type, width) {
    const auto kv = random_floats((size_t)n * width, seed, 1.0f), vv = random_floats((size_t)n * width, seed + 1, 1.0f);
    k.write(0, kv.data(), n);
    v.write(0, vv.data(), n);
  }
};

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Query head h of a row over the first n_keys rows of its cache, in double on the stored values.
std::vector<double> reference(const AttentionRow& r, const float* q, const float* g, int h, int n_head, int n_kv,
                              int hd) {
  const int kh = h / (n_head / n_kv);
  std::vector<float> scratch(hd);
  std::vector<double> p(r.n_keys), acc(hd, 0.0);
  double mx = -INFINITY, sum = 0.0;
  for (int j = 0; j < r.n_keys; j++) {
    const float* key = r.k->read(j, kh * hd, hd, scratch.data());
    double s = 0.0;
    for (int i = 0; i < hd; i++) s += (double)q[i] * key[i];
    mx = std::max(mx, p[j] = s / std::sqrt((double)hd));
  }
  for (double& x : p) sum += (x = std::exp(x - mx));
  for (int j = 0; j < r.n_keys; j++) {
    const float* value = r.v->read(j, kh * hd, hd, scratch.data());
    for (int i = 0; i < hd; i++) acc[i] += p[j] * value[i];
  }
  for (int i = 0; i < hd; i++) acc[i] = acc[i] / sum * sigmoid(g[i]);
  return acc;
}

// The rows through gated_attention_fast on a pool of `threads`, every head against the reference.
void check(std::span<const AttentionRow> rows, int n_head, int n_kv, int hd, int threads, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << n_head << "/" << n_kv << " heads, hd " << hd << ", " << rows.size()
                                    << " rows, first sees " << rows[0].n_keys << " keys, " << threads << " threads");
  const size_t width = (size_t)n_head * hd;
  const auto q = random_floats(rows.size() * width, seed, 2.0f), g = random_floats(rows.size() * width, seed + 7, 1.0f);
  std::vector<float> out(rows.size() * width, NAN);
  ThreadPool pool(threads);
  gated_attention_fast(pool, rows, q.data(), g.data(), n_head, n_kv, hd, out.data());
  double e2 = 0.0, r2 = 0.0, worst = 0.0;
  for (size_t t = 0; t < rows.size(); t++)
    for (int h = 0; h < n_head; h++) {
      const size_t at = t * width + (size_t)h * hd;
      const auto want = reference(rows[t], q.data() + at, g.data() + at, h, n_head, n_kv, hd);
      double e = 0.0, r = 0.0;
      for (int i = 0; i < hd; i++) e += (out[at + i] - want[i]) * (out[at + i] - want[i]), r += want[i] * want[i];
      e2 += e, r2 += r;
      worst = std::max(worst, std::sqrt(e / r));
    }
  EXPECT_LE(std::sqrt(e2 / r2), kBound);
  EXPECT_LE(worst, 10 * kBound);
}

struct Shape {
  int n_head, n_kv, hd;
};

// Decode rows (one query) at key counts around the split length (256) and long, each thread count.
TEST(CpuFastAttention, DecodeRowsAgainstDouble) {
  for (Shape s : {Shape{4, 2, 64}, Shape{16, 2, 256}, Shape{6, 2, 64}}) {
    const Cache c(KvType::kF32, s.n_kv * s.hd, 20000, 11);
    for (int n_keys : {1, 31, 255, 256, 257, 4095, 20000})
      for (int threads : {1, 2, 8}) {
        const AttentionRow row{&c.k, &c.v, n_keys};
        check(std::span(&row, 1), s.n_head, s.n_kv, s.hd, threads, 100 + n_keys);
      }
  }
}

// A pass of rows from two sequences: a causal chunk of 40 tokens at 300 (each seeing its own
// prefix) and a decode row of another cache at 5,000.
TEST(CpuFastAttention, RowsOfTwoSequences) {
  const Shape s{8, 2, 128};
  const Cache a(KvType::kF32, s.n_kv * s.hd, 340, 21), b(KvType::kF32, s.n_kv * s.hd, 5000, 23);
  std::vector<AttentionRow> rows;
  for (int t = 0; t < 40; t++) rows.push_back({&a.k, &a.v, 300 + t + 1});
  rows.push_back({&b.k, &b.v, 5000});
  for (int threads : {1, 8}) check(rows, s.n_head, s.n_kv, s.hd, threads, 31);
}

// Each --kv-type's cache, against the reference over the values it holds.
TEST(CpuFastAttention, EachKvType) {
  const Shape s{16, 2, 256};
  for (KvType type : {KvType::kF16, KvType::kBF16, KvType::kQ8_0}) {
    SCOPED_TRACE(kv_type_name(type));
    const Cache c(type, s.n_kv * s.hd, 3000, 41);
    for (int n_keys : {1, 3000}) {
      const AttentionRow row{&c.k, &c.v, n_keys};
      check(std::span(&row, 1), s.n_head, s.n_kv, s.hd, 8, 50 + n_keys);
    }
  }
}

TEST(CpuFastAttention, RefusesRowsWithoutKeysAndUngroupedHeads) {
  const Cache c(KvType::kF32, 64, 4, 1);
  ThreadPool pool(1);
  std::vector<float> q(4 * 64), out(4 * 64);
  const AttentionRow none{&c.k, &c.v, 0};
  EXPECT_THROW(gated_attention_fast(pool, std::span(&none, 1), q.data(), q.data(), 4, 1, 64, out.data()), Error);
  const AttentionRow one{&c.k, &c.v, 1};
  EXPECT_THROW(gated_attention_fast(pool, std::span(&one, 1), q.data(), q.data(), 3, 2, 32, out.data()), Error);
}

}  // namespace
}  // namespace rl::cpu
