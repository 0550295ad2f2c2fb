// The fast tier's decode products on 8-bit activations (matvec_q8.cu): quantize_q8 against its
// definition computed here, and every covered type's products at the 80B's shapes against the CPU
// reference, products in double on the dequantised weights and the fp32 activations (so the bound
// covers the activations' quantisation too).
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/kernels.h"
#include "cuda/plan.h"
#include "cuda/q6k_fragments.h"
#include "gpu_test_util.h"

namespace rl {
namespace {

using test::random_floats;
using test::random_rows;
using test::to_device;
using test::to_host;

const GgmlType kQ8Types[] = {GgmlType::Q4_K,    GgmlType::Q5_K,   GgmlType::Q6_K, GgmlType::Q8_0,
                             GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ1_M};

// The Q8 form by its definition (kernels.h, quantize_q8): per 32 values d = max|x| / 127, q =
// x / d rounded to nearest even (0 when d is 0), s = d · Σq, each in fp32; a block holding a NaN
// or an infinity: d = s = NaN, q = 0.
struct Q8Host {
  std::vector<int8_t> q;
  std::vector<float> d, s;
};
Q8Host quantize_q8_reference(const std::vector<float>& x) {
  Q8Host r;
  r.q.resize(x.size());
  for (size_t b = 0; b < x.size() / 32; b++) {
    float amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < 32; i++) {
      amax = std::max(amax, std::fabs(x[32 * b + i]));
      finite = finite && std::isfinite(x[32 * b + i]);
    }
    const float d = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    int sum = 0;
    for (int i = 0; i < 32; i++) {
      const int q = finite && d > 0.0f ? (int)std::nearbyint(x[32 * b + i] / d) : 0;
      r.q[32 * b + i] = (int8_t)q;
      sum += q;
    }
    r.d.push_back(d);
    r.s.push_back(d * (float)sum);
  }
  return r;
}

// The bits of a value, every NaN as one (the kernel's NaN need not be the CPU's).
uint32_t bits(float f) {
  if (std::isnan(f)) return 0x7fc00000u;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// x's Q8 form on the device.
struct Q8Device {
  cuda::DeviceBuffer q, ds;
  Q8Device(const cuda::DeviceBuffer& x, int rows, int cols)
      : q((size_t)rows * cols), ds((size_t)rows * cols / 32 * sizeof(float2)) {
    cuda::quantize_q8(x.f(), rows, cols, q.get<int8_t>(), ds.get<float2>(), nullptr);
  }
  const int8_t* values(size_t offset = 0) const { return q.get<int8_t>() + offset; }
  const float2* scales(size_t offset = 0) const { return ds.get<float2>() + offset; }
};

// Normalised mean squared error Σ(y − ref)² / Σ ref².
struct Nmse {
  double err = 0, ref = 0;
  void add(double y, double r) { err += (y - r) * (y - r), ref += r * r; }
  double value() const { return ref > 0 ? err / ref : err; }
};
// The fast tier's bound per product (DESIGN.md §5a; llama.cpp's backend tests hold quantised
// products to it). 8-bit activations err by ~1/254 of their block's largest value, an NMSE near
// 3e-5 on these inputs; a wrong scale, min, sign or codebook term gives O(1).
constexpr double kMaxNmse = 5e-4;

double reference_dot(GgmlType t, const uint8_t* row, const float* x, int cols) {
  std::vector<float> w(cols);
  dequantize_row(t, row, w.data(), cols);
  return test::exact_dot(w.data(), x, cols).first;
}

// SiLU(gate · x) * (up · x) from the reference products.
double swiglu_reference(GgmlType tg, const uint8_t* gate, GgmlType tu, const uint8_t* up, const float* x, int cols) {
  const double g = reference_dot(tg, gate, x, cols), u = reference_dot(tu, up, x, cols);
  return g / (1.0 + std::exp(-g)) * u;
}

class CudaQ8 : public ::testing::Test {
 protected:
  void SetUp() override {
    RL_REQUIRE_GPU();
    cuda::upload_quant_tables();
  }
};

TEST_F(CudaQ8, QuantizationMatchesItsDefinition) {
  // Random rows at three shapes, then hand-made blocks: all zeros; a largest value of 127 (d = 1)
  // with ties k + 0.5, which round to even; one value; negative largest; a NaN; an infinity.
  std::vector<float> special(6 * 32, 0.0f);
  special[32] = 127.0f;
  const float ties[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -3.5f};
  for (int i = 0; i < 8; i++) special[33 + i] = ties[i];
  special[64 + 7] = 1e-3f;
  for (int i = 0; i < 32; i++) special[96 + i] = -0.25f * (float)i, special[128 + i] = special[160 + i] = 1.0f;
  special[128 + 5] = std::numeric_limits<float>::quiet_NaN();
  special[160 + 31] = -std::numeric_limits<float>::infinity();
  struct Case {
    int rows, cols;
    std::vector<float> x;
  };
  std::vector<Case> cases = {{1, 2048, random_floats(2048, 1)},
                             {10, 512, random_floats(10 * 512, 2, 0.1f)},
                             {3, 4096, random_floats(3 * 4096, 3, 4.0f)},
                             {1, 192, special}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols));
    auto dx = to_device(c.x);
    Q8Device q8(dx, c.rows, c.cols);
    const auto q = to_host<int8_t>(q8.q, c.x.size());
    const auto ds = to_host<float2>(q8.ds, c.x.size() / 32);
    const Q8Host ref = quantize_q8_reference(c.x);
    for (size_t i = 0; i < c.x.size(); i++) ASSERT_EQ(q[i], ref.q[i]) << "value " << i << " = " << c.x[i];
    for (size_t b = 0; b < ds.size(); b++) {
      ASSERT_EQ(bits(ds[b].x), bits(ref.d[b])) << "block " << b << " scale " << ds[b].x << " vs " << ref.d[b];
      ASSERT_EQ(bits(ds[b].y), bits(ref.s[b])) << "block " << b << " sum " << ds[b].y << " vs " << ref.s[b];
    }
  }
  // The tie block, spelled out: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 126.5 -> 126, -3.5 -> -4.
  const Q8Host ref = quantize_q8_reference(special);
  EXPECT_EQ(ref.q[33], 0);
  EXPECT_EQ(ref.q[34], 2);
  EXPECT_EQ(ref.q[35], 2);
  EXPECT_EQ(ref.q[39], 126);
  EXPECT_EQ(ref.q[40], -4);
  EXPECT_TRUE(std::isnan(ref.d[4]) && std::isnan(ref.d[5]) && std::isfinite(ref.d[3]));
}

// A NaN activation makes every product of its input NaN, and only those (the Q8 form's NaN scale).
TEST_F(CudaQ8, NanActivationsPropagate) {
  const int rows = 20, cols = 512;
  for (GgmlType t : kQ8Types) {
    SCOPED_TRACE(type_name(t));
    auto w = random_rows(t, rows, cols, 31);
    auto x = random_floats(2 * cols, 32);
    x[cols + 300] = std::numeric_limits<float>::quiet_NaN();  // in the second input only
    auto dw = to_device(w), dx = to_device(x);
    Q8Device q8(dx, 2, cols);
    cuda::DeviceBuffer dy(2 * rows * sizeof(float));
    cuda::MatvecJob jobs[2];
    for (int i = 0; i < 2; i++) {
      jobs[i].w = dw.get<uint8_t>(), jobs[i].row_bytes = row_size(t, cols), jobs[i].rows = rows;
      jobs[i].xq = q8.values((size_t)i * cols), jobs[i].xds = q8.scales((size_t)i * cols / 32);
      jobs[i].y = dy.f() + i * rows;
    }
    cuda::matvec_q8_jobs(t, cols, jobs, 2, nullptr);
    const auto y = to_host<float>(dy, 2 * rows);
    for (int r = 0; r < rows; r++) {
      EXPECT_TRUE(std::isfinite(y[r])) << "row " << r;
      EXPECT_TRUE(std::isnan(y[rows + r])) << "row " << r;
    }
  }
}

// Dense products as project_group launches them: one job list of two matrices on one input
// (the 80B's ssm_in pair 2048 -> 8192 + 4096), one matrix 4096 -> 2048, and 37 rows of 256
// columns (rows of 4 or 8 units: the lane groups of 8, a partial block of rows).
TEST_F(CudaQ8, DenseProductsWithinTheTierBound) {
  struct Shape {
    int cols;
    std::vector<int> rows;
  };
  const Shape shapes[] = {{2048, {8192, 4096}}, {4096, {2048}}, {256, {37}}};
  for (GgmlType t : kQ8Types) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(std::string(type_name(t)) + " cols " + std::to_string(s.cols) + " jobs " +
                   std::to_string(s.rows.size()));
      const size_t rb = row_size(t, s.cols);
      auto x = random_floats(s.cols, 5 + s.cols);
      auto dx = to_device(x);
      Q8Device q8(dx, 1, s.cols);
      std::vector<std::vector<uint8_t>> w;
      std::vector<cuda::DeviceBuffer> dw, dy;
      std::vector<cuda::MatvecJob> jobs;
      for (size_t i = 0; i < s.rows.size(); i++) {
        w.push_back(random_rows(t, s.rows[i], s.cols, 100 + (uint32_t)i + s.cols));
        dw.push_back(to_device(w.back()));
        dy.emplace_back((size_t)s.rows[i] * sizeof(float));
        cuda::MatvecJob j;
        j.w = dw.back().get<uint8_t>(), j.row_bytes = rb, j.rows = s.rows[i], j.y = dy.back().f();
        j.xq = q8.values(), j.xds = q8.scales();
        jobs.push_back(j);
      }
      cuda::matvec_q8_jobs(t, s.cols, jobs.data(), (int)jobs.size(), nullptr);
      for (size_t i = 0; i < s.rows.size(); i++) {
        const auto y = to_host<float>(dy[i], s.rows[i]);
        Nmse m;
        for (int r = 0; r < s.rows[i]; r++) m.add(y[r], reference_dot(t, w[i].data() + r * rb, x.data(), s.cols));
        EXPECT_LE(m.value(), kMaxNmse) << "job " << i;
      }
    }
  }
}

// n experts' matrices in slots: slot e holds matrix e of each list at its offset (the cache's
// layout: gate, up, down), reached through a device array of slot pointers in shuffled order.
struct ExpertSlots {
  std::vector<std::vector<std::vector<uint8_t>>> mats;  // [list][expert] host bytes
  std::vector<size_t> offsets;                          // per list, within a slot
  cuda::DeviceBuffer pool, ptrs;
  ExpertSlots(const std::vector<std::pair<GgmlType, std::pair<int, int>>>& lists, int n) {
    // (7e + 3) mod n below is a permutation only when 7 and n are coprime.
    if (std::gcd(7, n) != 1) throw std::invalid_argument("ExpertSlots: " + std::to_string(n) + " experts, a multiple of 7");
    size_t slot = 0;
    for (auto& [t, shape] : lists) {  // 256-byte aligned matrices, as the cache's slots hold them
      offsets.push_back(slot);
      slot += (row_size(t, shape.second) * shape.first + 255) / 256 * 256;
    }
    std::vector<uint8_t> host(slot * n);
    mats.resize(lists.size());
    for (size_t l = 0; l < lists.size(); l++)
      for (int e = 0; e < n; e++) {
        const auto& [t, shape] = lists[l];
        mats[l].push_back(random_rows(t, shape.first, shape.second, 300 + 17 * (uint32_t)l + e));
        const int at = (e * 7 + 3) % n;  // expert e in slot `at`
        std::memcpy(host.data() + at * slot + offsets[l], mats[l][e].data(), mats[l][e].size());
      }
    pool = to_device(host);
    std::vector<const uint8_t*> p(n);
    for (int e = 0; e < n; e++) p[e] = pool.get<uint8_t>() + ((e * 7 + 3) % n) * slot;
    ptrs = to_device(p);
  }
  const uint8_t* const* slots() const { return ptrs.get<const uint8_t*>(); }
};

// The ten routed experts of a decode token at the 80B's shapes, through slot pointers: gate/up
// pairs 2048 -> 512 with SwiGLU (one launch), and down 512 -> 2048 on each expert's own input
// row and on one shared input. And the shared expert's pair from direct pointers.
TEST_F(CudaQ8, ExpertProductsWithinTheTierBound) {
  const int n = 10, n_embd = 2048, ff = 512;
  for (GgmlType t : kQ8Types) {
    SCOPED_TRACE(type_name(t));
    const size_t rb_gu = row_size(t, n_embd), rb_d = row_size(t, ff);
    ExpertSlots slots({{t, {ff, n_embd}}, {t, {ff, n_embd}}, {t, {n_embd, ff}}}, n);
    auto x = random_floats(n_embd, 21);
    auto dx = to_device(x);
    Q8Device q8(dx, 1, n_embd);
    cuda::DeviceBuffer da((size_t)n * ff * 4), du((size_t)n * ff * 4);
    cuda::matvec_q8_experts_gate_up(t, t, slots.slots(), slots.offsets[1] - slots.offsets[0], rb_gu, rb_gu, ff, n_embd,
                                    q8.values(), q8.scales(), da.f(), du.f(), n, nullptr);
    const auto act = to_host<float>(da, (size_t)n * ff);
    Nmse gu;
    for (int e = 0; e < n; e++)
      for (int r = 0; r < ff; r++)
        gu.add(act[(size_t)e * ff + r], swiglu_reference(t, slots.mats[0][e].data() + r * rb_gu, t,
                                                         slots.mats[1][e].data() + r * rb_gu, x.data(), n_embd));
    EXPECT_LE(gu.value(), kMaxNmse) << "gate/up";

    auto xd = random_floats((size_t)n * ff, 22);
    auto dxd = to_device(xd);
    Q8Device q8d(dxd, n, ff);
    cuda::DeviceBuffer dy((size_t)n * n_embd * 4);
    for (int per_expert : {1, 0}) {
      cuda::matvec_q8_experts(t, slots.slots(), slots.offsets[2], rb_d, n_embd, ff, q8d.values(), q8d.scales(),
                              per_expert, dy.f(), n, nullptr);
      const auto y = to_host<float>(dy, (size_t)n * n_embd);
      Nmse down;
      for (int e = 0; e < n; e++)
        for (int r = 0; r < n_embd; r++)
          down.add(y[(size_t)e * n_embd + r],
                   reference_dot(t, slots.mats[2][e].data() + r * rb_d, xd.data() + per_expert * e * ff, ff));
      EXPECT_LE(down.value(), kMaxNmse) << "down, input rows per expert " << per_expert;
    }

    // The shared expert's pair (matvec_q8_gate_up, direct pointers).
    auto dg = to_device(slots.mats[0][0]), dup = to_device(slots.mats[1][0]);
    cuda::GateUpJob j;
    j.gate = dg.get<uint8_t>(), j.up = dup.get<uint8_t>(), j.row_bytes_gate = j.row_bytes_up = rb_gu, j.rows = ff;
    j.xq = q8.values(), j.xds = q8.scales(), j.act = da.f();
    cuda::matvec_q8_gate_up(t, n_embd, &j, 1, nullptr);
    const auto sh = to_host<float>(da, ff);
    Nmse shared;
    for (int r = 0; r < ff; r++)
      shared.add(sh[r], swiglu_reference(t, slots.mats[0][0].data() + r * rb_gu, t, slots.mats[1][0].data() + r * rb_gu,
                                         x.data(), n_embd));
    EXPECT_LE(shared.value(), kMaxNmse) << "shared pair";
  }
}

// A pair of two types (the seed-mix's IQ1_M gate with an IQ2_XXS up): two launches and a swiglu.
TEST_F(CudaQ8, ExpertPairOfTwoTypes) {
  const int n = 10, n_embd = 2048, ff = 512;
  const GgmlType tg = GgmlType::IQ1_M, tu = GgmlType::IQ2_XXS;
  const size_t rbg = row_size(tg, n_embd), rbu = row_size(tu, n_embd);
  ExpertSlots slots({{tg, {ff, n_embd}}, {tu, {ff, n_embd}}}, n);
  auto x = random_floats(n_embd, 23);
  auto dx = to_device(x);
  Q8Device q8(dx, 1, n_embd);
  cuda::DeviceBuffer da((size_t)n * ff * 4), du((size_t)n * ff * 4);
  cuda::matvec_q8_experts_gate_up(tg, tu, slots.slots(), slots.offsets[1], rbg, rbu, ff, n_embd, q8.values(),
                                  q8.scales(), da.f(), du.f(), n, nullptr);
  const auto act = to_host<float>(da, (size_t)n * ff);
  Nmse m;
  for (int e = 0; e < n; e++)
    for (int r = 0; r < ff; r++)
      m.add(act[(size_t)e * ff + r], swiglu_reference(tg, slots.mats[0][e].data() + r * rbg, tu,
                                                      slots.mats[1][e].data() + r * rbu, x.data(), n_embd));
  EXPECT_LE(m.value(), kMaxNmse);
}

// A short pass's (token, selection) pairs (Products::expert_pairs): every expert on its own Q8
// input row (experts_per_row 1), or on row e / 3 (experts_per_row 3: three pairs a token), equals
// that expert alone on that row bit for bit, for a pair of one type (one launch) and of two (two
// launches and a swiglu), and so does each down product on its pair's row; an expert on another
// expert's row differs. The pairs are more than one launch's job list holds (one launch of jobs
// derived from the first). And pair_slots gives each selection its expert's slot.
TEST_F(CudaQ8, ExpertPairsReadTheirOwnInputRows) {
  const int n = cuda::kMaxMatvecJobs + 5, n_embd = 2048, ff = 512;
  for (auto [tg, tu] : {std::pair{GgmlType::IQ2_XS, GgmlType::IQ2_XS}, std::pair{GgmlType::IQ1_M, GgmlType::IQ2_XXS}}) {
    SCOPED_TRACE(std::string(type_name(tg)) + "/" + type_name(tu));
    const size_t rbg = row_size(tg, n_embd), rbu = row_size(tu, n_embd);
    ExpertSlots slots({{tg, {ff, n_embd}}, {tu, {ff, n_embd}}, {tu, {n_embd, ff}}}, n);
    auto dx = to_device(random_floats((size_t)n * n_embd, 31));
    Q8Device q8(dx, n, n_embd);
    cuda::DeviceBuffer da((size_t)n * ff * 4), du((size_t)n * ff * 4), d1(ff * 4), du1(ff * 4);
    cuda::matvec_q8_experts_gate_up(tg, tu, slots.slots(), slots.offsets[1], rbg, rbu, ff, n_embd, q8.values(),
                                    q8.scales(), da.f(), du.f(), n, nullptr, 1);
    const auto act = to_host<float>(da, (size_t)n * ff);
    for (int e = 0; e < n; e++) {
      cuda::matvec_q8_experts_gate_up(tg, tu, slots.slots() + e, slots.offsets[1], rbg, rbu, ff, n_embd,
                                      q8.values((size_t)e * n_embd), q8.scales((size_t)e * n_embd / 32), d1.f(),
                                      du1.f(), 1, nullptr);
      const auto one = to_host<float>(d1, ff);
      ASSERT_TRUE(std::equal(one.begin(), one.end(), act.begin() + (size_t)e * ff)) << "expert " << e;
    }
    // The first expert on the second expert's row: not what it gave on its own row.
    cuda::matvec_q8_experts_gate_up(tg, tu, slots.slots(), slots.offsets[1], rbg, rbu, ff, n_embd,
                                    q8.values(n_embd), q8.scales(n_embd / 32), d1.f(), du1.f(), 1, nullptr);
    const auto other = to_host<float>(d1, ff);
    EXPECT_FALSE(std::equal(other.begin(), other.end(), act.begin())) << "expert 0 on row 1";
    cuda::matvec_q8_experts_gate_up(tg, tu, slots.slots(), slots.offsets[1], rbg, rbu, ff, n_embd, q8.values(),
                                    q8.scales(), da.f(), du.f(), n, nullptr, 3);
    const auto act3 = to_host<float>(da, (size_t)n * ff);
    for (int e = 0; e < n; e++) {
      const size_t row = (size_t)e / 3;
      cuda::matvec_q8_experts_gate_up(tg, tu, slots.slots() + e, slots.offsets[1], rbg, rbu, ff, n_embd,
                                      q8.values(row * n_embd), q8.scales(row * n_embd / 32), d1.f(), du1.f(), 1,
                                      nullptr);
      const auto one = to_host<float>(d1, ff);
      ASSERT_TRUE(std::equal(one.begin(), one.end(), act3.begin() + (size_t)e * ff)) << "expert " << e << " on row " << row;
    }
    // The down products, pair e on row e of the pairs' outputs.
    auto dd = to_device(random_floats((size_t)n * ff, 32));
    Q8Device q8d(dd, n, ff);
    const size_t rbd = row_size(tu, ff);
    cuda::DeviceBuffer dy((size_t)n * n_embd * 4), dy1(n_embd * 4);
    cuda::matvec_q8_experts(tu, slots.slots(), slots.offsets[2], rbd, n_embd, ff, q8d.values(), q8d.scales(), 1, dy.f(),
                            n, nullptr);
    const auto y = to_host<float>(dy, (size_t)n * n_embd);
    for (int e = 0; e < n; e++) {
      cuda::matvec_q8_experts(tu, slots.slots() + e, slots.offsets[2], rbd, n_embd, ff, q8d.values((size_t)e * ff),
                              q8d.scales((size_t)e * ff / 32), 1, dy1.f(), 1, nullptr);
      const auto one = to_host<float>(dy1, n_embd);
      ASSERT_TRUE(std::equal(one.begin(), one.end(), y.begin() + (size_t)e * n_embd)) << "down of expert " << e;
    }
  }
  // pair_slots: residency of 8 experts, 3 of them not resident (their selections get the fallback).
  std::vector<uint64_t> residency(8, 0);
  for (int x : {0, 2, 3, 5, 7}) residency[x] = 0x1000 + 0x100 * x;
  const std::vector<int32_t> ids = {7, 2, 4, 0, 5, 1, 3, 6, 2};
  auto dres = to_device(residency), dids = to_device(ids);
  cuda::DeviceBuffer dptrs(ids.size() * sizeof(void*)), dn(4);
  const auto* fallback = reinterpret_cast<const uint8_t*>(uintptr_t{0x40});
  cuda::pair_slots(dids.get<int32_t>(), (int)ids.size(), dres.get<uint64_t>(), fallback,
                   dptrs.get<const uint8_t*>(), dn.get<int32_t>(), nullptr);
  const auto ptrs = to_host<uint64_t>(dptrs, ids.size());
  for (size_t i = 0; i < ids.size(); i++)
    EXPECT_EQ(ptrs[i], residency[ids[i]] ? residency[ids[i]] : 0x40u) << "selection " << i;
  EXPECT_EQ(to_host<int32_t>(dn, 1)[0], (int)ids.size());
}

// Several token columns a launch (batched decode): each column's products equal a one-column
// launch on its row bit for bit at 2048 columns (one warp a row there), and are within the
// tier's bound at 4096; outputs at a stride wider than the rows leave the gaps untouched. Column
// counts cover each launch size (8, 4, 2, 1) and their sums (3, 5, 13, 16).
TEST_F(CudaQ8, SeveralColumnsAsOneColumnEach) {
  for (GgmlType t : kQ8Types) {
    for (int cols : {2048, 4096}) {
      const int rows = 300, stride = rows + 7;
      const size_t rb = row_size(t, cols);
      const auto w = random_rows(t, rows, cols, 700 + cols);
      auto dw = to_device(w);
      for (int columns : {2, 3, 5, 8, 13, 16}) {
        SCOPED_TRACE(std::string(type_name(t)) + " cols " + std::to_string(cols) + " columns " +
                     std::to_string(columns));
        const auto x = random_floats((size_t)columns * cols, 40 + columns);
        auto dx = to_device(x);
        Q8Device q8(dx, columns, cols);
        const float kUntouched = -12345.0f;
        auto dy = to_device(std::vector<float>((size_t)columns * stride, kUntouched));
        cuda::MatvecJob j;
        j.w = dw.get<uint8_t>(), j.row_bytes = rb, j.rows = rows, j.y = dy.f(), j.y_stride = stride;
        j.xq = q8.values(), j.xds = q8.scales();
        cuda::matvec_q8_jobs(t, cols, &j, 1, nullptr, columns);
        const auto y = to_host<float>(dy, (size_t)columns * stride);
        cuda::DeviceBuffer d1((size_t)rows * sizeof(float));
        for (int c = 0; c < columns; c++) {
          cuda::MatvecJob one = j;
          one.y = d1.f(), one.y_stride = 0;
          one.xq = q8.values((size_t)c * cols), one.xds = q8.scales((size_t)c * cols / 32);
          cuda::matvec_q8_jobs(t, cols, &one, 1, nullptr);
          const auto y1 = to_host<float>(d1, rows);
          Nmse m;
          for (int r = 0; r < rows; r++) {
            const float got = y[(size_t)c * stride + r];
            if (cols == 2048) {
              ASSERT_EQ(bits(got), bits(y1[r])) << "column " << c << " row " << r;
            }
            m.add(got, reference_dot(t, w.data() + r * rb, x.data() + (size_t)c * cols, cols));
          }
          EXPECT_LE(m.value(), kMaxNmse) << "column " << c;
          for (int r = rows; r < stride; r++) ASSERT_EQ(y[(size_t)c * stride + r], kUntouched) << "gap of column " << c;
        }
      }
    }
  }
}

// mma-q8 (matmul_q8_jobs: the int8 tensor cores on the Q8 form) against matvec-q8 on the same
// token columns, the same numeric form summed in another order: within 1e-10 of it (a wrong
// fragment layout, scale or min term is O(1)) and within the tier's bound of the double product,
// for Q4_K, Q5_K and Q6_K, a job list of two (a shared input, outputs at a stride with gaps left
// untouched), rows that are not whole 16-row tiles, one and two 8-token tiles, widths of 1 to 16
// super-blocks (a warp of the block with none, with several; Q6_K's 512 columns, 420-byte rows,
// every other row 4-byte aligned only).
TEST_F(CudaQ8, MmaProductsEqualTheColumnsForm) {
  if (cuda::device_info().cc_major < 8) GTEST_SKIP() << "mma-q8 needs compute capability 8.0";
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    for (auto [rows, cols] : {std::pair{16, 256}, std::pair{77, 2048}, std::pair{300, 4096}, std::pair{40, 512}}) {
      const size_t rb = row_size(t, cols);
      const int rows2 = 21, stride = rows + rows2 + 5;
      const auto w = random_rows(t, rows, cols, 900 + rows), w2 = random_rows(t, rows2, cols, 901 + rows);
      auto dw = to_device(w), dw2 = to_device(w2);
      for (int columns : {2, 5, 8, 9, 16}) {
        SCOPED_TRACE(std::string(type_name(t)) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                     " columns " + std::to_string(columns));
        const auto x = random_floats((size_t)columns * cols, 60 + columns);
        auto dx = to_device(x);
        Q8Device q8(dx, columns, cols);
        const float kUntouched = -12345.0f;
        std::vector<float> got[2];
        for (int mma = 0; mma < 2; mma++) {
          auto dy = to_device(std::vector<float>((size_t)columns * stride, kUntouched));
          cuda::MatvecJob j[2];
          j[0].w = dw.get<uint8_t>(), j[0].rows = rows, j[0].y = dy.f();
          j[1].w = dw2.get<uint8_t>(), j[1].rows = rows2, j[1].y = dy.f() + rows;
          for (cuda::MatvecJob& k : j) k.row_bytes = rb, k.y_stride = stride, k.xq = q8.values(), k.xds = q8.scales();
          if (mma)
            cuda::matmul_q8_jobs(t, cols, j, 2, nullptr, columns);
          else
            cuda::matvec_q8_jobs(t, cols, j, 2, nullptr, columns);
          got[mma] = to_host<float>(dy, (size_t)columns * stride);
        }
        Nmse against_columns, against_ref;
        for (int c = 0; c < columns; c++) {
          const float* xc = x.data() + (size_t)c * cols;
          for (int r = 0; r < rows + rows2; r++) {
            const size_t at = (size_t)c * stride + r;
            against_columns.add(got[1][at], got[0][at]);
            const uint8_t* row = r < rows ? w.data() + r * rb : w2.data() + (r - rows) * rb;
            against_ref.add(got[1][at], reference_dot(t, row, xc, cols));
          }
          for (int r = rows + rows2; r < stride; r++)
            ASSERT_EQ(got[1][(size_t)c * stride + r], kUntouched) << "gap of column " << c;
        }
        EXPECT_LE(against_columns.value(), 1e-10);
        EXPECT_LE(against_ref.value(), kMaxNmse);
      }
    }
  }
  // What it cannot run: another type, a width of part of a block, more columns than it takes.
  cuda::MatvecJob j;
  EXPECT_THROW(cuda::matmul_q8_jobs(GgmlType::Q8_0, 256, &j, 1, nullptr, 2), Error);
  EXPECT_THROW(cuda::matmul_q8_jobs(GgmlType::Q4_K, 288, &j, 1, nullptr, 2), Error);
  EXPECT_THROW(cuda::matmul_q8_jobs(GgmlType::Q4_K, 256, &j, 1, nullptr, cuda::kMaxQ8Columns + 1), Error);
}

// Q6_K's A fragments (q6k_fragments.h) against the CPU's dequantisation, on the CPU: for every
// super-block of random rows, half n, activation block g and lane q, the fragment's bytes are the
// values q − 32 of l = 4q..4q + 3 (lo) and 16 + 4q.. (hi) of block 4n + g, and the scale bytes it
// names are theirs: value = d · scale · (q − 32) exactly (every scale nonzero here).
TEST(CudaMmaQ6k, FragmentsHoldTheDequantisedValues) {
  const int cols = 512, rows = 24;
  auto w = random_rows(GgmlType::Q6_K, rows, cols, 77);
  const size_t rb = row_size(GgmlType::Q6_K, cols);
  for (size_t i = 0; i < w.size(); i += cuda::kQ6kBytes)
    for (int k = 0; k < 16; k++)
      if (w[i + 192 + k] == 0) w[i + 192 + k] = 1;  // a zero scale would hide its values
  std::vector<float> deq(cols);
  int checked = 0;
  for (int r = 0; r < rows; r++) {
    dequantize_row(GgmlType::Q6_K, w.data() + r * rb, deq.data(), cols);
    for (int sb = 0; sb < cols / 256; sb++) {
      const uint8_t* b = w.data() + r * rb + (size_t)sb * cuda::kQ6kBytes;
      uint16_t dh;
      std::memcpy(&dh, b + cuda::kQ6kD, 2);
      const float d = fp16_to_f32(dh);
      for (int n = 0; n < 2; n++)
        for (int q = 0; q < 4; q++) {
          cuda::Q6kHalfWords hw{};
          for (int i = 0; i < 4; i++) std::memcpy(&hw.ql[i], b + cuda::q6k_ql_offset(n, i, q), 4);
          for (int i = 0; i < 2; i++) std::memcpy(&hw.qh[i], b + cuda::q6k_qh_offset(n, i, q), 4);
          for (int g = 0; g < 4; g++) {
            const cuda::Q6kFragment f = cuda::q6k_fragment(hw, g);
            for (int half = 0; half < 2; half++) {
              const float sc = (float)(int8_t)b[cuda::q6k_scale_offset(n, g) + half];
              const uint32_t word = half ? f.hi : f.lo;
              for (int i = 0; i < 4; i++) {
                const int l = 16 * half + 4 * q + i;
                const int v = (int8_t)(uint8_t)(word >> (8 * i));
                ASSERT_GE(v, -32);
                ASSERT_LE(v, 31);
                const float want = deq[256 * sb + 128 * n + 32 * g + l];
                ASSERT_EQ((d * sc) * (float)v, want) << "row " << r << " super-block " << sb << " half " << n
                                                     << " block " << g << " value " << l;
                checked++;
              }
            }
          }
        }
    }
  }
  EXPECT_EQ(checked, rows * cols);
}

// The shared expert's SwiGLU pair on several columns: as one-column launches, bit for bit. 15
// columns take a launch of each size (8, 4, 2, 1).
TEST_F(CudaQ8, SeveralColumnsOfASwigluPair) {
  const int n_embd = 2048, ff = 512, columns = 15;
  for (GgmlType t : kQ8Types) {
    SCOPED_TRACE(type_name(t));
    const size_t rb = row_size(t, n_embd);
    auto dg = to_device(random_rows(t, ff, n_embd, 801)), du = to_device(random_rows(t, ff, n_embd, 802));
    auto dx = to_device(random_floats((size_t)columns * n_embd, 803));
    Q8Device q8(dx, columns, n_embd);
    cuda::DeviceBuffer da((size_t)columns * ff * sizeof(float)), d1(ff * sizeof(float));
    cuda::GateUpJob j;
    j.gate = dg.get<uint8_t>(), j.up = du.get<uint8_t>(), j.row_bytes_gate = j.row_bytes_up = rb, j.rows = ff;
    j.xq = q8.values(), j.xds = q8.scales(), j.act = da.f();
    cuda::matvec_q8_gate_up(t, n_embd, &j, 1, nullptr, columns);
    const auto act = to_host<float>(da, (size_t)columns * ff);
    for (int c = 0; c < columns; c++) {
      cuda::GateUpJob one = j;
      one.act = d1.f(), one.xq = q8.values((size_t)c * n_embd), one.xds = q8.scales((size_t)c * n_embd / 32);
      cuda::matvec_q8_gate_up(t, n_embd, &one, 1, nullptr);
      const auto a1 = to_host<float>(d1, ff);
      for (int r = 0; r < ff; r++) ASSERT_EQ(bits(act[(size_t)c * ff + r]), bits(a1[r])) << "column " << c << " row " << r;
    }
  }
}

// A kernel's output (fp32, n values) and the Q8 form it wrote beside it, against a second run
// without the Q8 form (its output bit for bit) and quantize_q8 of that output taken as one row of
// n values (the layout the products read).
void expect_q8_of_output(const cuda::DeviceBuffer& out, const cuda::DeviceBuffer& out_plain, const cuda::DeviceBuffer& q,
                         const cuda::DeviceBuffer& ds, size_t n) {
  const auto o1 = test::to_host<float>(out, n), o2 = test::to_host<float>(out_plain, n);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(bits(o1[i]), bits(o2[i])) << "output " << i;
  const Q8Device want(out_plain, 1, (int)n);
  const auto got_q = test::to_host<int8_t>(q, n), want_q = test::to_host<int8_t>(want.q, n);
  const auto got_ds = test::to_host<float2>(ds, n / 32), want_ds = test::to_host<float2>(want.ds, n / 32);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(got_q[i], want_q[i]) << "value " << i;
  for (size_t b = 0; b < n / 32; b++) {
    ASSERT_EQ(bits(got_ds[b].x), bits(want_ds[b].x)) << "block " << b << " scale";
    ASSERT_EQ(bits(got_ds[b].y), bits(want_ds[b].y)) << "block " << b << " scale times sum";
  }
}

// add_rms_norm's Q8 form (written by the norm kernel where the width allows, by quantize_q8 after
// it elsewhere) against quantize_q8 of the same output, bit for bit: rows of 2,048 (a block a row,
// in the kernel), 128 (a warp a row, in the kernel) and 96 (not a multiple of 128: after it), 1, 4
// and kQ8PassTokens rows (the decode token and the Q8 column passes), one row with a NaN and one
// all zeros.
TEST_F(CudaQ8, AddRmsNormWritesTheQ8FormOfItsOutput) {
  for (int width : {2048, 128, 96})
    for (int rows : {1, 4, cuda::kQ8PassTokens}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows of " << width);
      auto xs = test::random_floats((size_t)rows * width, 3 + width, 2.0f), ys = test::random_floats(xs.size(), 4);
      const auto w = test::random_floats(width, 5, 1.0f);
      if (rows > 1) {
        xs[width + 7] = NAN;  // row 1: its block of 32 gets d = NaN
        std::fill(xs.begin() + 2 * width, xs.begin() + 3 * width, 0.0f);  // row 2: x + y = y
        std::fill(ys.begin() + 2 * width, ys.begin() + 3 * width, 0.0f);  // ... = 0 (d = 0, q = 0)
      }
      auto x1 = test::to_device(xs), x2 = test::to_device(xs), y = test::to_device(ys), dw = test::to_device(w);
      cuda::DeviceBuffer out1(xs.size() * 4), out2(xs.size() * 4), q(xs.size()), ds(xs.size() / 32 * sizeof(float2));
      cuda::add_rms_norm(x1.f(), y.f(), dw.f(), out1.f(), rows, width, 1e-6f, nullptr, q.get<int8_t>(),
                         ds.get<float2>());
      cuda::add_rms_norm(x2.f(), y.f(), dw.f(), out2.f(), rows, width, 1e-6f, nullptr);
      RL_CUDA_CHECK(cudaDeviceSynchronize());
      ASSERT_NO_FATAL_FAILURE(expect_q8_of_output(out1, out2, q, ds, xs.size()));
      if (rows > 1) {
        EXPECT_TRUE(std::isnan(test::to_host<float2>(ds, xs.size() / 32)[width / 32].x)) << "the NaN's block";
      }
    }
}

// gated_rms_norm's Q8 form of its output (the DeltaNet output projection's input: 32 heads of 128
// in the 80B) against quantize_q8 of the same output, bit for bit: rows of 128 (in the kernel), 96
// (after it) and 1,024 (a block a row).
TEST_F(CudaQ8, GatedRmsNormWritesTheQ8FormOfItsOutput) {
  for (int width : {128, 96, 1024}) {
    SCOPED_TRACE(::testing::Message() << "rows of " << width);
    const int rows = 32;
    const size_t n = (size_t)rows * width;
    const auto os = test::random_floats(n, 31 + width, 2.0f), zs = test::random_floats(n, 32);
    const auto w = test::random_floats(width, 33);
    auto o = test::to_device(os), z = test::to_device(zs), dw = test::to_device(w);
    cuda::DeviceBuffer out1(n * 4), out2(n * 4), q(n), ds(n / 32 * sizeof(float2));
    cuda::gated_rms_norm(o.f(), z.f(), dw.f(), out1.f(), rows, width, 1e-6f, nullptr, q.get<int8_t>(), ds.get<float2>());
    cuda::gated_rms_norm(o.f(), z.f(), dw.f(), out2.f(), rows, width, 1e-6f, nullptr);
    RL_CUDA_CHECK(cudaDeviceSynchronize());
    ASSERT_NO_FATAL_FAILURE(expect_q8_of_output(out1, out2, q, ds, n));
  }
}

// moe_combine_norm's Q8 form of its output (the next layer's mixer input) against quantize_q8 of the
// same output, bit for bit: rows of 2,048 (in the kernel) and 96 (after it), 1, 3 and
// kQ8PassTokens tokens of 10 selections each.
TEST_F(CudaQ8, MoeCombineNormWritesTheQ8FormOfItsOutput) {
  const int k = 10;
  for (int width : {2048, 96})
    for (int T : {1, 3, cuda::kQ8PassTokens}) {
      SCOPED_TRACE(::testing::Message() << T << " tokens of " << width);
      const size_t n = (size_t)T * width;
      const auto xs = test::random_floats(n, 21 + width, 2.0f), ys = test::random_floats(n * k, 22);
      const auto sh = test::random_floats(n, 23), sg = test::random_floats(T, 24), nw = test::random_floats(width, 25);
      const auto wts = test::random_floats((size_t)T * k, 26, 0.5f);
      std::vector<int32_t> assign((size_t)T * k);
      for (size_t i = 0; i < assign.size(); i++) assign[i] = (int32_t)((i * 7) % assign.size());
      auto x1 = test::to_device(xs), x2 = test::to_device(xs), y = test::to_device(ys), dsh = test::to_device(sh);
      auto dsg = test::to_device(sg), dnw = test::to_device(nw), dw = test::to_device(wts);
      cuda::DeviceBuffer da(assign.size() * 4), out1(n * 4), out2(n * 4), q(n), ds(n / 32 * sizeof(float2));
      RL_CUDA_CHECK(cudaMemcpy(da.get(), assign.data(), assign.size() * 4, cudaMemcpyHostToDevice));
      cuda::moe_combine_norm(x1.f(), y.f(), da.get<int32_t>(), dw.f(), k, dsh.f(), dsg.f(), T, width, dnw.f(), 1e-6f,
                             out1.f(), nullptr, q.get<int8_t>(), ds.get<float2>());
      cuda::moe_combine_norm(x2.f(), y.f(), da.get<int32_t>(), dw.f(), k, dsh.f(), dsg.f(), T, width, dnw.f(), 1e-6f,
                             out2.f(), nullptr);
      RL_CUDA_CHECK(cudaDeviceSynchronize());
      ASSERT_NO_FATAL_FAILURE(expect_q8_of_output(out1, out2, q, ds, n));
    }
}

// Products on fp32 input (x set, xq null: each block quantises it into shared memory) equal
// quantize_q8 then the product on the Q8 form, bit for bit: dense jobs on 1 to 8 token columns of
// 256 columns and 1 to 4 of 512 (each launch size; rows not a whole block; outputs at a stride,
// the gaps untouched), an input block holding a NaN among them; the
// routed experts' downs on their own rows (a listed launch of 10, a derived one of more than a
// list holds) and on one shared row.
TEST_F(CudaQ8, Fp32InputEqualsQuantizeThenProduct) {
  for (GgmlType t : kQ8Types) {
    for (int cols : {256, 512}) {
      const int rows = 300, stride = rows + 3;
      const size_t rb = row_size(t, cols);
      auto dw = to_device(random_rows(t, rows, cols, 800 + cols));
      for (int columns : {1, 2, 3, 4, 7, 8}) {
        if (!cuda::q8_f32_input_fits(cols, columns)) continue;
        SCOPED_TRACE(std::string(type_name(t)) + " cols " + std::to_string(cols) + " columns " +
                     std::to_string(columns));
        auto x = random_floats((size_t)columns * cols, 50 + columns);
        if (columns == 3) x[(size_t)cols + 70] = std::numeric_limits<float>::quiet_NaN();
        auto dx = to_device(x);
        Q8Device q8(dx, columns, cols);
        const float kUntouched = -12345.0f;
        const std::vector<float> untouched((size_t)columns * stride, kUntouched);
        auto dq = to_device(untouched), df = to_device(untouched);
        cuda::MatvecJob j;
        j.w = dw.get<uint8_t>(), j.row_bytes = rb, j.rows = rows, j.y_stride = stride;
        j.xq = q8.values(), j.xds = q8.scales(), j.y = dq.f();
        cuda::matvec_q8_jobs(t, cols, &j, 1, nullptr, columns);
        j.xq = nullptr, j.xds = nullptr, j.x = dx.f(), j.y = df.f();
        cuda::matvec_q8_jobs(t, cols, &j, 1, nullptr, columns);
        const auto yq = to_host<float>(dq, (size_t)columns * stride), yf = to_host<float>(df, (size_t)columns * stride);
        for (size_t i = 0; i < yq.size(); i++) ASSERT_EQ(bits(yf[i]), bits(yq[i])) << "output " << i;
        for (int c = 0; c < columns; c++)
          for (int r = rows; r < stride; r++) ASSERT_EQ(yf[(size_t)c * stride + r], kUntouched) << "gap of column " << c;
        if (columns == 3) {
          EXPECT_TRUE(std::isnan(yf[stride + 5]));  // the NaN's column
        }
      }
    }
  }
  const int n_embd = 2048, ff = 512;
  for (GgmlType t : kQ8Types) {
    for (int n : {10, cuda::kMaxMatvecJobs + 5}) {
      SCOPED_TRACE(std::string(type_name(t)) + " experts " + std::to_string(n));
      const size_t rb = row_size(t, ff);
      ExpertSlots slots({{t, {n_embd, ff}}}, n);
      auto dx = to_device(random_floats((size_t)n * ff, 60 + n));
      Q8Device q8(dx, n, ff);
      cuda::DeviceBuffer dq((size_t)n * n_embd * 4), df((size_t)n * n_embd * 4);
      for (int per_expert : {1, 0}) {
        cuda::matvec_q8_experts(t, slots.slots(), slots.offsets[0], rb, n_embd, ff, q8.values(), q8.scales(),
                                per_expert, dq.f(), n, nullptr);
        cuda::matvec_q8_experts_f32_input(t, slots.slots(), slots.offsets[0], rb, n_embd, ff, dx.f(), per_expert,
                                          df.f(), n, nullptr);
        const auto yq = to_host<float>(dq, (size_t)n * n_embd), yf = to_host<float>(df, (size_t)n * n_embd);
        for (size_t i = 0; i < yq.size(); i++)
          ASSERT_EQ(bits(yf[i]), bits(yq[i])) << "input rows per expert " << per_expert << ", output " << i;
      }
    }
  }
}

TEST_F(CudaQ8, RejectsWhatItCannotRun) {
  cuda::DeviceBuffer d(1 << 16);
  cuda::MatvecJob j;
  j.w = d.get<uint8_t>(), j.row_bytes = row_size(GgmlType::Q4_K, 256), j.rows = 1, j.y = d.f();
  j.xq = d.get<int8_t>(), j.xds = d.get<float2>();
  EXPECT_THROW(cuda::matvec_q8_jobs(GgmlType::Q4_0, 256, &j, 1, nullptr), Error);  // no Q8 product
  EXPECT_THROW(cuda::matvec_q8_jobs(GgmlType::Q4_K, 288, &j, 1, nullptr), Error);  // not whole blocks
  j.xq = nullptr;
  EXPECT_THROW(cuda::matvec_q8_jobs(GgmlType::Q4_K, 256, &j, 1, nullptr), Error);  // no Q8 input
  j.xq = d.get<int8_t>(), j.w = d.get<uint8_t>() + 8;
  EXPECT_THROW(cuda::matvec_q8_jobs(GgmlType::Q4_K, 256, &j, 1, nullptr), Error);  // misaligned Q4_K
  EXPECT_THROW(cuda::quantize_q8(d.f(), 1, 40, d.get<int8_t>(), d.get<float2>(), nullptr), Error);
  j.w = d.get<uint8_t>();
  EXPECT_THROW(cuda::matvec_q8_jobs(GgmlType::Q4_K, 256, &j, 1, nullptr, 0), Error);  // no columns
  EXPECT_THROW(cuda::matvec_q8_jobs(GgmlType::Q4_K, 256, &j, 1, nullptr, cuda::kMaxQ8Columns + 1), Error);
  // fp32 input: wider than the blocks' copy, more values in all than it holds, mixed with Q8 jobs.
  cuda::MatvecJob f = j;
  f.xq = nullptr, f.xds = nullptr, f.x = d.f();
  EXPECT_THROW(cuda::matvec_q8_jobs(GgmlType::Q4_K, 2048, &f, 1, nullptr), Error);
  EXPECT_THROW(cuda::matvec_q8_jobs(GgmlType::Q4_K, 512, &f, 1, nullptr, 5), Error);
  const cuda::MatvecJob mixed[2] = {f, j};
  EXPECT_THROW(cuda::matvec_q8_jobs(GgmlType::Q4_K, 256, mixed, 2, nullptr), Error);
  f.x = d.f() + 2;
  EXPECT_THROW(cuda::matvec_q8_jobs(GgmlType::Q4_K, 256, &f, 1, nullptr), Error);  // not 16-byte aligned
  EXPECT_FALSE(cuda::q8_f32_input_fits(1024, 1));
  EXPECT_FALSE(cuda::q8_f32_input_fits(480, 1));  // not whole rounds of 128
  EXPECT_TRUE(cuda::q8_f32_input_fits(512, 4));
  EXPECT_FALSE(cuda::q8_f32_input_fits(512, 5));
}

// Host only: the covered types.
TEST(CudaQ8Types, TheSeedMixTypesHaveQ8Products) {
  for (GgmlType t : kQ8Types) EXPECT_TRUE(cuda::q8_supported(t)) << type_name(t);
  for (GgmlType t : test::kWeightTypes) {
    bool covered = false;
    for (GgmlType c : kQ8Types) covered = covered || c == t;
    EXPECT_EQ(cuda::q8_supported(t), covered) << type_name(t);
  }
}

}  // namespace
}  // namespace rl
