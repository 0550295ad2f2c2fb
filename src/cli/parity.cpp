// redlite parity: a backend against a llama.cpp reference file (fixtures README format).
// Per prompt: top-1 agreement over the prompt positions, relative RMS error of the last logits,
// common prefix of the greedy continuation; PASS/FAIL against DESIGN.md §6's bounds for an F32
// reference, report only for a native one (llama.cpp's quantised-activation kernels). The fast
// tier against an F32 reference: PASS/FAIL against llama.cpp's native path over all the prompts
// (top-1 agreement over every position, mean last-position relative RMS).
#include <cstdio>
#include <sstream>

#include "cli/backend_parity.h"
#include "cli/command.h"
#include "cli/common_options.h"
#include "common/error.h"
#include "model/parity.h"

namespace rl::cli {
namespace {

struct ParityOptions {
  CommonOptions common;
  std::string ref;
  std::string native_ref;  // the fast tier's bar; empty: the .ref.json beside --ref
  std::string prompts;  // comma-separated names; empty: all
  int chunk = 256;
  bool trace = false;
  BackendParityOptions vs_oracle;
};

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Compares the reference's trace prompt tensor by tensor; returns false when a bound fails.
bool check_trace(Session& session, const Reference& ref, bool enforce) {
  const RefPrompt* p = ref.find_prompt(ref.trace_prompt);
  if (!p) fail("{}: trace prompt '{}' is not among the prompts", ref.path, ref.trace_prompt);
  RecordingTrace rec;
  session.reset();
  session.set_trace(&rec);
  session.prefill(p->token_ids);
  session.set_trace(nullptr);
  bool ok = true;
  for (const TraceDiff& d : compare_trace(rec.tensors, ref.load_trace())) {
    const bool pass = !d.missing && (d.is_i32 ? d.rows_differing == 0 : d.rel_rms <= kParityMaxRelRms);
    ok = ok && pass;
    if (d.missing)
      std::printf("  trace %-20s missing\n", d.name.c_str());
    else if (d.is_i32)
      std::printf("  trace %-20s rows differing %d%s\n", d.name.c_str(), d.rows_differing,
                  enforce ? (pass ? "  PASS" : "  FAIL") : "");
    else
      std::printf("  trace %-20s rel rms %.3e%s\n", d.name.c_str(), d.rel_rms,
                  enforce ? (pass ? "  PASS" : "  FAIL") : "");
  }
  return ok;
}

int run_parity(const ParityOptions& o) {
  if (o.ref.empty()) return run_backend_parity(o.common, o.vs_oracle);  // backend vs the CPU oracle
  const Reference ref = load_reference(o.ref);
  LoadedModel lm = open_model(o.common);
  if (ref.n_vocab != lm.model->config().n_vocab)
    fail("--ref {}: n_vocab {} does not match the model's {}", o.ref, ref.n_vocab, lm.model->config().n_vocab);
  const int n_ctx_needed = [&] {
    size_t n = 0;
    for (const RefPrompt& p : ref.prompts) n = std::max(n, p.token_ids.size() + p.greedy.size());
    return (int)n;
  }();
  const int n_ctx = std::max(lm.n_ctx, n_ctx_needed);
  auto session = lm.backend->new_session(n_ctx);

  std::vector<const RefPrompt*> prompts;
  if (o.prompts.empty()) {
    for (const RefPrompt& p : ref.prompts) prompts.push_back(&p);
  } else {
    for (const std::string& name : split_names(o.prompts)) {
      const RefPrompt* p = ref.find_prompt(name);
      if (!p) fail("--prompts: '{}' is not a prompt of {}", name, o.ref);
      prompts.push_back(p);
    }
  }

  // The exact tier is held to the oracle's bounds per prompt; the fast tier, against an F32
  // reference, to llama.cpp's native path over all the prompts together (fast_tier_verdict).
  const bool fast = lm.numerics == Numerics::kFast;
  const bool enforce = ref.is_f32 && !fast;
  std::printf("parity: %s backend, %s numerics, vs %s (%s reference: %s)\n", lm.backend->name().c_str(),
              numerics_name(lm.numerics), o.ref.c_str(), ref.is_f32 ? "F32" : "native",
              enforce ? "bounds enforced" : ref.is_f32 ? "the fast tier's bar" : "report only");
  bool all_pass = true;
  std::vector<PromptParity> results;
  for (const RefPrompt* p : prompts) {
    const PromptParity r = measure_prompt(*session, *p, ref.n_vocab, o.chunk);
    results.push_back(r);
    const bool pass = parity_passes(r);
    all_pass = all_pass && pass;
    std::printf("%-14s tokens %5d  top1 %5d/%-5d (%.1f%%)  last rel rms %.3e  max abs %.3e  greedy %2d/%d%s\n",
                r.name.c_str(), r.n_tokens, r.top1_agree, r.n_tokens, 100.0 * r.top1_agreement(),
                r.last_rel_rms, r.last_max_abs, r.greedy_common, r.greedy_len,
                enforce ? (pass ? "  PASS" : "  FAIL") : "");
  }
  if (o.trace && !ref.trace_prompt.empty()) all_pass = check_trace(*session, ref, enforce) && all_pass;
  if (fast && ref.is_f32) {
    std::vector<std::string> names;
    for (const RefPrompt* p : prompts) names.push_back(p->name);
    const std::string native_path = o.native_ref.empty() ? native_reference_path(o.ref) : o.native_ref;
    const TierAccuracy bar = native_accuracy(ref, load_reference(native_path), names);
    const TierAccuracy got = tier_accuracy(results);
    const bool top1_ok = got.top1_agreement() >= bar.top1_agreement();
    const bool rms_ok = got.mean_last_rel_rms <= bar.mean_last_rel_rms;
    std::printf("fast tier, %d prompts: top-1 agreement %.4f over %d positions (bar >= %.4f)  %s\n", got.n_prompts,
                got.top1_agreement(), got.n_positions, bar.top1_agreement(), top1_ok ? "PASS" : "FAIL");
    std::printf("fast tier, %d prompts: mean last rel rms %.4f (bar <= %.4f)  %s\n", got.n_prompts,
                got.mean_last_rel_rms, bar.mean_last_rel_rms, rms_ok ? "PASS" : "FAIL");
    std::printf("  (bar: llama.cpp's native path, %s, against the F32 reference)\n", native_path.c_str());
    std::printf("%s\n", got.meets(bar) ? "PASS" : "FAIL");
    return got.meets(bar) ? 0 : 1;
  }
  if (!enforce) return 0;
  std::printf("%s\n", all_pass ? "PASS" : "FAIL");
  return all_pass ? 0 : 1;
}

const Registrar registrar("parity", "compare a backend with a llama.cpp reference file", [](CLI::App& sub) {
  auto o = std::make_shared<ParityOptions>();
  add_common_options(sub, o->common);
  sub.add_option("--ref", o->ref, "reference JSON (<model>.ref-f32.json or .ref.json); without it the backend "
                 "is compared with the CPU oracle");
  sub.add_option("--native-ref", o->native_ref,
                 "--numerics fast with an F32 --ref: llama.cpp's native reference that sets the bar (default: the "
                 "<model>.ref.json beside --ref)");
  sub.add_option("--repeat", o->vs_oracle.repeat, "vs the oracle: passes (2: the second on a warm cache)")
      ->check(CLI::PositiveNumber);
  sub.add_option("--prompt-tokens", o->vs_oracle.prompt_tokens, "vs the oracle: longest prompt in tokens")
      ->check(CLI::PositiveNumber);
  sub.add_option("--budget-fractions", o->vs_oracle.budget_fractions,
                 "vs the oracle: expert-cache budgets as fractions of all experts, e.g. 1,0.5,0.1")
      ->delimiter(',');
  sub.add_option("--prompts", o->prompts, "prompt names, comma-separated (default: all)");
  sub.add_option("--chunk", o->chunk, "prefill chunk in tokens")->check(CLI::PositiveNumber);
  sub.add_flag("--trace", o->trace, "also compare the reference's intermediate tensors");
  return [o] { return run_parity(*o); };
});

}  // namespace
}  // namespace rl::cli
