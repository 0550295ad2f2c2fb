#include "cuda/expert_residency.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "common/error.h"
#include "gguf/gguf.h"

namespace rl::cuda {

ExpertResidency::ExpertResidency(const Model& model, const DeviceWeights& weights, const Streams& streams,
                                 int64_t cache_mib, CachePolicy::Kind policy, size_t working_bytes,
                                 bool host_misses)
    : model_(model), weights_(weights), streams_(streams) {
  const Config& c = model.config();
  n_layer_ = c.n_layer;
  n_expert_ = c.n_expert;
  const size_t slot_bytes = weights.slot_bytes();
  const size_t n_total = (size_t)c.n_layer * c.n_expert;
  size_t free_b = 0, total_b = 0;
  RL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t usable = free_b > kFreeMemoryReserve ? free_b - kFreeMemoryReserve : 0;
  size_t budget;
  if (cache_mib > 0) {
    // A budget the card cannot hold is refused even when the model's experts would need less:
    // the user asked for memory that is not there, and silently capping would hide it.
    budget = (size_t)cache_mib << 20;
    if (budget > usable)
      fail("--cache-mib {}: only {} MiB of device memory are free after the dense weights ({} MiB) "
           "and the working set ({} MiB), keeping {} MiB spare",
           cache_mib, usable >> 20, weights.dense_bytes >> 20, working_bytes >> 20,
           kFreeMemoryReserve >> 20);
  } else {
    budget = std::min(usable, n_total * slot_bytes);
  }
  // The half-life counts cache accesses: one a layer, so a pass is n_layer of them.
  cache_ = std::make_unique<ExpertCache>(c.n_layer, c.n_expert, slot_bytes, budget, c.n_expert_used,
                                         CachePolicy{policy, kDefaultLrfuHalfLifePasses * c.n_layer});
  slots_.allocate((size_t)cache_->n_slots() * slot_bytes);
  residency_table_.allocate(n_total * sizeof(uint64_t));
  RL_CUDA_CHECK(cudaMemset(residency_table_.get(), 0, n_total * sizeof(uint64_t)));
  residency_host_.assign(n_total, 0);
  residency_dirty_.assign(c.n_layer, false);
  cache_->set_listener([this](ExpertCache::Key k, int slot) {
    residency_host_[k] = slot < 0 ? 0 : (uint64_t)(slots_.get<uint8_t>() + (size_t)slot * cache_->slot_bytes());
    residency_dirty_[cache_->layer_of(k)] = true;
  });
  // With the host copy nothing is copied from the mapping after it is filled: the mapping is not
  // page-locked then (the memory check below sees the page-locked copy's room, not the file's too).
  const bool host_copy = host_misses && !cache_->holds_all() && make_host_experts();
  if (!host_copy) register_mapping(model.gguf());
}

ExpertResidency::~ExpertResidency() {
  if (streams_.copy) cudaStreamSynchronize(streams_.copy);
  for (cudaEvent_t e : pending_copy_events_) cudaEventDestroy(e);
  for (const uint8_t* base : registered_bases_) cudaHostUnregister(const_cast<uint8_t*>(base));
  if (host_experts_) cudaFreeHost(host_experts_);
}

// Every expert at its slot layout's offsets (gate, up, down) in one mapped, page-locked host
// allocation: the GPU-routed token's kernels read a miss there over the link, and a copy into a
// slot is then one copy, not three. Filled from the mapping by a thread per group of layers.
namespace {
// MemAvailable of /proc/meminfo in bytes (free memory plus what the kernel can reclaim), or 0 when
// it cannot be read.
size_t host_memory_available() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  std::fclose(f);
  return (size_t)kib << 10;
}
constexpr size_t kHostMemoryReserve = 4ull << 30;  // left to the system beside the page-locked experts

// Expert e's gate, up and down matrices (in the mapping) with their offsets in a slot.
std::array<std::pair<size_t, TensorView>, 3> slot_parts(const MoeDev& moe, int e) {
  return {{{0, moe.gate_exps.matrix(e)}, {moe.up_offset, moe.up_exps.matrix(e)},
           {moe.down_offset, moe.down_exps.matrix(e)}}};
}
}  // namespace

bool ExpertResidency::make_host_experts() {
  const size_t bytes = (size_t)n_layer_ * n_expert_ * slot_bytes();
  // Gives up with a message, what was taken released: misses are then copied as without it.
  auto give_up = [&](void* pinned, const std::string& why) {
    if (pinned) cudaFreeHost(pinned);
    for (DeviceBuffer* b : {&staging_, &staged_src_, &predicted_staging_, &predicted_staged_}) b->release();
    std::fprintf(stderr, "cuda: --miss-reads host: %s; misses are copied into the cache instead\n", why.c_str());
    return false;
  };
  // Page-locked memory cannot be paged out: refuse rather than take what the system needs.
  const size_t available = host_memory_available();
  if (available && bytes + kHostMemoryReserve > available)
    return give_up(nullptr, fmt::format("the experts need {:.1f} GiB of page-locked host memory and {:.1f} GiB are "
                                        "available (keeping {:.0f} GiB for the system)",
                                        bytes / 1073741824.0, available / 1073741824.0,
                                        kHostMemoryReserve / 1073741824.0));
  const auto t0 = std::chrono::steady_clock::now();
  const int k = model_.config().n_expert_used;  // the staging slots first: a failure there leaks nothing
  try {
    staging_.allocate((size_t)k * slot_bytes());
    staged_src_.allocate((size_t)k * sizeof(const uint8_t*));
    predicted_staging_.allocate((size_t)2 * k * slot_bytes());
    predicted_staged_.allocate((size_t)2 * k * sizeof(int32_t));
  } catch (const Error& ex) {
    cudaGetLastError();
    return give_up(nullptr, fmt::format("no device memory for its {} staging slots ({})", 3 * k, ex.what()));
  }
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return give_up(nullptr, fmt::format("could not page-lock {:.1f} GiB of host memory for the experts ({})",
                                        bytes / 1073741824.0, cudaGetErrorString(err)));
  }
  void* dev = nullptr;
  if (cudaHostGetDevicePointer(&dev, p, 0) != cudaSuccess) {
    cudaGetLastError();
    return give_up(p, "the GPU cannot map host memory");
  }
  uint8_t* base = static_cast<uint8_t*>(p);
  const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  auto fill = [&](unsigned t, unsigned n) {
    for (int L = (int)t; L < n_layer_; L += (int)n) {
      const MoeDev& moe = weights_.layers[L].moe;
      for (int e = 0; e < n_expert_; e++) {
        uint8_t* dst = base + ((size_t)L * n_expert_ + e) * slot_bytes();
        for (const auto& [offset, part] : slot_parts(moe, e)) std::memcpy(dst + offset, part.data, part.nbytes);
      }
    }
  };
  std::vector<std::thread> threads;
  try {
    for (unsigned t = 1; t < n_threads; t++) threads.emplace_back(fill, t, n_threads);
  } catch (const std::system_error&) {  // fewer threads than asked for: the rest on this one
  }
  // This thread fills share 0 and those of the threads that could not be started.
  const unsigned started = (unsigned)threads.size() + 1;
  for (unsigned t = 0; t < n_threads; t++)
    if (t == 0 || t >= started) fill(t, n_threads);
  for (std::thread& t : threads) t.join();
  host_experts_ = base;
  host_experts_dev_ = static_cast<const uint8_t*>(dev);
  std::fprintf(stderr, "cuda: --miss-reads host: %.1f GiB of experts in page-locked host memory (%.1f s; "
               "--miss-reads copy goes without)\n",
               bytes / 1073741824.0,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return true;
}

// Misses are copied straight from the mappings (each tensor view points into the mapping of the
// shard that holds it). Registering them (read-only, page-locked) lets the copy engine read them
// at PCIe speed; a pageable copy measured ~9x slower on the H200 host (DEVICE.md). When
// registration is refused the backend still works, with pageable copies.
void ExpertResidency::register_mapping(const GgufFile& f) {
  mappings_ = f.mappings();
  registered_ = true;
  const size_t page = 4096;
  for (const GgufFile::Mapping& m : mappings_) {
    const uint8_t* start = reinterpret_cast<const uint8_t*>((uintptr_t)m.base & ~(uintptr_t)(page - 1));
    const size_t len = align_up((size_t)(m.base + m.size - start), page);
    cudaError_t e = cudaHostRegister(const_cast<uint8_t*>(start), len,
                                     cudaHostRegisterReadOnly | cudaHostRegisterPortable);
    if (e == cudaSuccess) {
      registered_bases_.push_back(start);
    } else {
      cudaGetLastError();
      registered_ = false;
      std::fprintf(stderr, "cuda: could not page-lock the model mapping of %s (%s); its experts are copied "
                   "from pageable memory, which is slower\n", m.path.c_str(), cudaGetErrorString(e));
    }
  }
}

void ExpertResidency::sync_residency_rows() {
  const int E = n_expert_;
  for (size_t L = 0; L < residency_dirty_.size(); L++) {
    if (!residency_dirty_[L]) continue;
    RL_CUDA_CHECK(cudaMemcpyAsync(residency_table_.get<uint64_t>() + L * E, residency_host_.data() + L * E,
                                  E * sizeof(uint64_t), cudaMemcpyHostToDevice, streams_.compute));
    residency_dirty_[L] = false;
  }
}

// Enqueues the copies of a reservation's misses on the copy stream, after the expert kernels that
// last read those slots, and makes the compute stream wait for them.
void ExpertResidency::copy_misses(int L, const ExpertCache::Reservation& r, bool wait, bool ahead) {
  if (r.n_misses() == 0) return;
  loads_this_pass_ = true;
  // A file truncated after open would make the mapping's tail unreadable: refuse before copying
  // (with the host copy, which is read instead of the file, there are no mappings_).
  for (const GgufFile::Mapping& m : mappings_) {
    struct stat sb{};
    if (::stat(m.path.c_str(), &sb) != 0 || (uint64_t)sb.st_size < m.size)
      fail("{}: the model file changed size after it was opened (now {} bytes, expected {}); cannot "
           "copy the experts of layer {}", m.path, (long long)sb.st_size, m.size, L);
  }
  const MoeDev& moe = weights_.layers[L].moe;
  uint8_t* slots = slots_.get<uint8_t>();
  if (!ahead) RL_CUDA_CHECK(cudaStreamWaitEvent(streams_.copy, streams_.slots_free, 0));
  cudaEvent_t start = nullptr, stop = nullptr;
  RL_CUDA_CHECK(cudaEventCreate(&start));
  RL_CUDA_CHECK(cudaEventCreate(&stop));
  pending_copy_events_.push_back(start);
  pending_copy_events_.push_back(stop);
  RL_CUDA_CHECK(cudaEventRecord(start, streams_.copy));
  size_t bytes = 0;
  for (const ExpertCache::Entry& e : r.entries) {
    if (e.hit) continue;
    uint8_t* dst = slots + (size_t)e.slot * cache_->slot_bytes();
    const cudaStream_t copy = streams_.copy;
    if (host_experts_) {  // the expert in slot layout already: one copy
      const uint8_t* src = host_experts_ + ((size_t)L * n_expert_ + e.expert) * slot_bytes();
      RL_CUDA_CHECK(cudaMemcpyAsync(dst, src, moe.expert_bytes, cudaMemcpyHostToDevice, copy));
      bytes += moe.expert_bytes;
      continue;
    }
    for (const auto& [offset, part] : slot_parts(moe, e.expert)) {
      RL_CUDA_CHECK(cudaMemcpyAsync(dst + offset, part.data, part.nbytes, cudaMemcpyHostToDevice, copy));
      bytes += part.nbytes;
    }
  }
  RL_CUDA_CHECK(cudaEventRecord(stop, streams_.copy));
  pending_copy_bytes_.push_back(bytes);
  RL_CUDA_CHECK(cudaEventRecord(ahead ? streams_.prefetch_done : streams_.copies_done, streams_.copy));
  if (wait) RL_CUDA_CHECK(cudaStreamWaitEvent(streams_.compute, streams_.copies_done, 0));
}

void ExpertResidency::reserve_and_copy(int L, std::span<const int> experts, bool wait,
                                       std::vector<char>* resident) {
  const ExpertCache::Reservation& r = cache_->reserve(L, experts);
  try {
    copy_misses(L, r, wait);
  } catch (...) {
    cache_->abort();
    sync_residency_rows();
    throw;
  }
  if (resident) {
    resident->clear();
    for (const ExpertCache::Entry& e : r.entries) resident->push_back(e.hit);
  }
  cache_->commit();
  sync_residency_rows();
  in_flight_layer_ = L;
  in_flight_.assign(experts.begin(), experts.end());
}

void ExpertResidency::admit_misses(std::span<const int32_t> ids, int k, int limit) {
  const int n = n_layer_;
  // At most the slots beyond one layer's selections: a later layer's reservation, which spares only
  // its own experts, then evicts older experts before any brought in moments earlier.
  limit = std::min(limit, std::max(0, cache_->n_slots() - k));
  std::vector<std::pair<int, int>>& admit = admit_scratch_;  // (layer, expert), the layers in turn
  std::vector<int>& experts = layer_scratch_;  // a layer's bypassed misses, then a layer's admissions
  admit.clear();
  int next_first = admit_first_layer_;
  for (int i = 0; i < n; i++) {
    const int L = (admit_first_layer_ + i) % n;
    experts.clear();
    for (int j = 0; j < k; j++) {
      const int ex = ids[(size_t)L * k + j];
      if (cache_->lookup(L, ex) >= 0) continue;  // a hit (touched by the caller)
      if ((int)admit.size() < limit) {
        admit.emplace_back(L, ex);
        next_first = (L + 1) % n;
      } else {
        experts.push_back(ex);
      }
    }
    cache_->bypass(L, experts);  // before any reservation changes what is resident
  }
  admit_first_layer_ = next_first;
  // Each layer's admissions as one reservation (a layer's entries are consecutive).
  for (size_t a = 0; a < admit.size();) {
    const int L = admit[a].first;
    experts.clear();
    size_t b = a;
    for (; b < admit.size() && admit[b].first == L; b++) experts.push_back(admit[b].second);
    try {
      reserve_and_copy(L, experts, true);
    } catch (...) {
      // This layer's reservation is aborted (its experts counted as misses by the reservation);
      // the later layers' stay in host memory, counted as bypassed.
      for (size_t c = b; c < admit.size(); c++) cache_->bypass(admit[c].first, std::span<const int>(&admit[c].second, 1));
      throw;
    }
    a = b;
  }
}

void ExpertResidency::prefetch(int L, std::span<const int> predicted) {
  const ExpertCache::Reservation& r = cache_->reserve_ahead(L, predicted, in_flight_layer_, in_flight_);
  landing_layer_ = L;
  landing_.clear();
  try {
    copy_misses(L, r, false, true);
  } catch (...) {
    cache_->abort();
    sync_residency_rows();
    throw;
  }
  for (const ExpertCache::Entry& e : r.entries) landing_.push_back(e.expert);
  cache_->commit();
  sync_residency_rows();
}

void ExpertResidency::begin_pass() {
  loads_this_pass_ = false;
  landing_layer_ = -1;
  landing_.clear();
  RL_CUDA_CHECK(cudaStreamWaitEvent(streams_.compute, streams_.prefetch_done, 0));
}

double ExpertResidency::preload_all() {
  const Config& c = model_.config();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> all(c.n_expert);
  std::iota(all.begin(), all.end(), 0);
  const bool tty = isatty(2);
  for (int L = 0; L < c.n_layer; L++) {
    reserve_and_copy(L, all, true);
    RL_CUDA_CHECK(cudaStreamSynchronize(streams_.copy));
    if (tty || L + 1 == c.n_layer) {
      const int width = 30, done = (L + 1) * width / c.n_layer;
      std::fprintf(stderr, "\rloading experts [%.*s%*s] %d/%d layers", done,
                   "##############################", width - done, "", L + 1, c.n_layer);
      if (L + 1 == c.n_layer) std::fprintf(stderr, "\n");
    }
  }
  RL_CUDA_CHECK(cudaStreamSynchronize(streams_.compute));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The preload is not part of any request's statistics.
  for (cudaEvent_t e : pending_copy_events_) cudaEventDestroy(e);
  pending_copy_events_.clear();
  pending_copy_bytes_.clear();
  cache_->reset_stats();
  return seconds;
}

void ExpertResidency::record_copy_times(Profiler& profiler) {
  for (size_t i = 0; i < pending_copy_bytes_.size(); i++) {
    float ms = 0;
    cudaEventElapsedTime(&ms, pending_copy_events_[2 * i], pending_copy_events_[2 * i + 1]);
    cache_->record_copy(pending_copy_bytes_[i], ms / 1000.0);
    if (profiler.on) profiler.total_ms[kCopies] += ms;
  }
  for (cudaEvent_t e : pending_copy_events_) cudaEventDestroy(e);
  pending_copy_events_.clear();
  pending_copy_bytes_.clear();
}

}  // namespace rl::cuda
