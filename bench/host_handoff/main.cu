// bench_host_handoff: what it costs a GPU-routed decode token to hand part of each layer's work to
// the CPU and take the result back (issue 22 item 4: the CPU computing some of a layer's missed
// experts while the GPU computes the rest). Each layer of a token is modelled as
//
//   kernel A (routing: writes the layer's payload, 10 expert ids and a 2,048-float hidden state,
//   to page-locked mapped host memory) -> the CPU's part -> kernel B (the combine: reads the CPU's
//   2,048-float result from mapped host memory)
//
// for --layers layers in a row, the CPU's part done one of two ways:
//   host-node  a host node in the captured graph (cudaLaunchHostFunc) between A and B, on CUDA's own
//              host thread;
//   spin       a CPU thread of our own polling a flag that A sets, B spinning on a flag the thread
//              sets (no driver between them: only the link's latency);
// against the same graph with no CPU part (A -> B), which is what the token pays today. The CPU
// part spins --work-us microseconds (the experts it would compute) after reading the payload.
//
//   bench_host_handoff [--layers 48] [--work-us 0] [--reps 200]
//
// Prints per mode the time of a token (a graph replay, the mean over --reps after warm-up) and the
// cost a layer above the graph without the CPU part. A spin that waits longer than a second ends
// that mode with `failed` in place of its time and the run with an error, instead of hanging.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kIds = 10, kWidth = 2048;
constexpr long long kSpinLimitNs = 1'000'000'000;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_host_handoff: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// The mapped host memory both sides read and write: the payload of one layer at a time.
struct Shared {
  int ids[kIds];
  float hidden[kWidth];
  float result[kWidth];
  volatile unsigned ready;  // set by A (layer + 1); the CPU thread clears it when it takes the layer
  volatile unsigned done;   // set by the CPU (layer + 1), read by B
  volatile int failed;      // B waited past the limit
};

__device__ long long now_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A: the layer's payload to host memory; with `signal`, the flag the spinning CPU thread waits for.
__global__ void routing_kernel(Shared* s, const float* x, int layer, bool signal) {
  for (int i = threadIdx.x; i < kWidth; i += blockDim.x) s->hidden[i] = x[i] + (float)layer;
  if (threadIdx.x < kIds) s->ids[threadIdx.x] = (layer * 37 + threadIdx.x * 11) % 512;
  __syncthreads();
  if (signal && threadIdx.x == 0) {
    __threadfence_system();
    s->ready = (unsigned)layer + 1;
  }
}

// B: reads the CPU's result into x; with `wait`, first spins until the CPU thread has written it.
__global__ void combine_kernel(Shared* s, float* x, int layer, bool wait) {
  if (wait) {
    if (threadIdx.x == 0) {
      const long long t0 = now_ns();
      while (s->done != (unsigned)layer + 1) {
        if (s->failed || now_ns() - t0 > kSpinLimitNs) {  // once one layer gave up, the rest do at once
          s->failed = 1;
          break;
        }
      }
    }
    __syncthreads();
    __threadfence_system();
  }
  const volatile float* result = s->result;  // host memory another agent wrote: read it again
  for (int i = threadIdx.x; i < kWidth; i += blockDim.x) x[i] = 0.5f * x[i] + 1e-3f * result[i];
}

void spin_for(double us) {
  if (us <= 0) return;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(us);
  while (std::chrono::steady_clock::now() < end) {
  }
}

// The CPU's part of one layer: read the payload, "compute" for work_us, write the result.
void cpu_part(Shared* s, double work_us) {
  float acc = 0;
  for (int i = 0; i < kIds; i++) acc += (float)s->ids[i];
  for (int i = 0; i < kWidth; i += 64) acc += s->hidden[i];
  spin_for(work_us);
  for (int i = 0; i < kWidth; i++) s->result[i] = acc * 1e-6f + (float)i;
}

struct HostNodeArg {
  Shared* s;
  double work_us;
};
void CUDART_CB host_node(void* p) {
  const auto* a = static_cast<const HostNodeArg*>(p);
  cpu_part(a->s, a->work_us);
}

enum class Mode { kNone, kHostNode, kSpin };
const char* name(Mode m) { return m == Mode::kNone ? "none" : m == Mode::kHostNode ? "host-node" : "spin"; }

cudaGraphExec_t capture(Mode mode, cudaStream_t stream, Shared* s_dev, float* x, int layers, HostNodeArg* arg) {
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  for (int L = 0; L < layers; L++) {
    routing_kernel<<<1, 256, 0, stream>>>(s_dev, x, L, mode == Mode::kSpin);
    if (mode == Mode::kHostNode) check(cudaLaunchHostFunc(stream, host_node, arg), "host node");
    combine_kernel<<<1, 256, 0, stream>>>(s_dev, x, L, mode == Mode::kSpin);
  }
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaGraphDestroy(graph);
  return exec;
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 48, reps = 200;
  double work_us = 0;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_host_handoff: %s wants a value\n", flag);
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    try {
      if (a == "--layers") layers = std::stoi(value("--layers"));
      else if (a == "--reps") reps = std::stoi(value("--reps"));
      else if (a == "--work-us") work_us = std::stod(value("--work-us"));
      else {
        std::fprintf(stderr, "usage: bench_host_handoff [--layers N] [--work-us US] [--reps N]\n");
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "bench_host_handoff: %s: not a number\n", a.c_str());
      return 2;
    }
  }
  if (layers < 1 || layers > 1024 || reps < 1 || work_us < 0 || work_us > 1e5) {
    std::fprintf(stderr, "bench_host_handoff: --layers 1..1024, --reps >= 1, --work-us 0..100000\n");
    return 2;
  }
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::fprintf(stderr, "bench_host_handoff: no CUDA device\n");
    return 1;
  }
  Shared* s = nullptr;
  check(cudaHostAlloc(&s, sizeof(Shared), cudaHostAllocMapped), "mapped host memory");
  Shared* s_dev = nullptr;
  check(cudaHostGetDevicePointer(&s_dev, s, 0), "device pointer");
  s->ready = 0;
  s->done = 0;
  s->failed = 0;
  float* x = nullptr;
  check(cudaMalloc(&x, kWidth * sizeof(float)), "cudaMalloc");
  check(cudaMemset(x, 0, kWidth * sizeof(float)), "cudaMemset");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  HostNodeArg arg{s, work_us};

  // The spinning CPU thread, for the spin mode's replays only (a polling core during the other
  // modes would take a core from the host node's thread): takes each layer A flags (clearing the
  // flag before it answers, so the next layer's flag, set only after B has seen the answer, is
  // never lost) until told to stop.
  std::atomic<bool> stop{false};
  auto poll = [&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const unsigned r = s->ready;
      if (r == 0) continue;
      s->ready = 0;
      std::atomic_thread_fence(std::memory_order_acquire);
      cpu_part(s, work_us);
      std::atomic_thread_fence(std::memory_order_release);
      s->done = r;
    }
  };

  std::printf("layers %d, CPU work %.1f us a layer, %d reps\n", layers, work_us, reps);
  double none_us = 0;
  int status = 0;
  for (Mode mode : {Mode::kNone, Mode::kHostNode, Mode::kSpin}) {
    cudaGraphExec_t exec = capture(mode, stream, s_dev, x, layers, &arg);
    stop = false;
    std::thread worker;
    if (mode == Mode::kSpin) worker = std::thread(poll);
    cudaEvent_t t0, t1;
    check(cudaEventCreate(&t0), "event");
    check(cudaEventCreate(&t1), "event");
    double ms_sum = 0;
    for (int r = -10; r < reps; r++) {  // 10 warm-up replays
      s->ready = 0;
      s->done = 0;
      check(cudaEventRecord(t0, stream), "record");
      check(cudaGraphLaunch(exec, stream), "launch");
      check(cudaEventRecord(t1, stream), "record");
      check(cudaStreamSynchronize(stream), "replay");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, t0, t1), "elapsed");
      if (r >= 0) ms_sum += ms;
      if (s->failed) break;
    }
    if (worker.joinable()) {
      stop = true;
      worker.join();
    }
    if (s->failed) {
      // No time for this mode: the replays that ended before the failure are not a mean of --reps.
      std::fprintf(stderr, "bench_host_handoff: %s: the GPU waited more than a second for the CPU\n", name(mode));
      std::printf("%-10s failed\n", name(mode));
      status = 1;
      s->failed = 0;
    } else {
      const double token_us = 1000.0 * ms_sum / reps;
      if (mode == Mode::kNone) none_us = token_us;
      std::printf("%-10s token %9.1f us   a layer %7.2f us above none\n", name(mode), token_us,
                  (token_us - none_us) / layers);
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaGraphExecDestroy(exec);
  }
  cudaStreamDestroy(stream);
  cudaFree(x);
  cudaFreeHost(s);
  return status;
}
