// Corrupted GGUF images: truncations at every offset, byte flips over the header, metadata and
// tensor infos, every count/length/type/dim/offset field forced to hostile values, and a curated
// list of malformed files. Each must be rejected with an rl::Error that names the file, or (for a
// change that still describes a valid file) parse into something whose every value and tensor
// byte can be read safely. Each variant is parsed from its own exact-size heap copy, so
// AddressSanitizer (REDLITE_ASAN=ON) sees any read past the end.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf_sample.h"
#include "gguf_test_util.h"
#include "gguf_touch.h"
#include "test_util.h"

namespace rl {
namespace {

constexpr const char* kName = "corrupt.gguf";

struct Tally {
  int rejected = 0;
  int parsed = 0;
  int total() const { return rejected + parsed; }
};

enum class Outcome { kRejected, kParsed };

// Parses a private exact-size copy of `bytes`; checks the error names the file, or that the
// parsed file keeps every promise. `what` describes the variant for failure messages.
Outcome parse_variant(std::span<const uint8_t> bytes, const std::string& what, Tally& tally,
                      bool read_tensor_bytes = true) {
  std::vector<uint8_t> copy(bytes.begin(), bytes.end());
  try {
    auto f = GgufFile::from_bytes(copy, kName);
    const std::string broken = test::touch_everything(*f, read_tensor_bytes);
    EXPECT_EQ(broken, "") << what;
    tally.parsed++;
    return Outcome::kParsed;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(std::string(kName) + ":", 0), 0u)
        << what << ": the error does not name the file: " << e.what();
    tally.rejected++;
    return Outcome::kRejected;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw a non-rl::Error exception: " << e.what();
    return Outcome::kRejected;
  }
}

// The error message for bytes that must be rejected ("" when they parsed).
std::string rejection(std::span<const uint8_t> bytes) {
  std::vector<uint8_t> copy(bytes.begin(), bytes.end());
  try {
    GgufFile::from_bytes(copy, kName);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_REJECTED(bytes, fragment)                                                     \
  do {                                                                                       \
    const std::string msg_ = rejection(bytes);                                               \
    EXPECT_NE(msg_, "") << "accepted, expected an error containing '" << (fragment) << "'"; \
    EXPECT_NE(msg_.find(fragment), std::string::npos) << msg_;                               \
    EXPECT_EQ(msg_.rfind(std::string(kName) + ":", 0), 0u) << msg_;                          \
  } while (0)

uint64_t end_of_tensor_data(const std::vector<uint8_t>& bytes) {
  auto f = GgufFile::from_bytes(bytes, "valid");
  uint64_t end = 0;
  for (const auto& t : f->tensors()) end = std::max(end, f->data_offset() + t.offset + t.nbytes);
  return end;
}

class Corruption : public ::testing::TestWithParam<uint64_t> {};

TEST_P(Corruption, TruncationAtEveryOffset) {
  const std::vector<uint8_t> valid = test::raw_sample(GetParam()).bytes;
  const uint64_t data_end = end_of_tensor_data(valid);
  Tally tally;
  for (size_t n = 0; n < valid.size(); n++) {
    const Outcome o = parse_variant(std::span(valid.data(), n), "truncated to " + std::to_string(n), tally);
    // Only the zero padding after the last tensor may be cut off.
    EXPECT_EQ(o, n < data_end ? Outcome::kRejected : Outcome::kParsed) << "truncated to " << n;
  }
  std::printf("truncations: %d variants, %d rejected, %d parsed (cut in trailing padding)\n", tally.total(),
              tally.rejected, tally.parsed);
  EXPECT_GE(tally.total(), 900);
}

TEST_P(Corruption, ByteFlipsInHeaderMetadataAndTensorInfos) {
  const std::vector<uint8_t> valid = test::raw_sample(GetParam()).bytes;
  const uint64_t data_offset = GgufFile::from_bytes(valid, "valid")->data_offset();
  Tally tally;
  for (size_t p = 0; p < data_offset; p++) {
    for (uint8_t mask : {0x01, 0x10, 0x80, 0xFF}) {
      std::vector<uint8_t> v = valid;
      v[p] ^= mask;
      parse_variant(v, "byte " + std::to_string(p) + " ^= " + std::to_string(mask), tally);
    }
  }
  std::printf("byte flips: %d variants, %d rejected, %d parsed\n", tally.total(), tally.rejected, tally.parsed);
  EXPECT_GE(tally.total(), 2000);
  EXPECT_GT(tally.rejected, tally.total() / 4);
}

// Every recorded field (counts, lengths, value and element types, dims, ggml types, offsets) set
// to values chosen to overflow, underflow, point past the end or name unknown types.
TEST_P(Corruption, HostileValuesInEveryField) {
  const test::RawGguf raw = test::raw_sample(GetParam());
  const uint64_t size = raw.bytes.size();
  const std::vector<uint64_t> wide = {0, 1, 7, 31, 33, 0x7fffffffull, 0xffffffffull, 1ull << 32, 1ull << 40,
                                      1ull << 62, INT64_MAX, 1ull << 63, UINT64_MAX, size, size - 1, size + 1};
  const std::vector<uint64_t> narrow = {0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 14, 31, 39, 64, 255,
                                        0x7fffffff, 0x80000000, 0xffffffff};
  Tally tally;
  for (const auto& field : raw.fields) {
    const auto& values = field.width == 8 ? wide : field.width == 4 ? narrow : std::vector<uint64_t>{0, 1, 2, 255};
    for (uint64_t v : values) parse_variant(raw.with(field, v), field.label + " = " + std::to_string(v), tally);
  }
  std::printf("hostile field values: %d variants over %zu fields, %d rejected, %d parsed\n", tally.total(),
              raw.fields.size(), tally.rejected, tally.parsed);
  EXPECT_GE(tally.total(), 700);
}

INSTANTIATE_TEST_SUITE_P(Gguf, Corruption, ::testing::Values(32, 64),
                         [](const auto& info) { return "align" + std::to_string(info.param); });

// Specific malformations, each with the problem its message must name.
TEST(Corruption, MalformedFilesAreRejectedWithTheirCause) {
  const test::RawGguf raw = test::raw_sample(32);
  const std::vector<uint8_t>& valid = raw.bytes;
  const uint64_t data_size = valid.size() - GgufFile::from_bytes(valid, "valid")->data_offset();

  EXPECT_REJECTED(std::span<const uint8_t>(), "too small");
  EXPECT_REJECTED(std::span(valid.data(), 3), "too small");
  {
    std::vector<uint8_t> v = valid;
    std::memcpy(v.data(), "GGML", 4);
    EXPECT_REJECTED(v, "not a GGUF file");
  }
  EXPECT_REJECTED(raw.with("header.version", 1), "version 1");
  EXPECT_REJECTED(raw.with("header.version", 4), "unsupported GGUF version 4");
  EXPECT_REJECTED(raw.with("header.version", 0x03000000), "big-endian");
  EXPECT_REJECTED(raw.with("header.n_tensors", UINT64_MAX), "tensor count");
  EXPECT_REJECTED(raw.with("header.n_kv", UINT64_MAX), "metadata count");
  EXPECT_REJECTED(raw.with("header.n_kv", 1ull << 32), "metadata count");
  EXPECT_REJECTED(raw.with("kv[0].key.len", UINT64_MAX), "metadata key");
  EXPECT_REJECTED(raw.with("kv[0].key.len", 0), "empty");
  EXPECT_REJECTED(raw.with("kv[0].type", 13), "unknown value type 13");
  EXPECT_REJECTED(raw.with("kv[0].type", 0xffffffff), "unknown value type");
  EXPECT_REJECTED(raw.with("kv[0].str.len", 1ull << 40), "string");
  EXPECT_REJECTED(raw.with("kv[11].value", 2), "bool");                      // sample.bool
  EXPECT_REJECTED(raw.with("kv[13].count", 1ull << 61), "sample.tokens");     // string array count
  EXPECT_REJECTED(raw.with("kv[13].item[2].len", 1ull << 33), "string");      // one token's length
  EXPECT_REJECTED(raw.with("kv[13].elem_type", 99), "element type");
  EXPECT_REJECTED(raw.with("kv[14].count", 1ull << 62), "sample.scores");     // f32 array count
  EXPECT_REJECTED(raw.with("kv[16].item[1]", 7), "bool");                     // bool array item
  EXPECT_REJECTED(raw.with("kv[17].count", 1ull << 60), "sample.nested");     // nested array count
  EXPECT_REJECTED(raw.with("kv[17].item[0].count", 1ull << 62), "sample.nested");
  EXPECT_REJECTED(raw.with("kv[17].item[0].elem_type", 13), "element type");

  EXPECT_REJECTED(raw.with("tensor[0].name.len", 0), "empty name");
  EXPECT_REJECTED(raw.with("tensor[0].name.len", UINT64_MAX), "tensor name");
  EXPECT_REJECTED(raw.with("tensor[0].n_dims", 0), "dimensions");
  EXPECT_REJECTED(raw.with("tensor[0].n_dims", 5), "dimensions");
  EXPECT_REJECTED(raw.with("tensor[0].ne[0]", 0), "w.f32");
  EXPECT_REJECTED(raw.with("tensor[1].ne[1]", 0), "w.q8_0");
  EXPECT_REJECTED(raw.with("tensor[1].ne[0]", 31), "block size");
  EXPECT_REJECTED(raw.with("tensor[1].ne[1]", 1ull << 62), "w.q8_0");
  EXPECT_REJECTED(raw.with("tensor[1].ne[1]", UINT64_MAX), "w.q8_0");
  EXPECT_REJECTED(raw.with("tensor[2].ne[2]", 1ull << 40), "w.f16");
  EXPECT_REJECTED(raw.with("tensor[0].type", 4), "unknown ggml type 4");  // removed Q4_2
  EXPECT_REJECTED(raw.with("tensor[0].type", 1000), "unknown ggml type 1000");
  EXPECT_REJECTED(raw.with("tensor[1].offset", 33), "not aligned");
  EXPECT_REJECTED(raw.with("tensor[3].offset", data_size), "outside");
  EXPECT_REJECTED(raw.with("tensor[3].offset", UINT64_MAX - 31), "outside");
  EXPECT_REJECTED(raw.with("tensor[3].offset", 1ull << 63), "outside");

  // Duplicates: "sample.i8" renamed to "sample.u8"; tensor "w.f16" renamed to "w.f32".
  {
    std::vector<uint8_t> v = valid;
    const size_t at = raw.field("kv[2].key.len").offset + 8;
    ASSERT_EQ(std::string((const char*)v.data() + at, 9), "sample.i8");
    v[at + 7] = 'u';
    EXPECT_REJECTED(v, "duplicate metadata key 'sample.u8'");
  }
  {
    std::vector<uint8_t> v = valid;
    const size_t at = raw.field("tensor[2].name.len").offset + 8;
    ASSERT_EQ(std::string((const char*)v.data() + at, 5), "w.f16");
    std::memcpy(v.data() + at, "w.f32", 5);
    EXPECT_REJECTED(v, "duplicate tensor name 'w.f32'");
  }
  // Offsets that overlap but are aligned and in range describe readable data; llama.cpp requires
  // the packed layout, and so does this reader only in the sense that the bytes must exist.
}

TEST(Corruption, MalformedAlignmentKey) {
  auto file_with_alignment = [](GgufValueType type, uint64_t value) {
    test::RawGguf r;
    r.header(3, 1, 1);
    r.str("k", "general.alignment");
    r.u32("type", (uint32_t)type);
    if (type == GgufValueType::UINT64) r.u64("v", value);
    else if (type == GgufValueType::STRING) r.str("v", "64");
    else r.u32("v", (uint32_t)value);
    r.tensor_info(0, "t", {8}, (uint32_t)GgmlType::F32, 0);
    r.pad(64);
    r.bytes.resize(r.bytes.size() + 64, 0);
    return r.bytes;
  };
  EXPECT_REJECTED(file_with_alignment(GgufValueType::UINT32, 0), "power of two");
  EXPECT_REJECTED(file_with_alignment(GgufValueType::UINT32, 3), "power of two");
  EXPECT_REJECTED(file_with_alignment(GgufValueType::UINT32, 48), "power of two");
  EXPECT_REJECTED(file_with_alignment(GgufValueType::UINT32, 1u << 31), "power of two");
  EXPECT_REJECTED(file_with_alignment(GgufValueType::UINT64, UINT64_MAX), "general.alignment");
  EXPECT_REJECTED(file_with_alignment(GgufValueType::STRING, 0), "general.alignment");
  EXPECT_REJECTED(file_with_alignment(GgufValueType::FLOAT32, 0), "general.alignment");
  auto ok = GgufFile::from_bytes(file_with_alignment(GgufValueType::UINT32, 64), "ok");
  EXPECT_EQ(ok->alignment(), 64u);
  EXPECT_EQ(ok->data_offset() % 64, 0u);
}

TEST(Corruption, DeeplyNestedArraysAreRejectedNotRecursedForever) {
  test::RawGguf r;
  r.header(3, 0, 1);
  r.str("k", "deep");
  r.u32("", (uint32_t)GgufValueType::ARRAY);
  for (int i = 0; i < 100000; i++) {
    r.u32("", (uint32_t)GgufValueType::ARRAY);
    r.u64("", 1);
  }
  EXPECT_REJECTED(r.bytes, "nested");
}

TEST(Corruption, TensorInfosEndingAtEndOfFile) {
  // The data section would start past the end of the file.
  test::RawGguf r;
  r.header(3, 1, 0);
  r.tensor_info(0, "t", {8}, (uint32_t)GgmlType::F32, 0);
  r.bytes.push_back(0);  // 41 bytes: padding to 64 would pass the end
  EXPECT_REJECTED(r.bytes, kName);
}

// The same treatment on a real llama.cpp file (model B): truncations across its metadata (the
// 4,099-token vocabulary, merges, chat template) and tensor infos, and byte flips there.
TEST(Corruption, RealModelHeaderTruncationsAndFlips) {
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  std::vector<uint8_t> bytes = test::read_bytes(path);
  const uint64_t data_offset = GgufFile::from_bytes(bytes, "model-b")->data_offset();
  Tally tally;
  std::mt19937_64 rng(42);
  for (int i = 0; i < 400; i++) {
    const size_t n = i < 64 ? (size_t)i * 13 : (size_t)(rng() % data_offset);
    const Outcome o = parse_variant(std::span(bytes.data(), n), "model B truncated to " + std::to_string(n), tally);
    EXPECT_EQ(o, Outcome::kRejected) << "model B truncated to " << n;
  }
  // Flips parse the whole file in place (one byte changed, then restored).
  for (int i = 0; i < 400; i++) {
    const size_t p = (size_t)(rng() % data_offset);
    const uint8_t mask = (uint8_t)(1u << (rng() % 8));
    bytes[p] ^= mask;
    try {
      auto f = GgufFile::from_bytes(bytes, kName);
      EXPECT_EQ(test::touch_everything(*f, /*read_tensor_bytes=*/false), "") << "flip at " << p;
      tally.parsed++;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(std::string(kName) + ":", 0), 0u) << e.what();
      tally.rejected++;
    }
    bytes[p] ^= mask;
  }
  std::printf("model B header: %d variants, %d rejected, %d parsed\n", tally.total(), tally.rejected, tally.parsed);
}

#if defined(__SANITIZE_ADDRESS__)
#define RL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RL_ASAN 1
#endif
#endif

// A corrupted count in a large file must not make the reader allocate in proportion to the count
// before it has read the items (the 80B model is 23 GB: a bad count could ask for tens of GB).
// A sparse 4 GiB file with huge counts is opened under a 2 GiB heap limit (address space limit
// above the mapping), in a child process.
TEST(Corruption, HugeCountsInALargeFileDoNotAllocateUpFront) {
#ifdef RL_ASAN
  GTEST_SKIP() << "address-space limits do not work under AddressSanitizer";
#else
  test::TempDir dir;
  const uint64_t file_size = 4ull << 30;
  struct Case {
    const char* label;
    std::function<void(test::RawGguf&)> build;
  };
  const uint64_t big = 400'000'000;  // under file_size / 8: passes the "can it fit" checks
  const std::vector<Case> cases = {
      {"n_kv", [&](test::RawGguf& r) { r.header(3, 0, big * 3 / 4); }},  // under file_size / 13
      {"n_tensors", [&](test::RawGguf& r) { r.header(3, big / 4, 0); }},
      {"string array", [&](test::RawGguf& r) {
         r.header(3, 0, 1);
         r.str("", "tokenizer.ggml.tokens");
         r.u32("", (uint32_t)GgufValueType::ARRAY);
         r.u32("", (uint32_t)GgufValueType::STRING);
         r.u64("", big);
         r.str("", "x");
         r.u64("", UINT64_MAX);  // the second string's length is corrupt
       }},
      {"nested array", [&](test::RawGguf& r) {
         r.header(3, 0, 1);
         r.str("", "nested");
         r.u32("", (uint32_t)GgufValueType::ARRAY);
         r.u32("", (uint32_t)GgufValueType::ARRAY);
         r.u64("", big / 2);
         r.u32("", (uint32_t)GgufValueType::UINT8);
         r.u64("", 0);
         r.u32("", 77);  // the second item's element type is corrupt
       }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    test::RawGguf r;
    c.build(r);
    r.bytes.resize(r.bytes.size() + 64, 0xAB);  // non-zero filler: a length read here is absurd
    const std::string path = dir.file(std::string("sparse-") + c.label + ".gguf");
    {
      FILE* f = std::fopen(path.c_str(), "wb");
      ASSERT_NE(f, nullptr);
      std::fwrite(r.bytes.data(), 1, r.bytes.size(), f);
      std::fclose(f);
      std::filesystem::resize_file(path, file_size);  // sparse: reads as zeros, costs no disk
    }
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      rlimit lim{file_size + (2ull << 30), file_size + (2ull << 30)};
      setrlimit(RLIMIT_AS, &lim);
      try {
        GgufFile::open(path);
        _exit(2);  // parsed: wrong
      } catch (const Error& e) {
        std::fprintf(stderr, "%s: rejected: %s\n", c.label, e.what());
        _exit(0);
      } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "%s: std::bad_alloc\n", c.label);
        _exit(3);
      } catch (...) {
        _exit(4);
      }
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "2: parsed, 3: bad_alloc, 4: other exception";
  }
#endif
}

}  // namespace
}  // namespace rl
