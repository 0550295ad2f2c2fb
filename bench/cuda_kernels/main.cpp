// bench_cuda_kernels: the time of each CUDA kernel family at the 80B's shapes on the GPU host, in
// the manner of llm.c's dev/cuda benchmarks (bench.h says what a case is).
//
//   bench_cuda_kernels [--filter REGEX] [--reps N] [--warmup N] [--json] [--list]
//
// Timing: after `warmup` calls, the calls are enqueued in batches behind a spin kernel that holds
// the stream until the whole batch is queued, so the events around a batch time the GPU running
// the calls back to back (launch gaps of about a microsecond between kernels included, as in the
// decode graph), not the host launching them. The time printed is the mean over the reps.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <regex>
#include <string>
#include <vector>

#include "bench.h"
#include "cuda/kernels.h"

namespace rl::bench {
namespace {

constexpr double kH200BytesPerSecond = 4.8e12;  // the H200's HBM3e bandwidth (NVIDIA's figure)
constexpr int kMaxQueuedLaunches = 256;         // well under the driver's queue of pending launches
constexpr long long kSpinCycles = 20'000'000;   // ~10 ms at the H200's clock: longer than queueing a batch

struct Options {
  std::string filter = ".";
  int reps = 100;
  int warmup = 10;
  bool json = false;
  bool list = false;
};

struct Result {
  std::string name;
  double us = 0, bytes = 0, flops = 0;
  int copies = 1;
};

// Mean microseconds a call of c takes on the GPU over `reps` calls.
double time_case(const Case& c, const Options& o, cudaStream_t s) {
  for (int i = 0; i < o.warmup; i++) c.run(i % c.copies, s);
  RL_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaEvent_t start, stop;
  RL_CUDA_CHECK(cudaEventCreate(&start));
  RL_CUDA_CHECK(cudaEventCreate(&stop));
  const int batch = std::max(1, kMaxQueuedLaunches / std::max(1, c.launches));
  double total_ms = 0;
  for (int done = 0; done < o.reps;) {
    const int n = std::min(batch, o.reps - done);
    cuda::gpu_spin(kSpinCycles, s);
    RL_CUDA_CHECK(cudaEventRecord(start, s));
    for (int i = 0; i < n; i++) c.run((done + i) % c.copies, s);
    RL_CUDA_CHECK(cudaEventRecord(stop, s));
    RL_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    RL_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    total_ms += ms;
    done += n;
  }
  RL_CUDA_CHECK(cudaEventDestroy(start));
  RL_CUDA_CHECK(cudaEventDestroy(stop));
  return total_ms * 1e3 / o.reps;
}

void print_header() {
  cudaDeviceProp p{};
  int dev = 0;
  RL_CUDA_CHECK(cudaGetDevice(&dev));
  RL_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  fmt::print("{}: {} SMs, L2 {} MiB, {:.1f} GiB; bandwidth percentages against the H200's {:.1f} TB/s\n", p.name,
             p.multiProcessorCount, p.l2CacheSize >> 20, p.totalGlobalMem / 1073741824.0, kH200BytesPerSecond / 1e12);
  fmt::print("{:<62} {:>10} {:>10} {:>8} {:>6} {:>9} {:>7}\n", "kernel", "time us", "MB moved", "GB/s", "% peak",
             "GFLOP", "TFLOP/s");
}

void print_row(const Result& r) {
  const double gbs = r.bytes / (r.us * 1e-6) / 1e9;
  std::string flops = fmt::format("{:>9} {:>7}", "", "");
  if (r.flops > 0) flops = fmt::format("{:>9.2f} {:>7.2f}", r.flops / 1e9, r.flops / (r.us * 1e-6) / 1e12);
  fmt::print("{:<62} {:>10.2f} {:>10.3f} {:>8.1f} {:>6.1f} {}\n", r.name, r.us, r.bytes / 1e6, gbs,
             100.0 * gbs * 1e9 / kH200BytesPerSecond, flops);
  std::fflush(stdout);
}

nlohmann::json to_json(const Result& r, const Options& o) {
  const double bytes_per_s = r.bytes / (r.us * 1e-6);
  nlohmann::json j = {{"kernel", r.name},
                      {"time_us", r.us},
                      {"bytes", r.bytes},
                      {"gb_s", bytes_per_s / 1e9},
                      {"percent_of_4_8_tb_s", 100.0 * bytes_per_s / kH200BytesPerSecond},
                      {"reps", o.reps},
                      {"copies", r.copies}};
  if (r.flops > 0) {
    j["gflop"] = r.flops / 1e9;
    j["tflop_s"] = r.flops / (r.us * 1e-6) / 1e12;
  }
  return j;
}

int run(const Options& o) {
  std::regex filter;
  try {
    filter = std::regex(o.filter);
  } catch (const std::regex_error& e) {
    std::fprintf(stderr, "bench_cuda_kernels: --filter '%s' is not a regular expression: %s\n", o.filter.c_str(), e.what());
    return 2;
  }
  std::vector<CaseDef> all = decode_cases();
  for (CaseDef& d : prefill_cases()) all.push_back(std::move(d));
  std::vector<const CaseDef*> chosen;
  for (const CaseDef& d : all)
    if (std::regex_search(d.name, filter)) chosen.push_back(&d);
  if (chosen.empty()) {
    std::fprintf(stderr, "bench_cuda_kernels: no kernel matches --filter '%s' (--list names them)\n", o.filter.c_str());
    return 2;
  }
  if (o.list) {
    for (const CaseDef* d : chosen) fmt::print("{}\n", d->name);
    return 0;
  }
  if (!cuda::device_available()) {
    std::fprintf(stderr, "bench_cuda_kernels: no CUDA device on this machine\n");
    return 1;
  }
  cuda::upload_quant_tables();
  cudaStream_t s;
  RL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (!o.json) print_header();
  nlohmann::json out = nlohmann::json::array();
  int failed = 0;
  for (const CaseDef* d : chosen) {
    Result r;
    r.name = d->name;
    try {
      const Case c = d->make();  // its buffers are freed before the next case is made
      RL_CUDA_CHECK(cudaDeviceSynchronize());  // the inputs are in place (made on the default stream)
      r.us = time_case(c, o, s);
      r.bytes = c.bytes, r.flops = c.flops, r.copies = c.copies;
    } catch (const std::exception& e) {  // the others still run; the exit status says it
      std::fprintf(stderr, "bench_cuda_kernels: %s: %s\n", d->name.c_str(), e.what());
      failed++;
      continue;
    }
    if (o.json)
      out.push_back(to_json(r, o));
    else
      print_row(r);
  }
  RL_CUDA_CHECK(cudaStreamDestroy(s));
  if (o.json) fmt::print("{}\n", out.dump(2));
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace rl::bench

int main(int argc, char** argv) {
  rl::bench::Options o;
  CLI::App app{"Times each CUDA kernel family at the shapes of Qwen3-Next-80B-A3B (decode token, 512-token "
               "prefill chunk) on random weights of the seed-mix types: time, bytes moved, GB/s and percent of the "
               "H200's 4.8 TB/s, FLOP/s for the prefill products.",
               "bench_cuda_kernels"};
  app.add_option("--filter", o.filter, "only the kernels whose name matches this regular expression (ECMAScript)");
  app.add_option("--reps", o.reps, "timed calls of each kernel (the mean is printed)")->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", o.warmup, "untimed calls before the timed ones")->check(CLI::Range(0, 1000000));
  app.add_flag("--json", o.json, "print the results as a JSON array");
  app.add_flag("--list", o.list, "print the names of the selected kernels and exit (no GPU needed)");
  CLI11_PARSE(app, argc, argv);
  try {
    return rl::bench::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", e.what());
    return 1;
  }
}
