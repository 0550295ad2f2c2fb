// The CUDA backend against the CPU oracle on the fixture models (second test layer: needs the
// fixtures and a GPU): logits of prefill and decode, router selections, at several cache budgets;
// then the faults the issue names (budget too large, file truncated after open).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "cache/admission.h"
#include "common/error.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "backend_test_util.h"
#include "gpu_test_util.h"
#include "model/parity.h"
#include "synth/synth.h"
#include "test_util.h"

namespace rl {
namespace {

const char* const kModels[] = {"tiny-qwen3next-iq2xxs.gguf", "tiny-qwen3next-q4km.gguf"};

// The fixture models present (name, path). A test over them runs on those present and then, when
// one is absent, ends as skipped naming it (RL_SKIP_IF_FIXTURE_MODEL_MISSING; a failure before it
// still fails the test): the GPU host's calls carry one fixture at a time (64 MiB a call).
std::vector<std::pair<std::string, std::string>> fixture_models() {
  std::vector<std::pair<std::string, std::string>> found;
  for (const char* name : kModels)
    if (std::filesystem::exists(test::fixture(name))) found.emplace_back(name, test::fixture(name));
  return found;
}
std::string missing_fixture_models() {
  std::string missing;
  for (const char* name : kModels)
    if (!std::filesystem::exists(test::fixture(name))) missing += (missing.empty() ? "" : ", ") + test::fixture(name);
  return missing;
}
#define RL_REQUIRE_FIXTURE_MODELS()                                                                  \
  do {                                                                                               \
    if (fixture_models().empty()) GTEST_SKIP() << "no fixture model found: " << missing_fixture_models(); \
  } while (0)
#define RL_SKIP_IF_FIXTURE_MODEL_MISSING()                                                              \
  do {                                                                                                  \
    if (!missing_fixture_models().empty())                                                              \
      GTEST_SKIP() << "ran on the fixture models present; not found: " << missing_fixture_models();     \
  } while (0)

using test::budget_mib;
using test::expect_identical_passes;
using test::expect_identical_runs;
using test::prompt;
using test::RouterRecorder;

// The exact tier's bounds on the fixtures, relative RMS of the logits against the oracle, from
// `redlite parity --backend cuda` on the H200 (docs/PERF.md, code 3a2c01d): model A 1.233e-6 (its
// IQ2_XXS experts' prefill products run on X24), model B 7.622e-8; 8x and 13x margins.
double fixture_max_rel_rms(const std::string& name) {
  return name == "tiny-qwen3next-iq2xxs.gguf" ? 1e-5 : 1e-6;
}

// The oracle session `cpu` against the GPU session `gpu`: prefill `toks` with every position's
// logits (relative RMS ≤ max_rel_rms, the same top-1 at each position), then `steps` greedy decode
// steps (the same token, relative RMS ≤ max_rel_rms), and the same router selections throughout.
void expect_matches_oracle(Session& cpu, Session& gpu, std::span<const int32_t> toks, int n_vocab, int steps,
                           double max_rel_rms) {
  RouterRecorder ra, rb;
  cpu.set_trace(&ra);
  gpu.set_trace(&rb);
  std::vector<float> la_all, lb_all;
  auto la = cpu.prefill(toks, &la_all);
  auto lb = gpu.prefill(toks, &lb_all);
  EXPECT_LE(relative_rms(lb_all, la_all), max_rel_rms);
  for (size_t p = 0; p < toks.size(); p++)
    EXPECT_EQ(argmax(std::span(lb_all).subspan(p * n_vocab, n_vocab)),
              argmax(std::span(la_all).subspan(p * n_vocab, n_vocab))) << "position " << p;
  for (int step = 0; step < steps; step++) {
    const int32_t next = argmax(la);
    ASSERT_EQ(argmax(lb), next) << "greedy step " << step;
    la = cpu.decode(next);
    lb = gpu.decode(next);
    EXPECT_LE(relative_rms(lb, la), max_rel_rms) << "step " << step;
  }
  EXPECT_FALSE(ra.topk.empty());
  EXPECT_EQ(ra.topk, rb.topk) << "router selections differ";
  cpu.set_trace(nullptr);
  gpu.set_trace(nullptr);
}

TEST(CudaBackend, MatchesOracleAtSeveralBudgets) {
  RL_REQUIRE_GPU();
  RL_REQUIRE_FIXTURE_MODELS();
  const auto models = fixture_models();
  for (const auto& [name, path] : models) {
    auto model = Model::open(path);
    const int n_vocab = model->config().n_vocab;
    auto cpu = cpu::make_cpu_backend(model, 0);
    // Each replacement policy on the bounded caches: the policy picks slots, never values.
    const std::pair<double, CachePolicy::Kind> runs[] = {{1.0, CachePolicy::Kind::kLru},
                                                         {0.5, CachePolicy::Kind::kLru},
                                                         {0.1, CachePolicy::Kind::kLru},
                                                         {0.5, CachePolicy::Kind::kLrfu},
                                                         {0.1, CachePolicy::Kind::kLrfu}};
    for (const auto& [fraction, policy] : runs) {
      SCOPED_TRACE(std::string(name) + " budget fraction " + std::to_string(fraction) + " policy " +
                   cache_policy_name(policy));
      cuda::CudaOptions o;
      o.cache_mib = fraction == 1.0 ? 0 : budget_mib(*model, fraction);
      o.cache_policy = policy;
      auto gpu = cuda::make_cuda_backend(model, o);
      EXPECT_EQ(gpu->stats().fully_resident, fraction == 1.0);
      auto a = cpu->new_session(256), b = gpu->new_session(256);
      ASSERT_NO_FATAL_FAILURE(
          expect_matches_oracle(*a, *b, prompt(37, n_vocab, 1), n_vocab, 12, fixture_max_rel_rms(name)));
      const auto st = gpu->stats();
      if (fraction < 1.0) {
        EXPECT_GT(st.cache.misses, 0u);
      }
      EXPECT_GT(st.decode_bytes_per_token, 0u);
    }
  }
  RL_SKIP_IF_FIXTURE_MODEL_MISSING();
}

// Every ggml type on the GPU in a whole model: a tiny model of `redlite synth`'s all-types recipe
// (its matrices cycle through all 23 types; tests/synth checks the table), written to a temp dir,
// against the oracle within 1e-5 relative RMS (prefill at every position and greedy decode), the
// same top-1 and router selections; fully resident and with the experts streamed through a cache
// of about a third of them.
TEST(CudaBackend, AllTypesSynthModelMatchesTheOracle) {
  RL_REQUIRE_GPU();
  synth::Options so;
  so.preset = "tiny";
  so.recipe = "all-types";
  const test::SynthModelFile file("cuda-all-types", so);
  const auto& model = file.model;
  const int n_vocab = model->config().n_vocab;
  auto cpu = cpu::make_cpu_backend(model, 0);
  for (double fraction : {1.0, 0.3}) {
    SCOPED_TRACE("budget fraction " + std::to_string(fraction));
    cuda::CudaOptions o;
    o.cache_mib = fraction == 1.0 ? 0 : budget_mib(*model, fraction);
    auto gpu = cuda::make_cuda_backend(model, o);
    EXPECT_EQ(gpu->stats().fully_resident, fraction == 1.0);
    auto a = cpu->new_session(256), b = gpu->new_session(256);
    ASSERT_NO_FATAL_FAILURE(expect_matches_oracle(*a, *b, prompt(41, n_vocab, 2), n_vocab, 8, 1e-5));
  }
}

// The dense Q4_K products on X32 (x32_always: every product of the type, since the
// fixtures' products are too small for the default's rule of a block per SM) against the oracle on
// both fixtures: a prefill's logits at every position and greedy decode within 1e-5 relative RMS
// (the fixtures' parity prompts measured 7.7e-7 and 1.2e-6 with these products, eighth session)
// with the same top-1, the same router selections; and the products did run.
TEST(CudaBackend, X32ProductsMatchTheOracle) {
  RL_REQUIRE_GPU();
  if (cuda::device_info().cc_major < 9) GTEST_SKIP() << "matmul_x32 needs compute capability 9.0";
  RL_REQUIRE_FIXTURE_MODELS();
  const auto models = fixture_models();
  for (const auto& [name, path] : models) {
    SCOPED_TRACE(name);
    auto model = Model::open(path);
    const int n_vocab = model->config().n_vocab;
    auto cpu = cpu::make_cpu_backend(model, 0);
    cuda::CudaOptions o;
    o.x32_always = true;
    auto gpu = cuda::make_cuda_backend(model, o);
    auto a = cpu->new_session(256), b = gpu->new_session(256);
    const auto toks = prompt(45, n_vocab, 3);
    ASSERT_NO_FATAL_FAILURE(expect_matches_oracle(*a, *b, toks, n_vocab, 8, 1e-5));
    EXPECT_GT(gpu->stats().x32_products, 0u);
  }
  RL_SKIP_IF_FIXTURE_MODEL_MISSING();
}

// The GPU-routed decode (one CUDA graph per token) runs the synchronous path's kernels with the
// routing moved to the GPU, so its logits must be bit-identical to the synchronous path's: fully
// resident (every token GPU-routed) and at half the experts (tokens that select a non-resident
// expert are discarded, their states restored and recomputed), over two passes so the second
// runs on a warm cache.
TEST(CudaBackend, GpuRoutedDecodeEqualsSynchronousPath) {
  RL_REQUIRE_GPU();
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto model = Model::open(path);
  const int n_vocab = model->config().n_vocab;
  for (double fraction : {1.0, 0.5}) {
    SCOPED_TRACE("budget fraction " + std::to_string(fraction));
    cuda::CudaOptions on, off;
    on.cache_mib = off.cache_mib = fraction == 1.0 ? 0 : budget_mib(*model, fraction);
    off.speculation = cuda::CudaOptions::Speculation::kOff;
    // Half the experts: every decode token tries the graph, so tokens that select a non-resident
    // expert go through the discard / restore / recompute path.
    if (fraction < 1.0) on.speculation = cuda::CudaOptions::Speculation::kAlways;
    auto routed = cuda::make_cuda_backend(model, on), sync = cuda::make_cuda_backend(model, off);
    auto a = routed->new_session(128), b = sync->new_session(128);
    ASSERT_NO_FATAL_FAILURE(expect_identical_passes(*a, *b, prompt(9, n_vocab, 3), 16));
    const auto st = routed->stats();
    std::printf("budget %.1f: %llu GPU-routed tokens, %llu discarded\n", fraction,
                (unsigned long long)st.gpu_routed_tokens, (unsigned long long)st.gpu_routed_fallbacks);
    if (fraction == 1.0) {
      EXPECT_EQ(st.gpu_routed_tokens, 32u);
      EXPECT_EQ(st.gpu_routed_fallbacks, 0u);
      EXPECT_DOUBLE_EQ(st.cache.hit_rate(), 1.0);
    } else {
      EXPECT_GT(st.gpu_routed_fallbacks, 0u) << "the discard path was not exercised";
      EXPECT_EQ(st.gpu_routed_tokens + st.gpu_routed_fallbacks, 32u);
    }
    EXPECT_EQ(sync->stats().gpu_routed_tokens, 0u);
  }
}

// --miss-reads host: every decode token is the GPU-routed graph, whose kernels read a miss in place
// from the experts' copy in page-locked host memory (the same bytes as a slot's), so its logits are
// the synchronous path's bit for bit, with no token discarded, at any budget and any admission
// (0: the cache keeps what the prefill brought; 16: some misses come in after each token, from the
// host copy; -1: the commands' adaptive count, 16 or 64 by the recent hit rate). A cache that holds
// every expert keeps no host copy.
TEST(CudaBackend, MissesReadInPlaceEqualTheSynchronousPath) {
  RL_REQUIRE_GPU();
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto model = Model::open(path);
  const int n_vocab = model->config().n_vocab;
  for (double fraction : {1.0, 0.5, 0.1}) {
    for (int admit : {0, 16, -1}) {
      SCOPED_TRACE("budget fraction " + std::to_string(fraction) + ", --miss-admit " + std::to_string(admit));
      cuda::CudaOptions host, sync_opts;
      host.cache_mib = sync_opts.cache_mib = fraction == 1.0 ? 0 : budget_mib(*model, fraction);
      host.miss_reads = cuda::CudaOptions::MissReads::kHost;
      host.miss_admit = admit;
      sync_opts.speculation = cuda::CudaOptions::Speculation::kOff;
      auto in_place = cuda::make_cuda_backend(model, host), sync = cuda::make_cuda_backend(model, sync_opts);
      auto a = in_place->new_session(128), b = sync->new_session(128);
      ASSERT_NO_FATAL_FAILURE(expect_identical_passes(*a, *b, prompt(9, n_vocab, 3), 16));
      const auto st = in_place->stats();
      std::printf("budget %.1f, admit %d: %llu GPU-routed tokens, %llu misses read in place, %llu bypassed, "
                  "hit rate %.3f\n", fraction, admit, (unsigned long long)st.gpu_routed_tokens,
                  (unsigned long long)st.misses_read_in_place, (unsigned long long)st.cache.bypassed,
                  st.cache.hit_rate());
      EXPECT_EQ(st.gpu_routed_tokens, 32u);
      EXPECT_EQ(st.gpu_routed_fallbacks, 0u);
      if (fraction == 1.0) {
        EXPECT_FALSE(st.host_misses);
        EXPECT_EQ(st.misses_read_in_place, 0u);
        continue;
      }
      EXPECT_TRUE(st.host_misses);
      EXPECT_GT(st.misses_read_in_place, 0u) << "no miss was read in place";
      if (admit == 0) EXPECT_EQ(st.cache.bypassed, st.misses_read_in_place);
      else EXPECT_LT(st.cache.bypassed, st.misses_read_in_place) << "no miss was brought in";
      // A decode alone: every selection counted once, as a hit, a miss brought in (at most
      // `admit` a token) or a miss left in host memory (bypassed), and every miss read in place.
      a->reset();
      auto logits = a->prefill(prompt(9, n_vocab, 3), nullptr);
      in_place->reset_stats();
      for (int i = 0; i < 8; i++) logits = a->decode(argmax(logits));
      const auto d = in_place->stats();
      const Config& cfg = model->config();
      EXPECT_EQ(d.cache.hits + d.cache.misses, 8ull * cfg.n_layer * cfg.n_expert_used);
      EXPECT_EQ(d.cache.misses, d.misses_read_in_place);
      const int most = admit < 0 ? AdaptiveAdmission::kAdmitHigh : admit;
      EXPECT_LE(d.cache.misses - d.cache.bypassed, 8ull * most);
      if (admit < 0)
        EXPECT_TRUE(d.miss_admit_last == AdaptiveAdmission::kAdmitLow || d.miss_admit_last == AdaptiveAdmission::kAdmitHigh)
            << d.miss_admit_last;
      else
        EXPECT_EQ(d.miss_admit_last, admit);
    }
  }
}

// The same in the fast tier (its fp32 routing, Q8 products and f16 KV): at different budgets and
// admissions different selections miss and are read in place, while every prefill is the same
// host-routed pass and every decode token the same graph, so the logits must not change: a miss
// read from the wrong place (another expert's copy, another layer's) would change them.
TEST(CudaBackend, MissesReadInPlaceDoNotDependOnTheBudgetInTheFastTier) {
  RL_REQUIRE_GPU();
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto model = Model::open(path);
  const int n_vocab = model->config().n_vocab;
  auto options = [&](double fraction, int admit) {
    cuda::CudaOptions o;
    o.numerics = Numerics::kFast;
    o.kv_type = KvType::kF16;
    o.cache_mib = budget_mib(*model, fraction);
    o.miss_reads = cuda::CudaOptions::MissReads::kHost;
    o.miss_admit = admit;
    return o;
  };
  auto reference = cuda::make_cuda_backend(model, options(0.5, 16));
  auto b = reference->new_session(128);
  for (auto [fraction, admit] : {std::pair{0.1, 0}, std::pair{0.1, 64}}) {
    SCOPED_TRACE("budget fraction " + std::to_string(fraction) + ", --miss-admit " + std::to_string(admit));
    auto in_place = cuda::make_cuda_backend(model, options(fraction, admit));
    auto a = in_place->new_session(128);
    b->reset();
    ASSERT_NO_FATAL_FAILURE(expect_identical_runs(*a, *b, prompt(9, n_vocab, 3), false, 16));
    const auto st = in_place->stats();
    EXPECT_TRUE(st.host_misses);
    EXPECT_EQ(st.gpu_routed_tokens, 16u);
    EXPECT_GT(st.misses_read_in_place, 0u) << "no miss was read in place";
  }
  EXPECT_GT(reference->stats().misses_read_in_place, 0u);
}

// Copy overlap (the resident experts' kernels before the copies land, the missed ones after) only
// moves where each expert's rows sit: the logits and the cache's decisions must be the same as
// with every expert waiting for the copies, prefill and decode, on bounded caches. Both fixtures:
// the IQ one takes the X24 expert products (each batch converts its own rows of the SwiGLU output).
TEST(CudaBackend, CopyOverlapLeavesLogitsUnchanged) {
  RL_REQUIRE_GPU();
  RL_REQUIRE_FIXTURE_MODELS();
  const auto models = fixture_models();
  for (const auto& [name, path] : models) {
    auto model = Model::open(path);
    const int n_vocab = model->config().n_vocab;
    for (double fraction : {0.5, 0.1}) {
      SCOPED_TRACE(std::string(name) + " budget fraction " + std::to_string(fraction));
      cuda::CudaOptions on, off;
      on.cache_mib = off.cache_mib = budget_mib(*model, fraction);
      on.speculation = off.speculation = cuda::CudaOptions::Speculation::kOff;
      // (No prefetch, which needs the overlap: both make the same reservations, compared below.)
      on.prefetch = off.prefetch = cuda::CudaOptions::Prefetch::kOff;
      off.overlap_copies = false;
      auto with = cuda::make_cuda_backend(model, on), without = cuda::make_cuda_backend(model, off);
      auto a = with->new_session(128), b = without->new_session(128);
      ASSERT_NO_FATAL_FAILURE(expect_identical_runs(*a, *b, prompt(40, n_vocab, 5), true, 16));
      const auto sa = with->stats().cache, sb = without->stats().cache;
      EXPECT_GT(sa.misses, 0u) << "no copies: the overlap was not exercised";
      EXPECT_EQ(sa.hits, sb.hits);
      EXPECT_EQ(sa.misses, sb.misses);
      EXPECT_EQ(sa.bytes_copied, sb.bytes_copied);
    }
  }
  RL_SKIP_IF_FIXTURE_MODEL_MISSING();
}

using Prefetch = cuda::CudaOptions::Prefetch;

// Prediction and prefetch (--prefetch early and late) keep the exact tier on the oracle at every
// budget (the prediction has buffers of its own; each layer routes on its own input), and on a
// bounded cache they predict every decode layer but the first from the layer before, copy the
// predicted misses ahead and find some of those copies used.
TEST(CudaBackend, PrefetchMatchesOracleAtSeveralBudgets) {
  RL_REQUIRE_GPU();
  RL_REQUIRE_FIXTURE_MODELS();
  const auto models = fixture_models();
  for (const auto& [name, path] : models) {
    auto model = Model::open(path);
    const Config& c = model->config();
    auto cpu = cpu::make_cpu_backend(model, 0);
    for (Prefetch when : {Prefetch::kEarly, Prefetch::kLate}) {
      for (double fraction : {1.0, 0.5, 0.1}) {
        SCOPED_TRACE(std::string(name) + " --prefetch " + cuda::prefetch_name(when) + " budget fraction " +
                     std::to_string(fraction));
        cuda::CudaOptions o;
        o.cache_mib = fraction == 1.0 ? 0 : budget_mib(*model, fraction);
        o.prefetch = when;
        auto gpu = cuda::make_cuda_backend(model, o);
        auto a = cpu->new_session(256), b = gpu->new_session(256);
        const int steps = 12;
        ASSERT_NO_FATAL_FAILURE(
            expect_matches_oracle(*a, *b, prompt(37, c.n_vocab, 1), c.n_vocab, steps, fixture_max_rel_rms(name)));
        const auto st = gpu->stats().cache;
        std::printf("%s --prefetch %s, budget %.1f: hit rate %.3f, %llu predicted, accuracy %.3f, %llu prefetched, "
                    "%llu used, %llu wasted\n",
                    name.c_str(), cuda::prefetch_name(when), fraction, st.hit_rate(),
                    (unsigned long long)st.predicted,
                    st.predicted ? (double)st.predicted_used / (double)st.predicted : 0.0,
                    (unsigned long long)st.prefetched, (unsigned long long)st.prefetch_hits,
                    (unsigned long long)st.prefetch_wasted);
        if (fraction == 1.0) {
          EXPECT_EQ(st.predicted, 0u) << "every expert is resident: nothing to predict";
        } else {
          EXPECT_EQ(st.predicted, (uint64_t)steps * (c.n_layer - 1) * std::min(c.n_expert_used, o.prefetch_experts));
          EXPECT_GT(st.prefetched, 0u);
          EXPECT_GT(st.prefetch_hits, 0u) << "no prefetched expert was used";
          EXPECT_EQ(st.prefetched, st.prefetch_hits + st.prefetch_wasted);
        }
      }
    }
  }
  RL_SKIP_IF_FIXTURE_MODEL_MISSING();
}

// The prediction changes no value in either tier: with --prefetch early and late the logits are
// bit-identical to --prefetch off (prefill with every position's logits, then decode) on bounded
// caches (half the experts under LRU, a tenth under LRFU), and the layers reserve the same
// selections (hits + misses), some found prefetched.
TEST(CudaBackend, PrefetchLeavesLogitsUnchanged) {
  RL_REQUIRE_GPU();
  RL_REQUIRE_FIXTURE_MODELS();
  const auto models = fixture_models();
  for (const auto& [name, path] : models) {
    auto model = Model::open(path);
    const int n_vocab = model->config().n_vocab;
    for (Numerics numerics : {Numerics::kExact, Numerics::kFast}) {
      for (Prefetch when : {Prefetch::kEarly, Prefetch::kLate}) {
        for (double fraction : {0.5, 0.1}) {
          SCOPED_TRACE(std::string(name) + " " + numerics_name(numerics) + " --prefetch " +
                       cuda::prefetch_name(when) + " budget fraction " + std::to_string(fraction));
          cuda::CudaOptions on, off;
          on.cache_mib = off.cache_mib = budget_mib(*model, fraction);
          on.cache_policy = off.cache_policy = fraction < 0.5 ? CachePolicy::Kind::kLrfu : CachePolicy::Kind::kLru;
          on.numerics = off.numerics = numerics;
          on.kv_type = off.kv_type = numerics == Numerics::kFast ? KvType::kF16 : KvType::kF32;
          on.prefetch = when;
          // Every prediction copied ahead (early), and the top 3 only (late).
          on.prefetch_experts = when == Prefetch::kEarly ? model->config().n_expert_used : 3;
          off.prefetch = Prefetch::kOff;
          auto with = cuda::make_cuda_backend(model, on), without = cuda::make_cuda_backend(model, off);
          auto a = with->new_session(128), b = without->new_session(128);
          ASSERT_NO_FATAL_FAILURE(expect_identical_runs(*a, *b, prompt(40, n_vocab, 5), true, 16));
          const auto sa = with->stats().cache, sb = without->stats().cache;
          EXPECT_EQ(sa.hits + sa.misses, sb.hits + sb.misses);
          EXPECT_GT(sa.prefetch_hits, 0u);
          EXPECT_EQ(sb.predicted, 0u);
        }
      }
    }
  }
  RL_SKIP_IF_FIXTURE_MODEL_MISSING();
}

// The prefill's grouping by expert on the GPU (every expert resident) runs the same products on
// the same rows as the host's grouping: logits bit for bit — a traced prefill of two chunks
// (512 + 88), an untraced one with every position's logits, decode after each — the same router
// selections in the trace and the same hit count, on both fixtures (the IQ one takes the X24
// expert products, the other the fp64 ones).
TEST(CudaBackend, GpuGroupedPrefillEqualsHostGrouping) {
  RL_REQUIRE_GPU();
  RL_REQUIRE_FIXTURE_MODELS();
  const auto models = fixture_models();
  for (const auto& [name, path] : models) {
    SCOPED_TRACE(name);
    auto model = Model::open(path);
    cuda::CudaOptions on, off;
    on.prefill_chunk = off.prefill_chunk = 512;
    off.gpu_grouping = false;
    auto grouped = cuda::make_cuda_backend(model, on), host = cuda::make_cuda_backend(model, off);
    ASSERT_TRUE(grouped->stats().fully_resident);
    ASSERT_TRUE(host->stats().fully_resident);
    auto a = grouped->new_session(700), b = host->new_session(700);
    RouterRecorder ra, rb;
    a->set_trace(&ra);
    b->set_trace(&rb);
    ASSERT_NO_FATAL_FAILURE(expect_identical_runs(*a, *b, prompt(600, model->config().n_vocab, 4), false, 4));
    EXPECT_EQ(ra.topk, rb.topk);
    a->set_trace(nullptr);
    b->set_trace(nullptr);
    // Without a trace the grouped layers never wait for the host; every position's logits.
    a->reset();
    b->reset();
    ASSERT_NO_FATAL_FAILURE(expect_identical_runs(*a, *b, prompt(300, model->config().n_vocab, 5), true, 4));
    EXPECT_EQ(grouped->stats().cache.hits, host->stats().cache.hits);
    EXPECT_EQ(grouped->stats().cache.misses, 0u);
    // Both prefills of the grouped backend took the GPU grouping (every layer of every chunk),
    // the other backend never.
    uint64_t layers = 0;  // the MoE layers
    for (const LayerWeights& l : model->layers) layers += l.moe.gate_exps.present();
    EXPECT_EQ(grouped->stats().gpu_grouped_layers, (2 + 1) * layers);
    EXPECT_EQ(host->stats().gpu_grouped_layers, 0u);
  }
  RL_SKIP_IF_FIXTURE_MODEL_MISSING();
}

// --prefill-chunk: a prompt in passes of 97 tokens (7 passes for 600, boundaries inside every
// 512-token stretch) against one pass of 600 (the default 2048 holds it): the same router
// selections at every position, the last logits within the exact tier's products' rounding (the
// plan of a 97-token pass may take other kernels than a 600-token one's); a session reports its
// backend's chunk, and a chunk outside 1 .. kMaxPrefillChunk is refused at construction.
TEST(CudaBackend, PrefillChunkSplitsThePasses) {
  RL_REQUIRE_GPU();
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto model = Model::open(path);
  cuda::CudaOptions small;
  small.prefill_chunk = 97;
  auto a = cuda::make_cuda_backend(model, small), b = cuda::make_cuda_backend(model, {});
  auto sa = a->new_session(700), sb = b->new_session(700);
  EXPECT_EQ(sa->prefill_chunk(), 97);
  EXPECT_EQ(sb->prefill_chunk(), 2048);
  RouterRecorder ra, rb;
  sa->set_trace(&ra);
  sb->set_trace(&rb);
  const auto toks = prompt(600, model->config().n_vocab, 6);
  const auto la = sa->prefill(toks), lb = sb->prefill(toks);
  EXPECT_EQ(ra.topk.size(), 7 * rb.topk.size());  // 7 passes a layer against 1
  EXPECT_FALSE(rb.layers.by_layer.empty());
  EXPECT_EQ(ra.layers.by_layer, rb.layers.by_layer);
  EXPECT_LE(relative_rms(la, lb), 1e-6);
  for (int bad : {0, -1, cuda::kMaxPrefillChunk + 1}) {
    cuda::CudaOptions o;
    o.prefill_chunk = bad;
    try {
      cuda::make_cuda_backend(model, o);
      ADD_FAILURE() << "a prefill chunk of " << bad << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--prefill-chunk"), std::string::npos) << e.what();
    }
  }
}

TEST(CudaBackend, SnapshotRestoreAndChunkedPrefill) {
  RL_REQUIRE_GPU();
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto model = Model::open(path);
  cuda::CudaOptions o;
  o.prefill_chunk = 512;
  auto gpu = cuda::make_cuda_backend(model, o);
  auto s = gpu->new_session(1200);
  ASSERT_EQ(s->prefill_chunk(), 512);
  const auto toks = prompt(600, model->config().n_vocab, 2);  // two chunks: 512 + 88
  auto whole = s->prefill(toks);
  s->reset();
  s->prefill(std::span(toks).subspan(0, 300));
  auto snap = s->snapshot();
  auto rest = s->prefill(std::span(toks).subspan(300));
  EXPECT_LE(relative_rms(rest, whole), 1e-5);
  s->decode(5);
  s->restore(*snap);
  EXPECT_EQ(s->position(), 300);
  auto again = s->prefill(std::span(toks).subspan(300));
  EXPECT_EQ(again, rest);
}

TEST(CudaBackend, RefusesBudgetsThatDoNotFit) {
  RL_REQUIRE_GPU();
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto model = Model::open(path);
  size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  for (int64_t mib : {(int64_t)(free_b >> 20) + 1024, (int64_t)1}) {  // more than free; < k experts
    SCOPED_TRACE(mib);
    cuda::CudaOptions o;
    o.cache_mib = mib;
    try {
      cuda::make_cuda_backend(model, o);
      FAIL() << "expected rl::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--cache-mib"), std::string::npos) << e.what();
    }
  }
  // The process goes on: a fitting budget works after the refusals.
  auto gpu = cuda::make_cuda_backend(model, {});
  EXPECT_TRUE(gpu->stats().fully_resident);
}

TEST(CudaBackend, TruncatedFileEndsTheRequestAndProcessStaysUsable) {
  RL_REQUIRE_GPU();
  const std::string src = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(src);
  const std::string copy = std::filesystem::temp_directory_path() / "redlite-truncate-test.gguf";
  std::filesystem::copy_file(src, copy, std::filesystem::copy_options::overwrite_existing);
  {
    auto model = Model::open(copy);
    cuda::CudaOptions o;
    o.cache_mib = budget_mib(*model, 0.1);
    o.preload = false;
    auto gpu = cuda::make_cuda_backend(model, o);
    auto s = gpu->new_session(64);
    std::filesystem::resize_file(copy, std::filesystem::file_size(copy) / 2);
    EXPECT_THROW(s->prefill(prompt(5, model->config().n_vocab, 3)), Error);
  }
  std::filesystem::remove(copy);
  // The process goes on: another backend on an intact file works.
  auto model = Model::open(src);
  auto gpu = cuda::make_cuda_backend(model, {});
  auto s = gpu->new_session(64);
  EXPECT_EQ(s->prefill(prompt(5, model->config().n_vocab, 3)).size(), (size_t)model->config().n_vocab);
}

}  // namespace
}  // namespace rl
