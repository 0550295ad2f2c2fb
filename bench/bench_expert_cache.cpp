// The expert cache's bookkeeping per layer on a cache that holds every expert: ExpertCache::reserve
// + commit of one layer's experts, 48 layers of 512 as in the 80B model, requests of 10 distinct
// experts (a decode token) and of 500 (a 512-token prefill chunk selects nearly all of them). On
// the synchronous path the GPU waits while the host does this for every layer.
//
//   build-x/bench_expert_cache [--benchmark_filter=Reserve/500]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "cache/expert_cache.h"

namespace {

constexpr int kLayers = 48, kExperts = 512;

void bench_reserve(benchmark::State& state) {
  const int n = (int)state.range(0);
  rl::ExpertCache cache(kLayers, kExperts, 1, (size_t)kLayers * kExperts, 1);
  std::vector<int> all(kExperts);
  std::iota(all.begin(), all.end(), 0);
  for (int L = 0; L < kLayers; L++) {
    cache.reserve(L, all);
    cache.commit();
  }
  // One request per layer: n distinct experts in random order.
  std::mt19937 rng(1);
  std::vector<std::vector<int>> requests(kLayers);
  for (auto& r : requests) {
    r = all;
    std::shuffle(r.begin(), r.end(), rng);
    r.resize(n);
  }
  int L = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(cache.reserve(L, requests[L]).entries.data());
    cache.commit();
    L = (L + 1) % kLayers;
  }
  state.SetItemsProcessed(state.iterations());  // layers
}
BENCHMARK(bench_reserve)->Name("Reserve")->Arg(10)->Arg(500);

}  // namespace

BENCHMARK_MAIN();
