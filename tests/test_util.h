// Shared test helpers: where the fixtures and the redlite binary are.
#pragma once
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace rl::test {

// REDLITE_FIXTURES, else ../shared/fixtures next to the source tree.
inline std::string fixtures_dir() {
  if (const char* e = std::getenv("REDLITE_FIXTURES"); e && *e) return e;
  return std::string(REDLITE_SOURCE_DIR) + "/../shared/fixtures";
}

inline std::string fixture(const std::string& name) { return fixtures_dir() + "/" + name; }

// The redlite binary under test (set by CTest), else the one in the build tree.
inline std::string redlite_bin() {
  if (const char* e = std::getenv("REDLITE_BIN"); e && *e) return e;
  return std::string(REDLITE_BINARY_DIR) + "/redlite";
}

struct ShellRun {
  int exit_code = -1;  // -1: not run, or ended by a signal
  std::string out;     // what the command wrote to stdout
};

// Runs a shell command line and captures its stdout (redirect stderr in `cmd` as needed).
inline ShellRun run_shell(const std::string& cmd) {
  ShellRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The redlite binary with `args`, its stdout captured with stderr (or without it: stdout_only);
// under `timeout 20` when bounded (a command that should refuse a flag but serves would not end).
inline ShellRun run_redlite(const std::string& args, bool stdout_only = false, bool bounded = false) {
  return run_shell((bounded ? "timeout 20 " : "") + std::string("'") + redlite_bin() + "' " + args +
                   (stdout_only ? " 2>/dev/null" : " 2>&1"));
}

// A scratch file for this test process: <tmp>/redlite-<tag>-<pid>/<name>, the directory created.
inline std::string temp_path(const std::string& tag, const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("redlite-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

// Removes a temp_path file, and its directory once that is empty.
inline void remove_temp(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  std::filesystem::remove(std::filesystem::path(path).parent_path(), ec);  // fails harmlessly while others remain
}

}  // namespace rl::test

// Skips the test, visibly, when a fixture file is absent.
#define RL_REQUIRE_FIXTURE(path)                                                   \
  do {                                                                             \
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "fixture not found: " << (path) \
                                                     << " (set REDLITE_FIXTURES)"; \
  } while (0)
