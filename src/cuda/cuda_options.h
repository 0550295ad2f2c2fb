// What a caller may choose about the CUDA backend: a plain struct, filled by the command line
// (cli/common_options.cpp, add_cuda_options) or set field by field in a test. The backend reads
// nothing else (no environment). docs/cuda.md lists each option with the test that covers it.
// Header only and free of CUDA headers, so the command line knows the flags in every build.
#pragma once
#include <cstdint>

#include "cache/expert_cache.h"
#include "model/kv_type.h"
#include "model/numerics.h"

namespace rl::cuda {

// The largest --prefill-chunk (the workspace grows linearly with the chunk: docs/PERF.md).
constexpr int kMaxPrefillChunk = 8192;
// The largest --prefill-chunk for a model of k experts a token: a pass's T·k (token, expert) rows
// are one grid dimension of the expert-input gather (moe.cu), which CUDA bounds at 65,535 — 6,553
// tokens for the 80B's 10.
constexpr int max_prefill_chunk(int n_expert_used) {
  const int by_grid = 65535 / (n_expert_used > 0 ? n_expert_used : 1);
  return by_grid < kMaxPrefillChunk ? by_grid : kMaxPrefillChunk;
}
// A pass that returns every position's logits takes at most this many tokens, whatever the
// --prefill-chunk: its device logits buffer is tokens × n_vocab floats (311 MB at 512 and the 80B's
// 151,936, 1.2 GB at 2048), outside the working set the expert cache is sized around.
constexpr int kAllLogitsPassTokens = 512;
// The engine keeps the batched-step graphs of the last kMaxBatchGraphs batch sizes used (decode_graph.cpp:
// a graph serves every set of sessions of its size; a step takes 2 to kMaxBatchRows = 16, plan.h).
constexpr int kMaxBatchGraphs = 15;

struct CudaOptions {
  // The numeric tier (--numerics, docs/cuda.md "Numeric forms"): exact reproduces the oracle;
  // fast takes the fp32-sum kernels where the tier has them.
  Numerics numerics = Numerics::kExact;
  // The sessions' KV cache type (--kv-type, model/kv_type.h): the exact tier takes f32 only; the
  // fast tier's attention reads any type (the command line's default for it: f16).
  KvType kv_type = KvType::kF32;
  // Expert-cache budget in MiB (--cache-mib); 0: every expert when that fits in free device
  // memory, else what fits after the working set.
  int64_t cache_mib = 0;
  // Which expert a miss evicts from a bounded cache (--cache-policy lru|lrfu, docs/cache.md). LRU
  // stays the default: LRFU (half-life kDefaultLrfuHalfLifePasses passes) hit 1.1-2.3 points more
  // in cache_policy_sim's replays of the skewed 80B's recordings at 8 GiB (docs/PERF.md) but costs
  // ~86 us more bookkeeping a decode token in cache_policy_sim (dev), and the two have not been timed on the
  // GPU.
  CachePolicy::Kind cache_policy = CachePolicy::Kind::kLru;
  // Load every expert at open when the budget holds them all (--no-preload: load on first use).
  bool preload = true;
  // Per-stage GPU timing (--profile); the GPU-routed decode then runs without its graph.
  bool profile = false;
  // When decode tries the GPU-routed graph (--speculation off|resident|warm|always).
  enum class Speculation {
    kOff,            // off: always the synchronous path
    kFullyResident,  // resident (default): when the cache holds every expert, so no token can miss
    kWarmCache,      // warm: also on a bounded cache, after a pass that loaded nothing (DESIGN.md §5)
    kAlways,         // always: every decode token (tests: exercises the discard-and-recompute path)
  };
  // Bounded caches (warm, always) are off by default: their discard-and-recompute path is tested on
  // the GPU (bit-identical to the synchronous path) but its speed on a bounded cache was never
  // measured.
  Speculation speculation = Speculation::kFullyResident;
  // Where a bounded cache's misses are read (--miss-reads copy|host; docs/cuda.md "Misses read in
  // place"). copy: the synchronous decode path copies each layer's misses into slots and waits for
  // them (with the prediction's prefetch). host: the experts are also kept in slot layout in mapped,
  // page-locked host memory; the decode token is the GPU-routed graph whatever --speculation says,
  // its expert kernels read a miss where it is, over the link, and after the token up to
  // miss_admit of its misses are copied into the cache. Falls back to copy, with a message, when
  // that host memory cannot be had. The commands' default is host (cli/common_options.cpp); this
  // struct's stays copy, so each test names the path it exercises.
  enum class MissReads { kCopy, kHost };
  MissReads miss_reads = MissReads::kCopy;
  // --miss-reads host: misses of a decode token copied into the cache after it (--miss-admit, 0 to
  // 512; the layers take turns). Each costs the link time of one expert before the next token.
  // Negative (the commands' default): adaptive, 16 or 64 by the recent decode hit rate
  // (cache/admission.h).
  int miss_admit = 16;
  // Prediction and prefetch on a bounded cache (--prefetch off|on|early|late; docs/cuda.md
  // "Prediction and prefetch"): a host-routed decode token computes layer L+1's router and top-k on
  // layer L's hidden state (normed with layer L+1's post-attention norm) and copies the predicted
  // misses ahead; layer L+1 still routes on its own input, so a wrong prediction costs a copy,
  // never a selection. early (on): the residual at layer L's MoE input, so the copies overlap
  // layer L's experts and layer L+1's mixer; late: layer L's output, closer to layer L+1's input
  // but overlapping only layer L+1's mixer.
  enum class Prefetch { kOff, kEarly, kLate };
  // On by default: at --cache-mib 8192 on the H200 it decoded 84.4 tok/s against 77.5 off (one
  // round of scripts/device/ab.sh prefetch, PERF.md), the prediction overlapping the copies a
  // decode token otherwise waits for.
  Prefetch prefetch = Prefetch::kEarly;
  // How many of the prediction's top experts (by router logit) are prefetched (--prefetch-experts;
  // at most n_expert_used); 0: the path's own count (prefetch_count below, the commands' default).
  // A wrong one costs a copy on the link the real misses need, and the lower ranks are wrong more
  // often: on a 16-layer synthetic model of the 80B's widths (bench/prefetch_accuracy, docs/cuda.md)
  // rank 1 of the early prediction was selected 92 % of the time, rank 8 54 %, rank 10 37 %. The
  // copy path was timed on the H200 with 8 (above); this struct keeps 8, so a test names its count.
  int prefetch_experts = 8;
  // Tokens a prefill pass takes at most (--prefill-chunk, 1 to kMaxPrefillChunk); the workspace holds
  // a pass of this many. 2048: with ~10 of 512 experts a token, a 512-token pass gave each expert
  // ~10 tokens to spread its dequantised weight tiles over, 2048 gives ~40; on the H200 the 80B's
  // prefill of 32,768 tokens went from 4,428 to 6,010 tok/s (docs/PERF.md).
  int prefill_chunk = 2048;
  // Every dense Q4_K prefill product on X32 (--x32-always), also those whose grid has fewer blocks
  // than the GPU has SMs (by default those keep the fp64 products' column splits): parity checks
  // on short prompts and tests, whose products are all small.
  bool x32_always = false;
  // The fast tier's decode products on 8-bit activations (matvec-q8, dp4a) for the types that have
  // them (--fast-decode q8, the default); f32: the fp32-activation matvecs (matvec-f32) for every
  // type, the form they replace, for A/B measurements.
  bool q8_decode = true;

  // Reference paths of the bit-identity tests (no flag: their experiments are over and the
  // default won; the tests compare the default against them).
  // Synchronous path: a layer's resident experts run while its misses are copied, the missed ones
  // after the copies (false: all of them after the copies; CopyOverlapLeavesLogitsUnchanged).
  bool overlap_copies = true;
  // Prefill with every expert resident: a layer's selections are grouped by expert on the GPU
  // (false: the host groups them, as on a bounded cache; GpuGroupedPrefillEqualsHostGrouping).
  bool gpu_grouping = true;
  // The fast tier's parts, each replaceable by the exact tier's kernels, so that a test can hold
  // each part to the oracle alone (CudaFastTier.EachPartOnThe80BShape): the products (fp32-sum
  // matvecs, bf16 prefill products), the routing, the attention, the DeltaNet kernels.
  bool fast_products = true, fast_routing = true, fast_attention = true, fast_deltanet = true;
};

// The predictions a decode layer copies ahead: prefetch_experts, or where that is 0 (the commands'
// default) the path's own count, which the engine resolves once at open. staged (--miss-reads host,
// the GPU-routed token staging its misses from the host copy): 6, or 4 where the cache holds less
// than a quarter of the experts (cache_share: slots / (layers × experts)), where nearly every
// selection misses and a wrong guess takes link time a needed copy wanted. On the H100 (2026-12-06,
// docs/PERF.md), decode tok/s with 4 / 6 / 8: uniform routers at 2 GiB (share 0.10) 94.3–97.3 /
// 90.4–92.5 / 84.0–84.1 (none: 87.0–88.5); at 8 GiB (share 0.38) 116.8 / 116.6 / 108.0; the skewed
// model at 8 GiB 161.2–161.6 / 168.3–169.1 / 167.5. copy (the host-routed path): 8, as timed on
// the H200.
constexpr int kStagedPrefetchExperts = 6, kStagedPrefetchExpertsSmallCache = 4, kCopyPrefetchExperts = 8;
constexpr double kSmallCacheShare = 0.25;
inline int prefetch_count(const CudaOptions& o, bool staged, double cache_share) {
  if (o.prefetch_experts > 0) return o.prefetch_experts;
  if (!staged) return kCopyPrefetchExperts;
  return cache_share < kSmallCacheShare ? kStagedPrefetchExpertsSmallCache : kStagedPrefetchExperts;
}

// The --prefetch value of a setting (off, early, late).
inline const char* prefetch_name(CudaOptions::Prefetch p) {
  return p == CudaOptions::Prefetch::kOff ? "off" : p == CudaOptions::Prefetch::kLate ? "late" : "early";
}

}  // namespace rl::cuda
