// `redlite inspect` run as a program on the fixtures: the types it reports match the fixtures
// README, --dump matches ggml's own dequantisation (quant-zoo.ref.gguf, read here straight from
// the file at the offset inspect reports), and bad input exits 1 naming the problem.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string quote(const std::string& s) { return "'" + s + "'"; }

class ScratchDir {
 public:
  ScratchDir() {
    path_ = fs::temp_directory_path() / ("rl-inspect-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// Runs `redlite ARGS` with stdout and stderr captured separately.
RunResult run_redlite(const std::string& args) {
  ScratchDir dir;
  const std::string out = dir.file("stdout"), err = dir.file("stderr");
  // Bounded, so a command that hangs fails the test (exit 124) instead of stalling the suite.
  const std::string cmd = "timeout 60 " + quote(rl::test::redlite_bin()) + " " + args + " > " + quote(out) + " 2> " + quote(err);
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

nlohmann::json inspect_json(const std::string& model) {
  const RunResult r = run_redlite("inspect " + quote(model) + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

std::map<std::string, int> reported_type_counts(const nlohmann::json& j) {
  std::map<std::string, int> counts;
  for (const auto& [type, stats] : j["bytes_by_type"].items()) counts[type] = stats["count"].get<int>();
  return counts;
}

TEST(Inspect, ModelATypesMatchTheFixturesReadme) {
  const std::string model = rl::test::fixture("tiny-qwen3next-iq2xxs.gguf");
  RL_REQUIRE_FIXTURE(model);
  const nlohmann::json j = inspect_json(model);
  const std::map<std::string, int> expected = {{"f32", 27}, {"f16", 4},     {"q2_K", 1},    {"q4_K", 1},
                                               {"q5_K", 1}, {"q6_K", 1},    {"q8_0", 12},   {"iq2_xxs", 19},
                                               {"iq2_xs", 2}, {"iq1_m", 2}};
  EXPECT_EQ(reported_type_counts(j), expected);
  EXPECT_EQ(j["n_tensors"], 70);
  EXPECT_EQ(j["architecture"], "qwen3next");
  EXPECT_EQ(j["file_size"], 59801760);
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["alignment"], 32);
  EXPECT_EQ(j["hyperparameters"]["qwen3next.expert_count"], 64);
  EXPECT_EQ(j["tokenizer"]["vocab_size"], 151936);
  EXPECT_EQ(j["tokenizer"]["merges"], 151387);
  EXPECT_EQ(j["tokenizer"]["special_ids"]["bos"], 151643);
  EXPECT_EQ(j["tokenizer"]["has_chat_template"], true);
  // One expert of layer 0 = gate + up (IQ2_XXS, 256 rows x 66 bytes) + down (IQ2_XS, 256 x 74).
  EXPECT_EQ(j["experts"]["max_slot_bytes"], 2 * 256 * 66 + 256 * 74);
  // Layer 2: gate + up IQ1_M (256 x 56) + down IQ2_XXS.
  EXPECT_EQ(j["experts"]["layers"][2]["slot_bytes"], 2 * 256 * 56 + 256 * 66);
  EXPECT_EQ(j["experts"]["layers"].size(), 4u);
  uint64_t bytes = 0;
  for (const auto& [type, stats] : j["bytes_by_type"].items()) bytes += stats["bytes"].get<uint64_t>();
  EXPECT_EQ(bytes, j["tensor_bytes"].get<uint64_t>());
}

TEST(Inspect, ModelBTypesMatchTheFixturesReadme) {
  const std::string model = rl::test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  const nlohmann::json j = inspect_json(model);
  const std::map<std::string, int> expected = {{"f32", 40}, {"q4_K", 40}, {"q5_K", 3}, {"q6_K", 7}, {"q8_0", 3}};
  EXPECT_EQ(reported_type_counts(j), expected);
  EXPECT_EQ(j["n_tensors"], 93);
  EXPECT_EQ(j["name"], "Tiny Qwen3 Next Test B");
  EXPECT_EQ(j["tokenizer"]["vocab_size"], 4099);
  // Block 4 is the MTP block: its experts are listed but not counted as main-layer experts.
  EXPECT_EQ(j["experts"]["layers"].size(), 5u);
  EXPECT_EQ(j["experts"]["layers"][4]["mtp"], true);
  // Q4_K 256-wide rows are 144 bytes, Q6_K 210: layers 0, 1, 3 have a Q4_K down, layer 2 Q6_K.
  EXPECT_EQ(j["experts"]["layers"][0]["slot_bytes"], 3 * 256 * 144);
  EXPECT_EQ(j["experts"]["max_slot_bytes"], 2 * 256 * 144 + 256 * 210);
  EXPECT_EQ(j["experts"]["total_routed_bytes"], 64 * (3 * (3 * 256 * 144) + (2 * 256 * 144 + 256 * 210)));
}

TEST(Inspect, TextReportHasEveryTensorAndTheTotals) {
  const std::string model = rl::test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  const RunResult r = run_redlite("inspect " + quote(model));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* needle : {"architecture  qwen3next", "Tiny Qwen3 Next Test B", "GGUF v3, alignment 32",
                             "blk.4.nextn.eh_proj.weight", "256 x 256 x 64", "expert_count", "vocabulary 4099",
                             "merges 3840", "chat template yes", "bytes by type", "expert slot"})
    EXPECT_NE(r.out.find(needle), std::string::npos) << "missing: " << needle << "\n" << r.out;
}

std::vector<char> read_range(const std::string& path, uint64_t offset, uint64_t n) {
  std::ifstream in(path, std::ios::binary);
  in.seekg((std::streamoff)offset);
  std::vector<char> b(n);
  in.read(b.data(), (std::streamsize)n);
  EXPECT_EQ((uint64_t)in.gcount(), n);
  return b;
}

// Every block type of the quant zoo, dumped through `inspect --dump`, equals ggml's dequantisation
// bit for bit; the reference bytes are read directly from quant-zoo.ref.gguf.
TEST(Inspect, DumpEqualsGgmlDequantisation) {
  const std::string zoo = rl::test::fixture("quant/quant-zoo.gguf");
  const std::string ref = rl::test::fixture("quant/quant-zoo.ref.gguf");
  RL_REQUIRE_FIXTURE(zoo);
  RL_REQUIRE_FIXTURE(ref);
  const nlohmann::json ref_info = inspect_json(ref);
  ScratchDir dir;
  int checked = 0;
  for (const auto& t : ref_info["tensors"]) {
    const std::string name = t["name"];
    SCOPED_TRACE(name);
    ASSERT_EQ(t["type"], "f32");
    const std::string out = dir.file(name + ".f32");
    const RunResult r = run_redlite("inspect " + quote(zoo) + " --dump " + quote(name) + " --out " + quote(out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string dumped = slurp(out);
    const uint64_t nbytes = t["bytes"];
    const std::vector<char> expected =
        read_range(ref, ref_info["data_offset"].get<uint64_t>() + t["offset"].get<uint64_t>(), nbytes);
    ASSERT_EQ(dumped.size(), nbytes);
    size_t first_diff = 0;
    while (first_diff < nbytes && dumped[first_diff] == expected[first_diff]) first_diff++;
    EXPECT_EQ(first_diff, nbytes) << "first differing byte (value " << first_diff / 4 << ")";
    checked++;
  }
  EXPECT_EQ(checked, 23);
}

// A tensor of a real model: the F32 dump is the stored bytes.
TEST(Inspect, DumpOfAnF32TensorIsItsBytes) {
  const std::string model = rl::test::fixture("tiny-qwen3next-iq2xxs.gguf");
  RL_REQUIRE_FIXTURE(model);
  const nlohmann::json j = inspect_json(model);
  ScratchDir dir;
  const std::string out = dir.file("conv.f32");
  const RunResult r = run_redlite("inspect " + quote(model) + " --dump blk.1.ssm_conv1d.weight --out " + quote(out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& t : j["tensors"]) {
    if (t["name"] != "blk.1.ssm_conv1d.weight") continue;
    EXPECT_EQ(t["shape"], nlohmann::json({4, 512}));
    const std::vector<char> stored =
        read_range(model, j["data_offset"].get<uint64_t>() + t["offset"].get<uint64_t>(), 4 * 512 * 4);
    const std::string dumped = slurp(out);
    EXPECT_TRUE(dumped.size() == stored.size() && std::memcmp(dumped.data(), stored.data(), stored.size()) == 0);
  }
}

TEST(Inspect, ErrorsExitOneAndNameTheProblem) {
  const std::string zoo = rl::test::fixture("quant/quant-zoo.gguf");
  RL_REQUIRE_FIXTURE(zoo);
  ScratchDir dir;

  // Truncated inside the tensor data: the error names the file and the tensor that does not fit.
  const std::string truncated = dir.file("truncated.gguf");
  {
    const std::string bytes = slurp(zoo);
    std::ofstream(truncated, std::ios::binary).write(bytes.data(), (std::streamsize)(bytes.size() / 2));
  }
  RunResult r = run_redlite("inspect " + quote(truncated));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(truncated), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("outside the file's data section"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");

  // A corrupted header: the magic.
  const std::string not_gguf = dir.file("not.gguf");
  {
    std::string bytes = slurp(zoo);
    bytes[0] = 'X';
    std::ofstream(not_gguf, std::ios::binary).write(bytes.data(), (std::streamsize)bytes.size());
  }
  r = run_redlite("inspect " + quote(not_gguf) + " --json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not a GGUF file"), std::string::npos) << r.err;

  // A corrupted tensor count.
  const std::string bad_count = dir.file("bad-count.gguf");
  {
    std::string bytes = slurp(zoo);
    std::memset(bytes.data() + 8, 0xff, 8);
    std::ofstream(bad_count, std::ios::binary).write(bytes.data(), (std::streamsize)bytes.size());
  }
  r = run_redlite("inspect " + quote(bad_count));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("tensor count"), std::string::npos) << r.err;

  // A FIFO (reading it would wait for a writer forever) and a directory are refused at once.
  const std::string fifo = dir.file("model.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  r = run_redlite("inspect " + quote(fifo));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(fifo + ": not a regular file (a FIFO)"), std::string::npos) << r.err;
  r = run_redlite("inspect " + quote(dir.file("")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not a regular file (a directory)"), std::string::npos) << r.err;

  // Missing file.
  r = run_redlite("inspect " + quote(dir.file("absent.gguf")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("absent.gguf"), std::string::npos) << r.err;

  // Unknown tensor for --dump: no output file is left behind.
  const std::string out = dir.file("x.f32");
  r = run_redlite("inspect " + quote(zoo) + " --dump zoo.nope --out " + quote(out));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("zoo.nope"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  // --dump without --out is a usage error.
  r = run_redlite("inspect " + quote(zoo) + " --dump zoo.q4_K");
  EXPECT_NE(r.exit_code, 0);
}

}  // namespace
