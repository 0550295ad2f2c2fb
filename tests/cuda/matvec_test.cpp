// matvec / matmul / get_rows against the CPU reference dot products and dequantisation
// (quant/quant.h), for every weight type the backend runs, at several shapes.
#include <cmath>
#include <cstring>
#include <iterator>
#include <vector>

#include "cuda/kernels.h"
#include "common/error.h"
#include "gpu_test_util.h"

namespace rl {
namespace {

using test::random_floats;
using test::random_rows;
using test::to_device;
using test::to_host;

const auto& kTypes = test::kWeightTypes;

struct Shape {
  int rows, cols;
};
const Shape kShapes[] = {{1, 256}, {37, 512}, {300, 2048}, {64, 4096}};
// A row length of an odd number of blocks (25 of 32 values, 3 of 256), so that every other row
// starts at an odd multiple of the block size: MXFP4 (17 bytes) rows at odd addresses, Q5_0 and
// Q3_K rows at addresses that are not 4-byte aligned.
int odd_block_cols(GgmlType t) { return quant_type(t).block_size == 256 ? 768 : 800; }
std::vector<Shape> shapes_of(GgmlType t) {
  std::vector<Shape> v(std::begin(kShapes), std::end(kShapes));
  v.push_back({29, odd_block_cols(t)});
  return v;
}

// Reference dot and the magnitude sum |w_i x_i| that bounds its rounding.
std::pair<double, double> reference_dot(GgmlType t, const uint8_t* row, const float* x, int cols) {
  std::vector<float> w(cols);
  dequantize_row(t, row, w.data(), cols);
  return test::exact_dot(w.data(), x, cols);
}

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::device_available())
      GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped (run it on the GPU host)";
    cuda::upload_quant_tables();
  }
};

TEST_F(CudaKernels, MatvecMatchesCpuForEveryTypeAndShape) {
  for (GgmlType t : kTypes) {
    for (const Shape& s : shapes_of(t)) {
      SCOPED_TRACE(std::string(type_name(t)) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols));
      const size_t rb = row_size(t, s.cols);
      auto w = random_rows(t, s.rows, s.cols, 1000 + s.rows);
      auto x = random_floats(s.cols, 7);
      auto dw = to_device(w);
      auto dx = to_device(x);
      cuda::DeviceBuffer dy(s.rows * sizeof(float));
      cuda::matvec(t, dw.get(), rb, s.rows, s.cols, dx.f(), dy.f(), nullptr);
      auto y = to_host<float>(dy, s.rows);
      for (int r = 0; r < s.rows; r++) {
        auto [ref, mag] = reference_dot(t, w.data() + r * rb, x.data(), s.cols);
        test::expect_close(y[r], ref, mag, 2e-6, "row", r);
        test::expect_fp32_rounding(y[r], ref, mag, "row", r);
        // The table's dot_row (the oracle's own kernel) agrees with the same bound.
        test::expect_close(y[r], dot_row(t, w.data() + r * rb, x.data(), s.cols), mag, 2e-6, "dot_row", r);
      }
    }
  }
}

// n experts' SwiGLU pairs in one device pool: slot e holds gate_e at +0 and up_e at +mat (mat
// bytes each, random rows of seeds gate_seed + e, up_seed + e); the host copies for the reference.
struct ExpertPairs {
  std::vector<std::vector<uint8_t>> gate, up;
  cuda::DeviceBuffer pool, ptrs;  // ptrs: n device pointers to the slots
  ExpertPairs(GgmlType t, int rows, int cols, int n, int gate_seed, int up_seed) {
    const size_t mat = row_size(t, cols) * rows;
    std::vector<uint8_t> host((size_t)n * 2 * mat);
    for (int e = 0; e < n; e++) {
      gate.push_back(random_rows(t, rows, cols, gate_seed + e)), up.push_back(random_rows(t, rows, cols, up_seed + e));
      std::memcpy(host.data() + (size_t)e * 2 * mat, gate[e].data(), mat);
      std::memcpy(host.data() + (size_t)e * 2 * mat + mat, up[e].data(), mat);
    }
    pool = to_device(host);
    std::vector<const uint8_t*> p(n);
    for (int e = 0; e < n; e++) p[e] = pool.get<uint8_t>() + (size_t)e * 2 * mat;
    ptrs = to_device(p);
  }
  const uint8_t* const* slots() { return ptrs.get<const uint8_t*>(); }
};

// Normalised mean squared error Σ(y − ref)² / Σ ref² of outputs against their references.
struct Nmse {
  double err = 0, ref = 0;
  void add(double y, double r) { err += (y - r) * (y - r), ref += r * r; }
  double value() const { return ref > 0 ? err / ref : err; }
};
// The fast tier's bound per product: llama.cpp's backend tests hold quantised products to it. An
// fp32 sum of n products errs by ~sqrt(n) · 2^-24 of their magnitude, so these products land near
// 1e-12; a wrong scale, min or codebook term gives O(1).
constexpr double kFastNmse = 5e-4;

// The fast tier's decode products (fp32 sums): every type and shape, one matrix and a job list of
// two (the router and its neighbour are one launch), and the SwiGLU pair from two expert slots.
TEST_F(CudaKernels, FastMatvecWithinTheTierBoundForEveryTypeAndShape) {
  for (GgmlType t : kTypes) {
    for (const Shape& s : shapes_of(t)) {
      SCOPED_TRACE(std::string(type_name(t)) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols));
      const size_t rb = row_size(t, s.cols);
      auto w = random_rows(t, s.rows, s.cols, 2000 + s.rows);
      auto w2 = random_rows(t, 3, s.cols, 3000 + s.rows);
      auto x = random_floats(s.cols, 17);
      auto dw = to_device(w), dw2 = to_device(w2), dx = to_device(x);
      cuda::DeviceBuffer dy(s.rows * sizeof(float)), dy2(3 * sizeof(float));
      cuda::matvec(t, dw.get(), rb, s.rows, s.cols, dx.f(), dy.f(), nullptr, cuda::Sums::kFast);
      auto y = to_host<float>(dy, s.rows);
      Nmse one;
      for (int r = 0; r < s.rows; r++) one.add(y[r], reference_dot(t, w.data() + r * rb, x.data(), s.cols).first);
      EXPECT_LE(one.value(), kFastNmse);

      cuda::MatvecJob jobs[2];
      jobs[0].w = dw.get<uint8_t>(), jobs[0].row_bytes = rb, jobs[0].rows = s.rows, jobs[0].x = dx.f(),
      jobs[0].y = dy.f();
      jobs[1].w = dw2.get<uint8_t>(), jobs[1].row_bytes = rb, jobs[1].rows = 3, jobs[1].x = dx.f(), jobs[1].y = dy2.f();
      RL_CUDA_CHECK(cudaMemset(dy.get(), 0, s.rows * sizeof(float)));
      cuda::matvec_jobs(t, s.cols, jobs, 2, nullptr, cuda::Sums::kFast);
      y = to_host<float>(dy, s.rows);
      const auto y2 = to_host<float>(dy2, 3);
      Nmse list;
      for (int r = 0; r < s.rows; r++) list.add(y[r], reference_dot(t, w.data() + r * rb, x.data(), s.cols).first);
      for (int r = 0; r < 3; r++) list.add(y2[r], reference_dot(t, w2.data() + r * rb, x.data(), s.cols).first);
      EXPECT_LE(list.value(), kFastNmse);
    }
  }
}

// F32 weights on token columns (matvec_f32_columns: the routers and shared gates of a batched
// step): a job list of a matrix and a one-row neighbour writing one output of rows + 1 a column
// (y_stride), every column within the tier's bound of its double product; a misaligned input is
// refused.
TEST_F(CudaKernels, F32ColumnsWithinTheTierBound) {
  const Shape shapes[] = {{512, 2048}, {37, 260}, {1, 256}};
  for (const Shape& s : shapes) {
    for (int T : {2, 5, 16}) {
      SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.cols) + " on " + std::to_string(T) + " columns");
      const size_t rb = (size_t)s.cols * sizeof(float);
      const auto w = random_floats((size_t)s.rows * s.cols, 40 + s.rows);
      const auto g = random_floats(s.cols, 41);
      const auto x = random_floats((size_t)T * s.cols, 42 + T);
      auto dw = to_device(w), dg = to_device(g), dx = to_device(x);
      const int stride = s.rows + 1;
      cuda::DeviceBuffer dy((size_t)T * stride * sizeof(float));
      RL_CUDA_CHECK(cudaMemset(dy.get(), 0xff, (size_t)T * stride * sizeof(float)));  // NaN where unwritten
      cuda::MatvecJob jobs[2];
      for (cuda::MatvecJob& j : jobs) j.row_bytes = rb, j.x = dx.f(), j.y_stride = stride;
      jobs[0].w = dw.get<uint8_t>(), jobs[0].rows = s.rows, jobs[0].y = dy.f();
      jobs[1].w = dg.get<uint8_t>(), jobs[1].rows = 1, jobs[1].y = dy.f() + s.rows;
      cuda::matvec_f32_columns(s.cols, jobs, 2, T, nullptr);
      const auto y = to_host<float>(dy, (size_t)T * stride);
      for (int c = 0; c < T; c++) {
        Nmse col;
        const float* xc = x.data() + (size_t)c * s.cols;
        for (int r = 0; r < s.rows; r++)
          col.add(y[(size_t)c * stride + r], test::exact_dot(w.data() + (size_t)r * s.cols, xc, s.cols).first);
        col.add(y[(size_t)c * stride + s.rows], test::exact_dot(g.data(), xc, s.cols).first);
        EXPECT_LE(col.value(), kFastNmse) << "column " << c;
      }
      jobs[0].x = dx.f() + 1;  // 4-byte aligned only
      EXPECT_THROW(cuda::matvec_f32_columns(s.cols, jobs, 2, T, nullptr), Error);
    }
  }
}

TEST_F(CudaKernels, FastExpertSwigluWithinTheTierBound) {
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(type_name(t));
    const int rows = 96, cols = 512, n = 3;
    const size_t rb = row_size(t, cols), mat = rb * rows;
    ExpertPairs pairs(t, rows, cols, n, 80, 90);
    const auto &gs = pairs.gate, &us = pairs.up;
    auto x = random_floats(cols, 44);
    auto dx = to_device(x);
    cuda::DeviceBuffer da((size_t)n * rows * 4), du((size_t)n * rows * 4);
    cuda::matvec_experts_gate_up(t, t, pairs.slots(), mat, rb, rb, rows, cols, dx.f(), da.f(), du.f(), n, nullptr,
                                 cuda::Sums::kFast);
    const auto act = to_host<float>(da, (size_t)n * rows);
    Nmse m;
    for (int e = 0; e < n; e++)
      for (int r = 0; r < rows; r++) {
        const double g = reference_dot(t, gs[e].data() + r * rb, x.data(), cols).first;
        const double u = reference_dot(t, us[e].data() + r * rb, x.data(), cols).first;
        m.add(act[(size_t)e * rows + r], g / (1.0 + std::exp(-g)) * u);
      }
    EXPECT_LE(m.value(), kFastNmse);
  }
}

// Every output is the fp32 rounding of the exact sum (exact products, double sums), for every
// type, token counts that leave partial tiles, each token tile the kernel has, with and without
// column splits (0, 0: its own pick; 512 columns in 4 splits are 4 steps each, 2048 in 2 are 32).
TEST_F(CudaKernels, MatmulMatchesCpuForEveryTypeAndTokenCount) {
  const int token_counts[] = {2, 17, 64, 130};
  for (GgmlType t : kTypes) {
    for (int T : token_counts) {
      const Shape s = T == 17 ? Shape{300, 2048} : T == 2 ? Shape{70, odd_block_cols(t)} : Shape{70, 512};
      const size_t rb = row_size(t, s.cols);
      auto w = random_rows(t, s.rows, s.cols, 77 + T);
      auto x = random_floats((size_t)T * s.cols, 8 + T);
      auto dw = to_device(w);
      auto dx = to_device(x);
      for (auto [tile, splits] : {std::pair{0, 0}, {16, 1}, {32, 1}, {64, 1}, {16, 4}, {64, 2}}) {
        SCOPED_TRACE(std::string(type_name(t)) + " T=" + std::to_string(T) + " tile=" + std::to_string(tile) +
                     " splits=" + std::to_string(splits));
        cuda::DeviceBuffer dy((size_t)T * s.rows * sizeof(float));
        cuda::matmul(t, dw.get(), rb, s.rows, s.cols, dx.f(), T, dy.f(), nullptr, tile, splits);
        auto y = to_host<float>(dy, (size_t)T * s.rows);
        for (int tok = 0; tok < T; tok++)
          for (int r = 0; r < s.rows; r++) {
            auto [ref, mag] = reference_dot(t, w.data() + r * rb, x.data() + (size_t)tok * s.cols, s.cols);
            test::expect_fp32_rounding(y[(size_t)tok * s.rows + r], ref, mag, "out", tok * s.rows + r);
          }
      }
    }
  }
}

// Column splits that do not divide the steps (types with 32-value blocks only: 288 columns are
// 9 steps, in splits of 3, 3, 3, 0 and 5, 4): still the fp32 rounding of the exact sum.
TEST_F(CudaKernels, MatmulUnevenColumnSplits) {
  for (GgmlType t : {GgmlType::F32, GgmlType::Q8_0}) {
    const int rows = 40, cols = 288, T = 21;
    const size_t rb = row_size(t, cols);
    auto w = random_rows(t, rows, cols, 90);
    auto x = random_floats((size_t)T * cols, 91);
    auto dw = to_device(w), dx = to_device(x);
    for (int splits : {2, 4}) {
      SCOPED_TRACE(std::string(type_name(t)) + " splits=" + std::to_string(splits));
      cuda::DeviceBuffer dy((size_t)T * rows * sizeof(float));
      cuda::matmul(t, dw.get(), rb, rows, cols, dx.f(), T, dy.f(), nullptr, 16, splits);
      auto y = to_host<float>(dy, (size_t)T * rows);
      for (int tok = 0; tok < T; tok++)
        for (int r = 0; r < rows; r++) {
          auto [ref, mag] = reference_dot(t, w.data() + r * rb, x.data() + (size_t)tok * cols, cols);
          test::expect_fp32_rounding(y[(size_t)tok * rows + r], ref, mag, "out", tok * rows + r);
        }
    }
  }
}

// Experts addressed through slot pointers: three experts in shuffled slots, uneven token groups.
TEST_F(CudaKernels, ExpertProductsReadSlotsThroughPointers) {
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(type_name(t));
    const int rows = 96, cols = 512, n = 3;
    const size_t rb = row_size(t, cols), mat = rb * rows, offset = 4096;  // matrix at +offset
    std::vector<std::vector<uint8_t>> ws;
    std::vector<uint8_t> pool(4 * (mat + offset));
    const int slot_of[n] = {2, 0, 3};
    for (int e = 0; e < n; e++) {
      ws.push_back(random_rows(t, rows, cols, 500 + e));
      std::memcpy(pool.data() + slot_of[e] * (mat + offset) + offset, ws[e].data(), mat);
    }
    auto dpool = to_device(pool);
    std::vector<const uint8_t*> ptrs(n);
    for (int e = 0; e < n; e++) ptrs[e] = dpool.get<uint8_t>() + slot_of[e] * (mat + offset);
    auto dptrs = to_device(ptrs);

    // Decode form: one shared input, then per-expert inputs.
    auto x = random_floats((size_t)n * cols, 3);
    auto dx = to_device(x);
    cuda::DeviceBuffer dy((size_t)n * rows * sizeof(float));
    for (size_t stride : {(size_t)0, (size_t)cols}) {
      cuda::matvec_experts(t, dptrs.get<const uint8_t*>(), offset, rb, rows, cols, dx.f(), stride, dy.f(), n, nullptr);
      auto y = to_host<float>(dy, (size_t)n * rows);
      for (int e = 0; e < n; e++)
        for (int r = 0; r < rows; r++) {
          auto [ref, mag] = reference_dot(t, ws[e].data() + r * rb, x.data() + e * stride, cols);
          test::expect_fp32_rounding(y[(size_t)e * rows + r], ref, mag, "matvec_experts", e * rows + r);
        }
    }

    // Prefill form: groups of 5, 1 and 19 gathered rows.
    const std::vector<int> cnt = {5, 1, 19}, off = {0, 5, 6};
    const int total = 25;
    auto xs = random_floats((size_t)total * cols, 4);
    auto dxs = to_device(xs);
    std::vector<int> offcnt = off;
    offcnt.insert(offcnt.end(), cnt.begin(), cnt.end());
    auto doc = to_device(offcnt);
    cuda::DeviceBuffer dys((size_t)total * rows * sizeof(float));
    cuda::matmul_experts(t, dptrs.get<const uint8_t*>(), offset, rb, rows, cols, dxs.f(), doc.get<int>(),
                         doc.get<int>() + n, n, 19, dys.f(), nullptr);
    auto ys = to_host<float>(dys, (size_t)total * rows);
    for (int e = 0; e < n; e++)
      for (int i = 0; i < cnt[e]; i++)
        for (int r = 0; r < rows; r++) {
          const int row = off[e] + i;
          auto [ref, mag] = reference_dot(t, ws[e].data() + r * rb, xs.data() + (size_t)row * cols, cols);
          test::expect_fp32_rounding(ys[(size_t)row * rows + r], ref, mag, "matmul_experts", row * rows + r);
        }
  }
}

// The fused SwiGLU pair gives bit for bit the two products (same token tile) and swiglu: dense,
// and for experts whose gate and up sit in one slot; rows not a multiple of the kernel's 64.
TEST_F(CudaKernels, GateUpProductsEqualTwoProductsAndSwiglu) {
  for (GgmlType t : kTypes) {
    const int rows = 70, cols = 512, n = 3;
    const size_t rb = row_size(t, cols), mat = rb * rows;
    for (int T : {5, 37}) {
      SCOPED_TRACE(std::string(type_name(t)) + " T=" + std::to_string(T));
      auto gate = random_rows(t, rows, cols, 40 + T), up = random_rows(t, rows, cols, 41 + T);
      auto x = random_floats((size_t)T * cols, 42 + T);
      auto dg = to_device(gate), du = to_device(up), dx = to_device(x);
      cuda::DeviceBuffer da((size_t)T * rows * 4), db((size_t)T * rows * 4), dc((size_t)T * rows * 4);
      cuda::matmul_gate_up(t, dg.get(), du.get(), rb, rows, cols, dx.f(), T, da.f(), nullptr);
      cuda::matmul(t, dg.get(), rb, rows, cols, dx.f(), T, db.f(), nullptr, 16, 1);
      cuda::matmul(t, du.get(), rb, rows, cols, dx.f(), T, dc.f(), nullptr, 16, 1);
      cuda::swiglu(db.f(), dc.f(), db.f(), (size_t)T * rows, nullptr);
      const auto fused = to_host<float>(da, (size_t)T * rows), two = to_host<float>(db, (size_t)T * rows);
      for (size_t i = 0; i < fused.size(); i++) ASSERT_EQ(fused[i], two[i]) << "dense, value " << i;

      // Experts: slot e holds gate_e at +0 and up_e at +mat; groups of T tokens each.
      ExpertPairs pairs(t, rows, cols, n, 60, 70);
      std::vector<int> offcnt;
      for (int e = 0; e < n; e++) offcnt.push_back(e * T);
      for (int e = 0; e < n; e++) offcnt.push_back(T);
      auto doc = to_device(offcnt);
      auto xe = random_floats((size_t)n * T * cols, 43 + T);
      auto dxe = to_device(xe);
      const size_t out = (size_t)n * T * rows;
      cuda::DeviceBuffer ea(out * 4), eb(out * 4), ec(out * 4);
      const auto* p = pairs.slots();
      const int* oc = doc.get<int>();
      cuda::matmul_experts_gate_up(t, p, 0, mat, rb, rows, cols, dxe.f(), oc, oc + n, n, T, ea.f(), nullptr);
      cuda::matmul_experts(t, p, 0, rb, rows, cols, dxe.f(), oc, oc + n, n, T, eb.f(), nullptr);
      cuda::matmul_experts(t, p, mat, rb, rows, cols, dxe.f(), oc, oc + n, n, T, ec.f(), nullptr);
      cuda::swiglu(eb.f(), ec.f(), eb.f(), out, nullptr);
      const auto efused = to_host<float>(ea, out), etwo = to_host<float>(eb, out);
      for (size_t i = 0; i < out; i++) ASSERT_EQ(efused[i], etwo[i]) << "experts, value " << i;
    }
  }
}

TEST_F(CudaKernels, GetRowsMatchesReferenceDequantisation) {
  for (GgmlType t : kTypes) {
    for (int cols : {256, 2048, odd_block_cols(t)}) {
      SCOPED_TRACE(std::string(type_name(t)) + " cols=" + std::to_string(cols));
      const int rows = 40;
      const size_t rb = row_size(t, cols);
      auto w = random_rows(t, rows, cols, 900 + cols);
      const std::vector<int32_t> ids = {3, 0, 39, 3, 17};
      auto dw = to_device(w);
      auto di = to_device(ids);
      cuda::DeviceBuffer dout(ids.size() * cols * sizeof(float));
      cuda::get_rows(t, dw.get(), rb, cols, di.get<int32_t>(), (int)ids.size(), dout.f(), nullptr);
      auto out = to_host<float>(dout, ids.size() * cols);
      std::vector<float> ref(cols);
      for (size_t i = 0; i < ids.size(); i++) {
        dequantize_row(t, w.data() + ids[i] * rb, ref.data(), cols);
        // Bit for bit: the same float operations in the same order as the CPU reference.
        for (int c = 0; c < cols; c++) {
          uint32_t got, want;
          std::memcpy(&got, &out[i * cols + c], 4);
          std::memcpy(&want, &ref[c], 4);
          ASSERT_EQ(got, want) << "row " << i << " col " << c << ": " << out[i * cols + c] << " vs " << ref[c];
        }
      }
    }
  }
}

TEST_F(CudaKernels, RejectsUnsupportedTypesAndShapes) {
  cuda::DeviceBuffer d(1024);
  EXPECT_THROW(cuda::matvec(GgmlType::Q8_K, d.get(), 292, 1, 256, d.f(), d.f(), nullptr), Error);
  EXPECT_THROW(cuda::matvec(static_cast<GgmlType>(9999), d.get(), 110, 1, 256, d.f(), d.f(), nullptr), Error);
  EXPECT_THROW(cuda::matvec(GgmlType::F32, d.get(), 4 * 20, 1, 20, d.f(), d.f(), nullptr), Error);
}

// Host only (no GPU needed): the backend takes exactly the types the CPU reference can
// dequantise, the 23 of kTypes, and refuses the storage types and ids that are no type.
TEST(CudaWeightTypes, EveryTypeWithAFloatViewIsSupported) {
  int supported = 0;
  for (uint32_t id = 0; id < 64; id++) {
    const QuantType* q = find_quant_type(id);
    const bool want = q != nullptr && q->dequantize_row != nullptr;
    EXPECT_EQ(cuda::weight_type_supported(static_cast<GgmlType>(id)), want) << "type id " << id;
    supported += want;
  }
  EXPECT_EQ(supported, 23);
  for (GgmlType t : kTypes) EXPECT_TRUE(cuda::weight_type_supported(t)) << type_name(t);
  for (GgmlType t : {GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::TQ1_0, GgmlType::I32, static_cast<GgmlType>(9999)})
    EXPECT_FALSE(cuda::weight_type_supported(t)) << static_cast<uint32_t>(t);
}

}  // namespace
}  // namespace rl
