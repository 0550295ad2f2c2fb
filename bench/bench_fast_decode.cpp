// The CPU fast tier's one-token products (a decode step's) on a model's own matrices: for each kind
// of product of a Qwen3-Next layer, the weight bytes it reads per second.
//
//   build-x/bench_fast_decode MODEL.gguf [THREADS]
//
// Last, the thread pool's cost: the time of a run of 64 tasks of about 1 us each (ideal:
// 64 / THREADS us), what a decode step pays a few hundred times.
//
// Made for the 80B's widths (`redlite synth --preset 80b --recipe seed-mix --n-layer 4`): layer 0
// is a DeltaNet layer with IQ2_XS experts, layer 1 has IQ1_M gate/up experts, layer 3 is an
// attention layer. A layer's matrices (a few MB) stay in the last-level cache between repetitions,
// so those rows are compute-bound figures; the LM head (214 MB) is read from memory every time.
// The last column divides by the process's CPU time instead of the wall time: with one thread on
// a loaded machine it is the kernel's own rate, whatever share of the core the process got.
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "cpu/products.h"
#include "model/model.h"

namespace {

struct Case {
  std::string name;
  std::vector<rl::TensorView> matrices;  // one batch, as the forward pass forms it
};

// Ten experts' gate and up matrices of a layer (the decode step's first batch), or their down.
std::vector<rl::TensorView> ten_experts(const rl::MoeWeights& moe, bool down) {
  std::vector<rl::TensorView> out;
  for (int e = 0; e < 10; e++) {
    if (down) {
      out.push_back(moe.down_exps.matrix(7 * e));
    } else {
      out.push_back(moe.gate_exps.matrix(7 * e));
      out.push_back(moe.up_exps.matrix(7 * e));
    }
  }
  return out;
}

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void run(const Case& c, const rl::cpu::Products& products) {
  size_t bytes = 0, n_out = 0;
  int64_t n_in = 0;
  for (const rl::TensorView& W : c.matrices) bytes += W.nbytes, n_out += W.n_rows(), n_in = std::max(n_in, W.row_length());
  std::vector<float> x(n_in), out(n_out);
  for (size_t i = 0; i < x.size(); i++) x[i] = (float)((i * 7919) % 2001) / 1000.0f - 1.0f;
  std::vector<rl::cpu::ProductJob> jobs;
  for (size_t j = 0, row = 0; j < c.matrices.size(); row += c.matrices[j].n_rows(), j++)
    jobs.push_back({c.matrices[j], x.data(), 1, out.data() + row});
  products.matmul_batch(jobs);  // first touch of the mapping
  int reps = 0;
  double seconds = 0;
  const double cpu0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  do {
    products.matmul_batch(jobs);
    reps++;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (seconds < 0.5);
  const double cpu = cpu_seconds() - cpu0;
  std::printf("%-22s %-8s %8.1f MB %9.3f ms %7.2f GB/s %7.2f GB/s of CPU time\n", c.name.c_str(),
              rl::type_name(c.matrices[0].type), bytes / 1e6, seconds / reps * 1e3, bytes * (double)reps / seconds / 1e9,
              bytes * (double)reps / cpu / 1e9);
}

void pool_runs(rl::cpu::ThreadPool& pool) {
  std::atomic<int64_t> sink{0};
  const auto task = [&](int64_t t) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(1);
    while (std::chrono::steady_clock::now() < until) {
    }
    sink.fetch_add(t, std::memory_order_relaxed);
  };
  constexpr int kRuns = 5000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < kRuns; r++) pool.run(64, task);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kRuns;
  std::printf("thread pool: %.1f us per run of 64 tasks of 1 us (ideal %.1f)\n", us, 64.0 / pool.size());
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [THREADS]\n", argv[0]);
    return 2;
  }
  const auto model = rl::Model::open(argv[1]);
  if (model->layers.size() < 4) throw std::runtime_error("the model needs 4 layers (an attention layer at 3)");
  rl::cpu::ThreadPool pool(argc > 2 ? std::atoi(argv[2]) : 1);
  const auto products = rl::cpu::make_products(rl::Numerics::kFast, pool);
  const auto& l0 = model->layers[0];
  const std::vector<Case> cases = {
      {"lm_head", {model->output}},
      {"ssm_in (DeltaNet)", {l0.ssm.legacy_fused ? l0.ssm.in : l0.ssm.qkv}},
      {"ssm_out", {l0.ssm.out}},
      {"attn_q", {model->layers[3].attn.q}},
      {"router", {l0.moe.router}},
      {"10 experts gate+up", ten_experts(l0.moe, false)},
      {"10 experts gate+up", ten_experts(model->layers[1].moe, false)},
      {"10 experts down", ten_experts(l0.moe, true)},
      {"shared expert gate", {l0.moe.gate_shexp}},
      {"shared expert down", {l0.moe.down_shexp}},
  };
  std::printf("%d thread(s)\n", pool.size());
  for (const Case& c : cases) run(c, *products);
  pool_runs(pool);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_fast_decode: %s\n", e.what());
  return 1;
}
