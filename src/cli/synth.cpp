// redlite synth: write a synthetic qwen3next GGUF (random, numerically healthy weights) with the
// tensor table of a real model, or print that table as JSON (--table-only).
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "cli/command.h"
#include "common/error.h"
#include "common/format.h"
#include "synth/recipes.h"
#include "synth/synth.h"

namespace rl::cli {
namespace {

struct SynthArgs {
  synth::Options options;
  std::string out;
  std::string layout = "legacy";
  bool table_only = false;
  std::map<std::string, int> dims;  // only the flags that were given
};

int run_synth(const SynthArgs& a, const std::map<std::string, CLI::Option*>& dim_flags) {
  synth::Options o = a.options;
  if (a.layout == "legacy") o.layout = synth::ProjectionLayout::LegacyFused;
  else if (a.layout == "split") o.layout = synth::ProjectionLayout::Split;
  else fail("--layout {}: unknown layout (known: legacy, split)", a.layout);
  for (const auto& [name, opt] : dim_flags)
    if (opt->count() > 0) o.dim_overrides[name] = a.dims.at(name);

  const synth::Plan plan = synth::make_plan(o);
  if (a.table_only) {
    std::printf("%s\n", synth::plan_json(plan).dump(1).c_str());
    return 0;
  }
  if (a.out.empty()) fail("--out: required (or use --table-only)");
  const synth::WriteStats s = synth::write_model(plan, a.out);
  std::printf("wrote %s: %zu tensors, %s in %.2f s (%.0f MB/s, %d threads), preset %s, recipe %s, seed %llu%s%s\n",
              a.out.c_str(), plan.tensors.size(), human_bytes(s.file_bytes).c_str(), s.seconds,
              s.file_bytes / 1e6 / std::max(s.seconds, 1e-9), s.threads, o.preset.c_str(), o.recipe.c_str(),
              (unsigned long long)o.seed, s.placeholder_vocab ? ", placeholder vocabulary" : "",
              o.router_skew > 0 ? fmt::format(", router skew {}", o.router_skew).c_str() : "");
  return 0;
}

Registrar reg("synth", "Write a synthetic qwen3next GGUF with random weights (benchmarks, demos, tests)",
              [](CLI::App& sub) -> std::function<int()> {
                auto a = std::make_shared<SynthArgs>();
                auto dim_flags = std::make_shared<std::map<std::string, CLI::Option*>>();
                sub.add_option("--preset", a->options.preset, "tiny (a few MB) or 80b (Qwen3-Next-80B-A3B shapes)")
                    ->required();
                sub.add_option("--out", a->out, "output GGUF path (written as PATH.tmp, then renamed)");
                sub.add_option("--seed", a->options.seed, "random seed (same seed, same bytes)");
                sub.add_option("--recipe", a->options.recipe, synth::recipe_help());
                sub.add_option("--vocab-from", a->options.vocab_from,
                               "copy the tokenizer of this GGUF (default: a placeholder byte-level vocabulary)");
                sub.add_option("--router-skew", a->options.router_skew,
                               "Zipf exponent of expert popularity; > 0 also adds slow DeltaNet topic heads so consecutive tokens reuse experts (0 = plain random model; docs/synth.md)");
                sub.add_option("--layout", a->layout, "DeltaNet projections: legacy (ssm_in) or split (attn_qkv + attn_gate)");
                sub.add_option("--threads", a->options.threads, "fill threads (default: all cores)");
                sub.add_flag("--table-only", a->table_only, "print the tensor table and metadata as JSON, write nothing");
                for (const auto& name : synth::dim_names()) {
                  std::string flag = "--" + name;
                  std::replace(flag.begin(), flag.end(), '_', '-');
                  a->dims[name] = 0;
                  (*dim_flags)[name] = sub.add_option(flag, a->dims[name], "override the preset's " + name);
                }
                return [a, dim_flags] { return run_synth(*a, *dim_flags); };
              });

}  // namespace
}  // namespace rl::cli
