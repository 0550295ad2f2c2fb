// Helpers of the CUDA backend tests (whole sessions against the oracle): prompts, cache budgets as
// a fraction of the experts, the router's selections and logits from the trace, bit-identical runs.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "model/parity.h"
#include "model/session.h"
#include "synth/synth.h"
#include "test_util.h"

namespace rl::test {

// Deterministic token ids spread over the vocabulary.
inline std::vector<int32_t> prompt(int n, int n_vocab, int seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 7919 + seed * 104729) % n_vocab);
  return t;
}

// A model `redlite synth` writes for a test into a temp dir, opened; the file goes with the object.
struct SynthModelFile {
  std::string path;
  std::shared_ptr<const Model> model;
  SynthModelFile(const std::string& tag, const synth::Options& o) : path(temp_path(tag, "model.gguf")) {
    synth::write_model(synth::make_plan(o), path);
    model = Model::open(path);
  }
  ~SynthModelFile() {
    model.reset();
    remove_temp(path);
  }
  SynthModelFile(const SynthModelFile&) = delete;
  SynthModelFile& operator=(const SynthModelFile&) = delete;
};

// Budget in MiB for a fraction of the model's experts (at least one layer's k experts).
inline int64_t budget_mib(const Model& m, double fraction) {
  const Config& c = m.config();
  size_t expert = 0;
  for (const LayerWeights& l : m.layers)
    expert = std::max(expert, l.moe.gate_exps.matrix(0).nbytes + l.moe.up_exps.matrix(0).nbytes +
                                  l.moe.down_exps.matrix(0).nbytes + 3 * 256);
  const double total = (double)expert * c.n_layer * c.n_expert;
  return std::max<int64_t>((int64_t)std::ceil(total * fraction / 1048576.0), 1);
}

// The router of every MoE layer of every pass, in order, from the trace: its selections
// ("ffn_moe_topk-L", [n_tokens][k]) and its logits ("ffn_moe_logits-L", [n_tokens][n_expert]);
// `layers` holds the selections by layer, however the passes were split.
struct RouterRecorder final : TraceSink {
  std::vector<std::vector<int32_t>> topk;
  std::vector<std::vector<float>> logits;
  SelectionRecorder layers;
  void tensor(std::string_view name, int n, int w, const float* d) override {
    if (name.rfind("ffn_moe_logits", 0) == 0) logits.emplace_back(d, d + (size_t)n * w);
  }
  void ids(std::string_view name, int n, int w, const int32_t* d) override {
    if (name.rfind("ffn_moe_topk", 0) == 0) topk.emplace_back(d, d + (size_t)n * w);
    layers.ids(name, n, w, d);
  }
};

// Selections that differ between two recordings, layer by layer (as `redlite parity` counts them).
inline int count_router_mismatches(const RouterRecorder& a, const RouterRecorder& b) {
  return count_selection_mismatches(a.layers, b.layers);
}

// Prefills both sessions with `toks` (with every position's logits when all_logits) and decodes
// `steps` greedy tokens from b's logits: every logit must be bit-identical, both at one position.
inline void expect_identical_runs(Session& a, Session& b, std::span<const int32_t> toks, bool all_logits, int steps) {
  std::vector<float> all_a, all_b;
  auto la = a.prefill(toks, all_logits ? &all_a : nullptr), lb = b.prefill(toks, all_logits ? &all_b : nullptr);
  ASSERT_EQ(la, lb);
  ASSERT_EQ(all_a, all_b);
  for (int step = 0; step < steps; step++) {
    const int32_t next = argmax(lb);
    la = a.decode(next);
    lb = b.decode(next);
    ASSERT_EQ(la, lb) << "step " << step;
    ASSERT_EQ(a.position(), b.position());
  }
}

// Two runs of toks on a and b, each session reset first, the second asking for every position's
// logits (the prefill's logits buffer then grows after a decode graph was captured, which must not
// write there): expect_identical_runs each time.
inline void expect_identical_passes(Session& a, Session& b, std::span<const int32_t> toks, int steps) {
  for (int pass = 0; pass < 2; pass++) {
    SCOPED_TRACE("pass " + std::to_string(pass));
    a.reset();
    b.reset();
    ASSERT_NO_FATAL_FAILURE(expect_identical_runs(a, b, toks, pass == 1, steps));
  }
}

}  // namespace rl::test
