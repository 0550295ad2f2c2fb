// A real `redlite serve` child process for the tests that drive it with the official `openai`
// npm client (tests/server/*.mjs): a free loopback port, start, wait for /health, SIGTERM.
#pragma once
#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

extern char** environ;

namespace rl::test {

inline int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, (sockaddr*)&a, sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, (sockaddr*)&a, &len);
  close(fd);
  return ntohs(a.sin_port);
}

// Why the node client cannot run here ("" when it can): the npm package or node is missing.
inline std::string node_client_missing() {
  const std::string dir = std::string(REDLITE_SOURCE_DIR) + "/tests/server";
  if (!std::filesystem::exists(dir + "/node_modules/openai"))
    return "the openai npm client is not installed: run `npm ci` in tests/server (scripts/test.sh does)";
  if (run_shell("node --version 2>/dev/null").out.empty()) return "node is not installed";
  return "";
}

// `redlite serve -m MODEL` on a free port (CPU backend, 2 threads, API key `key`), its output in
// `log`; stopped with SIGTERM.
class ServeProcess {
 public:
  ServeProcess(const std::string& model, const std::string& key, const std::string& log,
               const std::vector<std::string>& extra_args = {})
      : port_(free_port()), log_(log) {
    std::vector<std::string> args = {redlite_bin(), "serve", "-m", model, "--port", std::to_string(port_),
                                     "--api-key", key, "--backend", "cpu", "--threads", "2"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    ok_ = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) == 0;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~ServeProcess() {
    if (!ok_) return;
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 100 && waitpid(pid_, &status, WNOHANG) == 0; i++) usleep(50000);
    if (waitpid(pid_, &status, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  bool ok() const { return ok_; }
  int port() const { return port_; }
  const std::string& log() const { return log_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }

  // Waits up to a minute for /health to answer 200 (the model loaded).
  bool wait_healthy() const {
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 600; i++) {
      auto h = c.Get("/health");
      if (h && h->status == 200) return true;
      usleep(100000);
    }
    return false;
  }

 private:
  int port_;
  std::string log_;
  pid_t pid_ = -1;
  bool ok_ = false;
};

}  // namespace rl::test
