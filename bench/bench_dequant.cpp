// Single-thread throughput of the reference dequantisers and dot products, one benchmark per ggml
// type, on the tensors of quant-zoo.gguf (32 rows x 1024 values of each type, made by ggml).
//
// A zoo tensor plus its fp32 output fits in L2, so these are compute-bound figures: what the
// CPU oracle's inner loop costs per value, not what DRAM can feed.
//
//   build-x/bench_dequant [--benchmark_filter=Dequantize/q4_K]
//
// bytes_per_second counts quantised input bytes; items_per_second counts values.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/quant.h"

namespace {

std::string zoo_path() {
  if (const char* e = std::getenv("REDLITE_FIXTURES"); e && *e) return std::string(e) + "/quant/quant-zoo.gguf";
  return std::string(REDLITE_SOURCE_DIR) + "/../shared/fixtures/quant/quant-zoo.gguf";
}

// Dequantise the whole tensor, row by row, into one fp32 buffer.
void bench_dequantize(benchmark::State& state, const rl::GgufTensorInfo* t) {
  const rl::QuantType& qt = rl::quant_type(t->type);
  const int64_t n = t->ne[0];
  const size_t row_bytes = rl::row_size(t->type, n);
  std::vector<float> out((size_t)t->n_elements());  // [rows][n]
  for (auto _ : state) {
    for (int64_t r = 0; r < t->n_rows(); r++)
      qt.dequantize_row(t->data + r * row_bytes, out.data() + r * n, n);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * (int64_t)t->nbytes);
  state.SetItemsProcessed(state.iterations() * t->n_elements());
}

// Dot every row with one fp32 vector (a matrix-vector product, as the CPU oracle does).
void bench_dot(benchmark::State& state, const rl::GgufTensorInfo* t) {
  const rl::QuantType& qt = rl::quant_type(t->type);
  const int64_t n = t->ne[0];
  const size_t row_bytes = rl::row_size(t->type, n);
  std::vector<float> x((size_t)n);  // [n]
  for (int64_t i = 0; i < n; i++) x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
  std::vector<float> y((size_t)t->n_rows());  // [rows]
  for (auto _ : state) {
    for (int64_t r = 0; r < t->n_rows(); r++) y[r] = qt.dot_row(t->data + r * row_bytes, x.data(), n);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * (int64_t)t->nbytes);
  state.SetItemsProcessed(state.iterations() * t->n_elements());
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::unique_ptr<rl::GgufFile> zoo;
  try {
    zoo = rl::GgufFile::open(zoo_path());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dequant: %s (set REDLITE_FIXTURES)\n", e.what());
    return 1;
  }
  for (const auto& t : zoo->tensors()) {
    const rl::QuantType* qt = rl::find_quant_type((uint32_t)t.type);
    if (!qt || !qt->dequantize_row) continue;
    benchmark::RegisterBenchmark((std::string("Dequantize/") + qt->name).c_str(), bench_dequantize, &t);
    benchmark::RegisterBenchmark((std::string("Dot/") + qt->name).c_str(), bench_dot, &t);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
