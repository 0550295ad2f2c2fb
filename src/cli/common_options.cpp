#include "cli/common_options.h"

#include <algorithm>
#include <charconv>
#include <map>

#include "cache/admission.h"
#include "common/error.h"
#include "cpu/cpu_backend.h"
#include "cpu/thread_pool.h"
#ifdef REDLITE_HAVE_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#endif

namespace rl::cli {

void add_common_options(CLI::App& app, CommonOptions& opts, bool model_required) {
  auto* m = app.add_option("-m,--model", opts.model_path, "GGUF model file (architecture qwen3next)");
  if (model_required) m->required();
  app.add_option("--backend", opts.backend, "cpu or cuda (default: cuda when this build has it, else cpu)");
  // Refused at parse time (the thread pool refuses too), so `serve` fails at start, not in its loader.
  const CLI::Validator at_most_max_threads(
      [](std::string& value) -> std::string {
        const int n = std::atoi(value.c_str());
        if (n <= cpu::max_threads()) return {};
        return fmt::format("{} is more than {} CPU threads (4 per hardware thread of this machine, {} at most)", value,
                           cpu::max_threads(), cpu::kMaxThreadsCap);
      },
      "");
  app.add_option("--threads", opts.threads, "CPU threads (default: all cores; at most 4 per core, 512 at most)")
      ->check(CLI::NonNegativeNumber)
      ->check(at_most_max_threads);
  app.add_option("--numerics", opts.numerics,
                 "fast (default: fp32 sums with 8-bit activations on the cpu, docs/cpu-fast.md; fp32 sums and "
                 "half-precision tensor-core products on cuda, docs/cuda.md) or exact (the fp32 oracle's values)")
      ->check(CLI::IsMember({"fast", "exact"}));
  app.add_option("--ctx", opts.ctx, "context length in tokens (default: min(4096, the model's))")
      ->check(CLI::NonNegativeNumber);
  add_kv_type_option(app, opts.kv_type);
  app.add_option("--cache-mib", opts.cache_mib,
                 "GPU expert-cache budget in MiB (default: every expert when they fit in free device memory, "
                 "else what fits)")
      ->check(CLI::NonNegativeNumber);
  add_cuda_options(app, opts.cuda);
}

namespace {
// An option whose values are the names of `names`, setting `target` to the named value; by name
// only (a CheckedTransformer would also take the enumerators' numbers).
template <class E>
CLI::Option* add_named_option(CLI::App& app, const std::string& flag, E& target, std::map<std::string, E> names,
                              const std::string& help) {
  return app
      .add_option_function<std::string>(
          flag, [&target, names](const std::string& v) { target = names.at(v); }, help)
      ->check(CLI::IsMember(names));
}
}  // namespace

void add_cuda_options(CLI::App& app, cuda::CudaOptions& opts) {
  using S = cuda::CudaOptions::Speculation;
  const char* group = "CUDA backend";
  app.add_flag_function(
         "--no-preload", [&opts](int64_t) { opts.preload = false; },
         "cuda: do not load every expert at open when the cache holds them all (load on first use)")
      ->group(group);
  add_named_option(app, "--speculation", opts.speculation,
                   {{"off", S::kOff}, {"resident", S::kFullyResident}, {"warm", S::kWarmCache}, {"always", S::kAlways}},
                   "cuda: when decode runs the GPU-routed graph: off, resident (default: when every expert is "
                   "resident), warm (also after a pass that loaded no expert), always (every token)")
      ->group(group);
  app.add_option_function<std::string>(
         "--cache-policy", [&opts](const std::string& v) { opts.cache_policy = parse_cache_policy(v); },
         "cuda: which expert a miss evicts from a bounded expert cache: lru (default: least recently used) "
         "or lrfu (least recently and frequently used); docs/cache.md")
      ->check(CLI::IsMember({"lru", "lrfu"}))
      ->group(group);
  using M = cuda::CudaOptions::MissReads;
  // The commands read a bounded cache's misses from the host copy unless told otherwise: it decoded
  // faster than the copy path at every budget and routing measured (docs/PERF.md). CudaOptions keeps
  // copy as its own default, so a test names the path it exercises.
  opts.miss_reads = M::kHost;
  add_named_option(app, "--miss-reads", opts.miss_reads, {{"copy", M::kCopy}, {"host", M::kHost}},
                   "cuda, bounded expert cache: host (default: the experts also kept in page-locked host memory, "
                   "which the GPU-routed decode token's kernels read in place, staged into device memory; up to "
                   "--miss-admit misses a token copied in after it; copy where that memory cannot be had) or copy "
                   "(a decode layer's misses copied into the cache before its experts run)")
      ->group(group);
  // The commands adapt the admissions to the hit rate unless given a count (cache/admission.h).
  opts.miss_admit = -1;
  app.add_option("--miss-admit", opts.miss_admit,
                 fmt::format("cuda, --miss-reads host: misses of a decode token copied into the cache after it "
                             "(default: {}, or {} while the hit rate of the recent decode tokens is at least {})",
                             AdaptiveAdmission::kAdmitLow, AdaptiveAdmission::kAdmitHigh,
                             AdaptiveAdmission::kAdmitHitRate))
      ->check(CLI::Range(0, 512))
      ->group(group);
  using P = cuda::CudaOptions::Prefetch;
  add_named_option(app, "--prefetch", opts.prefetch,
                   {{"off", P::kOff}, {"on", P::kEarly}, {"early", P::kEarly}, {"late", P::kLate}},
                   "cuda, bounded expert cache: predict each decode layer's experts with its router on the previous "
                   "layer's hidden state and copy the predicted misses ahead (the real selection is always used): "
                   "on (default; = early: on the previous layer's MoE input), late (on the previous layer's "
                   "output), or off")
      ->group(group);
  // The commands leave the count to the path and the cache (cuda::prefetch_count); CudaOptions keeps 8.
  opts.prefetch_experts = 0;
  app.add_option("--prefetch-experts", opts.prefetch_experts,
                 fmt::format("cuda, --prefetch: how many of the predicted experts (the most likely first) are "
                             "copied ahead (default: with --miss-reads host {}, or {} where the cache holds under a "
                             "quarter of the experts; {} with copy; at most the model's experts per token)",
                             cuda::kStagedPrefetchExperts, cuda::kStagedPrefetchExpertsSmallCache,
                             cuda::kCopyPrefetchExperts))
      ->check(CLI::Range(1, 512))
      ->group(group);
  app.add_flag("--profile", opts.profile,
               "cuda: per-stage GPU times (the GPU-routed decode then runs kernel by kernel, not as a graph)")
      ->group(group);
  app.add_option_function<std::string>(
         "--fast-decode", [&opts](const std::string& v) { opts.q8_decode = v == "q8"; },
         "cuda, --numerics fast: decode products on 8-bit activations with dp4a (q8, the default) for Q4_K, "
         "Q5_K, Q6_K, Q8_0, IQ2_XXS, IQ2_XS, IQ1_M, or on fp32 activations for every type (f32)")
      ->check(CLI::IsMember({"q8", "f32"}))
      ->group(group);
  app.add_option("--prefill-chunk", opts.prefill_chunk,
                 "cuda: tokens a prefill pass takes at most (default 2048); a longer prompt runs in passes of this "
                 "many. Larger passes give each expert more tokens per weight read (faster prefill) and take more "
                 "device memory for their activations")
      ->check(CLI::Range(1, cuda::kMaxPrefillChunk))
      ->group(group);
  app.add_flag("--x32-always", opts.x32_always,
               "cuda: every dense Q4_K prefill product on X32, also those too small to fill the GPU "
               "(parity checks on short prompts)")
      ->group(group);
}

CLI::Option* add_kv_type_option(CLI::App& app, std::string& kv_type) {
  return app
      .add_option("--kv-type", kv_type,
                  "KV cache type: f32, f16, bf16 or q8_0 (32 8-bit values with one fp16 scale); default f16 for "
                  "--numerics fast, f32 for exact (the only type the exact tier takes); docs/cuda.md")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
}

cuda::CudaOptions cuda_options(const CommonOptions& opts) {
  cuda::CudaOptions o = opts.cuda;
  o.cache_mib = opts.cache_mib;
  o.numerics = resolve_numerics(opts);
  o.kv_type = resolve_kv_type(opts);
  return o;
}

std::string default_backend_name() {
#ifdef REDLITE_HAVE_CUDA
  return cuda::device_available() ? "cuda" : "cpu";
#else
  return "cpu";
#endif
}

Numerics resolve_numerics(const CommonOptions& opts) {
  if (opts.numerics.empty()) return Numerics::kFast;
  const std::optional<Numerics> n = parse_numerics(opts.numerics);
  if (!n) fail("--numerics {}: expected fast or exact", opts.numerics);
  return *n;
}

KvType kv_type_for(Numerics numerics, const std::string& kv_type) {
  if (kv_type.empty()) return default_kv_type(numerics);
  const std::optional<KvType> kv = parse_kv_type(kv_type);
  if (!kv) fail("--kv-type {}: expected f32, f16, bf16 or q8_0", kv_type);
  check_kv_tier(numerics, *kv);
  return *kv;
}

KvType resolve_kv_type(const CommonOptions& opts) { return kv_type_for(resolve_numerics(opts), opts.kv_type); }

std::unique_ptr<Backend> open_backend(const std::string& name, std::shared_ptr<const Model> model,
                                      const CommonOptions& opts) {
  const Numerics numerics = resolve_numerics(opts);
  if (name == "cpu") return cpu::make_cpu_backend(std::move(model), opts.threads, numerics, resolve_kv_type(opts));
#ifdef REDLITE_HAVE_CUDA
  if (name == "cuda") return cuda::make_cuda_backend(std::move(model), cuda_options(opts));
#endif
  fail("--backend {}: unknown or not built in this binary (available: cpu)", name);
}

void check_ctx(int ctx, int n_ctx_train, const std::string& model_path) {
  if (ctx > 0 && n_ctx_train > 0 && ctx > n_ctx_train)
    fail("--ctx {}: past the model's context_length of {} tokens ({})", ctx, n_ctx_train, model_path);
}

LoadedModel open_model(const CommonOptions& opts) {
  if (opts.model_path.empty()) fail("-m/--model: no model file given");
  LoadedModel lm;
  lm.model = Model::open(opts.model_path);
  const int n_ctx_train = lm.model->config().n_ctx_train;
  check_ctx(opts.ctx, n_ctx_train, opts.model_path);
  const std::string backend = opts.backend.empty() ? default_backend_name() : opts.backend;
  lm.numerics = resolve_numerics(opts);
  lm.kv_type = resolve_kv_type(opts);
  lm.backend = open_backend(backend, lm.model, opts);
  lm.n_ctx = opts.ctx > 0 ? opts.ctx : std::min(4096, n_ctx_train);
  // A context the backend cannot hold is refused now, naming the bytes, not at the first request.
  lm.backend->check_session_fits(lm.n_ctx);
  return lm;
}

std::vector<int32_t> parse_token_ids(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view item(text.data() + pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int32_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size())
      fail("{}: '{}' is not a token id (expected a comma-separated list such as 1,2,3)", flag,
           std::string(item));
    ids.push_back(v);
    pos = end + 1;
  }
  if (ids.empty()) fail("{}: no token ids given", flag);
  return ids;
}

}  // namespace rl::cli
