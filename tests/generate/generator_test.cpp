// Generator and PromptCache on a scripted fake session: streaming, stop rules (including stop
// strings that span tokens), limits, cancellation, and prefill of only the new tokens.
#include <gtest/gtest.h>

#include "fakes.h"
#include "generate/generator.h"
#include "generate/prompt_cache.h"

namespace rl {
namespace {

using test::FakeSession;
using test::FakeTokenizer;

// After the prompt, the fake model writes `script` token by token, then repeats its last token.
FakeSession::Script replay(std::vector<int32_t> script, size_t prompt_len) {
  return [script, prompt_len](const std::vector<int32_t>& processed) {
    size_t step = processed.size() >= prompt_len ? processed.size() - prompt_len : 0;
    return script[std::min(step, script.size() - 1)];
  };
}

GenerationConfig greedy(int max_tokens) {
  GenerationConfig c;
  c.sampling.temperature = 0;
  c.max_tokens = max_tokens;
  return c;
}

struct Collected {
  std::vector<std::string> pieces;
  std::string all() const {
    std::string s;
    for (auto& p : pieces) s += p;
    return s;
  }
};

TEST(Generator, StreamsUntilEndOfGeneration) {
  FakeTokenizer tok;
  // "Hel" "lo" " wor" "ld" <|im_end|>
  FakeSession session(tok.n_vocab(), replay({256, 257, 258, 259, FakeTokenizer::kImEnd}, 3));
  Generator gen(session, tok);
  Collected out;
  std::vector<int32_t> prompt = {'a', 'b', 'c'};
  auto r = gen.generate(prompt, greedy(100), [&](std::string_view s) { out.pieces.emplace_back(s); });
  EXPECT_EQ(out.all(), "Hello world");
  EXPECT_EQ(r.text, "Hello world");
  EXPECT_EQ(r.finish, FinishReason::Stop);
  EXPECT_EQ(r.stop_token, FakeTokenizer::kImEnd);
  EXPECT_EQ(r.pending_token, FakeTokenizer::kImEnd);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{256, 257, 258, 259, FakeTokenizer::kImEnd}));
  EXPECT_EQ(r.prompt_tokens, 3);
  EXPECT_EQ(r.prefill_tokens, 3);
  EXPECT_EQ(r.decode_passes, 4);  // the end-of-generation token is not decoded
  EXPECT_EQ(session.position(), 7);
  EXPECT_EQ(gen.history(), session.processed);
}

TEST(Generator, StopsAtTheTokenLimit) {
  FakeTokenizer tok;
  FakeSession session(tok.n_vocab(), replay({'x'}, 2));
  Generator gen(session, tok);
  std::vector<int32_t> prompt = {'a', 'b'};
  auto r = gen.generate(prompt, greedy(5), nullptr);
  EXPECT_EQ(r.finish, FinishReason::Length);
  EXPECT_EQ(r.text, "xxxxx");
  EXPECT_EQ(r.decode_passes, 4);
  EXPECT_EQ(r.pending_token, 'x');
  EXPECT_EQ(session.position(), 6);
}

// "Hel" "lo" " wor" "ld": the stop string "o wo" starts inside "lo" and ends inside " wor". Nothing of
// it may reach the stream, and the text before it must.
TEST(Generator, StopStringSpanningTokensDoesNotLeak) {
  FakeTokenizer tok;
  FakeSession session(tok.n_vocab(), replay({256, 257, 258, 259, 'z'}, 1));
  Generator gen(session, tok);
  GenerationConfig c = greedy(50);
  c.stop_strings = {"o wo"};
  Collected out;
  std::vector<int32_t> prompt = {'a'};
  auto r = gen.generate(prompt, c, [&](std::string_view s) { out.pieces.emplace_back(s); });
  EXPECT_EQ(out.all(), "Hell");
  EXPECT_EQ(r.text, "Hell");
  EXPECT_EQ(r.finish, FinishReason::Stop);
  EXPECT_EQ(r.stop_string, "o wo");
  for (auto& p : out.pieces) EXPECT_EQ(p.find('o'), std::string::npos) << "leaked piece: " << p;
}

// A held-back prefix that never becomes the stop string is released, in order.
TEST(Generator, HeldBackTextIsReleased) {
  FakeTokenizer tok;
  FakeSession session(tok.n_vocab(), replay({256, 257, 258, 259, FakeTokenizer::kImEnd}, 1));
  Generator gen(session, tok);
  GenerationConfig c = greedy(50);
  c.stop_strings = {"lox", "ldy"};  // "lo" and "ld" look like starts of these
  Collected out;
  std::vector<int32_t> prompt = {'a'};
  auto r = gen.generate(prompt, c, [&](std::string_view s) { out.pieces.emplace_back(s); });
  EXPECT_EQ(out.all(), "Hello world");
  EXPECT_EQ(r.finish, FinishReason::Stop);
  EXPECT_FALSE(r.stop_string.has_value());
}

TEST(StopMatcher, EarliestMatchWins) {
  StopMatcher m({"cd", "xb"});
  EXPECT_EQ(m.push("a"), "a");
  EXPECT_EQ(m.push("xc"), "x");  // "c" may start "cd": held
  EXPECT_EQ(m.push("dxb"), "");  // "cd" (at 0) comes before "xb" (at 2)
  EXPECT_EQ(m.matched(), "cd");
  EXPECT_EQ(m.flush(), "");
  StopMatcher none({});
  EXPECT_EQ(none.push("abc"), "abc");
}

TEST(Generator, MultiByteCharactersAreNeverSplit) {
  FakeTokenizer tok;
  // "été" split over byte tokens: 0xC3 0xA9 't' 0xC3 0xA9.
  FakeSession session(tok.n_vocab(), replay({0xC3, 0xA9, 't', 0xC3, 0xA9, FakeTokenizer::kEndOfText}, 1));
  Generator gen(session, tok);
  Collected out;
  std::vector<int32_t> prompt = {'a'};
  gen.generate(prompt, greedy(50), [&](std::string_view s) { out.pieces.emplace_back(s); });
  EXPECT_EQ(out.all(), "\xC3\xA9t\xC3\xA9");
  for (auto& p : out.pieces) EXPECT_TRUE(p == "\xC3\xA9" || p == "t") << "split piece of size " << p.size();
}

TEST(Generator, CancelStopsAndKeepsHistoryConsistent) {
  FakeTokenizer tok;
  FakeSession session(tok.n_vocab(), replay({'x'}, 1));
  Generator gen(session, tok);
  std::atomic<bool> cancel{false};
  int pieces = 0;
  std::vector<int32_t> prompt = {'a'};
  auto r = gen.generate(prompt, greedy(1000), [&](std::string_view) {
    if (++pieces == 3) cancel = true;
  }, &cancel);
  EXPECT_EQ(r.finish, FinishReason::Cancelled);
  EXPECT_EQ(r.text, "xxx");
  EXPECT_FALSE(r.pending_token.has_value());
  EXPECT_EQ(gen.history(), session.processed);
}

// A second request that extends what the session holds prefills only the new tokens; one that
// diverges starts over.
TEST(Generator, SecondTurnPrefillsOnlyNewTokens) {
  FakeTokenizer tok;
  FakeSession session(tok.n_vocab(), [](const std::vector<int32_t>&) { return (int32_t)'x'; });
  Generator gen(session, tok);
  std::vector<int32_t> turn1 = {'a', 'b', 'c', 'd'};
  auto r1 = gen.generate(turn1, greedy(3), nullptr);
  EXPECT_EQ(r1.prefill_tokens, 4);
  ASSERT_TRUE(r1.pending_token);

  std::vector<int32_t> turn2 = gen.history();
  turn2.push_back(*r1.pending_token);
  for (int32_t t : {'e', 'f'}) turn2.push_back(t);
  auto r2 = gen.generate(turn2, greedy(2), nullptr);
  EXPECT_EQ(r2.reused_tokens, 6);   // 4 prompt + 2 decoded
  EXPECT_EQ(r2.prefill_tokens, 3);  // pending 'x', 'e', 'f'
  EXPECT_EQ(session.prefill_calls, (std::vector<int>{4, 3}));
  EXPECT_EQ(session.resets, 1);     // only the first call's fresh start

  std::vector<int32_t> other = {'q', 'r'};
  auto r3 = gen.generate(other, greedy(1), nullptr);
  EXPECT_EQ(r3.reused_tokens, 0);
  EXPECT_EQ(r3.prefill_tokens, 2);
  EXPECT_EQ(session.resets, 2);
  EXPECT_EQ(gen.history(), session.processed);
}

TEST(PromptCache, RestoresTheLongestStoredPrefix) {
  FakeTokenizer tok;
  FakeSession session(tok.n_vocab(), [](const std::vector<int32_t>&) { return (int32_t)'x'; });
  PromptCache cache(1 << 20);
  cache.put(std::vector<int32_t>{1, 2}, std::make_unique<test::FakeSnapshot>(std::vector<int32_t>{1, 2}));
  cache.put(std::vector<int32_t>{1, 2, 3, 4}, std::make_unique<test::FakeSnapshot>(std::vector<int32_t>{1, 2, 3, 4}));
  cache.put(std::vector<int32_t>{9}, std::make_unique<test::FakeSnapshot>(std::vector<int32_t>{9}));
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  EXPECT_EQ(cache.restore_longest_prefix(prompt, prompt.size() - 1, session), 4);
  EXPECT_EQ(session.processed, (std::vector<int32_t>{1, 2, 3, 4}));
  // max_len excludes the exact-length entry.
  std::vector<int32_t> exact = {1, 2, 3, 4};
  EXPECT_EQ(cache.restore_longest_prefix(exact, exact.size() - 1, session), 2);
  std::vector<int32_t> miss = {7, 8};
  EXPECT_EQ(cache.restore_longest_prefix(miss, 1, session), 0);
  EXPECT_EQ(cache.hits(), 2u);
  EXPECT_EQ(cache.misses(), 1u);
  EXPECT_THROW(cache.put(std::vector<int32_t>{1}, std::make_unique<test::FakeSnapshot>(std::vector<int32_t>{1, 2})), Error);
}

TEST(PromptCache, EvictsLeastRecentlyUsedWithinBudget) {
  FakeTokenizer tok;
  FakeSession session(tok.n_vocab(), [](const std::vector<int32_t>&) { return (int32_t)'x'; });
  auto snap = [](std::vector<int32_t> t) { return std::make_unique<test::FakeSnapshot>(std::move(t)); };
  // FakeSnapshot costs 1000 + 4 per token: three one-token entries need 3012 bytes.
  PromptCache cache(2100);
  cache.put(std::vector<int32_t>{1}, snap({1}));
  cache.put(std::vector<int32_t>{2}, snap({2}));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.bytes(), 2008u);
  std::vector<int32_t> p1 = {1, 5};
  EXPECT_EQ(cache.restore_longest_prefix(p1, 1, session), 1);  // {1} is now the most recent
  cache.put(std::vector<int32_t>{3}, snap({3}));                // evicts {2}
  EXPECT_EQ(cache.size(), 2u);
  std::vector<int32_t> p2 = {2, 5}, p3 = {3, 5};
  EXPECT_EQ(cache.restore_longest_prefix(p2, 1, session), 0);
  EXPECT_EQ(cache.restore_longest_prefix(p1, 1, session), 1);
  EXPECT_EQ(cache.restore_longest_prefix(p3, 1, session), 1);
  // Replacing a key does not double-count it; an entry over the whole budget is not kept.
  cache.put(std::vector<int32_t>{3}, snap({3}));
  EXPECT_EQ(cache.bytes(), 2008u);
  cache.put(std::vector<int32_t>(400, 1), snap(std::vector<int32_t>(400, 1)));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_LE(cache.bytes(), cache.max_bytes());
}

// Two conversations alternate on one session: the cache brings back each one's state, so the
// prefill covers only what is new.
TEST(PromptCache, GeneratorRestoresAnEarlierBoundary) {
  FakeTokenizer tok;
  FakeSession session(tok.n_vocab(), [](const std::vector<int32_t>&) { return (int32_t)'x'; });
  Generator gen(session, tok);
  PromptCache cache(1 << 20);
  std::vector<int32_t> a = {'a', 'a', 'a', 'a'}, b = {'b', 'b', 'b'};
  gen.generate(a, greedy(1), nullptr, nullptr, &cache);  // stores the state after `a`
  gen.generate(b, greedy(1), nullptr, nullptr, &cache);
  std::vector<int32_t> a2 = a;
  a2.push_back('c');
  auto r = gen.generate(a2, greedy(1), nullptr, nullptr, &cache);
  EXPECT_EQ(r.reused_tokens, 4);
  EXPECT_EQ(r.prefill_tokens, 1);
  EXPECT_EQ(session.restores, 1);
  EXPECT_EQ(session.processed, a2);
  EXPECT_EQ(gen.history(), session.processed);
}

// A generation snapshots its session at the prompt's end and at its own end for the cache; a cache
// with no budget would drop them, so none is taken.
TEST(PromptCache, AnEmptyBudgetTakesNoSnapshots) {
  FakeTokenizer tok;
  FakeSession session(tok.n_vocab(), [](const std::vector<int32_t>&) { return (int32_t)'x'; });
  Generator gen(session, tok);
  const std::vector<int32_t> prompt = {'a', 'b', 'c'};
  PromptCache none(0);
  gen.generate(prompt, greedy(3), nullptr, nullptr, &none);
  EXPECT_EQ(session.snapshots, 0);
  EXPECT_EQ(none.size(), 0u);
  PromptCache some(1 << 20);
  gen.generate(prompt, greedy(3), nullptr, nullptr, &some);
  EXPECT_EQ(session.snapshots, 2);
  EXPECT_EQ(some.size(), 2u);
}

TEST(Generator, RejectsPromptsThatDoNotFit) {
  FakeTokenizer tok;
  FakeSession session(tok.n_vocab(), [](const std::vector<int32_t>&) { return (int32_t)'x'; }, 8);
  Generator gen(session, tok);
  std::vector<int32_t> long_prompt(8, 'a'), empty;
  EXPECT_THROW(gen.generate(long_prompt, greedy(1), nullptr), Error);
  EXPECT_THROW(gen.generate(empty, greedy(1), nullptr), Error);
  // Generation that reaches the end of the context stops with "length", not an error.
  std::vector<int32_t> prompt(5, 'a');
  auto r = gen.generate(prompt, greedy(100), nullptr);
  EXPECT_EQ(r.finish, FinishReason::Length);
  EXPECT_LE(session.position(), 8);
}

}  // namespace
}  // namespace rl
