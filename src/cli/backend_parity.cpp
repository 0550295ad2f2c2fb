#include "cli/backend_parity.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>

#include "common/error.h"
#include "model/parity.h"

namespace rl::cli {
namespace {

// Fixed, model-independent prompts: deterministic ids spread over the vocabulary.
std::vector<int32_t> make_prompt(int n, int n_vocab, int seed) {
  std::vector<int32_t> t(n);
  uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(seed + 1);
  for (int i = 0; i < n; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    t[i] = (int32_t)(s % (uint64_t)n_vocab);
  }
  return t;
}

struct Run {
  std::vector<float> prompt_logits;  // [n][n_vocab]
  std::vector<std::vector<float>> greedy_logits;
  std::vector<int32_t> greedy;
  SelectionRecorder topk;
};

Run run(Session& s, const std::vector<int32_t>& prompt, int n_greedy) {
  Run r;
  s.reset();
  s.set_trace(&r.topk);
  std::vector<float> last = s.prefill(prompt, &r.prompt_logits);
  for (int i = 0; i < n_greedy; i++) {
    const int32_t next = argmax(last);
    r.greedy.push_back(next);
    last = s.decode(next);
    r.greedy_logits.push_back(last);
  }
  s.set_trace(nullptr);
  return r;
}

}  // namespace

int run_backend_parity(const CommonOptions& common, const BackendParityOptions& o) {
  if (common.model_path.empty()) fail("-m/--model: no model file given");
  const std::string name = common.backend.empty() ? default_backend_name() : common.backend;
  auto model = Model::open(common.model_path);
  const int n_vocab = model->config().n_vocab;
  CommonOptions oracle_options = common;
  oracle_options.numerics = "exact";  // the reference is the oracle, whatever tier the backend under test runs
  oracle_options.kv_type = "f32";     // and its KV cache, whatever --kv-type the backend under test keeps
  auto oracle = open_backend("cpu", model, oracle_options);
  const std::vector<int> lengths = {std::max(2, o.prompt_tokens / 4), o.prompt_tokens};
  const int n_ctx = o.prompt_tokens + o.greedy + 1;
  auto so = oracle->new_session(n_ctx);

  // The exact tier is held to the oracle (every bound below); the fast tier's figures against it are
  // reported (its bar is llama.cpp's native path: `parity --ref`).
  const bool exact = resolve_numerics(common) == Numerics::kExact;
  std::printf("parity: %s backend (%s numerics) vs the cpu oracle on %s (%d prompts, %d greedy tokens, repeat %d)%s\n",
              name.c_str(), exact ? "exact" : "fast", common.model_path.c_str(), (int)lengths.size(), o.greedy,
              o.repeat, exact ? "" : ", report only");
  std::vector<Run> reference;
  for (size_t p = 0; p < lengths.size(); p++)
    reference.push_back(run(*so, make_prompt(lengths[p], n_vocab, (int)p), o.greedy));
  so.reset();
  oracle.reset();

  // Budgets in MiB: a fraction of (layers x experts) slots of the largest expert (3 matrices, each
  // padded to 256 bytes as the CUDA backend lays out its slots).
  std::vector<int64_t> budgets;
  if (o.budget_fractions.empty()) budgets.push_back(common.cache_mib);
  size_t slot = 0;
  for (const LayerWeights& l : model->layers) {
    auto pad = [](size_t n) { return (n + 255) / 256 * 256; };
    slot = std::max(slot, pad(l.moe.gate_exps.matrix(0).nbytes) + pad(l.moe.up_exps.matrix(0).nbytes) +
                              pad(l.moe.down_exps.matrix(0).nbytes));
  }
  const double all_bytes = (double)slot * model->config().n_layer * model->config().n_expert;
  for (double f : o.budget_fractions)
    budgets.push_back(f >= 1.0 ? 0 : std::max<int64_t>(1, (int64_t)std::ceil(all_bytes * f / 1048576.0)));

  bool all_pass = true;
  for (size_t bi = 0; bi < budgets.size(); bi++) {
    CommonOptions opts = common;
    opts.cache_mib = budgets[bi];
    std::printf("budget: --cache-mib %lld%s\n", (long long)budgets[bi],
                o.budget_fractions.empty()
                    ? ""
                    : fmt::format(" ({} of the experts)", o.budget_fractions[bi]).c_str());
    auto backend = open_backend(name, model, opts);
    auto sb = backend->new_session(n_ctx);
    for (int pass = 0; pass < o.repeat; pass++) {
      for (size_t p = 0; p < lengths.size(); p++) {
        const Run& ref = reference[p];
        const Run got = run(*sb, make_prompt(lengths[p], n_vocab, (int)p), o.greedy);
        int top1 = 0, positions = 0;
        double worst = 0, rms_sum = 0;
        for (int i = 0; i < lengths[p]; i++, positions++) {
          std::span<const float> a(got.prompt_logits.data() + (size_t)i * n_vocab, n_vocab);
          std::span<const float> b(ref.prompt_logits.data() + (size_t)i * n_vocab, n_vocab);
          top1 += argmax(a) == argmax(b);
          const double rr = relative_rms(a, b);
          worst = std::max(worst, rr);
          rms_sum += rr;
        }
        const int prompt_top1 = top1;
        const int common_greedy = common_prefix(got.greedy, ref.greedy);
        for (int i = 0; i < common_greedy; i++, positions++) {
          top1 += argmax(got.greedy_logits[i]) == argmax(ref.greedy_logits[i]);
          worst = std::max(worst, relative_rms(got.greedy_logits[i], ref.greedy_logits[i]));
        }
        const int mismatches = count_selection_mismatches(got.topk, ref.topk);
        const bool pass_ok =
            top1 == positions && worst <= o.max_rel_rms && common_greedy == o.greedy && mismatches == 0;
        all_pass = all_pass && pass_ok;
        std::printf(
            "pass %d prompt %zu: tokens %4d  top1 %d/%d  max rel rms %.3e  greedy %d/%d  router "
            "mismatches %d  %s\n",
            pass + 1, p, lengths[p], top1, positions, worst, common_greedy, o.greedy, mismatches,
            exact ? (pass_ok ? "PASS" : "FAIL") : "");
        if (!exact)
          std::printf("  teacher-forced over the prompt: top-1 agreement %d/%d (%.1f%%), mean rel rms %.3e\n",
                      prompt_top1, lengths[p], 100.0 * prompt_top1 / lengths[p], rms_sum / lengths[p]);
      }
    }
  }
  if (!exact) return 0;
  std::printf("%s\n", all_pass ? "PASS" : "FAIL");
  return all_pass ? 0 : 1;
}

}  // namespace rl::cli
