// Bad arguments give clear errors (naming the argument or path) and leave no file behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "common/error.h"
#include "synth/synth.h"

namespace rl::synth {
namespace {

namespace fs = std::filesystem;

// The message of the rl::Error that f throws ("" when it does not throw).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const rl::Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

TEST(SynthErrors, UnknownPresetAndRecipe) {
  Options o;
  o.preset = "70b";
  const std::string e1 = error_of([&] { make_plan(o); });
  EXPECT_CONTAINS(e1, "--preset 70b");
  EXPECT_CONTAINS(e1, "tiny, 80b");
  o.preset = "tiny";
  o.recipe = "q3";
  const std::string e2 = error_of([&] { make_plan(o); });
  EXPECT_CONTAINS(e2, "--recipe q3");
  EXPECT_CONTAINS(e2, "seed-mix");
}

TEST(SynthErrors, DimensionNotDivisibleByTheBlockSize) {
  Options o;
  o.preset = "tiny";
  o.dim_overrides["n_embd"] = 320;  // Q4_K / IQ2_XS rows need multiples of 256
  const std::string e = error_of([&] { make_plan(o); });
  EXPECT_CONTAINS(e, "--n-embd");
  EXPECT_CONTAINS(e, "256");
  EXPECT_CONTAINS(e, "320");

  o.dim_overrides = {{"n_ff_exp", 384}};
  const std::string e2 = error_of([&] { make_plan(o); });
  EXPECT_CONTAINS(e2, "--n-ff-exp");
  EXPECT_CONTAINS(e2, "ffn_down_exps");

  o.recipe = "f32";  // F32 has blocks of 1: the same width is fine
  EXPECT_EQ(error_of([&] { make_plan(o); }), "");
}

TEST(SynthErrors, InconsistentDimensions) {
  Options o;
  o.preset = "tiny";
  o.dim_overrides = {{"n_expert_used", 64}};
  EXPECT_CONTAINS(error_of([&] { make_plan(o); }), "--n-expert-used 64");
  o.dim_overrides = {{"ssm_v_heads", 3}};
  EXPECT_CONTAINS(error_of([&] { make_plan(o); }), "--ssm-v-heads 3");
  o.dim_overrides = {{"n_layer", 0}};
  EXPECT_CONTAINS(error_of([&] { make_plan(o); }), "--n-layer 0");
  o.dim_overrides = {};
  o.router_skew = -1;
  EXPECT_CONTAINS(error_of([&] { make_plan(o); }), "--router-skew");
  o.router_skew = 0;
  o.vocab_from = "/nonexistent/vocab.gguf";
  EXPECT_CONTAINS(error_of([&] { make_plan(o); }), "/nonexistent/vocab.gguf");
}

TEST(SynthErrors, UnwritablePathLeavesNothing) {
  Options o;
  o.preset = "tiny";
  const Plan plan = make_plan(o);
  const std::string path = "/nonexistent-redlite-dir/model.gguf";
  EXPECT_CONTAINS(error_of([&] { write_model(plan, path); }), path);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

// Disk full, as the process sees it: a file-size limit makes write() fail part-way (EFBIG). Run
// in a child so the limit does not touch the test process.
TEST(SynthErrors, DiskFullLeavesNoPartialFile) {
  Options o;
  o.preset = "tiny";
  o.threads = 1;
  const Plan plan = make_plan(o);
  const fs::path dir = fs::temp_directory_path() / ("redlite-synth-full-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "model.gguf").string();
  const std::string msg_path = (dir / "message.txt").string();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    rlimit lim{};
    getrlimit(RLIMIT_FSIZE, &lim);
    const rlim_t saved = lim.rlim_cur;
    lim.rlim_cur = 1 << 20;  // 1 MiB: the tiny model is several
    setrlimit(RLIMIT_FSIZE, &lim);
    int code = 0;
    std::string msg;
    try {
      write_model(plan, path);
    } catch (const rl::Error& e) {
      msg = e.what();
      code = 3;
    } catch (...) {
      code = 4;
    }
    lim.rlim_cur = saved;
    setrlimit(RLIMIT_FSIZE, &lim);
    std::ofstream(msg_path) << msg;
    _exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3) << "expected an rl::Error from the write";
  std::ifstream in(msg_path);
  const std::string msg((std::istreambuf_iterator<char>(in)), {});
  EXPECT_CONTAINS(msg, path);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rl::synth
