// CUDA error handling and small RAII helpers shared by the CUDA backend and its launchers.
// Included by .cu files, so it must not include fmt.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

namespace rl::cuda {

// Every CUDA runtime failure becomes an rl::Error naming the call and the CUDA message.
[[noreturn]] void throw_cuda_error(const char* expr, cudaError_t err);
#define RL_CUDA_CHECK(expr)                                            \
  do {                                                                 \
    cudaError_t rl_err_ = (expr);                                      \
    if (rl_err_ != cudaSuccess) ::rl::cuda::throw_cuda_error(#expr, rl_err_); \
  } while (0)

// Throws rl::Error(message). For .cu files, which cannot include fmt (common/error.h): nvcc's
// host pass rejects fmt 9's compile-time format checks.
[[noreturn]] void throw_error(const std::string& message);

// Kernel launches report configuration errors through cudaGetLastError.
#define RL_CUDA_LAUNCH_CHECK() RL_CUDA_CHECK(cudaGetLastError())

// True when a CUDA device can be used (tests skip, front ends pick the CPU otherwise).
bool device_available();

// The current device's multiprocessor count and compute capability (major), read once per process
// (the launchers size grids and pick features by them).
struct DeviceInfo {
  int sm_count = 0;
  int cc_major = 0;
};
const DeviceInfo& device_info();

// Owned device allocation (cudaMalloc); freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { allocate(bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  void allocate(size_t bytes) {
    release();
    if (bytes) RL_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    bytes_ = bytes;
  }
  // cudaFree waits for the device's work first, so a buffer freed while copies or kernels on it
  // are in flight (a snapshot's rows, a session's caches) is freed after them; every owner relies
  // on that rather than on a wait of its own.
  void release() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <class T = void>
  T* get() const { return static_cast<T*>(ptr_); }
  float* f() const { return static_cast<float*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace rl::cuda
