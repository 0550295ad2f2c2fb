#include "cli/common_options.h"

#include <algorithm>
#include <charconv>

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
  app.add_option("--ctx", opts.ctx, "context length in tokens (default: min(4096, the model's))")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--cache-mib", opts.cache_mib, "GPU expert-cache budget in MiB (default: backend's)")
      ->check(CLI::NonNegativeNumber);
}

std::string default_backend_name() {
#ifdef REDLITE_HAVE_CUDA
  return cuda::device_available() ? "cuda" : "cpu";
#else
  return "cpu";
#endif
}

std::unique_ptr<Backend> open_backend(const std::string& name, std::shared_ptr<const Model> model,
                                      const CommonOptions& opts) {
  if (name == "cpu") return cpu::make_cpu_backend(std::move(model), opts.threads);
#ifdef REDLITE_HAVE_CUDA
  if (name == "cuda") return cuda::make_cuda_backend(std::move(model), cuda::CudaOptions::from_env(opts.cache_mib));
#endif
  fail("--backend {}: unknown or not built in this binary (available: cpu)", name);
}

LoadedModel open_model(const CommonOptions& opts) {
  if (opts.model_path.empty()) fail("-m/--model: no model file given");
  LoadedModel lm;
  lm.model = Model::open(opts.model_path);
  lm.backend = open_backend(opts.backend.empty() ? default_backend_name() : opts.backend, lm.model, opts);
  lm.n_ctx = opts.ctx > 0 ? opts.ctx : std::min(4096, lm.model->config().n_ctx_train);
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
