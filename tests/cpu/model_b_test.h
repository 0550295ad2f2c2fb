// Model B (4,099-token vocabulary, fast on two cores) and the 174 tokens of its reference's
// "medium" prompt: the fixture of the CPU session tests. Skips, naming the file, without it.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "model/model.h"
#include "model/parity.h"
#include "test_util.h"

namespace rl::test {

inline std::string model_b_gguf() { return fixture("tiny-qwen3next-q4km.gguf"); }

class ModelBTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string gguf = model_b_gguf();
    const std::string ref = fixture("tiny-qwen3next-q4km.ref-f32.json");
    RL_REQUIRE_FIXTURE(gguf);
    RL_REQUIRE_FIXTURE(ref);
    model_ = Model::open(gguf);
    tokens_ = load_reference(ref).find_prompt("medium")->token_ids;
  }

  std::shared_ptr<const Model> model_;
  std::vector<int32_t> tokens_;
};

// Model B on the CPU backend's oracle tier with `threads` threads (0: every core), made once the
// fixture is there; span(from, n): tokens_[from, from + n).
class ModelBBackendTest : public ModelBTest {
 protected:
  explicit ModelBBackendTest(int threads = 2) : threads_(threads) {}
  void SetUp() override {
    ModelBTest::SetUp();
    if (IsSkipped()) return;
    backend_ = cpu::make_cpu_backend(model_, threads_);
  }
  std::span<const int32_t> span(size_t from, size_t n) const { return std::span(tokens_).subspan(from, n); }
  std::unique_ptr<Backend> backend_;

 private:
  int threads_;
};

// Tests of the redlite binary on model B: skip without the binary or the fixture.
class ModelBCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(redlite_bin())) GTEST_SKIP() << "redlite binary not built";
    model_ = model_b_gguf();
    RL_REQUIRE_FIXTURE(model_);
  }
  std::string model_;
};

}  // namespace rl::test
