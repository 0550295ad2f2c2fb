// Split GGUF models (llama.cpp gguf-split layout), written here from fixture model B with the
// project's GGUF writer: opened from the first shard they give bit-identical logits to the
// unsplit file on the CPU oracle, every tensor viewing its own shard's mapping; a missing or
// foreign shard, and opening a later shard, are errors that name the shard.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "common/error.h"
#include "cpu/cpu_backend.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "gguf_split_writer.h"
#include "test_util.h"

namespace rl {
namespace {

const std::string kModelB = "tiny-qwen3next-q4km.gguf";

using test::shard_path;
using test::write_shard;

class SplitModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = test::fixture(kModelB);
    RL_REQUIRE_FIXTURE(path_);
    src_ = GgufFile::open(path_);
    prefix_ = test::temp_path("split", "model-b");
    test::write_split(*src_, prefix_, kShards);
  }
  void TearDown() override {
    for (int i = 0; i < kShards; ++i) std::filesystem::remove(shard_path(prefix_, i, kShards));
    test::remove_temp(prefix_);
  }
  static constexpr int kShards = 3;
  std::string path_, prefix_;
  std::unique_ptr<GgufFile> src_;
};

TEST_F(SplitModelTest, GivesBitIdenticalLogitsToTheUnsplitFile) {
  auto split = GgufFile::open(shard_path(prefix_, 0, kShards));
  ASSERT_EQ(split->mappings().size(), (size_t)kShards);
  ASSERT_EQ(split->tensors().size(), src_->tensors().size());
  // Each tensor views the mapping of the shard that holds it, with the unsplit file's bytes.
  const auto maps = split->mappings();
  for (const GgufTensorInfo& t : split->tensors()) {
    const GgufTensorInfo& orig = src_->tensor(t.name);
    ASSERT_EQ(t.nbytes, orig.nbytes) << t.name;
    EXPECT_EQ(std::memcmp(t.data, orig.data, t.nbytes), 0) << t.name;
    int holder = -1;
    for (size_t m = 0; m < maps.size(); ++m)
      if (t.data >= maps[m].base && t.data + t.nbytes <= maps[m].base + maps[m].size) holder = (int)m;
    EXPECT_GE(holder, 0) << t.name;
  }
  auto whole = cpu::make_cpu_backend(Model::open(path_), 1);
  auto parts = cpu::make_cpu_backend(Model::open(shard_path(prefix_, 0, kShards)), 1);
  const std::vector<int32_t> tokens = {1, 17, 300, 42, 4000, 5, 99, 1234};
  std::vector<float> a_all, b_all;
  auto a = whole->new_session(64);
  auto b = parts->new_session(64);
  a->prefill(tokens, &a_all);
  b->prefill(tokens, &b_all);
  const std::vector<float> a_next = a->decode(7), b_next = b->decode(7);
  ASSERT_EQ(a_all.size(), b_all.size());
  EXPECT_EQ(std::memcmp(a_all.data(), b_all.data(), a_all.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a_next.data(), b_next.data(), a_next.size() * sizeof(float)), 0);
}

void expect_error(const std::string& path, const std::string& needle) {
  try {
    GgufFile::open(path);
    ADD_FAILURE() << "opened " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(SplitModelTest, MissingForeignAndLaterShardsAreNamed) {
  const std::string first = shard_path(prefix_, 0, kShards), second = shard_path(prefix_, 1, kShards),
                    third = shard_path(prefix_, 2, kShards);
  expect_error(second, "this is shard 2 of 3");
  write_shard(*src_, prefix_, 2, kShards, /*split_no=*/1);  // a copy of shard 2's number in place of 3
  expect_error(first, third);
  expect_error(first, "does not belong to this split model");
  std::filesystem::remove(second);
  expect_error(first, second);
  expect_error(first, "shard 2 of 3");
  // Not named NAME-00001-of-0000N.gguf: the other shards cannot be found.
  const std::string renamed = prefix_ + "-first.gguf";
  std::filesystem::copy_file(first, renamed);
  expect_error(renamed, "is not named");
  std::filesystem::remove(renamed);
}

}  // namespace
}  // namespace rl
