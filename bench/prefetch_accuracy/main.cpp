// prefetch_accuracy: how well layer L+1's router, applied to layer L's hidden state, predicts the
// experts layer L+1 selects (the CUDA backend's --prefetch, docs/cuda.md "Prediction and
// prefetch"), measured on the CPU oracle over greedy decode passes. For each decode pass and layer
// L < n_layer - 1 it takes the oracle's residual at layer L's MoE input (attn_residual-L: what
// --prefetch early reads) and after layer L (l_out-L: --prefetch late), norms it with layer L+1's
// post-attention norm, takes the top-k of layer L+1's router on it (ties to the lower index, as
// the routing) and counts how many of layer L+1's real selections (ffn_moe_topk-(L+1)) it holds.
// Accuracy = that count / k, against chance k / n_expert. A synthetic model's random weights make
// the figure a check of the mechanism, not of a real model's. The self-check predicts each layer
// from its own MoE input, which must give the oracle's selections back (1, but for near-ties of
// the k-th and (k+1)-th logits summed in another order): it checks this tool's norm, router and top-k.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.h"
#include "cpu/cpu_backend.h"
#include "model/model.h"
#include "model/parity.h"
#include "model/session.h"

namespace {

using namespace rl;

// The decode passes' residuals and selections, by trace name, one entry per pass.
struct Recorder final : TraceSink {
  bool on = false;
  std::map<std::string, std::vector<std::vector<float>>> tensors;
  std::map<std::string, std::vector<std::vector<int32_t>>> selections;
  void tensor(std::string_view name, int n, int w, const float* d) override {
    if (on && (name.rfind("attn_residual-", 0) == 0 || name.rfind("l_out-", 0) == 0))
      tensors[std::string(name)].emplace_back(d, d + (size_t)n * w);
  }
  void ids(std::string_view name, int n, int w, const int32_t* d) override {
    if (on && name.rfind("ffn_moe_topk-", 0) == 0) selections[std::string(name)].emplace_back(d, d + (size_t)n * w);
  }
};

// top-k of router · (RMSNorm(x) * norm), ties to the lower expert index.
std::vector<int> predict(const std::vector<float>& router, const std::vector<float>& norm, const std::vector<float>& x,
                         int n_expert, int k, float eps) {
  const size_t n = x.size();
  double ss = 0;
  for (float v : x) ss += (double)v * v;
  const double scale = 1.0 / std::sqrt(ss / (double)n + eps);
  std::vector<double> h(n), logit(n_expert);
  for (size_t i = 0; i < n; i++) h[i] = x[i] * scale * norm[i];
  for (int e = 0; e < n_expert; e++) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)router[(size_t)e * n + i] * h[i];
    logit[e] = s;
  }
  std::vector<int> order(n_expert);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int a, int b) { return logit[a] > logit[b] || (logit[a] == logit[b] && a < b); });
  order.resize(k);
  return order;
}

int run(const std::string& path, int prompt_tokens, int decode_tokens, int threads) {
  auto model = Model::open(path);
  const Config& c = model->config();
  const int K = c.n_expert_used, E = c.n_expert;
  auto backend = cpu::make_cpu_backend(model, threads, Numerics::kExact);
  auto session = backend->new_session(prompt_tokens + decode_tokens + 1);
  Recorder rec;
  session->set_trace(&rec);
  std::vector<int32_t> prompt(prompt_tokens);
  for (int i = 0; i < prompt_tokens; i++) prompt[i] = (int32_t)((i * 7919 + 104729) % c.n_vocab);
  std::vector<float> logits = session->prefill(prompt);
  rec.on = true;
  for (int i = 0; i < decode_tokens; i++) logits = session->decode(argmax(logits));
  session->set_trace(nullptr);

  std::printf("%s: %d layers, %d experts, top %d; %d decode passes after %d prompt tokens; chance %.4f\n",
              path.c_str(), c.n_layer, E, K, decode_tokens, prompt_tokens, (double)K / E);
  struct Source {
    const char* trace;  // the residual's trace name
    int behind;         // layers between it and the layer predicted
    const char* label;
  };
  for (const Source& src : {Source{"attn_residual", 1, "early (layer L's MoE input)"},
                            Source{"l_out", 1, "late (layer L's output)"},
                            Source{"attn_residual", 2, "two ahead (layer L-1's MoE input)"},
                            Source{"attn_residual", 0, "self-check (its own MoE input)"}}) {
    uint64_t right = 0, total = 0;
    int n_predicted_layers = 0;
    std::vector<uint64_t> right_at_rank(K, 0);  // predictions of rank r (by router logit) that were selected
    std::string per_layer;
    for (int L = src.behind - 1; L + 1 < c.n_layer; L++) {  // layer L+1 predicted
      const LayerWeights& next = model->layers[L + 1];
      const std::vector<float> router = to_f32(next.moe.router), norm = to_f32(next.post_attention_norm);
      const auto& xs = rec.tensors[fmt::format("{}-{}", src.trace, L + 1 - src.behind)];
      const auto& actual = rec.selections[fmt::format("ffn_moe_topk-{}", L + 1)];
      if (xs.size() != (size_t)decode_tokens || actual.size() != (size_t)decode_tokens)
        fail("prefetch_accuracy: the trace holds {} {} and {} selections of layer {} for {} passes", xs.size(), src.trace,
             actual.size(), L + 1, decode_tokens);
      uint64_t layer_right = 0;
      for (int p = 0; p < decode_tokens; p++) {
        const std::vector<int> pred = predict(router, norm, xs[p], E, K, c.rms_eps);
        for (int r = 0; r < K; r++) {
          const bool used = std::count(actual[p].begin(), actual[p].end(), pred[r]) > 0;
          layer_right += used;
          right_at_rank[r] += used;
        }
      }
      right += layer_right;
      total += (uint64_t)decode_tokens * K;
      n_predicted_layers++;
      per_layer += fmt::format(" {:.2f}", (double)layer_right / ((double)decode_tokens * K));
    }
    std::string per_rank;
    for (int r = 0; r < K; r++)
      per_rank += fmt::format(" {:.2f}", (double)right_at_rank[r] / ((double)decode_tokens * n_predicted_layers));
    std::printf("  %-33s accuracy %.4f; by layer L+1 = %d..%d:%s; by rank 1..%d:%s\n", src.label,
                total ? (double)right / total : 0.0, src.behind, c.n_layer - 1, per_layer.c_str(), K,
                per_rank.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"prefetch_accuracy: the next layer's router on this layer's hidden state, against its real "
               "selections (CPU oracle, greedy decode)"};
  std::string model;
  int prompt_tokens = 16, decode_tokens = 32, threads = 0;
  app.add_option("-m,--model", model, "GGUF model (qwen3next)")->required();
  app.add_option("--prompt-tokens", prompt_tokens, "prompt length before the decode passes")->check(CLI::Range(1, 4096));
  app.add_option("--decode-tokens", decode_tokens, "decode passes measured")->check(CLI::Range(1, 4096));
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(model, prompt_tokens, decode_tokens, threads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "prefetch_accuracy: %s\n", e.what());
    return 1;
  }
}
