// Expert residency: the one GPU-side owner of the ExpertCache. It holds the slots (device memory
// for n_slots experts), the residency table the GPU routes with ([n_layer][n_expert] slot address
// or 0, mirrored from the cache's decisions), the page-locked model mapping the misses are copied
// from, and the copies themselves (on the copy stream, timed for the cache's statistics).
#pragma once
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "cache/expert_cache.h"
#include "cuda/cuda_check.h"
#include "cuda/device_weights.h"
#include "cuda/profiler.h"
#include "cuda/streams.h"
#include "gguf/gguf.h"
#include "model/model.h"

namespace rl::cuda {

constexpr size_t kFreeMemoryReserve = 1ull << 30;  // left free for the driver and other sessions

class ExpertResidency {
 public:
  // Sizes the cache: cache_mib > 0 is the budget (refused, naming --cache-mib, when it exceeds
  // free memory minus kFreeMemoryReserve); 0 holds every expert when that fits, else what fits.
  // dense_bytes and working_bytes only name the rest of the memory plan in that message.
  // policy: the cache's replacement policy (LRFU with kDefaultLrfuHalfLifePasses passes).
  // host_misses (--miss-reads host): on a cache that cannot hold every expert, also keep every
  // expert in slot layout in mapped, page-locked host memory (miss_source); when that memory cannot
  // be had, a message says so and misses are copied as without it.
  ExpertResidency(const Model& model, const DeviceWeights& weights, const Streams& streams, int64_t cache_mib,
                  CachePolicy::Kind policy, size_t working_bytes, bool host_misses = false);
  ~ExpertResidency();
  ExpertResidency(const ExpertResidency&) = delete;
  ExpertResidency& operator=(const ExpertResidency&) = delete;

  ExpertCache& cache() { return *cache_; }
  const ExpertCache& cache() const { return *cache_; }
  bool all_resident() const { return cache_->n_resident() == n_layer_ * n_expert_; }
  // The slot area (slot s at slots() + s * slot_bytes()) and the device residency row of layer L.
  uint8_t* slots() const { return slots_.get<uint8_t>(); }
  size_t slot_bytes() const { return cache_->slot_bytes(); }
  const uint8_t* slot_of(int L, int expert) const {
    return slots() + (size_t)cache_->lookup(L, expert) * slot_bytes();
  }
  const uint64_t* residency_row(int L) const { return residency_table_.get<uint64_t>() + (size_t)L * n_expert_; }
  // Copies come from page-locked memory: the registered mapping, or the host copy.
  bool pinned_copies() const { return registered_ || host_experts_; }

  // Misses read in place (--miss-reads host): every expert in slot layout in mapped host memory,
  // expert e of layer L at miss_source(L) + e * miss_stride() (device addresses), which the
  // GPU-routed token's route kernel gives a selection that is not resident; the copies into slots
  // then come from there too, one an expert. Without it miss_source(L) is any slot and the stride
  // 0 (a miss reads a wrong but readable slot, and the host discards the token).
  bool host_misses() const { return host_experts_ != nullptr; }
  const uint8_t* miss_source(int L) const {
    return host_experts_ ? host_experts_dev_ + (size_t)L * n_expert_ * slot_bytes() : slots();
  }
  size_t miss_stride() const { return host_experts_ ? slot_bytes() : 0; }
  // With the host copy: a token's staging slots (one a selection, n_expert_used of them) that its
  // missed experts are copied into before its expert kernels run (stage_misses), and the copies'
  // sources (the route kernel's miss_src). nullptr without it.
  uint8_t* staging() const { return host_experts_ ? staging_.get<uint8_t>() : nullptr; }
  const uint8_t** staged_src() const { return host_experts_ ? staged_src_.get<const uint8_t*>() : nullptr; }
  // With the host copy: the prediction branch's staging (two sets of n_expert_used slots and their
  // experts, alternating by layer: a layer's set is read while the next layer's is written).
  uint8_t* predicted_staging(int L) const {
    return predicted_staging_.get<uint8_t>() + (size_t)(L % 2) * model_.config().n_expert_used * slot_bytes();
  }
  int32_t* predicted_staged(int L) const {
    return predicted_staged_.get<int32_t>() + (L % 2) * model_.config().n_expert_used;
  }
  // After a GPU-routed token that read its misses in place (ids [n_layer][k]: its selections; those
  // not resident are its misses): up to `limit` of them are brought in (reserved and copied from
  // host memory, the compute stream waiting for the copies; the layers take turns being first),
  // the others counted as bypassed misses (ExpertCache::bypass). The caller has touched the hits.
  void admit_misses(std::span<const int32_t> ids, int k, int limit);

  // Reserves experts of layer L, enqueues the misses' copies (with wait, the compute stream waits
  // for them), commits and brings the device residency rows up to date; aborts the reservation
  // when a copy fails. `resident`, when given, receives whether each expert was already resident
  // (request order). These experts are then the layer in flight that a prefetch spares.
  void reserve_and_copy(int L, std::span<const int> experts, bool wait, std::vector<char>* resident = nullptr);
  // Prefetch (expert_prefetch.cpp): reserves the predicted experts of layer L that are not
  // resident, sparing the last reservation's (ExpertCache::reserve_ahead), enqueues their copies
  // (Streams::prefetch_done after them; nothing waits for them here) and commits. Layer L's
  // reservation then finds them resident, and landing() says which may still be being copied.
  void prefetch(int L, std::span<const int> predicted);
  // Whether `expert` of layer L came with this pass's last prefetch: the compute stream must wait
  // for Streams::prefetch_done before reading its slot.
  bool landing(int L, int expert) const {
    return L == landing_layer_ && std::find(landing_.begin(), landing_.end(), expert) != landing_.end();
  }
  // Loads every expert (when the cache holds them all); returns the seconds it took. Not part of
  // any request's statistics.
  double preload_all();

  // Expert loads of the pass in progress / of the last pass: with --speculation warm the GPU-routed
  // path is tried only after a pass that loaded nothing.
  // A pass starts: no expert is landing for it, and the compute stream waits for any prefetch still
  // being copied (one left by a pass that ended in an error).
  void begin_pass();
  void end_pass() { last_pass_loaded_ = loads_this_pass_; }
  bool last_pass_loaded() const { return last_pass_loaded_; }
  // After the copy stream is idle: each copy's bytes and time into the cache's statistics (and
  // the profiler's copies stage).
  void record_copy_times(Profiler& profiler);

 private:
  void register_mapping(const GgufFile& f);
  // Allocates and fills host_experts_ (false, with a message, when the allocation is refused).
  bool make_host_experts();
  // ahead: a prefetch's copies (no wait for Streams::slots_free: its victims are never the
  // layer in flight's experts, and every earlier layer's kernels ended before the host saw this
  // layer's selections; Streams::prefetch_done after them instead of copies_done).
  void copy_misses(int L, const ExpertCache::Reservation& r, bool wait, bool ahead = false);
  void sync_residency_rows();

  const Model& model_;
  const DeviceWeights& weights_;
  const Streams& streams_;
  int n_layer_ = 0, n_expert_ = 0;
  std::unique_ptr<ExpertCache> cache_;
  DeviceBuffer slots_;
  DeviceBuffer residency_table_;  // [n_layer][n_expert] slot address or 0
  std::vector<uint64_t> residency_host_;
  std::vector<bool> residency_dirty_;
  bool registered_ = false;                       // every mapping page-locked
  std::vector<const uint8_t*> registered_bases_;  // one per registered mapping (split files have several)
  std::vector<GgufFile::Mapping> mappings_;       // the files the experts are copied from
  uint8_t* host_experts_ = nullptr;               // --miss-reads host: [n_layer][n_expert] slots, page-locked
  const uint8_t* host_experts_dev_ = nullptr;     // its device address
  int admit_first_layer_ = 0;                     // admit_misses: the layer that goes first next time
  // admit_misses' lists, kept so that a token allocates nothing: the admissions, and one layer's
  // experts (its bypassed misses, then its admissions).
  std::vector<std::pair<int, int>> admit_scratch_;
  std::vector<int> layer_scratch_;
  DeviceBuffer staging_;                          // [n_expert_used] slots (staging())
  DeviceBuffer staged_src_;                       // [n_expert_used] host-copy addresses (staged_src())
  DeviceBuffer predicted_staging_;                // [2][n_expert_used] slots (predicted_staging())
  DeviceBuffer predicted_staged_;                 // [2][n_expert_used] int32 (predicted_staged())
  int in_flight_layer_ = -1;           // the last reservation's layer and experts (a prefetch spares them)
  std::vector<int> in_flight_;
  int landing_layer_ = -1;             // the last prefetch's layer and copied experts, this pass
  std::vector<int> landing_;
  bool loads_this_pass_ = false;
  bool last_pass_loaded_ = false;
  std::vector<cudaEvent_t> pending_copy_events_;  // (start, stop) pairs awaiting collection
  std::vector<size_t> pending_copy_bytes_;
};

}  // namespace rl::cuda
