// GgufWriter: byte layout against a hand-built file, round trips through GgufFile, streaming in
// chunks, and failure handling (no partial file left, errors name the path and the cause).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "gguf_sample.h"
#include "gguf_test_util.h"
#include "test_util.h"

namespace rl {
namespace {

using test::TempDir;

class WriterAlignment : public ::testing::TestWithParam<uint64_t> {};

TEST_P(WriterAlignment, BytesEqualTheSpecLayoutBuiltByHand) {
  const uint64_t alignment = GetParam();
  TempDir dir;
  const std::string path = dir.file("sample.gguf");
  const GgufWriter w = test::sample_writer(alignment);
  w.write(path);
  const std::vector<uint8_t> written = test::read_bytes(path);
  const std::vector<uint8_t> expected = test::raw_sample(alignment).bytes;
  EXPECT_EQ(written.size(), expected.size());
  EXPECT_EQ(w.file_size(), expected.size());
  EXPECT_TRUE(written == expected) << "writer output differs from the hand-built layout";
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_P(WriterAlignment, RoundTripKeepsEveryKeyValueAndTensorByte) {
  const uint64_t alignment = GetParam();
  TempDir dir;
  const std::string path = dir.file("sample.gguf");
  test::sample_writer(alignment).write(path);
  auto f = GgufFile::open(path);
  test::expect_sample_contents(*f, alignment);
}

TEST_P(WriterAlignment, ChunkSizeDoesNotChangeTheFile) {
  const uint64_t alignment = GetParam();
  TempDir dir;
  const GgufWriter w = test::sample_writer(alignment);
  w.write(dir.file("a.gguf"), 1);     // one row per fill call
  w.write(dir.file("b.gguf"), 100);   // a few rows per call
  w.write(dir.file("c.gguf"));        // whole tensors
  const auto a = test::read_bytes(dir.file("a.gguf"));
  EXPECT_TRUE(a == test::read_bytes(dir.file("b.gguf")));
  EXPECT_TRUE(a == test::read_bytes(dir.file("c.gguf")));
}

TEST_P(WriterAlignment, AddValueCopiesAFileExactly) {
  const uint64_t alignment = GetParam();
  TempDir dir;
  test::sample_writer(alignment).write(dir.file("src.gguf"));
  auto src = GgufFile::open(dir.file("src.gguf"));
  GgufWriter copy(alignment);
  for (const auto& kv : src->metadata()) copy.add_value(kv.key, kv.value);
  for (const auto& t : src->tensors())
    copy.add_tensor_bytes(t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                          std::vector<uint8_t>(t.data, t.data + t.nbytes));
  copy.write(dir.file("copy.gguf"));
  EXPECT_TRUE(test::read_bytes(dir.file("src.gguf")) == test::read_bytes(dir.file("copy.gguf")));
}

INSTANTIATE_TEST_SUITE_P(Gguf, WriterAlignment, ::testing::Values(32, 64, 128),
                         [](const auto& info) { return "align" + std::to_string(info.param); });

// Every ggml type the table knows, at ranks 1-4, through the reader: every byte comes back.
TEST(GgufWriter, EveryTensorTypeAndRankRoundTrips) {
  struct Expected {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
  };
  std::mt19937 rng(1234);
  std::vector<Expected> expected;
  GgufWriter w(64);
  w.add_string("general.architecture", "types");
  int rank = 1;
  for (uint32_t id = 0; id < 64; id++) {
    const QuantType* qt = find_quant_type(id);
    if (!qt) continue;
    std::vector<int64_t> ne = {qt->block_size * (1 + (int64_t)(id % 3))};
    for (int d = 1; d < rank; d++) ne.push_back(1 + (int64_t)((id + d) % 3));
    rank = rank % 4 + 1;
    const size_t rows = [&] { size_t r = 1; for (size_t d = 1; d < ne.size(); d++) r *= (size_t)ne[d]; return r; }();
    std::vector<uint8_t> bytes(row_size(qt->type, ne[0]) * rows);
    for (auto& b : bytes) b = (uint8_t)rng();
    expected.push_back({std::string("t.") + qt->name, qt->type, ne, bytes});
    const size_t row_bytes = row_size(qt->type, ne[0]);
    auto shared = std::make_shared<std::vector<uint8_t>>(bytes);
    w.add_tensor(expected.back().name, qt->type, ne, [shared, row_bytes](uint8_t* dst, int64_t first, int64_t n) {
      std::memcpy(dst, shared->data() + first * row_bytes, n * row_bytes);
    });
  }
  ASSERT_GE(expected.size(), 30u);
  TempDir dir;
  w.write(dir.file("types.gguf"), 40);
  auto f = GgufFile::open(dir.file("types.gguf"));
  ASSERT_EQ(f->tensors().size(), expected.size());
  EXPECT_EQ(f->file_size(), w.file_size());
  uint64_t end = 0;
  for (size_t i = 0; i < expected.size(); i++) {
    const GgufTensorInfo& t = f->tensors()[i];
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(t.name, expected[i].name);
    EXPECT_EQ(t.type, expected[i].type);
    ASSERT_EQ(t.n_dims, expected[i].ne.size());
    for (size_t d = 0; d < t.n_dims; d++) EXPECT_EQ(t.ne[d], expected[i].ne[d]);
    EXPECT_EQ(t.offset, (end + 63) / 64 * 64);
    EXPECT_EQ((uintptr_t)(t.data - f->base()) % 64, 0u);
    ASSERT_EQ(t.nbytes, expected[i].bytes.size());
    EXPECT_EQ(0, std::memcmp(t.data, expected[i].bytes.data(), t.nbytes));
    end = t.offset + t.nbytes;
  }
}

TEST(GgufWriter, FillGetsWholeRowsBoundedByTheChunkSize) {
  const int64_t rows = 37;
  const size_t row_bytes = row_size(GgmlType::Q8_0, 64);  // 68
  std::vector<std::pair<int64_t, int64_t>> calls;
  GgufWriter w;
  w.add_tensor("t", GgmlType::Q8_0, {64, rows}, [&](uint8_t* dst, int64_t first, int64_t n) {
    calls.emplace_back(first, n);
    std::memset(dst, (int)first, n * row_bytes);
  });
  TempDir dir;
  w.write(dir.file("t.gguf"), 5 * row_bytes + 10);
  int64_t next = 0;
  for (auto [first, n] : calls) {
    EXPECT_EQ(first, next);
    EXPECT_GE(n, 1);
    EXPECT_LE((size_t)n * row_bytes, 5 * row_bytes + 10);
    next = first + n;
  }
  EXPECT_EQ(next, rows);
  EXPECT_EQ(calls.size(), 8u);  // ceil(37 / 5)

  // A chunk smaller than one row still passes whole rows, one at a time.
  calls.clear();
  w.write(dir.file("t.gguf"), 1);
  EXPECT_EQ(calls.size(), (size_t)rows);
}

TEST(GgufWriter, EmptyFileHasOnlyHeaderAndPadding) {
  TempDir dir;
  GgufWriter w;
  w.write(dir.file("e.gguf"));
  const auto bytes = test::read_bytes(dir.file("e.gguf"));
  // "GGUF", version 3, 0 tensors, 0 kv: 24 bytes, padded to 32.
  const std::vector<uint8_t> expected = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         0,   0,   0,   0,   0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(bytes, expected);
  auto f = GgufFile::open(dir.file("e.gguf"));
  EXPECT_EQ(f->metadata().size(), 0u);
  EXPECT_EQ(f->tensors().size(), 0u);
}

TEST(GgufWriter, RejectsInvalidInput) {
  for (uint64_t bad : {uint64_t(0), uint64_t(48), uint64_t(1) << 33})
    EXPECT_THROW({ GgufWriter bad_writer(bad); }, Error) << bad;

  GgufWriter w;
  w.add_u32("a", 1);
  EXPECT_THROW(w.add_string("a", "again"), Error);
  EXPECT_THROW(w.add_u32("", 1), Error);
  EXPECT_THROW(w.add_u32("general.alignment", 64), Error);  // conflicts with the writer's 32
  EXPECT_THROW(w.add_u64("general.alignment", 32), Error);  // must be u32
  w.add_u32("general.alignment", 32);                       // restating it is fine

  GgufWriter w64(64);
  w64.add_u32("general.alignment", 64);  // a copied key that agrees with the constructor
  EXPECT_EQ(w64.file_size() % 64, 0u);

  auto zeros = [](uint8_t*, int64_t, int64_t) {};
  w.add_tensor("t", GgmlType::F32, {4}, zeros);
  EXPECT_THROW(w.add_tensor("t", GgmlType::F32, {4}, zeros), Error);                // duplicate
  EXPECT_THROW(w.add_tensor("", GgmlType::F32, {4}, zeros), Error);                 // empty name
  EXPECT_THROW(w.add_tensor(std::string(64, 'x'), GgmlType::F32, {4}, zeros), Error);  // > 63 bytes
  w.add_tensor(std::string(63, 'x'), GgmlType::F32, {4}, zeros);
  EXPECT_THROW(w.add_tensor("q", GgmlType::Q4_K, {128}, zeros), Error);             // not a block multiple
  EXPECT_THROW(w.add_tensor("z", GgmlType::F32, {4, 0}, zeros), Error);             // empty dimension
  EXPECT_THROW(w.add_tensor("r", GgmlType::F32, {1, 1, 1, 1, 1}, zeros), Error);    // 5 dims
  EXPECT_THROW(w.add_tensor("n", GgmlType::F32, {}, zeros), Error);                 // 0 dims
  EXPECT_THROW(w.add_tensor("u", (GgmlType)4, {4}, zeros), Error);                  // removed type id
  EXPECT_THROW(w.add_tensor("o", GgmlType::F32, {INT64_MAX / 2, 4}, zeros), Error);  // overflow
  EXPECT_THROW(w.add_tensor("f", GgmlType::F32, {4}, nullptr), Error);
  EXPECT_THROW(w.add_tensor_bytes("b", GgmlType::F32, {4}, std::vector<uint8_t>(15)), Error);
  try {
    w.add_tensor_bytes("b", GgmlType::F32, {4}, std::vector<uint8_t>(15));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor b"), std::string::npos) << e.what();
  }
  // A failed add leaves the layout as it was.
  const uint64_t before = w.file_size();
  EXPECT_THROW(w.add_tensor_bytes("b", GgmlType::F32, {4}, std::vector<uint8_t>(15)), Error);
  EXPECT_EQ(w.file_size(), before);
}

TEST(GgufWriter, UnwritableDirectoryFailsNamingThePath) {
  TempDir dir;
  const std::string path = dir.file("missing-dir/out.gguf");
  try {
    test::sample_writer(32).write(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  }
  // A path below a regular file.
  test::sample_writer(32).write(dir.file("plain"));
  EXPECT_THROW(test::sample_writer(32).write(dir.file("plain/out.gguf")), Error);
  // The target is a directory: the rename fails and the temporary file is removed.
  std::filesystem::create_directory(dir.file("adir"));
  EXPECT_THROW(test::sample_writer(32).write(dir.file("adir")), Error);
  EXPECT_FALSE(std::filesystem::exists(dir.file("adir.tmp")));
}

TEST(GgufWriter, FillFailureRemovesThePartialFileAndKeepsTheOldOne) {
  TempDir dir;
  const std::string path = dir.file("model.gguf");
  test::sample_writer(32).write(path);
  const auto old_bytes = test::read_bytes(path);

  GgufWriter w;
  w.add_string("general.architecture", "x");
  w.add_tensor("ok", GgmlType::F32, {64, 64}, [](uint8_t* dst, int64_t, int64_t n) { std::memset(dst, 1, n * 256); });
  w.add_tensor("bad", GgmlType::F32, {64, 64}, [](uint8_t*, int64_t first, int64_t) {
    if (first >= 10) throw std::runtime_error("synthetic generator failed");
  });
  try {
    w.write(path, 1024);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad"), std::string::npos) << msg;
    EXPECT_NE(msg.find("synthetic generator failed"), std::string::npos) << msg;
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_TRUE(test::read_bytes(path) == old_bytes) << "a failed write must not touch the existing file";
}

// Runs `body` in a child process and returns its exit status (so limits set there stay there).
template <class F>
int run_in_child(F body) {
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A file-size limit makes the kernel refuse writes (EFBIG) the way a full disk does (ENOSPC):
// the writer must report it with the path and leave nothing behind.
TEST(GgufWriter, DiskFullLeavesNoPartialFile) {
  TempDir dir;
  const std::string path = dir.file("big.gguf");
  const int status = run_in_child([&] {
    signal(SIGXFSZ, SIG_IGN);
    rlimit lim{64 << 10, 64 << 10};
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) return 10;
    GgufWriter w;
    w.add_tensor("big", GgmlType::F32, {1024, 1024}, [](uint8_t* dst, int64_t, int64_t n) {
      std::memset(dst, 7, n * 4096);
    });
    try {
      w.write(path, 16 << 10);
      return 11;
    } catch (const Error& e) {
      const std::string msg = e.what();
      std::fprintf(stderr, "writer error (expected): %s\n", msg.c_str());
      if (msg.find(path) == std::string::npos) return 12;
      if (msg.find("File too large") == std::string::npos) return 13;
    }
    if (std::filesystem::exists(path + ".tmp") || std::filesystem::exists(path)) return 14;
    return 0;
  });
  EXPECT_EQ(status, 0);
}

// The same on a real filesystem that is too small (a 256 KiB tmpfs), where mounting is allowed.
TEST(GgufWriter, DiskFullOnASmallFilesystem) {
  TempDir dir;
  const std::string mnt = dir.file("small-fs");
  std::filesystem::create_directory(mnt);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0)
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno) << ")";
  const std::string path = mnt + "/model.gguf";
  GgufWriter w;
  w.add_tensor("big", GgmlType::F32, {1024, 1024}, [](uint8_t* dst, int64_t, int64_t n) { std::memset(dst, 7, n * 4096); });
  try {
    w.write(path, 16 << 10);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_FALSE(std::filesystem::exists(path));
  umount(mnt.c_str());
}

// The writer holds one chunk at a time: a 512 MiB file with 4 MiB chunks must not grow the
// process by more than a few chunks.
TEST(GgufWriter, StreamsWithoutHoldingTheModelInMemory) {
  TempDir dir;
  const std::string path = dir.file("stream.gguf");
  const int status = run_in_child([&] {
    rusage before{};
    getrusage(RUSAGE_SELF, &before);
    GgufWriter w;
    w.add_tensor("big", GgmlType::F32, {262144, 512}, [](uint8_t* dst, int64_t first, int64_t n) {
      for (int64_t r = 0; r < n; r++) std::memset(dst + (r << 20), (int)((first + r) & 0xff), 1 << 20);  // 1 MiB rows
    });
    w.write(path, 4 << 20);
    rusage after{};
    getrusage(RUSAGE_SELF, &after);
    const long grown_mib = (after.ru_maxrss - before.ru_maxrss) / 1024;
    std::fprintf(stderr, "peak RSS grew by %ld MiB while writing 512 MiB\n", grown_mib);
    return grown_mib < 32 ? 0 : 1;
  });
  EXPECT_EQ(status, 0);
  auto f = GgufFile::open(path);
  const GgufTensorInfo& t = f->tensor("big");
  EXPECT_EQ(t.nbytes, 512u << 20);
  EXPECT_EQ(t.data[0], 0);
  EXPECT_EQ(t.data[(size_t)511 << 20], 511 & 0xff);
  EXPECT_EQ(t.data[((size_t)300 << 20) + 5], 300 & 0xff);
}

// A llama.cpp-written file rewritten through the reader and writer is the same file, byte for byte:
// the writer lays out metadata, tensor infos, offsets and padding exactly as ggml does.
void expect_rewrite_identical(const std::string& fixture) {
  auto src = GgufFile::open(fixture);
  GgufWriter copy(src->alignment());
  for (const auto& kv : src->metadata()) copy.add_value(kv.key, kv.value);
  for (const auto& t : src->tensors()) {
    const GgufTensorInfo* info = &t;
    const size_t row_bytes = t.row_bytes();
    copy.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                    [info, row_bytes](uint8_t* dst, int64_t first, int64_t n) {
                      std::memcpy(dst, info->data + first * row_bytes, n * row_bytes);
                    });
  }
  EXPECT_EQ(copy.file_size(), src->file_size());
  TempDir dir;
  copy.write(dir.file("copy.gguf"), 1 << 20);
  const auto original = test::read_bytes(fixture);
  const auto rewritten = test::read_bytes(dir.file("copy.gguf"));
  ASSERT_EQ(rewritten.size(), original.size());
  size_t first_diff = 0;
  while (first_diff < original.size() && original[first_diff] == rewritten[first_diff]) first_diff++;
  EXPECT_EQ(first_diff, original.size()) << "first differing byte";
}

TEST(GgufWriter, RewritingLlamaCppFixturesIsByteIdentical) {
  for (const char* name : {"tiny-qwen3next-q4km.gguf", "quant/quant-zoo.gguf"}) {
    const std::string path = test::fixture(name);
    RL_REQUIRE_FIXTURE(path);
    SCOPED_TRACE(name);
    expect_rewrite_identical(path);
  }
}

// The 80B-shaped seed-mix table (807 tensors) with model A's Qwen2 vocabulary: the fixtures README
// gives the size llama.cpp's tools produce for exactly this file, 22,982,503,520 bytes. Computed
// without writing anything (synth writes it for real on the GPU host).
TEST(GgufWriter, LayoutOfThe80BSeedMixHasLlamaCppsFileSize) {
  const std::string table_path = test::fixture("80b-seed-mix.tensors.json");
  const std::string vocab_path = test::fixture("tiny-qwen3next-iq2xxs.gguf");
  RL_REQUIRE_FIXTURE(table_path);
  RL_REQUIRE_FIXTURE(vocab_path);
  std::ifstream in(table_path);
  const nlohmann::json table = nlohmann::json::parse(in);
  auto vocab = GgufFile::open(vocab_path);

  GgufWriter w;
  for (const auto& [key, value] : table["metadata"].items()) {
    if (value.is_string()) w.add_string(key, value.get<std::string>());
    else if (value.is_number_float()) w.add_f32(key, value.get<float>());
    else w.add_u32(key, value.get<uint32_t>());
  }
  for (const auto& [key, value] : table["tokenizer_keys"].items()) {
    const GgufValue* v = vocab->find(key);
    ASSERT_NE(v, nullptr) << key;
    if (v->is_array()) {
      EXPECT_EQ("array[" + std::to_string(v->size()) + "]", value.get<std::string>()) << key;
    }
    w.add_value(key, *v);
  }
  auto unused = [](uint8_t*, int64_t, int64_t) { FAIL() << "nothing is written"; };
  for (const auto& t : table["tensors"]) {
    const QuantType* qt = find_quant_type_by_name(t["type"].get<std::string>());
    ASSERT_NE(qt, nullptr) << t["type"];
    w.add_tensor(t["name"].get<std::string>(), qt->type, t["ne"].get<std::vector<int64_t>>(), unused);
  }
  EXPECT_EQ(table["tensors"].size(), 807u);
  EXPECT_EQ(w.file_size(), 22982503520ull);
}

}  // namespace
}  // namespace rl
