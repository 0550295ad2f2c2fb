// `redlite chat` driven in a real terminal (tmux) with the tiny fixture model: two turns, then
// Ctrl-C in the middle of a reply. The second turn must prefill only its new tokens: the count
// the chat prints on stderr is compared with the tokenizer's count of the continuation text
// (closing of the first reply + the user turn + the generation prompt).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "generate/chat_template.h"
#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace rl {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

class TmuxSession {
 public:
  TmuxSession(const std::string& command)
      : name_("redlite_chat_test_" + std::to_string(::getpid())) {
    std::string cmd = "tmux -L " + name_ + " new-session -d -s " + name_ + " -x 160 -y 50 " + shell_quote(command);
    started_ = std::system(cmd.c_str()) == 0;
  }
  ~TmuxSession() { std::system(("tmux -L " + name_ + " kill-server 2>/dev/null").c_str()); }
  bool started() const { return started_; }
  void send_line(const std::string& text) {
    std::system(("tmux -L " + name_ + " send-keys -t " + name_ + " -l " + shell_quote(text)).c_str());
    std::system(("tmux -L " + name_ + " send-keys -t " + name_ + " Enter").c_str());
  }
  bool alive() { return std::system(("tmux -L " + name_ + " has-session -t " + name_ + " 2>/dev/null").c_str()) == 0; }
  void send_ctrl_c() { std::system(("tmux -L " + name_ + " send-keys -t " + name_ + " C-c").c_str()); }
  // The pane with its scrollback (-S -): a reply longer than the window must not push the lines a
  // test looks for off the captured text.
  std::string screen() {
    std::string out;
    FILE* p = ::popen(("tmux -L " + name_ + " capture-pane -p -S - -t " + name_ + " 2>/dev/null").c_str(), "r");
    if (!p) return out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
    return out;
  }

 private:
  std::string name_;
  bool started_ = false;
};

// Polls `cond` for up to `seconds`.
// The chat's input prompt "> " is on screen (capture-pane drops the trailing space).
bool shows_prompt(const std::string& screen) {
  std::istringstream lines(screen);
  std::string line;
  while (std::getline(lines, line))
    if (line == ">" || line.rfind("> ", 0) == 0) return true;
  return false;
}

template <class F>
bool wait_for(F cond, double seconds) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return cond();
}

struct TurnStats {
  int prefill = -1;
  std::string finish;
};

std::vector<TurnStats> turn_stats(const std::string& stderr_text) {
  std::vector<TurnStats> out;
  std::regex re(R"(\[prefill: (\d+) tokens.*finish: (\w+)\])");
  for (auto it = std::sregex_iterator(stderr_text.begin(), stderr_text.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back({std::stoi((*it)[1]), (*it)[2]});
  return out;
}

std::string chat_command(const std::string& model, int max_tokens, const std::string& err_path) {
  // Greedy and past end-of-generation tokens, so every reply runs to its length or a Ctrl-C.
  return test::redlite_bin() + " chat -m " + model + " --backend cpu --threads 2 --greedy --ignore-eos -n " +
         std::to_string(max_tokens) + " 2> " + err_path;
}

TEST(ChatTerminal, SecondTurnPrefillsOnlyItsNewTokens) {
  const std::string model = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  if (std::system("command -v tmux > /dev/null 2>&1") != 0) GTEST_SKIP() << "tmux not installed";
  const std::string err_path = ::testing::TempDir() + "redlite_chat_turns.txt";
  std::remove(err_path.c_str());

  TmuxSession tmux(chat_command(model, 8, err_path));
  ASSERT_TRUE(tmux.started()) << "could not start tmux";
  ASSERT_TRUE(wait_for([&] { return shows_prompt(tmux.screen()); }, 60))
      << "no prompt; screen:\n" << tmux.screen() << "\nstderr:\n" << read_file(err_path);
  tmux.send_line("Hello there");
  ASSERT_TRUE(wait_for([&] { return turn_stats(read_file(err_path)).size() >= 1; }, 60)) << read_file(err_path);
  tmux.send_line("How are you?");
  ASSERT_TRUE(wait_for([&] { return turn_stats(read_file(err_path)).size() >= 2; }, 60)) << read_file(err_path);
  const std::string screen = tmux.screen();  // before /exit ends the session
  tmux.send_line("/exit");
  EXPECT_NE(screen.find("> Hello there"), std::string::npos) << screen;
  EXPECT_NE(screen.find("> How are you?"), std::string::npos) << screen;

  // Expected counts from the tokenizer and the template, independently of the chat's bookkeeping.
  auto file = GgufFile::open(model);
  auto tok = Tokenizer::from_gguf(*file);
  ChatTemplate tmpl = ChatTemplate::detect(tok->chat_template(), false);
  std::vector<ChatMessage> first = {ChatMessage{"user", "Hello there", {}, {}, {}}};
  ChatMessage second{"user", "How are you?", {}, {}, {}};
  const size_t turn1 = tok->encode(tmpl.render(first), true).size() + (tok->add_bos() ? 1 : 0);
  const size_t continuation = tok->encode(tmpl.continuation(std::span(&second, 1)), true).size();

  auto stats = turn_stats(read_file(err_path));
  ASSERT_EQ(stats.size(), 2u) << read_file(err_path);
  EXPECT_EQ(stats[0].finish, "length");
  EXPECT_EQ(stats[0].prefill, (int)turn1);
  // The reply's last token (sampled at the limit, not yet processed) + the continuation; nothing
  // of the first turn is prefilled again.
  EXPECT_EQ(stats[1].prefill, (int)continuation + 1) << "the second turn must prefill only its new tokens";
}

TEST(ChatTerminal, CtrlCStopsAReplyAndTheChatGoesOn) {
  const std::string model = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  if (std::system("command -v tmux > /dev/null 2>&1") != 0) GTEST_SKIP() << "tmux not installed";
  const std::string err_path = ::testing::TempDir() + "redlite_chat_cancel.txt";
  std::remove(err_path.c_str());

  // Replies of up to 3000 tokens: far longer than the time before the Ctrl-C.
  TmuxSession tmux(chat_command(model, 3000, err_path));
  ASSERT_TRUE(tmux.started()) << "could not start tmux";
  ASSERT_TRUE(wait_for([&] { return shows_prompt(tmux.screen()); }, 60))
      << "no prompt; screen:\n" << tmux.screen() << "\nstderr:\n" << read_file(err_path);
  tmux.send_line("Tell me a long story");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  tmux.send_ctrl_c();
  ASSERT_TRUE(wait_for([&] { return turn_stats(read_file(err_path)).size() >= 1; }, 30)) << read_file(err_path);
  tmux.send_line("Another one");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  tmux.send_ctrl_c();
  ASSERT_TRUE(wait_for([&] { return turn_stats(read_file(err_path)).size() >= 2; }, 30)) << read_file(err_path);
  // Back at the prompt after the second "[reply stopped]".
  ASSERT_TRUE(wait_for([&] {
    std::string sc = tmux.screen();
    size_t at = sc.rfind("[reply stopped]");
    return at != std::string::npos && shows_prompt(sc.substr(at));
  }, 10)) << tmux.screen();
  const std::string screen = tmux.screen();  // before /exit ends the session
  tmux.send_line("/exit");
  ASSERT_TRUE(wait_for([&] { return !tmux.alive(); }, 10)) << "/exit did not leave the chat";

  auto stats = turn_stats(read_file(err_path));
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].finish, "cancelled");
  EXPECT_EQ(stats[1].finish, "cancelled");
  EXPECT_NE(screen.find("[reply stopped]"), std::string::npos) << screen;
  EXPECT_NE(screen.find("> Another one"), std::string::npos) << screen;
}

}  // namespace
}  // namespace rl
