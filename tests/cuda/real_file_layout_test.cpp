// The GPU backend on two layouts the published Qwen3-Next GGUFs use: the shared-expert gate
// ffn_gate_inp_shexp stored as F16 (synth recipe q4km-shexp-f16), matched against the CPU oracle;
// and a split model (three shards written here), whose logits must equal the unsplit file's on
// the GPU bit for bit, with a small expert cache so that experts are copied from every shard.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "backend_test_util.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "gguf_split_writer.h"
#include "gpu_test_util.h"
#include "model/model.h"
#include "model/parity.h"
#include "synth/synth.h"
#include "test_util.h"

namespace rl {
namespace {

TEST(CudaRealLayouts, F16SharedExpertGateMatchesTheOracle) {
  RL_REQUIRE_GPU();
  synth::Options o;
  o.preset = "tiny";
  o.recipe = "q4km-shexp-f16";
  const test::SynthModelFile file("cuda-layouts", o);
  const auto& model = file.model;
  const int n_vocab = model->config().n_vocab;
  auto cpu_backend = cpu::make_cpu_backend(model, 0);
  auto gpu_backend = cuda::make_cuda_backend(model, cuda::CudaOptions{});
  auto cpu = cpu_backend->new_session(128);
  auto gpu = gpu_backend->new_session(128);
  std::vector<float> a, b;
  const auto toks = test::prompt(29, n_vocab, 1);
  cpu->prefill(toks, &a);
  gpu->prefill(toks, &b);
  EXPECT_LE(relative_rms(b, a), 1e-3);
  for (size_t p = 0; p < toks.size(); p++)
    EXPECT_EQ(argmax(std::span(b).subspan(p * n_vocab, n_vocab)),
              argmax(std::span(a).subspan(p * n_vocab, n_vocab)))
        << "position " << p;
}

TEST(CudaRealLayouts, SplitModelGivesTheUnsplitLogits) {
  RL_REQUIRE_GPU();
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  const std::string prefix = test::temp_path("cuda-layouts", "split");
  test::write_split(*GgufFile::open(path), prefix, 3);
  auto whole = Model::open(path);
  auto split = Model::open(test::shard_path(prefix, 0, 3));
  // A cache of a tenth of the experts: misses on every layer, so experts are copied from all
  // three shards' mappings.
  cuda::CudaOptions small;
  small.cache_mib = test::budget_mib(*whole, 0.1);
  for (const cuda::CudaOptions& opt : {cuda::CudaOptions{}, small}) {
    auto backend_a = cuda::make_cuda_backend(whole, opt);
    auto backend_b = cuda::make_cuda_backend(split, opt);
    auto a = backend_a->new_session(128);
    auto b = backend_b->new_session(128);
    const auto toks = test::prompt(23, whole->config().n_vocab, 1);
    std::vector<float> all_a, all_b;  // every position's logits
    std::vector<float> la = a->prefill(toks, &all_a), lb = b->prefill(toks, &all_b);
    EXPECT_EQ(all_a, all_b) << "cache_mib " << opt.cache_mib;
    ASSERT_EQ(la, lb) << "cache_mib " << opt.cache_mib;
    for (int step = 0; step < 6; step++) {
      const int32_t next = argmax(la);
      la = a->decode(next);
      lb = b->decode(next);
      ASSERT_EQ(la, lb) << "step " << step;
    }
  }
  for (int i = 0; i < 3; i++) std::filesystem::remove(test::shard_path(prefix, i, 3));
  test::remove_temp(prefix);
}

}  // namespace
}  // namespace rl
