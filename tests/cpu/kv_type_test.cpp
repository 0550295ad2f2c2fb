// KV cache types of the CPU backend (--kv-type, cpu/kv_cache.h): the stored values against
// hand-worked and common/fp16.h roundings, and on model B the logits of each type against the
// f32 cache's, teacher-forced over the 174-token "medium" prompt.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/fp16.h"
#include "cpu/cpu_backend.h"
#include "cpu/forward.h"
#include "cpu/kv_cache.h"
#include "model/parity.h"
#include "model_b_test.h"

namespace rl {
namespace {

// Each row's values read back from a cache of `type` (two rows, so the row stride is exercised).
std::vector<float> round_trip(KvType type, const std::vector<float>& x, int width) {
  cpu::KvRows rows(type, width);
  rows.write(0, x.data(), x.size() / width);
  std::vector<float> out(x.size()), scratch(width);
  for (size_t r = 0; r < x.size() / width; r++) {
    const float* got = rows.read(r, 0, width, scratch.data());
    std::copy(got, got + width, out.begin() + r * width);
  }
  return out;
}

TEST(KvRows, BytesPerRowOfEachType) {
  EXPECT_EQ(cpu::KvRows(KvType::kF32, 64).bytes(), 0u);
  for (auto [type, bytes] : {std::pair{KvType::kF32, 256u}, {KvType::kF16, 128u}, {KvType::kBF16, 128u},
                             {KvType::kQ8_0, 68u}}) {  // q8_0: 2 blocks of 32 int8 and an fp16 scale
    cpu::KvRows rows(type, 64);
    std::vector<float> x(3 * 64, 0.5f);
    rows.write(0, x.data(), 3);
    EXPECT_EQ(rows.bytes(), 3 * bytes) << kv_type_name(type);
    EXPECT_EQ(rows.rows(), 3u);
  }
  EXPECT_THROW(cpu::KvRows(KvType::kQ8_0, 48), Error);
}

TEST(KvRows, HalfTypesRoundEachValueToNearestEven) {
  std::vector<float> x(2 * 32);
  for (size_t i = 0; i < x.size(); i++) x[i] = std::sin(0.37f * i) * (1.0f + i) + 1e-3f;
  const std::vector<float> f32 = round_trip(KvType::kF32, x, 32);
  const std::vector<float> f16 = round_trip(KvType::kF16, x, 32);
  const std::vector<float> bf16 = round_trip(KvType::kBF16, x, 32);
  for (size_t i = 0; i < x.size(); i++) {
    EXPECT_EQ(f32[i], x[i]);
    EXPECT_EQ(f16[i], fp16_to_f32(f32_to_fp16(x[i]))) << i;
    EXPECT_EQ(bf16[i], bf16_to_f32(f32_to_bf16(x[i]))) << i;
  }
}

TEST(KvRows, Q8BlocksAsGgml) {
  // Block 0: x_j = j - 16, max |x| = 16, d = 16/127, q = round(x·127/16) (worked by hand below);
  // block 1: all zeros (d = 0, q = 0).
  std::vector<float> x(64, 0.0f);
  for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
  const std::vector<float> y = round_trip(KvType::kQ8_0, x, 64);
  const float d = fp16_to_f32(f32_to_fp16(16.0f / 127.0f));
  // -16 -> -127, 1 -> round(7.9375) = 8, 2 -> round(15.875) = 16, 3 -> round(23.8125) = 24,
  // -1 -> -8, 15 -> round(119.0625) = 119, 0 -> 0.
  for (auto [j, q] : {std::pair{0, -127}, {17, 8}, {18, 16}, {19, 24}, {15, -8}, {31, 119}, {16, 0}})
    EXPECT_EQ(y[j], (float)q * d) << "value " << j;
  for (int j = 32; j < 64; j++) EXPECT_EQ(y[j], 0.0f);
  // Any block: every value within half a step of its block's scale.
  std::vector<float> r(4 * 32);
  for (size_t i = 0; i < r.size(); i++) r[i] = std::cos(1.3f * i) * (i % 7 + 0.25f);
  const std::vector<float> z = round_trip(KvType::kQ8_0, r, 128);
  for (size_t b = 0; b < 4; b++) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(r[b * 32 + j]));
    for (int j = 0; j < 32; j++) EXPECT_LE(std::fabs(z[b * 32 + j] - r[b * 32 + j]), 0.5f * amax / 127.0f * 1.001f);
  }
}

// Reads of a part of a row (one KV head): the same values as reading the whole row.
TEST(KvRows, ReadsOfOneHeadMatchTheWholeRow) {
  std::vector<float> x(128);
  for (size_t i = 0; i < x.size(); i++) x[i] = std::sin(0.11f * i) * 3.0f;
  for (KvType type : {KvType::kF32, KvType::kF16, KvType::kBF16, KvType::kQ8_0}) {
    cpu::KvRows rows(type, 128);
    rows.write(0, x.data(), 1);
    std::vector<float> whole(128), part(64);
    const float* w = rows.read(0, 0, 128, whole.data());
    const float* p = rows.read(0, 64, 64, part.data());
    EXPECT_EQ(std::memcmp(w + 64, p, 64 * sizeof(float)), 0) << kv_type_name(type);
  }
}

TEST(KvType, ExactTierTakesF32Only) {
  EXPECT_NO_THROW(check_kv_type(Numerics::kExact, KvType::kF32, 64));
  for (KvType t : {KvType::kF16, KvType::kBF16, KvType::kQ8_0}) {
    try {
      check_kv_type(Numerics::kExact, t, 64);
      ADD_FAILURE() << kv_type_name(t) << " accepted by the exact tier";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--numerics exact"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("--kv-type"), std::string::npos) << e.what();
    }
    EXPECT_NO_THROW(check_kv_type(Numerics::kFast, t, 64));
  }
  EXPECT_THROW(check_kv_type(Numerics::kFast, KvType::kQ8_0, 48), Error);
}

class KvTypeModelB : public test::ModelBTest {
 protected:
  // Every position's logits of the prompt with a cache of `type` (fast tier, 2 threads).
  std::vector<float> logits(KvType type) {
    auto backend = cpu::make_cpu_backend(model_, 2, Numerics::kFast, type);
    std::vector<float> all;
    backend->new_session((int)tokens_.size())->prefill(tokens_, &all);
    return all;
  }
};

struct Agreement {
  double mean_rel_rms = 0, max_rel_rms = 0, second_rel_rms = 0, top1 = 0;  // second: the second-largest position's
};

Agreement compare(const std::vector<float>& a, const std::vector<float>& ref, size_t n_vocab) {
  Agreement g;
  const size_t n = ref.size() / n_vocab;
  for (size_t t = 0; t < n; t++) {
    const std::span<const float> x(a.data() + t * n_vocab, n_vocab), y(ref.data() + t * n_vocab, n_vocab);
    const double r = relative_rms(x, y);
    g.mean_rel_rms += r / n;
    g.second_rel_rms = std::max(g.second_rel_rms, std::min(g.max_rel_rms, r));
    g.max_rel_rms = std::max(g.max_rel_rms, r);
    g.top1 += (argmax(x) == argmax(y)) / (double)n;
  }
  return g;
}

// Each type's logits against the f32 cache's, in the fast tier. Bounds: twice what model B
// measured (dev, 2026-12-01, with the fast tier's fp32 attention and delta rule: mean / max
// relative RMS and top-1 over the 174 positions, f16 4.34e-3 / 8.10e-3 / 0.9943, bf16 6.29e-3 /
// 2.20e-2 / 0.9828, q8_0 6.86e-3 / 9.35e-3 / 0.9943; top-1 bounds: the measured figure less 2 of
// 174 positions). With the oracle's double attention and recurrence the same types measured
// 4.48e-3 / 2.18e-2 / 0.9943, 6.26e-3 / 8.81e-3 / 0.9828 and 6.84e-3 / 9.47e-3 / 0.9885: the
// means hold still, the maxima (one position each) move with any change of the tier's rounding. The figures are not the types'
// rounding steps scaled (bf16's step is 8 times f16's): the fast tier quantises the attention
// output to 8 bits for the output projection, and a perturbed value that crosses a rounding
// boundary moves by a whole step, so a few millesimal changes of the cache give logits changes
// of that order. The accuracy that matters is FastTierParity's (every type meets the tier's bar
// against llama.cpp's reference); these bounds catch a cache that stores the wrong values.
// Since the fast tier's SiLU is fp32 (simd::silu8, 2026-12-06) the same run measures f16 4.39e-3 /
// 7.98e-3 / 1.0000, bf16 6.14e-3 / 9.17e-3 / 0.9885, q8_0 7.04e-3 / 3.19e-2 / 0.9885: bf16 lost its
// outlier and q8_0 gained one (position 55; every other position within 1.2e-2), so q8_0's maximum
// bound is twice that measurement, as the others were made, and its second-largest position keeps
// the old maximum's bound (1.87e-2); the means and top-1 bounds stand.
TEST_F(KvTypeModelB, EachTypeWithinItsBoundOfTheF32Cache) {
  const size_t V = (size_t)model_->config().n_vocab;
  const std::vector<float> ref = logits(KvType::kF32);
  // f32: the stored values are the computed ones, so the logits are the f32 cache's bit for bit.
  EXPECT_EQ(std::memcmp(logits(KvType::kF32).data(), ref.data(), ref.size() * sizeof(float)), 0);
  struct Bound {
    KvType type;
    double mean_rel_rms, max_rel_rms, second_rel_rms, top1;
  };
  for (const Bound& b : {Bound{KvType::kF16, 8.7e-3, 1.62e-2, 1.62e-2, 0.982},
                         Bound{KvType::kBF16, 1.26e-2, 4.4e-2, 4.4e-2, 0.971},
                         Bound{KvType::kQ8_0, 1.37e-2, 6.4e-2, 1.87e-2, 0.982}}) {
    const Agreement g = compare(logits(b.type), ref, V);
    std::printf("%s: mean rel rms %.3e, max %.3e, second %.3e, top-1 %.4f\n", kv_type_name(b.type), g.mean_rel_rms,
                g.max_rel_rms, g.second_rel_rms, g.top1);
    EXPECT_LE(g.mean_rel_rms, b.mean_rel_rms) << kv_type_name(b.type);
    EXPECT_LE(g.max_rel_rms, b.max_rel_rms) << kv_type_name(b.type);
    EXPECT_LE(g.second_rel_rms, b.second_rel_rms) << kv_type_name(b.type);
    EXPECT_GE(g.top1, b.top1) << kv_type_name(b.type);
  }
}

// A snapshot of each type holds the recurrent states while its rows are the session's; once the
// session overwrites them, its own copy of them in the type (the bytes from the README's shapes:
// 1,024 a token in f32, 512 in f16 and bf16, 272 in q8_0). Both ways it restores bit for bit: the
// continuation equals the one the session gave before.
TEST_F(KvTypeModelB, SnapshotsOfEachTypeRestoreBitForBit) {
  const Config& c = model_->config();
  for (auto [type, per_token] :
       {std::pair{KvType::kF32, 1024u}, {KvType::kF16, 512u}, {KvType::kBF16, 512u}, {KvType::kQ8_0, 272u}}) {
    SCOPED_TRACE(kv_type_name(type));
    auto backend = cpu::make_cpu_backend(model_, 2, Numerics::kFast, type);
    EXPECT_EQ(c.kv_bytes_per_token(type), per_token);
    EXPECT_EQ(backend->session_bytes(100), cpu::state_bytes(c, 100, type));
    auto s = backend->new_session(256);
    s->prefill(std::span(tokens_).first(100));
    auto snap = s->snapshot();
    EXPECT_EQ(snap->bytes(), c.recurrent_state_bytes());
    const auto rest = s->prefill(std::span(tokens_).subspan(100, 20));
    s->reset();
    s->restore(*snap);
    EXPECT_EQ(s->prefill(std::span(tokens_).subspan(100, 20)), rest);
    s->reset();
    s->prefill(std::span(tokens_).subspan(120, 30));  // overwrites rows 0..29
    EXPECT_EQ(snap->bytes(), c.recurrent_state_bytes() + 100 * per_token);
    s->restore(*snap);
    EXPECT_EQ(s->prefill(std::span(tokens_).subspan(100, 20)), rest);
  }
}

}  // namespace
}  // namespace rl
