// The fast tier's prefill products (matmul_bf16.cu) against the CPU reference: weights dequantised
// by quant/quant.h, products summed in double. For every weight type and several shapes (T = 1,
// 77 and 512 tokens, rows and tokens that leave partial tiles, each token tile the kernel has),
// the normalised squared error Σ(y − ref)²/Σref² stays within the tier's bar of 5e-4. What bf16
// rounding of weights and activations gives, for these random inputs: ≈ 1e-5 (matmul_bf16.cu's
// design comment), so the bar has a margin of ~50× and a wrong row, token, group or column
// (NMSE ~1 or more) or an unwritten output (the output buffers start as NaN) fails it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"

namespace rl {
namespace {

constexpr double kMaxNmse = 5e-4;  // DESIGN.md §5a: the fast tier's per-kernel bar

class Bf16Products : public ::testing::Test {
 protected:
  void SetUp() override {
    RL_REQUIRE_GPU();
    cuda::upload_quant_tables();
  }
};

// W [rows][cols] as the CPU reference dequantises it.
std::vector<float> dequantize_matrix(GgmlType t, const std::vector<uint8_t>& w, int rows, int cols) {
  std::vector<float> out((size_t)rows * cols);
  const size_t rb = row_size(t, cols);
  for (int r = 0; r < rows; r++) dequantize_row(t, w.data() + r * rb, out.data() + (size_t)r * cols, cols);
  return out;
}

// ref [T][rows] = X [T][cols] · Wᵀ, summed in double.
std::vector<double> reference_product(const std::vector<float>& w, int rows, int cols, const float* x, int T) {
  std::vector<double> ref((size_t)T * rows);
  for (int t = 0; t < T; t++)
    for (int r = 0; r < rows; r++) {
      double s = 0;
      const float* wr = w.data() + (size_t)r * cols;
      const float* xt = x + (size_t)t * cols;
      for (int k = 0; k < cols; k++) s += (double)wr[k] * (double)xt[k];
      ref[(size_t)t * rows + r] = s;
    }
  return ref;
}

// SiLU(gate) · up, the SwiGLU input, in double.
std::vector<double> reference_swiglu(const std::vector<double>& gate, const std::vector<double>& up) {
  std::vector<double> act(gate.size());
  for (size_t i = 0; i < act.size(); i++) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  return act;
}

// Σ(y − ref)² / Σref²: NaN when any y is NaN (an unwritten output of a NaN-filled buffer), so the
// bar's comparison fails on it.
double nmse(const std::vector<float>& y, const std::vector<double>& ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    const double d = (double)y[i] - ref[i];
    err += d * d;
    norm += ref[i] * ref[i];
  }
  EXPECT_GT(norm, 0.0);
  return err / norm;
}

// An output of n floats that starts as NaN, with a guard of NaN floats after it that the product
// must leave alone.
class Output {
 public:
  explicit Output(size_t n) : n_(n), buf_((n + kGuard) * sizeof(float)) {
    RL_CUDA_CHECK(cudaMemset(buf_.get(), 0xFF, buf_.bytes()));
  }
  float* f() const { return buf_.f(); }
  std::vector<float> fetch() const {
    auto all = test::to_host<float>(buf_, n_ + kGuard);
    for (size_t i = n_; i < all.size(); i++) {
      uint32_t bits;
      std::memcpy(&bits, &all[i], 4);
      EXPECT_EQ(bits, 0xFFFFFFFFu) << "written past the output's end, at " << i - n_;
    }
    all.resize(n_);
    return all;
  }

 private:
  static constexpr size_t kGuard = 64;
  size_t n_;
  cuda::DeviceBuffer buf_;
};

struct DenseShape {
  int rows, cols, T;
};
// T = 1; 77 tokens (a partial 16-, 32- and 64-token tile) over 130 rows (a 2-row last row tile) and
// an odd number of blocks a row (so MXFP4 rows start at odd addresses, Q5_0 and Q3_K rows at
// addresses that are not 4-byte aligned); a whole 512-token chunk.
std::vector<DenseShape> dense_shapes(GgmlType t) {
  const int odd_cols = quant_type(t).block_size == 256 ? 768 : 800;
  return {{300, 2048, 1}, {130, odd_cols, 77}, {200, 256, 512}};
}

// A dense product's inputs: random weights (seed) and activations (seed + 1) of shape s, the
// product in double on the dequantised weights, and both inputs on the device.
struct DenseCase {
  size_t rb;
  std::vector<uint8_t> w;
  std::vector<float> x;
  std::vector<double> ref;
  cuda::DeviceBuffer dw, dx;
  DenseCase(GgmlType t, const DenseShape& s, uint32_t seed)
      : rb(row_size(t, s.cols)),
        w(test::random_rows(t, s.rows, s.cols, seed)),
        x(test::random_floats((size_t)s.T * s.cols, seed + 1)),
        ref(reference_product(dequantize_matrix(t, w, s.rows, s.cols), s.rows, s.cols, x.data(), s.T)),
        dw(test::to_device(w)),
        dx(test::to_device(x)) {}
};

std::string trace(GgmlType t, const DenseShape& s, int tile) {
  return std::string(type_name(t)) + " rows=" + std::to_string(s.rows) + " cols=" + std::to_string(s.cols) +
         " T=" + std::to_string(s.T) + " tile=" + std::to_string(tile);
}

TEST_F(Bf16Products, DenseWithinTheFastBarForEveryType) {
  for (GgmlType t : test::kWeightTypes) {
    for (const DenseShape& s : dense_shapes(t)) {
      const DenseCase c(t, s, 300 + s.T);
      for (int tile : {0, 16, 64}) {
        SCOPED_TRACE(trace(t, s, tile));
        Output y((size_t)s.T * s.rows);
        cuda::matmul_bf16(t, c.dw.get(), c.rb, s.rows, s.cols, c.dx.f(), s.T, y.f(), nullptr, tile);
        EXPECT_LE(nmse(y.fetch(), c.ref), kMaxNmse);
      }
    }
  }
}

TEST_F(Bf16Products, GateUpWithinTheFastBarForEveryType) {
  for (GgmlType t : test::kWeightTypes) {
    for (const DenseShape& s : dense_shapes(t)) {
      const size_t rb = row_size(t, s.cols);
      const auto gate = test::random_rows(t, s.rows, s.cols, 310 + s.T);
      const auto up = test::random_rows(t, s.rows, s.cols, 311 + s.T);
      const auto x = test::random_floats((size_t)s.T * s.cols, 312 + s.T);
      const auto ref = reference_swiglu(
          reference_product(dequantize_matrix(t, gate, s.rows, s.cols), s.rows, s.cols, x.data(), s.T),
          reference_product(dequantize_matrix(t, up, s.rows, s.cols), s.rows, s.cols, x.data(), s.T));
      auto dg = test::to_device(gate), du = test::to_device(up), dx = test::to_device(x);
      for (int tile : {0, 16, 32}) {
        SCOPED_TRACE(trace(t, s, tile));
        Output act((size_t)s.T * s.rows);
        cuda::matmul_bf16_gate_up(t, dg.get(), du.get(), rb, s.rows, s.cols, dx.f(), s.T, act.f(), nullptr, tile);
        EXPECT_LE(nmse(act.fetch(), ref), kMaxNmse);
      }
    }
  }
}

// Experts in shuffled cache slots, each slot [4096 bytes][gate matrix][up matrix] (the plain
// product reads the gate matrix), and groups of 5, 0, 70 (two 64-token tiles, three 32-token
// ones), 1 and 17 rows of X; 130 rows (a partial row tile), 512 columns.
struct ExpertCase {
  static constexpr int kGroups = 5, kRows = 130, kCols = 512, kPad = 4096;
  static constexpr int kCount[kGroups] = {5, 0, 70, 1, 17};
  static constexpr int kSlotOf[kGroups] = {3, 0, 4, 1, 2};
  GgmlType t;
  size_t rb, mat;
  std::vector<std::vector<uint8_t>> gate, up;
  std::vector<int> off;  // first row of each group
  int total = 0, max_cnt = 0;
  std::vector<float> x;  // [total][kCols]
  cuda::DeviceBuffer pool, ptrs, offcnt, dx;

  explicit ExpertCase(GgmlType type) : t(type), rb(row_size(type, kCols)), mat(rb * kRows) {
    const size_t slot = kPad + 2 * mat;
    std::vector<uint8_t> host(kGroups * slot);
    std::vector<const uint8_t*> p(kGroups);
    for (int g = 0; g < kGroups; g++) {
      gate.push_back(test::random_rows(t, kRows, kCols, 400 + g));
      up.push_back(test::random_rows(t, kRows, kCols, 410 + g));
      std::memcpy(host.data() + kSlotOf[g] * slot + kPad, gate[g].data(), mat);
      std::memcpy(host.data() + kSlotOf[g] * slot + kPad + mat, up[g].data(), mat);
      off.push_back(total);
      total += kCount[g];
      max_cnt = std::max(max_cnt, kCount[g]);
    }
    pool = test::to_device(host);
    for (int g = 0; g < kGroups; g++) p[g] = pool.get<uint8_t>() + kSlotOf[g] * slot;
    ptrs = test::to_device(p);
    std::vector<int> oc = off;
    oc.insert(oc.end(), std::begin(kCount), std::end(kCount));
    offcnt = test::to_device(oc);
    x = test::random_floats((size_t)total * kCols, 420);
    dx = test::to_device(x);
  }
  const uint8_t* const* slots() const { return ptrs.get<const uint8_t*>(); }
  const int* row_off() const { return offcnt.get<int>(); }
  const int* row_cnt() const { return offcnt.get<int>() + kGroups; }
  // ref [total][kRows]: each group's rows of X times its matrix (gate or up).
  std::vector<double> reference(const std::vector<std::vector<uint8_t>>& m) const {
    std::vector<double> ref;
    for (int g = 0; g < kGroups; g++) {
      const auto part = reference_product(dequantize_matrix(t, m[g], kRows, kCols), kRows, kCols,
                                          x.data() + (size_t)off[g] * kCols, kCount[g]);
      ref.insert(ref.end(), part.begin(), part.end());
    }
    return ref;
  }
};

TEST_F(Bf16Products, ExpertsWithinTheFastBarForEveryType) {
  for (GgmlType t : test::kWeightTypes) {
    SCOPED_TRACE(type_name(t));
    const ExpertCase c(t);
    const size_t n = (size_t)c.total * c.kRows;
    Output y(n);
    cuda::matmul_bf16_experts(t, c.slots(), c.kPad, c.rb, c.kRows, c.kCols, c.dx.f(), c.row_off(), c.row_cnt(),
                              c.kGroups, c.max_cnt, y.f(), nullptr);
    EXPECT_LE(nmse(y.fetch(), c.reference(c.gate)), kMaxNmse) << "experts";
    Output act(n);
    cuda::matmul_bf16_experts_gate_up(t, c.slots(), c.kPad, c.kPad + c.mat, c.rb, c.kRows, c.kCols, c.dx.f(),
                                      c.row_off(), c.row_cnt(), c.kGroups, c.max_cnt, act.f(), nullptr);
    EXPECT_LE(nmse(act.fetch(), reference_swiglu(c.reference(c.gate), c.reference(c.up))), kMaxNmse)
        << "experts gate_up";
  }
}

// A NaN activation makes every output of its token NaN and no other (bf16 keeps NaN; an
// accumulation that dropped it, or mixed tokens, would not).
TEST_F(Bf16Products, NanActivationReachesOnlyItsToken) {
  const int rows = 130, T = 20, bad = 3;
  for (GgmlType t : test::kWeightTypes) {
    SCOPED_TRACE(type_name(t));
    const int cols = (int)quant_type(t).block_size == 256 ? 256 : 64;
    const size_t rb = row_size(t, cols);
    auto x = test::random_floats((size_t)T * cols, 500);
    x[(size_t)bad * cols + 5] = std::nanf("");
    auto dg = test::to_device(test::random_rows(t, rows, cols, 501));
    auto du = test::to_device(test::random_rows(t, rows, cols, 502));
    auto dx = test::to_device(x);
    Output y((size_t)T * rows), act((size_t)T * rows);
    cuda::matmul_bf16(t, dg.get(), rb, rows, cols, dx.f(), T, y.f(), nullptr);
    cuda::matmul_bf16_gate_up(t, dg.get(), du.get(), rb, rows, cols, dx.f(), T, act.f(), nullptr);
    for (const auto& out : {y.fetch(), act.fetch()})
      for (int tok = 0; tok < T; tok++)
        for (int r = 0; r < rows; r++)
          ASSERT_EQ(std::isnan(out[(size_t)tok * rows + r]), tok == bad) << "token " << tok << " row " << r;
  }
}

// A split product's scratch of `floats` floats, set to NaN before each product (so a sum that read
// a partial no block wrote is NaN and fails the bar), with a guard after it that must stay NaN.
class Scratch {
 public:
  explicit Scratch(size_t floats) : floats_(floats), buf_((floats + kGuard) * sizeof(float)) {}
  float* reset() {
    RL_CUDA_CHECK(cudaMemset(buf_.get(), 0xFF, buf_.bytes()));
    return buf_.f();
  }
  size_t floats() const { return floats_; }
  void expect_guard_intact() const {
    const auto all = test::to_host<float>(buf_, floats_ + kGuard);
    for (size_t i = floats_; i < all.size(); i++) {
      uint32_t bits;
      std::memcpy(&bits, &all[i], 4);
      ASSERT_EQ(bits, 0xFFFFFFFFu) << "written past the scratch's end, at " << i - floats_;
    }
  }

 private:
  static constexpr size_t kGuard = 64;
  size_t floats_;
  cuda::DeviceBuffer buf_;
};

// Products split over their columns (matmul_bf16 with a scratch): every type within the bar at 2,
// 3 and 8 slices where the columns allow, on one row (a shared gate's 2048 → 1), a partial row tile
// over columns that are not whole slices (768: 3 slices at most; 800, the 32-value types: 3 asked
// give 2, 512 + 288) and a router-like 2048-column matrix; every output written (the outputs start
// as NaN), nothing past them or past the scratch, which holds exactly the slices' partial sums.
TEST_F(Bf16Products, SplitOverColumnsWithinTheFastBarForEveryType) {
  for (GgmlType t : test::kWeightTypes) {
    const int odd_cols = quant_type(t).block_size == 256 ? 768 : 800;
    for (const DenseShape& s : std::vector<DenseShape>{{1, 2048, 77}, {130, odd_cols, 77}, {300, 2048, 200}}) {
      const DenseCase c(t, s, 320 + s.rows);
      for (int slices : {2, 3, 8}) {
        if (slices * 256 > s.cols) continue;
        SCOPED_TRACE(trace(t, s, 64) + " slices=" + std::to_string(slices));
        const int units = (s.cols + 255) / 256, per = (units + slices - 1) / slices;
        Scratch scratch((size_t)((units + per - 1) / per) * s.T * s.rows);
        Output y((size_t)s.T * s.rows);
        cuda::matmul_bf16(t, c.dw.get(), c.rb, s.rows, s.cols, c.dx.f(), s.T, y.f(), nullptr, 0, scratch.reset(),
                          scratch.floats(), slices);
        EXPECT_LE(nmse(y.fetch(), c.ref), kMaxNmse);
        scratch.expect_guard_intact();
      }
    }
  }
}

// The slices matmul_bf16 picks: enough 64-token blocks for two an SM where the grid is small (the
// 80B's shared gate and router on a 512-token pass), bounded by the columns (one a 256) and the
// scratch, none where the grid fills the GPU or the columns are one slice; the product it then
// computes is within the bar and the same bits on every call (the slices are added in order).
TEST_F(Bf16Products, SplitPicksSlicesWhereTheGridIsSmall) {
  const long sms = cuda::device_info().sm_count;
  const size_t big = (size_t)8 << 20;
  // At most 8 (2048 columns: 8 units of 256), else what fills 2·sms blocks from `tiles` 128-row ×
  // 64-token tiles (8 for one row of 512 tokens, 32 for 512 rows); then as many slices as the even
  // width ceil(8 / s) units gives (s = 3: 768, 768 and 512 columns; s = 5: four of 512).
  const auto expect_slices = [&](long tiles) {
    const long s = std::min<long>(8, (2 * sms + tiles - 1) / tiles), per = (8 + s - 1) / s;
    return (int)((8 + per - 1) / per);
  };
  EXPECT_EQ(cuda::matmul_bf16_slices(1, 2048, 512, big), expect_slices(8));
  EXPECT_EQ(cuda::matmul_bf16_slices(512, 2048, 512, big), expect_slices(32));
  EXPECT_EQ(cuda::matmul_bf16_slices(512, 2048, 512, (size_t)3 * 512 * 512), std::min(3, expect_slices(32)));
  EXPECT_EQ(cuda::matmul_bf16_slices(4096, 2048, 2048, big), 1);  // 1024 tiles
  EXPECT_EQ(cuda::matmul_bf16_slices(1, 256, 512, big), 1);       // one slice of columns
  EXPECT_EQ(cuda::matmul_bf16_slices(1, 2048, 512, 512), 1);      // a scratch of one slice

  const GgmlType t = GgmlType::F32;
  const int rows = 1, cols = 2048, T = 512;
  ASSERT_GT(cuda::matmul_bf16_slices(rows, cols, T, big), 1);
  const auto w = test::random_rows(t, rows, cols, 330);
  const auto x = test::random_floats((size_t)T * cols, 331);
  const auto ref = reference_product(dequantize_matrix(t, w, rows, cols), rows, cols, x.data(), T);
  auto dw = test::to_device(w), dx = test::to_device(x);
  Scratch scratch(big);
  Output a((size_t)T * rows), b((size_t)T * rows);
  cuda::matmul_bf16(t, dw.get(), row_size(t, cols), rows, cols, dx.f(), T, a.f(), nullptr, 0, scratch.reset(), big);
  cuda::matmul_bf16(t, dw.get(), row_size(t, cols), rows, cols, dx.f(), T, b.f(), nullptr, 0, scratch.reset(), big);
  scratch.expect_guard_intact();
  const auto ya = a.fetch(), yb = b.fetch();
  EXPECT_LE(nmse(ya, ref), kMaxNmse);
  EXPECT_EQ(std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(float)), 0);
}

// Host only (no GPU needed): bad arguments are refused before any CUDA call, naming what is wrong.
void expect_error(const std::function<void()>& call, const std::string& naming) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one naming \"" << naming << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(naming), std::string::npos) << e.what();
  }
}

TEST(Bf16ProductArguments, BadArgumentsAreRefusedByName) {
  // Addresses are never dereferenced: every call fails its checks first.
  const auto* w = reinterpret_cast<const uint8_t*>(uintptr_t{1} << 20);
  const auto* x = reinterpret_cast<const float*>(uintptr_t{2} << 20);
  auto* y = reinterpret_cast<float*>(uintptr_t{3} << 20);
  const auto* slots = reinterpret_cast<const uint8_t* const*>(uintptr_t{4} << 20);
  const auto* oc = reinterpret_cast<const int*>(uintptr_t{5} << 20);
  const GgmlType q4k = GgmlType::Q4_K;
  const size_t rb = row_size(q4k, 512);
  expect_error([&] { cuda::matmul_bf16(GgmlType::Q8_K, w, 292, 4, 256, x, 2, y, nullptr); }, "weight type q8_K");
  expect_error([&] { cuda::matmul_bf16(GgmlType::F32, w, 4 * 48, 4, 48, x, 2, y, nullptr); }, "48 columns");
  expect_error([&] { cuda::matmul_bf16(q4k, w, 144 * 3, 4, 96 * 3 + 96, x, 2, y, nullptr); }, "block of 256");
  expect_error([&] { cuda::matmul_bf16(q4k, w, rb - 144, 4, 512, x, 2, y, nullptr); }, "bytes apart");
  expect_error([&] { cuda::matmul_bf16(q4k, w, rb + 2, 4, 512, x, 2, y, nullptr); }, "whole blocks");
  expect_error([&] { cuda::matmul_bf16(q4k, w + 2, rb, 4, 512, x, 2, y, nullptr); }, "4-byte aligned");
  expect_error([&] { cuda::matmul_bf16(q4k, w, rb, 4, 512, x + 1, 2, y, nullptr); }, "16-byte aligned");
  expect_error([&] { cuda::matmul_bf16(q4k, w, rb, 4, 512, x, -1, y, nullptr); }, "-1 tokens");
  expect_error([&] { cuda::matmul_bf16(q4k, w, rb, 4, 512, x, 2, y, nullptr, 32); }, "token tile 32");
  expect_error([&] { cuda::matmul_bf16(q4k, w, rb, 4, 512, nullptr, 2, y, nullptr, 16); }, "null");
  // Split products (a scratch of `floats`; no CUDA call before these checks either).
  auto* scratch = reinterpret_cast<float*>(uintptr_t{6} << 20);
  expect_error([&] { cuda::matmul_bf16(q4k, w, rb, 4, 512, x, 2, y, nullptr, 0, nullptr, 0, 2); }, "partial sums");
  expect_error([&] { cuda::matmul_bf16(q4k, w, rb, 4, 512, x, 2, y, nullptr, 0, scratch, 15, 2); },
               "the scratch holds 15 floats");
  expect_error([&] { cuda::matmul_bf16(q4k, w, rb, 4, 512, x, 2, y, nullptr, 0, scratch, 64, 3); }, "3 slices of 512");
  expect_error([&] { cuda::matmul_bf16(q4k, w, rb, 4, 512, x, 2, y, nullptr, 0, scratch, 64, -1); }, "-1 slices");
  expect_error([&] { cuda::matmul_bf16(q4k, w, rb, 4, 512, x, 2, y, nullptr, 16, scratch, 64, 2); }, "64-token tile");
  expect_error([&] { cuda::matmul_bf16_gate_up(q4k, w, w + 2, rb, 4, 512, x, 2, y, nullptr); }, "up weights");
  expect_error([&] { cuda::matmul_bf16_gate_up(q4k, w, w, rb, 4, 512, x, 2, y, nullptr, 64); }, "token tile 64");
  expect_error([&] { cuda::matmul_bf16_experts(q4k, slots, 2, rb, 4, 512, x, oc, oc, 3, 9, y, nullptr); },
               "weight offset 2");
  expect_error([&] { cuda::matmul_bf16_experts(q4k, slots, 0, rb, 4, 512, x, nullptr, oc, 3, 9, y, nullptr); },
               "row offsets");
  expect_error([&] { cuda::matmul_bf16_experts(q4k, slots, 0, rb, 4, 512, x, oc, oc, -1, 9, y, nullptr); },
               "-1 groups");
  expect_error(
      [&] { cuda::matmul_bf16_experts_gate_up(q4k, slots, 0, 6, rb, 4, 512, x, oc, oc, 3, 9, y, nullptr); },
      "up offset 6");
}

}  // namespace
}  // namespace rl
