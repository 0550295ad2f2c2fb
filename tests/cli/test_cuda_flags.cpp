// The CUDA backend's flags as the command line parses them (no GPU needed): listed by --help,
// accepted with their documented values (on the CPU backend, which ignores them), a value that
// names no setting refused with the flag's name; `inspect --plan` prints the layer plan on a GPU
// and fails with a message naming the reason anywhere else.
#include <gtest/gtest.h>

#include <string>

#include "cuda/cuda_options.h"
#include "test_util.h"

namespace {

using rl::test::run_redlite;

TEST(CudaFlags, HelpListsThem) {
  const auto r = run_redlite("bench --help");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const char* flag : {"--no-preload", "--speculation", "--profile", "--x32-always", "--cache-mib", "--cache-policy",
                           "--prefetch", "--prefetch-experts", "--prefill-chunk", "--miss-reads", "--miss-admit"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << " missing from:\n" << r.out;
}

// The commands read a bounded cache's misses from the host copy by default (CudaOptions itself
// defaults to copy); the help says which. Behaviour: `bench --json` reports "miss_reads" on a GPU.
TEST(CudaFlags, HelpNamesHostAsTheMissReadsDefault) {
  const auto r = run_redlite("bench --help");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const size_t flag = r.out.find("--miss-reads");
  ASSERT_NE(flag, std::string::npos) << r.out;
  const size_t host = r.out.find("host (default", flag), copy = r.out.find("copy (default", flag);
  EXPECT_NE(host, std::string::npos) << r.out;
  EXPECT_EQ(copy, std::string::npos) << r.out;
  EXPECT_EQ(rl::cuda::CudaOptions{}.miss_reads, rl::cuda::CudaOptions::MissReads::kCopy);
}

// The commands leave --prefetch-experts to the path and the cache: where the GPU-routed token
// stages its misses from the host copy 6, or 4 below a quarter of the experts cached (the 80B at
// --cache-mib 2048 holds about a tenth of them: 2,361 slots of 24,576 experts, H100 bench); 8 where a
// layer's misses are copied, whatever the cache (the counts measured for each, cuda_options.h). A
// given count is used everywhere; CudaOptions itself keeps 8. The help names the defaults.
TEST(CudaFlags, PrefetchExpertsDefaultFollowsTheMissPathAndTheCache) {
  using rl::cuda::CudaOptions;
  using rl::cuda::prefetch_count;
  CudaOptions unset;
  unset.prefetch_experts = 0;
  EXPECT_EQ(prefetch_count(unset, true, 2361.0 / 24576), 4);
  EXPECT_EQ(prefetch_count(unset, true, 0.2499), 4);
  EXPECT_EQ(prefetch_count(unset, true, 0.25), 6);
  EXPECT_EQ(prefetch_count(unset, true, 0.38), 6);
  EXPECT_EQ(prefetch_count(unset, false, 0.096), 8);
  EXPECT_EQ(prefetch_count(unset, false, 0.38), 8);
  CudaOptions given;
  given.prefetch_experts = 3;
  for (const bool staged : {true, false})
    for (const double share : {0.05, 0.5}) EXPECT_EQ(prefetch_count(given, staged, share), 3);
  EXPECT_EQ(CudaOptions{}.prefetch_experts, 8);
  EXPECT_EQ(prefetch_count(CudaOptions{}, true, 0.05), 8);
  const auto r = run_redlite("bench --help");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const size_t flag = r.out.find("--prefetch-experts");
  ASSERT_NE(flag, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("default: with --miss-reads host 6, or 4 where the cache holds under a quarter of the "
                       "experts; 8 with copy",
                       flag),
            std::string::npos)
      << r.out;
}

// The commands adapt --miss-admit to the decode hit rate unless given a count (cache/admission.h;
// CudaOptions keeps 16); the help says so with the counts and the threshold.
TEST(CudaFlags, HelpNamesTheAdaptiveMissAdmitDefault) {
  const auto r = run_redlite("bench --help");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const size_t flag = r.out.find("--miss-admit");
  ASSERT_NE(flag, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(default: 16, or 64 while the hit rate of the recent decode tokens is at least 0.6)", flag),
            std::string::npos)
      << r.out;
  EXPECT_EQ(rl::cuda::CudaOptions{}.miss_admit, 16);
}

TEST(CudaFlags, DocumentedValuesAreAccepted) {
  const std::string model = rl::test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  const std::string out = rl::test::temp_path("cuda-flags", "logits.f32");
  for (const char* speculation : {"off", "resident", "warm", "always"}) {
    const auto r = run_redlite("logits -m '" + model + "' --backend cpu --tokens 1,2 --out '" + out +
                                    "' --no-preload --profile --x32-always --speculation " + speculation);
    EXPECT_EQ(r.exit_code, 0) << speculation << ": " << r.out;
  }
  for (const char* policy : {"lru", "lrfu"}) {
    const auto r = run_redlite("logits -m '" + model + "' --backend cpu --tokens 1,2 --out '" + out +
                               "' --cache-policy " + policy);
    EXPECT_EQ(r.exit_code, 0) << policy << ": " << r.out;
  }
  for (const char* chunk : {"1", "512", "8192"}) {
    const auto r = run_redlite("logits -m '" + model + "' --backend cpu --tokens 1,2 --out '" + out +
                               "' --prefill-chunk " + chunk);
    EXPECT_EQ(r.exit_code, 0) << chunk << ": " << r.out;
  }
  for (const char* reads : {"copy --miss-admit 0", "host", "host --miss-admit 512"}) {
    const auto r = run_redlite("logits -m '" + model + "' --backend cpu --tokens 1,2 --out '" + out +
                               "' --miss-reads " + reads);
    EXPECT_EQ(r.exit_code, 0) << reads << ": " << r.out;
  }
  for (const char* prefetch : {"off", "on", "early", "late"}) {
    const auto r = run_redlite("logits -m '" + model + "' --backend cpu --tokens 1,2 --out '" + out +
                               "' --prefetch-experts 3 --prefetch " + prefetch);
    EXPECT_EQ(r.exit_code, 0) << prefetch << ": " << r.out;
  }
  rl::test::remove_temp(out);
}

TEST(CudaFlags, UnknownSpeculationIsRefusedNamingTheFlag) {
  for (const char* bad : {"2", "on", "Warm"}) {
    const auto r = run_redlite(std::string("bench -m none.gguf --speculation ") + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.out.find("--speculation"), std::string::npos) << bad << ": " << r.out;
  }
}

TEST(CudaFlags, PrefillChunkOutOfRangeIsRefusedNamingTheFlag) {
  for (const char* bad : {"0", "-5", "8193", "many"}) {
    const auto r = run_redlite(std::string("bench -m none.gguf --prefill-chunk ") + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.out.find("--prefill-chunk"), std::string::npos) << bad << ": " << r.out;
  }
}

// The model's bound on the chunk (hand-computed: 65,535 gather rows over k experts a token).
TEST(CudaFlags, PrefillChunkIsBoundByTheExpertsATokenPass) {
  EXPECT_EQ(rl::cuda::max_prefill_chunk(10), 6553);  // the 80B: 6,553 × 10 = 65,530 rows
  EXPECT_EQ(rl::cuda::max_prefill_chunk(8), 8191);
  EXPECT_EQ(rl::cuda::max_prefill_chunk(4), rl::cuda::kMaxPrefillChunk);
  EXPECT_EQ(rl::cuda::max_prefill_chunk(512), 127);
  EXPECT_EQ(rl::cuda::max_prefill_chunk(0), rl::cuda::kMaxPrefillChunk);
}

TEST(CudaFlags, UnknownCachePolicyIsRefusedNamingTheFlag) {
  for (const char* bad : {"arc", "LRU", "1"}) {
    const auto r = run_redlite(std::string("bench -m none.gguf --cache-policy ") + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.out.find("--cache-policy"), std::string::npos) << bad << ": " << r.out;
  }
}

TEST(CudaFlags, UnknownPrefetchIsRefusedNamingTheFlag) {
  for (const char* bad : {"yes", "ON", "1", "moe"}) {
    const auto r = run_redlite(std::string("bench -m none.gguf --prefetch ") + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.out.find("--prefetch"), std::string::npos) << bad << ": " << r.out;
  }
  for (const char* bad : {"0", "-1", "513", "six"}) {
    const auto r = run_redlite(std::string("bench -m none.gguf --prefetch-experts ") + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.out.find("--prefetch-experts"), std::string::npos) << bad << ": " << r.out;
  }
}

TEST(CudaFlags, BadMissReadsIsRefusedNamingTheFlag) {
  for (const char* bad : {"mapped", "HOST", "1"}) {
    const auto r = run_redlite(std::string("bench -m none.gguf --miss-reads ") + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.out.find("--miss-reads"), std::string::npos) << bad << ": " << r.out;
  }
  for (const char* bad : {"-1", "513", "many"}) {
    const auto r = run_redlite(std::string("bench -m none.gguf --miss-admit ") + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.out.find("--miss-admit"), std::string::npos) << bad << ": " << r.out;
  }
}

TEST(InspectPlan, PrintsThePlanOrSaysWhyNot) {
  const std::string model = rl::test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  auto r = run_redlite("inspect '" + model + "' --plan --backend cpu");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--plan --backend cpu: only the cuda backend has a layer plan"), std::string::npos) << r.out;
  r = run_redlite("inspect '" + model + "' --plan --backend cuda --cache-mib 0");
  if (r.exit_code == 0) {  // a GPU machine: both plans, a line per layer (the fixture has 4 + 1 MTP blocks)
    for (const char* part :
         {"prefill chunk (2048 tokens)", "decode (1 token)", "layer  0 deltanet", "layer  3 attention", "lm_head="})
      EXPECT_NE(r.out.find(part), std::string::npos) << part << " not in:\n" << r.out;
  } else {
    EXPECT_EQ(r.exit_code, 1) << r.out;
    const bool no_device = r.out.find("--plan --backend cuda: no CUDA device is available") != std::string::npos;
    const bool no_backend = r.out.find("--plan --backend cuda: this redlite was built without the CUDA backend") !=
                            std::string::npos;
    EXPECT_TRUE(no_device || no_backend) << r.out;
  }
  // The plan's flags need --plan.
  r = run_redlite("inspect '" + model + "' --cache-mib 5");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--cache-mib requires --plan"), std::string::npos) << r.out;
}

}  // namespace
