// ReasoningSplitter: streamed pieces, cut anywhere, give the same reasoning and content as the
// whole reply; </think> split across pieces is found; a reply without reasoning is untouched; a
// hybrid model's own <think> block is split off; the newlines framing the block are dropped.
// Expected values are written by hand from the Qwen3 templates' layout.
#include <gtest/gtest.h>

#include "server/reasoning_split.h"

using rl::ReasoningSplitter;
using Start = rl::ReplyStart;

namespace {

std::pair<std::string, std::string> split_whole(const std::string& text, Start start) {
  ReasoningSplitter s(start);
  auto [r, c] = s.push(text);
  auto [hr, hc] = s.finish();
  return {r + hr, c + hc};
}

std::pair<std::string, std::string> split_pieces(const std::string& text, Start start, size_t a, size_t b) {
  ReasoningSplitter s(start);
  std::string r, c;
  for (auto piece : {text.substr(0, a), text.substr(a, b - a), text.substr(b)}) {
    auto [pr, pc] = s.push(piece);
    r += pr;
    c += pc;
  }
  auto [hr, hc] = s.finish();
  return {r + hr, c + hc};
}

}  // namespace

TEST(ReasoningSplit, WholeReply) {
  auto [r, c] = split_whole("Let me think.\n</think>\n\nParis.", Start::Reasoning);
  EXPECT_EQ(r, "Let me think.");
  EXPECT_EQ(c, "Paris.");
}

TEST(ReasoningSplit, NoEndTagMeansAllReasoning) {
  auto [r, c] = split_whole("still thinking </thi", Start::Reasoning);
  EXPECT_EQ(r, "still thinking </thi");
  EXPECT_EQ(c, "");
  auto [r2, c2] = split_whole("\nstill thinking\n\n", Start::Reasoning);
  EXPECT_EQ(r2, "still thinking");
  EXPECT_EQ(c2, "");
}

TEST(ReasoningSplit, InactiveKeepsLeadingNewlinesAndTags) {
  auto [r, c] = split_whole("\n\nHello </think> world", Start::Content);
  EXPECT_EQ(r, "");
  EXPECT_EQ(c, "\n\nHello </think> world");
}

// A hybrid template's generation prompt leaves the choice to the model: a reply that opens with
// <think> is split, one that does not is all content (leading whitespace and all).
TEST(ReasoningSplit, HybridModelOpensItsOwnBlock) {
  auto [r, c] = split_whole("<think>\nThe user greets.\n</think>\n\nHello!", Start::Either);
  EXPECT_EQ(r, "The user greets.");
  EXPECT_EQ(c, "Hello!");
  auto [r2, c2] = split_whole("\n<think>\n\n</think>\n\nHi", Start::Either);
  EXPECT_EQ(r2, "");
  EXPECT_EQ(c2, "Hi");
  auto [r3, c3] = split_whole("\n <thinking> is a tag", Start::Either);
  EXPECT_EQ(r3, "");
  EXPECT_EQ(c3, "\n <thinking> is a tag");
  auto [r4, c4] = split_whole("  <thi", Start::Either);  // stopped while undecided: content
  EXPECT_EQ(r4, "");
  EXPECT_EQ(c4, "  <thi");
}

TEST(ReasoningSplit, EveryCutGivesTheWholeResult) {
  const std::string texts[] = {"abc</think>\n\nanswer\n", "</think>x",      "a</think>", "a</thin</think>\n\n\nb",
                               "no tags at all",          "\n</think>\n",    "<think>\nr\n\n</think>\n\nc",
                               "  <think>x</think>y",     "<thinking now", "\n\n<thi",  "a\n\nb\n</think>"};
  for (Start start : {Start::Reasoning, Start::Content, Start::Either})
    for (const std::string& t : texts) {
      const auto whole = split_whole(t, start);
      for (size_t a = 0; a <= t.size(); a++)
        for (size_t b = a; b <= t.size(); b++)
          EXPECT_EQ(split_pieces(t, start, a, b), whole) << "text '" << t << "' cut at " << a << ", " << b;
    }
}
