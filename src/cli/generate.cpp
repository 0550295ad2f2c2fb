// redlite generate: a continuation of a prompt, as token ids (JSON with --json).
// The prompt comes from --tokens; the text path (-p, through the tokenizer) plugs into
// prompt_ids() and print_result().
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/common_options.h"
#include "common/error.h"
#include "cli/text_generation.h"
#include "generate/sampler.h"

namespace rl::cli {
namespace {

struct GenerateOptions {
  CommonOptions common;
  std::string tokens;
  std::string prompt_text;  // -p: text through the model's tokenizer
  int n_generate = 32;
  bool greedy = false;
  bool json = false;
  SamplingParams sampling;
};

std::vector<int32_t> prompt_ids(const GenerateOptions& o, const Tokenizer* tok) {
  if (tok) return tokenize_prompt(*tok, o.prompt_text, /*add_bos=*/true);
  if (o.tokens.empty()) fail("generate: give the prompt with --tokens 1,2,3 or -p TEXT");
  return parse_token_ids(o.tokens, "--tokens");
}

struct Generation {
  std::vector<int32_t> prompt, generated;
  double prefill_s = 0, decode_s = 0;
};

Generation generate(Session& session, const GenerateOptions& o, const Tokenizer* tok) {
  using clock = std::chrono::steady_clock;
  Generation g;
  g.prompt = prompt_ids(o, tok);
  SamplingParams params = o.sampling;
  if (o.greedy) params.temperature = 0.0f;
  params.validate();
  Sampler sampler(params);
  for (int32_t t : g.prompt) sampler.accept(t);

  const auto t0 = clock::now();
  std::vector<float> logits = session.prefill(g.prompt);
  const auto t1 = clock::now();
  for (int i = 0; i < o.n_generate; i++) {
    const int32_t next = sampler.sample(logits);
    sampler.accept(next);
    g.generated.push_back(next);
    if (i + 1 < o.n_generate) logits = session.decode(next);
  }
  const auto t2 = clock::now();
  g.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  g.decode_s = std::chrono::duration<double>(t2 - t1).count();
  return g;
}

void print_result(const Generation& g, const GenerateOptions& o, const std::string& backend, const Tokenizer* tok) {
  const int n_decode = std::max(0, (int)g.generated.size() - 1);  // the first token needs no decode pass
  const double prefill_tok_s = g.prefill_s > 0 ? g.prompt.size() / g.prefill_s : 0;
  const double decode_tok_s = g.decode_s > 0 ? n_decode / g.decode_s : 0;
  if (o.json) {
    nlohmann::json j;
    j["backend"] = backend;
    j["prompt_tokens"] = g.prompt;
    j["tokens"] = g.generated;
    if (tok) j["text"] = tok->decode(g.generated, /*render_special=*/false);
    j["greedy"] = o.greedy || o.sampling.greedy();
    j["prefill_tok_s"] = prefill_tok_s;
    j["decode_tok_s"] = decode_tok_s;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());  // random-weight text may not be UTF-8
  } else {
    for (size_t i = 0; i < g.generated.size(); i++) std::printf(i ? ",%d" : "%d", g.generated[i]);
    std::printf("\n");
  }
  std::fprintf(stderr, "%s: prompt %zu tokens %.1f tok/s, generated %zu tokens, decode %.2f tok/s\n",
               backend.c_str(), g.prompt.size(), prefill_tok_s, g.generated.size(), decode_tok_s);
}

int run_generate(const GenerateOptions& o) {
  LoadedModel lm = open_model(o.common);
  std::unique_ptr<Tokenizer> tok;
  if (!o.prompt_text.empty()) tok = Tokenizer::from_gguf(lm.model->gguf());
  auto session = lm.new_session();
  const Generation g = generate(*session, o, tok.get());
  print_result(g, o, lm.backend->name(), tok.get());
  return 0;
}

const Registrar registrar("generate", "generate a continuation of a prompt (token ids)", [](CLI::App& sub) {
  auto o = std::make_shared<GenerateOptions>();
  add_common_options(sub, o->common);
  auto* tokens = sub.add_option("--tokens", o->tokens, "prompt token ids, e.g. 1,2,3");
  sub.add_option("-p,--prompt", o->prompt_text, "prompt text (tokenized with the model's tokenizer)")->excludes(tokens);
  sub.add_option("-n,--n-predict", o->n_generate, "tokens to generate")->check(CLI::NonNegativeNumber);
  sub.add_flag("--greedy", o->greedy, "argmax decoding (ties to the lower id)");
  sub.add_option("--temp", o->sampling.temperature, "sampling temperature (<= 0: greedy)");
  sub.add_option("--top-k", o->sampling.top_k, "top-k (<= 0: off)");
  sub.add_option("--top-p", o->sampling.top_p, "top-p (>= 1: off)");
  sub.add_option("--seed", o->sampling.seed, "sampling seed");
  sub.add_flag("--json", o->json, "print JSON: prompt_tokens, tokens, tok/s");
  return [o] { return run_generate(*o); };
});

}  // namespace
}  // namespace rl::cli
