// The GPU-routed decode's kernels against independent references: route_topk against a host
// top-k written from the rule (softmax in double, probabilities rounded to fp32, ties to the lower
// index, renormalised weights), with near-ties and exact ties; the fused add + RMSNorm against
// add_inplace followed by rms_norm (bit for bit); the fused MoE combine + next norm against
// moe_combine followed by rms_norm; attention_prep against split/norm/rope/store; the fused gate/up/SwiGLU expert product against
// two matvec_experts launches and swiglu (bit for bit); the prefill's grouping by expert
// (group_by_expert) against the grouping's definition.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>

#include "common/error.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"

namespace rl {
namespace {

using test::random_floats;
using test::to_device;
using test::to_host;

class CudaGpuRouting : public ::testing::Test {
 protected:
  void SetUp() override { RL_REQUIRE_GPU(); }
};

// The selection rule, written out plainly: sort all experts by (probability desc, index asc).
void reference_route(const std::vector<float>& l, int K, float scale, std::vector<int>& ids,
                     std::vector<float>& w) {
  const int E = (int)l.size();
  const double m = *std::max_element(l.begin(), l.end());
  double sum = 0.0;
  for (float v : l) sum += std::exp((double)v - m);
  std::vector<float> p(E);
  for (int e = 0; e < E; e++) p[e] = (float)(std::exp((double)l[e] - m) / sum);
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  double sel = 0.0;
  for (int k = 0; k < K; k++) sel += p[order[k]];
  ids.assign(order.begin(), order.begin() + K);
  w.resize(K);
  for (int k = 0; k < K; k++) {
    double wk = p[order[k]] / sel;
    if (scale != 0.0f) wk *= scale;
    w[k] = (float)wk;
  }
}

TEST_F(CudaGpuRouting, TopKMatchesTheRuleWithTiesAndResidency) {
  struct Case { int E, K; float scale; uint32_t seed; bool ties; };
  for (const Case& cs : {Case{512, 10, 0.0f, 1, false}, Case{512, 10, 2.5f, 2, true}, Case{16, 4, 0.0f, 3, true},
                         Case{8, 2, 1.0f, 4, false}, Case{300, 7, 0.0f, 5, true}}) {
    auto logits = random_floats(cs.E, cs.seed, 0.5f);
    if (cs.ties) {
      // Exact ties (equal logits) and near-ties one ulp apart, among the largest values.
      const int top = (int)(std::max_element(logits.begin(), logits.end()) - logits.begin());
      for (int e = 0; e < cs.E; e += 3) logits[e] = logits[top];
      logits[1] = std::nextafter(logits[top], -INFINITY);
    }
    // Every other expert resident at a fake address; the rest missing.
    std::vector<uint64_t> residency(cs.E);
    for (int e = 0; e < cs.E; e++) residency[e] = e % 2 ? 0 : 0x1000u * (uint64_t)(e + 1);
    const uint64_t fallback = 0xABC000;
    auto dl = to_device(logits), dr = to_device(residency);
    cuda::DeviceBuffer dids(cs.K * 4), dw(cs.K * 4), dptr(cs.K * 8), dmiss(4);
    cuda::route_topk(dl.f(), cs.E, cs.K, cs.scale, dr.get<uint64_t>(), reinterpret_cast<const uint8_t*>(fallback),
                     dids.get<int32_t>(), dw.f(), dptr.get<const uint8_t*>(), dmiss.get<int32_t>(), nullptr);
    const auto ids = to_host<int32_t>(dids, cs.K);
    const auto w = to_host<float>(dw, cs.K);
    const auto ptr = to_host<uint64_t>(dptr, cs.K);
    const auto miss = to_host<int32_t>(dmiss, 1);
    std::vector<int> want_ids;
    std::vector<float> want_w;
    reference_route(logits, cs.K, cs.scale, want_ids, want_w);
    int want_miss = 0;
    for (int k = 0; k < cs.K; k++) {
      EXPECT_EQ(ids[k], want_ids[k]) << "E=" << cs.E << " k=" << k;
      EXPECT_EQ(w[k], want_w[k]) << "E=" << cs.E << " k=" << k;
      const uint64_t want_ptr = residency[want_ids[k]] ? residency[want_ids[k]] : fallback;
      want_miss += residency[want_ids[k]] == 0;
      EXPECT_EQ(ptr[k], want_ptr) << "E=" << cs.E << " k=" << k;
    }
    EXPECT_EQ(miss[0], want_miss) << "E=" << cs.E;
  }
}

// The fast tier's routing (fp32, one warp a token) against the same rule: the same experts in the
// same order where no two probabilities nearly tie (exact ties, from equal logits, still go to the
// lower index), weights within fp32 rounding; T tokens through route_tokens, one through
// route_topk with its slots.
TEST_F(CudaGpuRouting, FastTopKSelectsAsTheRule) {
  struct Case { int E, K, T; float scale; uint32_t seed; bool ties; };
  for (const Case& cs : {Case{512, 10, 9, 0.0f, 21, false}, Case{512, 10, 1, 2.5f, 22, true},
                         Case{16, 4, 3, 0.0f, 23, true}, Case{300, 7, 5, 1.0f, 24, false},
                         // each register share of the kernel (E up to 128, 256, 512, 1024, 2048)
                         Case{200, 8, 2, 0.0f, 25, true}, Case{1000, 10, 2, 0.0f, 26, false},
                         Case{2048, 32, 1, 0.0f, 27, true}}) {
    SCOPED_TRACE("E=" + std::to_string(cs.E) + " K=" + std::to_string(cs.K) + " T=" + std::to_string(cs.T));
    auto logits = random_floats((size_t)cs.T * cs.E, cs.seed, 0.5f);
    if (cs.ties)
      for (int t = 0; t < cs.T; t++) {
        float* l = logits.data() + (size_t)t * cs.E;
        const float top = *std::max_element(l, l + cs.E);
        for (int e = 0; e < cs.E; e += 3) l[e] = top;
      }
    std::vector<uint64_t> residency(cs.E);
    for (int e = 0; e < cs.E; e++) residency[e] = e % 2 ? 0 : 0x1000u * (uint64_t)(e + 1);
    auto dl = to_device(logits), dr = to_device(residency);
    cuda::DeviceBuffer dids((size_t)cs.T * cs.K * 4), dw((size_t)cs.T * cs.K * 4), dptr(cs.K * 8), dmiss(4);
    cuda::route_tokens(dl.f(), cs.T, cs.E, cs.K, cs.scale, dids.get<int32_t>(), dw.f(), nullptr, cuda::Sums::kFast);
    auto ids = to_host<int32_t>(dids, (size_t)cs.T * cs.K);
    auto w = to_host<float>(dw, (size_t)cs.T * cs.K);
    for (int t = 0; t < cs.T; t++) {
      std::vector<float> lt(logits.begin() + (size_t)t * cs.E, logits.begin() + (size_t)(t + 1) * cs.E);
      std::vector<int> want_ids;
      std::vector<float> want_w;
      reference_route(lt, cs.K, cs.scale, want_ids, want_w);
      for (int k = 0; k < cs.K; k++) {
        EXPECT_EQ(ids[(size_t)t * cs.K + k], want_ids[k]) << "t=" << t << " k=" << k;
        EXPECT_NEAR(w[(size_t)t * cs.K + k], want_w[k], 1e-5 * std::fabs(want_w[k])) << "t=" << t << " k=" << k;
      }
    }
    const uint64_t fallback = 0xABC000;
    cuda::route_topk(dl.f(), cs.E, cs.K, cs.scale, dr.get<uint64_t>(), reinterpret_cast<const uint8_t*>(fallback),
                     dids.get<int32_t>(), dw.f(), dptr.get<const uint8_t*>(), dmiss.get<int32_t>(), nullptr,
                     cuda::Sums::kFast);
    ids = to_host<int32_t>(dids, cs.K);
    const auto ptr = to_host<uint64_t>(dptr, cs.K);
    const auto miss = to_host<int32_t>(dmiss, 1);
    int want_miss = 0;
    for (int k = 0; k < cs.K; k++) {
      EXPECT_EQ(ptr[k], residency[ids[k]] ? residency[ids[k]] : fallback) << "k=" << k;
      want_miss += residency[ids[k]] == 0;
    }
    EXPECT_EQ(miss[0], want_miss);
  }
}

TEST_F(CudaGpuRouting, FusedAddRmsNormEqualsTheTwoKernels) {
  for (int width : {64, 2048}) {
    const int rows = 5;
    auto x = random_floats((size_t)rows * width, 11, 3.0f), y = random_floats((size_t)rows * width, 12);
    auto w = random_floats(width, 13);
    auto dx1 = to_device(x), dx2 = to_device(x), dy = to_device(y), dw = to_device(w);
    cuda::DeviceBuffer o1(x.size() * 4), o2(x.size() * 4);
    cuda::add_inplace(dx1.f(), dy.f(), x.size(), nullptr);
    cuda::rms_norm(dx1.f(), dw.f(), o1.f(), rows, width, 1e-6f, nullptr);
    cuda::add_rms_norm(dx2.f(), dy.f(), dw.f(), o2.f(), rows, width, 1e-6f, nullptr);
    EXPECT_EQ(to_host<float>(dx1, x.size()), to_host<float>(dx2, x.size())) << "width " << width;
    EXPECT_EQ(to_host<float>(o1, x.size()), to_host<float>(o2, x.size())) << "width " << width;
  }
}

TEST_F(CudaGpuRouting, FusedCombineNormEqualsCombineThenRmsNorm) {
  for (int width : {256, 2048}) {
    const int T = 3, K = 4, n_assign = T * K;
    auto x = random_floats((size_t)T * width, 21, 2.0f), y = random_floats((size_t)n_assign * width, 22);
    auto sh = random_floats((size_t)T * width, 23), sg = random_floats(T, 24), w = random_floats(width, 25);
    auto wts = random_floats(n_assign, 26);
    std::vector<int32_t> assign(n_assign);
    for (int i = 0; i < n_assign; i++) assign[i] = (i * 7) % n_assign;  // a permutation
    auto dx1 = to_device(x), dx2 = to_device(x), dy = to_device(y), dsh = to_device(sh), dsg = to_device(sg);
    auto dw = to_device(w), dwts = to_device(wts), das = to_device(assign);
    cuda::DeviceBuffer o1(x.size() * 4), o2(x.size() * 4);
    cuda::moe_combine(dx1.f(), dy.f(), das.get<int32_t>(), dwts.f(), K, dsh.f(), dsg.f(), T, width, nullptr);
    cuda::rms_norm(dx1.f(), dw.f(), o1.f(), T, width, 1e-6f, nullptr);
    cuda::moe_combine_norm(dx2.f(), dy.f(), das.get<int32_t>(), dwts.f(), K, dsh.f(), dsg.f(), T, width, dw.f(), 1e-6f,
                           o2.f(), nullptr);
    EXPECT_EQ(to_host<float>(dx1, x.size()), to_host<float>(dx2, x.size())) << "width " << width;
    const auto a = to_host<float>(o1, x.size()), b = to_host<float>(o2, x.size());
    if (width >= 1024) {
      EXPECT_EQ(a, b) << "width " << width;  // the same partition of the sum of squares
    } else {
      for (size_t i = 0; i < a.size(); i++) ASSERT_NEAR(a[i], b[i], 1e-6 * (1 + std::fabs(a[i]))) << i;
    }
  }
}

TEST_F(CudaGpuRouting, FusedAttentionPrepEqualsTheSixKernels) {
  struct Case { int T, n_head, n_kv, hd, n_rot, pos0; };
  for (const Case& cs : {Case{1, 16, 2, 256, 64, 300}, Case{5, 4, 2, 64, 32, 7}, Case{3, 8, 8, 128, 128, 0}}) {
    const int T = cs.T, nh = cs.n_head, nkv = cs.n_kv, hd = cs.hd, n_ctx = cs.pos0 + T + 3;
    const float theta_scale = std::pow(10000.0f, -2.0f / (float)cs.n_rot);
    auto qg = random_floats((size_t)T * nh * 2 * hd, 31, 2.0f), k = random_floats((size_t)T * nkv * hd, 32, 2.0f);
    auto v = random_floats((size_t)T * nkv * hd, 33), qn = random_floats(hd, 34), kn = random_floats(hd, 35);
    std::vector<int32_t> pos(T);
    for (int t = 0; t < T; t++) pos[t] = cs.pos0 + t;
    auto dqg = to_device(qg), dk1 = to_device(k), dk2 = to_device(k), dv = to_device(v), dqn = to_device(qn),
         dkn = to_device(kn), dpos = to_device(pos);
    const size_t qn_floats = (size_t)T * nh * hd, cache = (size_t)n_ctx * nkv * hd;
    cuda::DeviceBuffer q1(qn_floats * 4), g1(qn_floats * 4), q2(qn_floats * 4), g2(qn_floats * 4);
    cuda::DeviceBuffer kc1(cache * 4), vc1(cache * 4), kc2(cache * 4), vc2(cache * 4);
    for (auto* b : {&kc1, &vc1, &kc2, &vc2}) RL_CUDA_CHECK(cudaMemset(b->get(), 0, b->bytes()));
    cuda::split_q_gate(dqg.f(), q1.f(), g1.f(), T, nh, hd, nullptr);
    cuda::rms_norm(q1.f(), dqn.f(), q1.f(), T * nh, hd, 1e-6f, nullptr);
    cuda::rms_norm(dk1.f(), dkn.f(), dk1.f(), T * nkv, hd, 1e-6f, nullptr);
    cuda::rope_neox(q1.f(), T, nh, hd, (size_t)nh * hd, cs.n_rot, theta_scale, dpos.get<int32_t>(), nullptr);
    cuda::rope_neox(dk1.f(), T, nkv, hd, (size_t)nkv * hd, cs.n_rot, theta_scale, dpos.get<int32_t>(), nullptr);
    cuda::store_kv(dk1.f(), dv.f(), kc1.f(), vc1.f(), T, nkv, hd, 0, nullptr, dpos.get<int32_t>());
    cuda::attention_prep(dqg.f(), dk2.f(), dv.f(), q2.f(), g2.f(), dqn.f(), dkn.f(), kc2.f(), vc2.f(), T, nh, nkv, hd,
                         1e-6f, cs.n_rot, theta_scale, dpos.get<int32_t>(), nullptr);
    EXPECT_EQ(to_host<float>(q1, qn_floats), to_host<float>(q2, qn_floats)) << "q, hd " << hd;
    EXPECT_EQ(to_host<float>(g1, qn_floats), to_host<float>(g2, qn_floats)) << "gate, hd " << hd;
    EXPECT_EQ(to_host<float>(kc1, cache), to_host<float>(kc2, cache)) << "k cache, hd " << hd;
    EXPECT_EQ(to_host<float>(vc1, cache), to_host<float>(vc2, cache)) << "v cache, hd " << hd;
    EXPECT_EQ(to_host<float>(dk2, k.size()), k) << "k input unchanged";
  }
}

TEST_F(CudaGpuRouting, FusedGateUpSwigluEqualsTwoExpertLaunchesAndSwiglu) {
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ1_M, GgmlType::Q6_K}) {
    const int rows = 97, cols = 512, n = 3;  // odd: the IQ types' warps take two pairs / four rows
    const size_t rb = row_size(t, cols);
    const size_t up_offset = (size_t)rows * rb + 256;  // a gap, as slots align each matrix
    std::vector<uint64_t> ptrs;
    cuda::DeviceBuffer dslots((size_t)n * 2 * up_offset);
    for (int e = 0; e < n; e++) {
      auto g = test::random_rows(t, rows, cols, 100 + e), u = test::random_rows(t, rows, cols, 200 + e);
      uint8_t* base = dslots.get<uint8_t>() + (size_t)e * 2 * up_offset;
      RL_CUDA_CHECK(cudaMemcpy(base, g.data(), g.size(), cudaMemcpyHostToDevice));
      RL_CUDA_CHECK(cudaMemcpy(base + up_offset, u.data(), u.size(), cudaMemcpyHostToDevice));
      ptrs.push_back((uint64_t)base);
    }
    auto dptrs = to_device(ptrs);
    auto x = random_floats(cols, 7);
    auto dx = to_device(x);
    cuda::DeviceBuffer g1(n * rows * 4), u1(n * rows * 4), act(n * rows * 4), scratch(n * rows * 4);
    const auto* pp = dptrs.get<const uint8_t*>();
    cuda::matvec_experts(t, pp, 0, rb, rows, cols, dx.f(), 0, g1.f(), n, nullptr);
    cuda::matvec_experts(t, pp, up_offset, rb, rows, cols, dx.f(), 0, u1.f(), n, nullptr);
    cuda::swiglu(g1.f(), u1.f(), g1.f(), (size_t)n * rows, nullptr);
    cuda::matvec_experts_gate_up(t, t, pp, up_offset, rb, rb, rows, cols, dx.f(), act.f(), scratch.f(), n,
                                 nullptr);
    const auto want = to_host<float>(g1, n * rows);
    EXPECT_EQ(want, to_host<float>(act, n * rows)) << type_name(t);
  }
}

// group_by_expert on random selections (experts with 0 to ~30 rows; in the 2048-expert case most
// experts unused) and on a fixed pattern whose experts have 1, 33, 266 and 300 rows (cut into 1, 3,
// 17 and 19 groups): every selection has one row, each expert's rows are contiguous and in
// ascending expert order, gather names each row's token, the groups cut each expert's rows in
// order into pieces of at most 16 with the expert's slot pointer, the groups past the last have
// no rows, and the number of experts used is right. Then the refusals.
TEST_F(CudaGpuRouting, GroupByExpertMatchesTheDefinition) {
  struct Case {
    int T, K, E;
    bool pattern;  // token t selects 3 and then 0 (t = 0), 1 (t <= 33) or 2
  };
  for (Case cs : {Case{512, 10, 512, false}, Case{37, 4, 8, false}, Case{76, 10, 512, false},
                  Case{300, 8, 2048, false}, Case{2, 1, 3, false}, Case{300, 2, 4, true}}) {
    SCOPED_TRACE(std::to_string(cs.T) + " tokens, " + std::to_string(cs.K) + " of " + std::to_string(cs.E));
    const int n = cs.T * cs.K, n_groups = cuda::expert_group_bound(n, cs.E);
    std::mt19937 rng(cs.T + cs.E);
    std::vector<int32_t> ids(n);
    for (int t = 0; t < cs.T; t++) {
      if (cs.pattern) {
        ids[(size_t)t * 2] = 3;
        ids[(size_t)t * 2 + 1] = t == 0 ? 0 : t <= 33 ? 1 : 2;
        continue;
      }
      // Distinct experts per token, skewed towards low ids so that some experts get more rows.
      std::vector<int> pick;
      while ((int)pick.size() < cs.K) {
        const int e = (int)(std::min(rng() % cs.E, rng() % cs.E));
        if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
      }
      std::copy(pick.begin(), pick.end(), ids.begin() + (size_t)t * cs.K);
    }
    std::vector<uint64_t> residency(cs.E);
    for (int e = 0; e < cs.E; e++) residency[e] = 0x100000ull + 4096ull * (uint64_t)e;
    auto d_ids = to_device(ids), d_res = to_device(residency);
    cuda::DeviceBuffer d_gather(n * 4), d_assign(n * 4), d_ptrs(n_groups * 8), d_groups(2 * n_groups * 4), d_used(4);
    cuda::group_by_expert(d_ids.get<int32_t>(), n, cs.K, cs.E, d_res.get<uint64_t>(), d_gather.get<int32_t>(),
                          d_assign.get<int32_t>(), d_ptrs.get<const uint8_t*>(), d_groups.get<int32_t>(),
                          d_groups.get<int32_t>() + n_groups, n_groups, d_used.get<int32_t>(), nullptr);
    const auto gather = to_host<int32_t>(d_gather, n), assign = to_host<int32_t>(d_assign, n);
    const auto ptrs = to_host<uint64_t>(d_ptrs, n_groups);
    const auto groups = to_host<int32_t>(d_groups, 2 * n_groups);
    const int used = to_host<int32_t>(d_used, 1)[0];
    // The definition: expert e's rows are [start[e], start[e] + count[e]), experts ascending.
    std::vector<int> count(cs.E, 0), start(cs.E, 0);
    for (int32_t e : ids) count[e]++;
    for (int e = 1; e < cs.E; e++) start[e] = start[e - 1] + count[e - 1];
    std::vector<char> taken(n, 0);
    for (int i = 0; i < n; i++) {
      const int a = assign[i], e = ids[i];
      ASSERT_GE(a, start[e]) << "selection " << i;
      ASSERT_LT(a, start[e] + count[e]) << "selection " << i;
      ASSERT_FALSE(taken[a]) << "row " << a << " assigned twice";
      taken[a] = 1;
      ASSERT_EQ(gather[a], i / cs.K) << "row " << a;
    }
    int v = 0, experts_used = 0;
    for (int e = 0; e < cs.E; e++) {
      experts_used += count[e] > 0;
      for (int r = 0; r < count[e]; r += 16, v++) {
        ASSERT_LT(v, n_groups);
        EXPECT_EQ(ptrs[v], residency[e]) << "group " << v;
        EXPECT_EQ(groups[v], start[e] + r) << "group " << v;
        EXPECT_EQ(groups[n_groups + v], std::min(16, count[e] - r)) << "group " << v;
      }
    }
    for (; v < n_groups; v++) EXPECT_EQ(groups[n_groups + v], 0) << "group " << v << " past the last";
    EXPECT_EQ(used, experts_used);
  }
  cuda::DeviceBuffer b(64);
  EXPECT_THROW(cuda::group_by_expert(b.get<int32_t>(), 10, 2, 4096, nullptr, nullptr, nullptr, nullptr, nullptr,
                                     nullptr, 100, nullptr, nullptr),
               Error);
  EXPECT_THROW(cuda::group_by_expert(b.get<int32_t>(), 64, 2, 8, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                     cuda::expert_group_bound(64, 8) - 1, nullptr, nullptr),
               Error);
  EXPECT_THROW(cuda::group_by_expert(b.get<int32_t>(), 9, 2, 8, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                     100, nullptr, nullptr),
               Error);
}

// --miss-reads host: a selection that is not resident reads its host copy (host + e * stride) or,
// with staging, staging slot k (staging + k * stride), whose bytes stage_misses then copies from the
// host copy; a hit keeps its slot and its staging slot is left alone. Both tiers' route kernels.
TEST_F(CudaGpuRouting, MissesReadTheirHostCopyOrItsStagedCopy) {
  const int E = 64, K = 8;
  const size_t stride = 512, bytes = 384;  // an expert's extent in its slot, 16-byte pieces
  void* host_p = nullptr;
  ASSERT_EQ(cudaHostAlloc(&host_p, E * stride, cudaHostAllocMapped), cudaSuccess);
  const std::unique_ptr<void, cudaError_t (*)(void*)> host_owner(host_p, cudaFreeHost);
  uint8_t* host = static_cast<uint8_t*>(host_p);
  for (size_t i = 0; i < E * stride; i++) host[i] = (uint8_t)(i * 7 + i / stride);
  void* host_dev = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&host_dev, host_p, 0), cudaSuccess);
  const uint8_t* copy = static_cast<const uint8_t*>(host_dev);
  std::vector<uint64_t> residency(E);
  for (int e = 0; e < E; e++) residency[e] = e % 2 ? 0 : 0x1000u * (uint64_t)(e + 1);
  const auto logits = random_floats(E, 31, 0.5f);
  auto dl = to_device(logits), dr = to_device(residency);
  for (cuda::Sums sums : {cuda::Sums::kExact, cuda::Sums::kFast}) {
    SCOPED_TRACE(sums == cuda::Sums::kFast ? "fast" : "exact");
    cuda::DeviceBuffer dids(K * 4), dw(K * 4), dptr(K * 8), dmiss(4), staging(K * stride), src(K * 8);
    cuda::route_topk(dl.f(), E, K, 0.0f, dr.get<uint64_t>(), copy, dids.get<int32_t>(), dw.f(),
                     dptr.get<const uint8_t*>(), dmiss.get<int32_t>(), nullptr, sums, stride);
    auto ids = to_host<int32_t>(dids, K);
    auto ptr = to_host<uint64_t>(dptr, K);
    int misses = 0;
    for (int k = 0; k < K; k++) {
      const bool hit = residency[ids[k]] != 0;
      misses += !hit;
      EXPECT_EQ(ptr[k], hit ? residency[ids[k]] : (uint64_t)(copy + ids[k] * stride)) << "k=" << k;
    }
    ASSERT_GT(misses, 0);
    ASSERT_LT(misses, K);
    EXPECT_EQ(to_host<int32_t>(dmiss, 1)[0], misses);

    // The sources start as readable non-null addresses (expert 0's copy): a hit whose source the
    // route kernel left unwritten would have its staging slot overwritten.
    const std::vector<uint64_t> stale(K, (uint64_t)copy);
    auto reset_src = [&] { ASSERT_EQ(cudaMemcpy(src.get(), stale.data(), K * 8, cudaMemcpyHostToDevice), cudaSuccess); };
    ASSERT_NO_FATAL_FAILURE(reset_src());
    ASSERT_EQ(cudaMemset(staging.get(), 0xEE, K * stride), cudaSuccess);
    cuda::route_topk(dl.f(), E, K, 0.0f, dr.get<uint64_t>(), copy, dids.get<int32_t>(), dw.f(),
                     dptr.get<const uint8_t*>(), dmiss.get<int32_t>(), nullptr, sums, stride,
                     staging.get<uint8_t>(), src.get<const uint8_t*>());
    cuda::stage_misses(src.get<const uint8_t*>(), staging.get<uint8_t>(), K, bytes, stride, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ids = to_host<int32_t>(dids, K);
    ptr = to_host<uint64_t>(dptr, K);
    // Each selection but `skip`: a hit keeps its slot and its staging slot untouched (0xEE); a miss
    // reads staging slot k, which holds its expert's first `bytes` bytes of the host copy.
    auto expect_staged = [&](int skip) {
      const auto staged = to_host<uint8_t>(staging, K * stride);
      for (int k = 0; k < K; k++) {
        if (k == skip) continue;
        const bool hit = residency[ids[k]] != 0;
        EXPECT_EQ(ptr[k], hit ? residency[ids[k]] : (uint64_t)(staging.get<uint8_t>() + k * stride)) << "k=" << k;
        for (size_t i = 0; i < stride; i++) {
          const uint8_t want = !hit && i < bytes ? host[ids[k] * stride + i] : 0xEE;
          ASSERT_EQ(staged[k * stride + i], want) << "k=" << k << " byte " << i << (hit ? " (hit)" : " (miss)");
        }
      }
    };
    ASSERT_NO_FATAL_FAILURE(expect_staged(-1));
    // A staged prediction (stage_predicted) of the first missed selection and the first hit: the
    // miss reads the predicted slot and is not staged again; the hit is marked -1 and not copied.
    int miss_k = -1, hit_k = -1;
    for (int k = 0; k < K; k++) {
      if (residency[ids[k]] == 0 && miss_k < 0) miss_k = k;
      if (residency[ids[k]] != 0 && hit_k < 0) hit_k = k;
    }
    const std::vector<int32_t> predicted = {ids[hit_k], ids[miss_k]};
    auto dpred = to_device(predicted);
    cuda::DeviceBuffer pred_slots(2 * stride), staged_ids(2 * 4);
    ASSERT_EQ(cudaMemset(pred_slots.get(), 0xDD, 2 * stride), cudaSuccess);
    cuda::name_predicted_misses(dpred.get<int32_t>(), 2, dr.get<uint64_t>(), staged_ids.get<int32_t>(), nullptr);
    cuda::stage_predicted(staged_ids.get<int32_t>(), 2, copy, bytes, stride, pred_slots.get<uint8_t>(), nullptr);
    ASSERT_NO_FATAL_FAILURE(reset_src());
    ASSERT_EQ(cudaMemset(staging.get(), 0xEE, K * stride), cudaSuccess);
    const cuda::StagedPrediction pred{staged_ids.get<int32_t>(), 2, pred_slots.get<uint8_t>()};
    cuda::route_topk(dl.f(), E, K, 0.0f, dr.get<uint64_t>(), copy, dids.get<int32_t>(), dw.f(),
                     dptr.get<const uint8_t*>(), dmiss.get<int32_t>(), nullptr, sums, stride,
                     staging.get<uint8_t>(), src.get<const uint8_t*>(), pred);
    cuda::stage_misses(src.get<const uint8_t*>(), staging.get<uint8_t>(), K, bytes, stride, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto staged_h = to_host<int32_t>(staged_ids, 2);
    EXPECT_EQ(staged_h[0], -1);
    EXPECT_EQ(staged_h[1], ids[miss_k]);
    const auto pred_bytes = to_host<uint8_t>(pred_slots, 2 * stride);
    for (size_t i = 0; i < stride; i++) {
      ASSERT_EQ(pred_bytes[i], 0xDD) << "the resident prediction was copied, byte " << i;
      ASSERT_EQ(pred_bytes[stride + i], i < bytes ? host[ids[miss_k] * stride + i] : 0xDD) << "byte " << i;
    }
    ptr = to_host<uint64_t>(dptr, K);
    EXPECT_EQ(to_host<int32_t>(dmiss, 1)[0], misses);  // still a miss of the cache
    EXPECT_EQ(ptr[miss_k], (uint64_t)(pred_slots.get<uint8_t>() + stride));
    const auto staged_again = to_host<uint8_t>(staging, K * stride);
    for (size_t i = 0; i < stride; i++) ASSERT_EQ(staged_again[miss_k * stride + i], 0xEE) << "staged twice";
    ASSERT_NO_FATAL_FAILURE(expect_staged(miss_k));  // the other selections as without the prediction
  }
}

}  // namespace
}  // namespace rl
