// ReasoningSplitter: streamed pieces, cut anywhere, give the same reasoning and content as the
// whole reply; </think> split across pieces is found; a reply without reasoning is untouched.
#include <gtest/gtest.h>

#include "server/reasoning_split.h"

using rl::ReasoningSplitter;

namespace {

std::pair<std::string, std::string> split_whole(const std::string& text, bool active) {
  ReasoningSplitter s(active);
  auto [r, c] = s.push(text);
  r += s.flush_reasoning();
  return {r, c};
}

std::pair<std::string, std::string> split_pieces(const std::string& text, bool active, size_t a, size_t b) {
  ReasoningSplitter s(active);
  std::string r, c;
  for (auto piece : {text.substr(0, a), text.substr(a, b - a), text.substr(b)}) {
    auto [pr, pc] = s.push(piece);
    r += pr;
    c += pc;
  }
  r += s.flush_reasoning();
  return {r, c};
}

}  // namespace

TEST(ReasoningSplit, WholeReply) {
  auto [r, c] = split_whole("Let me think.\n</think>\n\nParis.", true);
  EXPECT_EQ(r, "Let me think.\n");
  EXPECT_EQ(c, "Paris.");
}

TEST(ReasoningSplit, NoEndTagMeansAllReasoning) {
  auto [r, c] = split_whole("still thinking </thi", true);
  EXPECT_EQ(r, "still thinking </thi");
  EXPECT_EQ(c, "");
}

TEST(ReasoningSplit, InactiveKeepsLeadingNewlinesAndTags) {
  auto [r, c] = split_whole("\n\nHello </think> world", false);
  EXPECT_EQ(r, "");
  EXPECT_EQ(c, "\n\nHello </think> world");
}

TEST(ReasoningSplit, EveryCutGivesTheWholeResult) {
  const std::string texts[] = {"abc</think>\n\nanswer\n", "</think>x", "a</think>", "a</thin</think>\n\n\nb",
                               "no tags at all", "\n</think>\n"};
  for (bool active : {true, false})
    for (const std::string& t : texts) {
      const auto whole = split_whole(t, active);
      for (size_t a = 0; a <= t.size(); a++)
        for (size_t b = a; b <= t.size(); b++)
          EXPECT_EQ(split_pieces(t, active, a, b), whole) << "text '" << t << "' cut at " << a << ", " << b;
    }
}
