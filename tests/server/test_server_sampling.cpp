// Sampling and logprobs through the server, end to end (fixture model B, CPU backend): the seed
// makes a sampled reply reproducible and another seed changes it; top_k, top_p and min_p at their
// limits reduce sampling at temperature 1 to the greedy reply; each penalty changes a greedy
// reply exactly as the Generator with that penalty does; and the reported logprobs equal a
// log-softmax computed here, in double, of the logits `redlite logits` writes for the same tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "server_test_util.h"

using nlohmann::json;
using namespace rl;
using namespace rl::test;

namespace {

constexpr const char* kPrompt = "The quick brown fox";

// A completion of kPrompt unless the body names a prompt.
json completion(const TestServer& s, json body) {
  if (!body.contains("prompt")) body["prompt"] = kPrompt;
  auto r = s.client().Post("/v1/completions", body.dump(), "application/json");
  if (!r) return json{{"error", "no response"}};
  if (r->status != 200) return json{{"error", r->body}};
  return json::parse(r->body);
}

std::string completion_text(const TestServer& s, const json& body) {
  const json j = completion(s, body);
  EXPECT_FALSE(j.contains("error")) << j.dump();
  return j.contains("choices") ? j["choices"][0]["text"].get<std::string>() : std::string();
}

// The server's sampling defaults (OpenAI's: temperature 1, top_p 1, no top-k or min-p filter).
SamplingParams server_defaults() {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

// The Generator's reply to `prompt` (text) with `params`.
std::string generator_text(const std::string& prompt, const SamplingParams& params, int max_tokens) {
  auto owned = fixture_loader(server_model())([](float) {});
  return test::generator_text(owned.tokenizer->encode(prompt, true), params, max_tokens);
}

class ServerSampling : public ServerModelTest {};

}  // namespace

// A seed reproduces a sampled reply (chat and completions); two seeds give two replies; and the
// seeded reply is the Generator's with that seed, so the value itself reaches the sampler.
TEST_F(ServerSampling, SeedReproducesAndDifferentSeedsDiffer) {
  TestServer s(ServerConfig{});
  ASSERT_TRUE(s.ready());
  const json at_42 = {{"max_tokens", 16}, {"temperature", 1.0}, {"seed", 42}};
  json at_43 = at_42;
  at_43["seed"] = 43;
  const std::string a = completion_text(s, at_42), b = completion_text(s, at_42), c = completion_text(s, at_43);
  EXPECT_EQ(a, b) << "the same seed gave two replies";
  EXPECT_NE(a, c) << "seeds 42 and 43 gave the same reply";
  SamplingParams p = server_defaults();
  p.seed = 42;
  EXPECT_EQ(a, generator_text(kPrompt, p, 16));
  EXPECT_NE(a, completion_text(s, {{"max_tokens", 16}, {"temperature", 0}})) << "temperature 1 sampled the greedy reply";

  json chat = chat_body("Tell me a story.", 16);
  chat["temperature"] = 1.0;
  chat["seed"] = 7;
  auto post = [&](const json& body) {
    auto r = s.client().Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r && r->status == 200 ? json::parse(r->body)["choices"][0]["message"]["content"].get<std::string>()
                                 : std::string();
  };
  const std::string first = post(chat);
  EXPECT_EQ(post(chat), first);
  chat["seed"] = 8;
  EXPECT_NE(post(chat), first);
}

// At temperature 1 the filters at their limits leave only the most probable token: top_k 1,
// top_p just above 0 (the smallest set reaching it is one token), min_p 1 (p_i >= p_max). Each
// reply must be the greedy one, which plain temperature-1 sampling is not.
TEST_F(ServerSampling, FiltersAtTheirLimitsGiveTheGreedyReply) {
  TestServer s(ServerConfig{});
  ASSERT_TRUE(s.ready());
  const std::string greedy = completion_text(s, {{"max_tokens", 16}, {"temperature", 0}});
  ASSERT_FALSE(greedy.empty());
  EXPECT_NE(completion_text(s, {{"max_tokens", 16}, {"temperature", 1.0}, {"seed", 5}}), greedy);
  const json limits[] = {{{"top_k", 1}}, {{"top_p", 1e-6}}, {{"min_p", 1.0}}};
  for (json body : limits) {
    SCOPED_TRACE(body.dump());
    body["max_tokens"] = 16;
    body["temperature"] = 1.0;
    body["seed"] = 5;
    EXPECT_EQ(completion_text(s, body), greedy);
  }
}

// Each penalty, alone, at temperature 0: the reply is the Generator's with that penalty, and it
// differs from the plain greedy reply, so a penalty dropped on the way fails the test. A penalty
// changes a greedy reply only where the argmax is a token already seen; the prompt is the first
// of a fixed list for which the Generator's reply changes with every penalty.
TEST_F(ServerSampling, PenaltiesReachTheSampler) {
  constexpr int kTokens = 24;
  struct Penalty {
    const char* field;
    float value;
    float SamplingParams::*member;
  };
  const Penalty penalties[] = {{"presence_penalty", 2.0f, &SamplingParams::presence_penalty},
                               {"frequency_penalty", 2.0f, &SamplingParams::frequency_penalty},
                               {"repeat_penalty", 5.0f, &SamplingParams::repeat_penalty}};
  auto with = [](const Penalty* p) {
    SamplingParams params = server_defaults();
    params.temperature = 0;
    if (p) params.*p->member = p->value;
    return params;
  };
  std::string prompt;
  std::vector<std::string> want;  // per penalty
  for (int i = 0; i < 40 && prompt.empty(); i++) {
    const std::string candidate = "Client " + std::to_string(i) + " says";
    const std::string greedy = generator_text(candidate, with(nullptr), kTokens);
    want.clear();
    for (const Penalty& p : penalties) want.push_back(generator_text(candidate, with(&p), kTokens));
    if (std::all_of(want.begin(), want.end(), [&](const std::string& w) { return w != greedy; })) prompt = candidate;
  }
  ASSERT_FALSE(prompt.empty()) << "no prompt of the list has a greedy reply that every penalty changes";
  TestServer s(ServerConfig{});
  ASSERT_TRUE(s.ready());
  for (size_t i = 0; i < std::size(penalties); i++) {
    SCOPED_TRACE(penalties[i].field);
    EXPECT_EQ(completion_text(s, {{"prompt", prompt}, {"max_tokens", kTokens}, {"temperature", 0},
                                  {penalties[i].field, penalties[i].value}}),
              want[i]);
  }
}

namespace {

// `redlite logits` on the CPU backend: [tokens.size()][n_vocab] logits, one row per position.
std::vector<float> oracle_logits(const std::vector<int32_t>& tokens, int n_vocab) {
  std::string ids;
  for (int32_t t : tokens) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::string out = temp_path("sampling", "logits.f32");
  const ShellRun r = run_shell(redlite_bin() + " logits -m " + server_model() + " --backend cpu --numerics exact --threads 2 --tokens " +
                               ids + " --all-positions --out " + out + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  std::vector<float> v(tokens.size() * (size_t)n_vocab);
  std::ifstream f(out, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), (std::streamsize)(v.size() * sizeof(float)));
  EXPECT_EQ((size_t)f.gcount(), v.size() * sizeof(float)) << "short logits file " << out;
  remove_temp(out);
  return v;
}

// log-softmax of one row, in double.
std::vector<double> log_softmax(const float* row, int n) {
  double mx = -INFINITY;
  for (int i = 0; i < n; i++) mx = std::max(mx, (double)row[i]);
  double sum = 0;
  for (int i = 0; i < n; i++) sum += std::exp((double)row[i] - mx);
  const double log_z = mx + std::log(sum);
  std::vector<double> out(n);
  for (int i = 0; i < n; i++) out[i] = (double)row[i] - log_z;
  return out;
}

// Token ids in order of probability (ties to the lower id, as the server and greedy sampling).
std::vector<int32_t> most_probable(const std::vector<double>& lp, size_t n) {
  std::vector<int32_t> idx(lp.size());
  for (size_t i = 0; i < idx.size(); i++) idx[i] = (int32_t)i;
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                    [&](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
  idx.resize(n);
  return idx;
}

// The server computes the log-softmax in float from its own decode logits: measured within 9.1e-7
// of this one on the fixture (both tests), 5e-6 leaves a margin of 5x.
constexpr double kLogprobTolerance = 5e-6;

// One reported token (`logprob`, `top` as (piece, logprob) most probable first) against the
// reference row: the chosen token is the greedy one, its logprob and the alternatives' match.
struct Reported {
  std::string piece;
  double logprob;
  std::vector<std::pair<std::string, double>> top;
};

// Replays the greedy reply through `redlite logits`: the reported tokens, in order, each the
// argmax of its row, with the reported logprobs. Returns the number of tokens checked.
size_t expect_logprobs_match_oracle(const std::vector<int32_t>& prompt, const std::vector<Reported>& reported,
                                    size_t top_n) {
  auto owned = fixture_loader(server_model())([](float) {});
  const Tokenizer& tok = *owned.tokenizer;
  const int n_vocab = tok.n_vocab();
  // Greedy ids from the oracle, one position at a time, checked against the reported pieces.
  std::vector<int32_t> ids = prompt;
  double worst = 0;
  for (size_t i = 0; i < reported.size(); i++) {
    const std::vector<float> rows = oracle_logits(ids, n_vocab);
    const std::vector<double> lp = log_softmax(rows.data() + (ids.size() - 1) * (size_t)n_vocab, n_vocab);
    const std::vector<int32_t> best = most_probable(lp, std::max<size_t>(top_n, 1));
    SCOPED_TRACE("generated token " + std::to_string(i));
    EXPECT_EQ(reported[i].piece, wire_text(tok.piece(best[0]))) << "not the greedy token";
    EXPECT_NEAR(reported[i].logprob, lp[best[0]], kLogprobTolerance);
    worst = std::max(worst, std::fabs(reported[i].logprob - lp[best[0]]));
    EXPECT_EQ(reported[i].top.size(), top_n);
    for (size_t k = 0; k < std::min(top_n, reported[i].top.size()); k++) {
      EXPECT_EQ(reported[i].top[k].first, wire_text(tok.piece(best[k]))) << "alternative " << k;
      EXPECT_NEAR(reported[i].top[k].second, lp[best[k]], kLogprobTolerance) << "alternative " << k;
      worst = std::max(worst, std::fabs(reported[i].top[k].second - lp[best[k]]));
    }
    ids.push_back(best[0]);
  }
  std::printf("logprobs of %zu tokens: largest |server - log-softmax of redlite logits| %.2e\n", reported.size(), worst);
  return reported.size();
}

}  // namespace

TEST_F(ServerSampling, CompletionLogprobsEqualTheOraclesLogSoftmax) {
  TestServer s(ServerConfig{});
  ASSERT_TRUE(s.ready());
  const json j = completion(s, {{"max_tokens", 5}, {"temperature", 0}, {"logprobs", 4}});
  ASSERT_FALSE(j.contains("error")) << j.dump();
  const json& lp = j["choices"][0]["logprobs"];
  std::vector<Reported> reported;
  for (size_t i = 0; i < lp["tokens"].size(); i++) {
    Reported r{lp["tokens"][i], lp["token_logprobs"][i], {}};
    // Completions' alternatives are an object {piece: logprob}: sort it by logprob to compare.
    for (const auto& [piece, v] : lp["top_logprobs"][i].items()) r.top.emplace_back(piece, v.get<double>());
    std::sort(r.top.begin(), r.top.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    reported.push_back(std::move(r));
  }
  ASSERT_EQ(reported.size(), 5u);
  auto owned = fixture_loader(server_model())([](float) {});
  EXPECT_EQ(expect_logprobs_match_oracle(owned.tokenizer->encode(kPrompt, true), reported, 4), 5u);
}

TEST_F(ServerSampling, ChatLogprobsEqualTheOraclesLogSoftmax) {
  TestServer s(ServerConfig{});
  ASSERT_TRUE(s.ready());
  json body = chat_body("Hi", 5);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  auto r = s.client().Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json answer = json::parse(r->body);
  std::vector<Reported> reported;
  for (const json& t : answer["choices"][0]["logprobs"]["content"]) {
    Reported one{t["token"], t["logprob"], {}};
    for (const json& alt : t["top_logprobs"]) one.top.emplace_back(alt["token"], alt["logprob"].get<double>());
    reported.push_back(std::move(one));
  }
  ASSERT_FALSE(reported.empty());
  const std::vector<int32_t> prompt = chat_prompt_tokens("Hi");
  EXPECT_EQ(answer["usage"]["prompt_tokens"].get<size_t>(), prompt.size());
  EXPECT_EQ(expect_logprobs_match_oracle(prompt, reported, 3), reported.size());
}
