// The CUDA backend's flags as the command line parses them (no GPU needed): listed by --help,
// accepted with their documented values (on the CPU backend, which ignores them), a value that
// names no setting refused with the flag's name.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace {

// Runs `redlite ARGS` with stdout and stderr captured together.
rl::test::ShellRun run_redlite(const std::string& args) {
  return rl::test::run_shell("'" + rl::test::redlite_bin() + "' " + args + " 2>&1");
}

TEST(CudaFlags, HelpListsThem) {
  const auto r = run_redlite("bench --help");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const char* flag : {"--no-preload", "--speculation", "--profile", "--x32-always", "--cache-mib"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << " missing from:\n" << r.out;
}

TEST(CudaFlags, DocumentedValuesAreAccepted) {
  const std::string model = rl::test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  const std::string out = rl::test::temp_path("cuda-flags", "logits.f32");
  for (const char* speculation : {"off", "resident", "warm", "always"}) {
    const auto r = run_redlite("logits -m '" + model + "' --backend cpu --tokens 1,2 --out '" + out +
                                    "' --no-preload --profile --x32-always --speculation " + speculation);
    EXPECT_EQ(r.exit_code, 0) << speculation << ": " << r.out;
  }
  rl::test::remove_temp(out);
}

TEST(CudaFlags, UnknownSpeculationIsRefusedNamingTheFlag) {
  for (const char* bad : {"2", "on", "Warm"}) {
    const auto r = run_redlite(std::string("bench -m none.gguf --speculation ") + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.out.find("--speculation"), std::string::npos) << bad << ": " << r.out;
  }
}

}  // namespace
