// The quant type table against ggml itself: quant-zoo.gguf holds one tensor per ggml block type
// (ggml's own quantizer), quant-zoo.ref.gguf holds ggml's own dequantisation of each as F32.
// Dequantisation must reproduce it bit for bit; dot_row must match a double-precision dot of those
// reference values; the table's sizes must match ggml's block layouts and the files' byte counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <ostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "test_util.h"

namespace rl {
namespace {

// Every type DESIGN.md §2 says a Qwen3-Next GGUF can hold, with ggml's block size and bytes per
// block (ggml-common.h), written out here independently of quant.cpp's table.
struct ExpectedType {
  const char* name;
  GgmlType type;
  int64_t block_size;
  size_t type_size;
};

const ExpectedType kDesignTypes[] = {
    {"f32", GgmlType::F32, 1, 4},           {"f16", GgmlType::F16, 1, 2},
    {"bf16", GgmlType::BF16, 1, 2},         {"q4_0", GgmlType::Q4_0, 32, 18},
    {"q4_1", GgmlType::Q4_1, 32, 20},       {"q5_0", GgmlType::Q5_0, 32, 22},
    {"q5_1", GgmlType::Q5_1, 32, 24},       {"q8_0", GgmlType::Q8_0, 32, 34},
    {"q2_K", GgmlType::Q2_K, 256, 84},      {"q3_K", GgmlType::Q3_K, 256, 110},
    {"q4_K", GgmlType::Q4_K, 256, 144},     {"q5_K", GgmlType::Q5_K, 256, 176},
    {"q6_K", GgmlType::Q6_K, 256, 210},     {"iq1_s", GgmlType::IQ1_S, 256, 50},
    {"iq1_m", GgmlType::IQ1_M, 256, 56},    {"iq2_xxs", GgmlType::IQ2_XXS, 256, 66},
    {"iq2_xs", GgmlType::IQ2_XS, 256, 74},  {"iq2_s", GgmlType::IQ2_S, 256, 82},
    {"iq3_xxs", GgmlType::IQ3_XXS, 256, 98}, {"iq3_s", GgmlType::IQ3_S, 256, 110},
    {"iq4_nl", GgmlType::IQ4_NL, 32, 18},   {"iq4_xs", GgmlType::IQ4_XS, 256, 136},
    {"mxfp4", GgmlType::MXFP4, 32, 17},
};
static_assert(std::size(kDesignTypes) == 23);

// So a failing parameterised test prints "q4_K", not the struct's bytes.
void PrintTo(const ExpectedType& t, std::ostream* os) { *os << t.name; }

std::string zoo_path() { return test::fixture("quant/quant-zoo.gguf"); }
std::string zoo_ref_path() { return test::fixture("quant/quant-zoo.ref.gguf"); }

std::string type_param_name(const testing::TestParamInfo<ExpectedType>& info) { return info.param.name; }

// The zoo tensor of one type and its F32 reference, checked for shape and type.
struct ZooPair {
  std::unique_ptr<GgufFile> quant_file, ref_file;
  const GgufTensorInfo* quant = nullptr;
  const GgufTensorInfo* ref = nullptr;
};

// Fills pair or records a fatal failure (callers ASSERT_NO_FATAL_FAILURE).
void load_zoo_pair(const ExpectedType& t, ZooPair& pair) {
  pair.quant_file = GgufFile::open(zoo_path());
  pair.ref_file = GgufFile::open(zoo_ref_path());
  const std::string name = std::string("zoo.") + t.name;
  pair.quant = pair.quant_file->find_tensor(name);
  ASSERT_NE(pair.quant, nullptr) << "quant-zoo.gguf has no tensor " << name;
  pair.ref = pair.ref_file->find_tensor(name);
  ASSERT_NE(pair.ref, nullptr) << "quant-zoo.ref.gguf has no tensor " << name;
  ASSERT_EQ(pair.quant->type, t.type) << name << " is stored as " << type_name(pair.quant->type);
  ASSERT_EQ(pair.ref->type, GgmlType::F32) << name;
  ASSERT_EQ(pair.quant->ne, pair.ref->ne) << name;
  ASSERT_EQ(pair.ref->nbytes, (uint64_t)pair.ref->n_elements() * 4) << name;
}

// x: [n] deterministic values in [-1, 1) (a 32-bit LCG, so the test is the same everywhere).
std::vector<float> test_vector(int64_t n, uint32_t seed) {
  std::vector<float> x(n);
  uint32_t s = seed;
  for (auto& v : x) {
    s = s * 1664525u + 1013904223u;
    v = (float)((double)(s >> 8) / (double)(1u << 24) * 2.0 - 1.0);
  }
  return x;
}

// ---- the zoo covers the design's types ------------------------------------------------------

TEST(QuantZoo, CoversEveryDesignType) {
  RL_REQUIRE_FIXTURE(zoo_path());
  auto zoo = GgufFile::open(zoo_path());
  std::set<uint32_t> present;
  for (const auto& t : zoo->tensors()) present.insert((uint32_t)t.type);
  for (const auto& t : kDesignTypes)
    EXPECT_TRUE(present.count((uint32_t)t.type)) << "quant-zoo.gguf has no tensor of type " << t.name;
}

// ---- dequantisation: bit for bit with ggml ---------------------------------------------------

class ZooDequantize : public testing::TestWithParam<ExpectedType> {};

TEST_P(ZooDequantize, MatchesGgmlBitForBit) {
  RL_REQUIRE_FIXTURE(zoo_path());
  RL_REQUIRE_FIXTURE(zoo_ref_path());
  const ExpectedType& t = GetParam();
  ZooPair pair;
  ASSERT_NO_FATAL_FAILURE(load_zoo_pair(t, pair));
  const QuantType& qt = quant_type(t.type);
  ASSERT_NE(qt.dequantize_row, nullptr) << t.name;

  const int64_t n = pair.quant->ne[0];
  const size_t row_bytes = row_size(t.type, n);
  ASSERT_EQ(row_bytes * (size_t)pair.quant->n_rows(), pair.quant->nbytes) << t.name;
  const float* ref_values = reinterpret_cast<const float*>(pair.ref->data);

  // One guard value past the row catches a dequantiser that writes too far.
  std::vector<float> row(n + 1);
  const float guard = 12345.0f;
  int64_t mismatched_rows = 0;
  for (int64_t r = 0; r < pair.quant->n_rows(); r++) {
    row[n] = guard;
    qt.dequantize_row(pair.quant->data + r * row_bytes, row.data(), n);
    ASSERT_EQ(row[n], guard) << t.name << " row " << r << ": wrote past the end of the row";
    const float* expected = ref_values + r * n;
    if (std::memcmp(row.data(), expected, (size_t)n * 4) == 0) continue;
    mismatched_rows++;
    for (int64_t i = 0; i < n; i++) {
      if (std::memcmp(&row[i], &expected[i], 4) != 0) {
        ADD_FAILURE() << t.name << " row " << r << " first differs at column " << i << ": got "
                      << row[i] << ", ggml " << expected[i];
        break;
      }
    }
    if (mismatched_rows >= 3) break;  // enough to diagnose
  }
  EXPECT_EQ(mismatched_rows, 0) << t.name;
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ZooDequantize, testing::ValuesIn(kDesignTypes), type_param_name);

// ---- dot products: against a double-precision dot of ggml's dequantised values ---------------

class ZooDot : public testing::TestWithParam<ExpectedType> {};

// |dot_row - exact| <= 1e-5 * sum |a_i x_i|. fp32 partial sums over 32768 terms stay far inside
// it (the 16-lane sums of quant_basic/quant_k measure about 2e-8), while pairing a block with the
// wrong slice of x, or dropping or repeating a block, lands orders of magnitude above it.
void expect_dot_close(const QuantType& qt, const uint8_t* src, const float* dequantized, int64_t n,
                      uint32_t seed, const std::string& what) {
  const std::vector<float> x = test_vector(n, seed);
  double exact = 0, magnitude = 0;
  for (int64_t i = 0; i < n; i++) {
    exact += (double)dequantized[i] * (double)x[i];
    magnitude += std::fabs((double)dequantized[i] * (double)x[i]);
  }
  const float got = qt.dot_row(src, x.data(), n);
  EXPECT_LE(std::fabs((double)got - exact), 1e-5 * magnitude)
      << what << ": dot_row " << got << ", exact " << exact << ", sum|a*x| " << magnitude;
  EXPECT_GT(magnitude, 0.0) << what << ": degenerate test data";
}

TEST_P(ZooDot, MatchesDoublePrecisionDot) {
  RL_REQUIRE_FIXTURE(zoo_path());
  RL_REQUIRE_FIXTURE(zoo_ref_path());
  const ExpectedType& t = GetParam();
  ZooPair pair;
  ASSERT_NO_FATAL_FAILURE(load_zoo_pair(t, pair));
  const QuantType& qt = quant_type(t.type);
  ASSERT_NE(qt.dot_row, nullptr) << t.name;

  const int64_t n = pair.quant->ne[0];
  const size_t row_bytes = row_size(t.type, n);
  const float* ref_values = reinterpret_cast<const float*>(pair.ref->data);
  for (int64_t r = 0; r < pair.quant->n_rows(); r++)
    expect_dot_close(qt, pair.quant->data + r * row_bytes, ref_values + r * n, n, 1000 + (uint32_t)r,
                     std::string(t.name) + " row " + std::to_string(r));

  // The whole tensor as one long row (rows are contiguous): many blocks into the same lanes.
  expect_dot_close(qt, pair.quant->data, ref_values, pair.quant->n_elements(), 7,
                   std::string(t.name) + " whole tensor");

  // A single block, and for the float types a length that leaves a partial chunk.
  expect_dot_close(qt, pair.quant->data, ref_values, t.block_size, 11, std::string(t.name) + " one block");
  if (t.block_size == 1)
    expect_dot_close(qt, pair.quant->data, ref_values, n - 37, 13, std::string(t.name) + " n - 37");
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ZooDot, testing::ValuesIn(kDesignTypes), type_param_name);

// ---- the table -------------------------------------------------------------------------------

TEST(QuantTable, MatchesGgmlBlockLayouts) {
  for (const auto& t : kDesignTypes) {
    const QuantType* qt = find_quant_type((uint32_t)t.type);
    ASSERT_NE(qt, nullptr) << t.name;
    EXPECT_EQ(qt->type, t.type) << t.name;
    EXPECT_STREQ(qt->name, t.name);
    EXPECT_STREQ(type_name(t.type), t.name);
    EXPECT_EQ(qt->block_size, t.block_size) << t.name;
    EXPECT_EQ(qt->type_size, t.type_size) << t.name;
    EXPECT_NE(qt->dequantize_row, nullptr) << t.name;
    EXPECT_NE(qt->dot_row, nullptr) << t.name;
    EXPECT_EQ(&quant_type(t.type), qt) << t.name;
  }
}

TEST(QuantTable, RowSize) {
  for (const auto& t : kDesignTypes) {
    EXPECT_EQ(row_size(t.type, 0), 0u) << t.name;
    EXPECT_EQ(row_size(t.type, 1024), (size_t)(1024 / t.block_size) * t.type_size) << t.name;
    EXPECT_EQ(row_size(t.type, 2048 * 256), (size_t)(2048 * 256 / t.block_size) * t.type_size) << t.name;
  }
  EXPECT_EQ(row_size(GgmlType::Q4_K, 2048), 8u * 144u);
  EXPECT_EQ(row_size(GgmlType::Q8_0, 64), 2u * 34u);
  EXPECT_EQ(row_size(GgmlType::F32, 3), 12u);
}

TEST(QuantTable, RowSizeRejectsPartialBlocks) {
  EXPECT_THROW(row_size(GgmlType::Q4_K, 100), Error);
  EXPECT_THROW(row_size(GgmlType::Q4_0, 33), Error);
  EXPECT_THROW(row_size(GgmlType::IQ2_XXS, 255), Error);
  EXPECT_THROW(row_size(GgmlType::MXFP4, -32), Error);
  try {
    row_size(GgmlType::Q6_K, 300);
    FAIL() << "row_size accepted 300 values of q6_K";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q6_K"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("300"), std::string::npos) << e.what();
  }
}

TEST(QuantTable, FindByName) {
  for (const auto& t : kDesignTypes) {
    const QuantType* qt = find_quant_type_by_name(t.name);
    ASSERT_NE(qt, nullptr) << t.name;
    EXPECT_EQ(qt->type, t.type) << t.name;
  }
  ASSERT_NE(find_quant_type_by_name("Q4_K"), nullptr);
  EXPECT_EQ(find_quant_type_by_name("Q4_K")->type, GgmlType::Q4_K);
  ASSERT_NE(find_quant_type_by_name("IQ2_XXS"), nullptr);
  EXPECT_EQ(find_quant_type_by_name("IQ2_XXS")->type, GgmlType::IQ2_XXS);
  EXPECT_EQ(find_quant_type_by_name("BF16")->type, GgmlType::BF16);
  EXPECT_EQ(find_quant_type_by_name("q4"), nullptr);
  EXPECT_EQ(find_quant_type_by_name("q4_K_M"), nullptr);
  EXPECT_EQ(find_quant_type_by_name(""), nullptr);
  EXPECT_EQ(find_quant_type_by_name("nonsense"), nullptr);
}

TEST(QuantTable, UnknownIds) {
  EXPECT_EQ(find_quant_type(4), nullptr);  // ggml's removed Q4_2
  EXPECT_EQ(find_quant_type(5), nullptr);  // ggml's removed Q4_3
  EXPECT_EQ(find_quant_type(1000), nullptr);
  EXPECT_EQ(find_quant_type(0xffffffffu), nullptr);
  EXPECT_THROW(quant_type((GgmlType)1000), Error);
  EXPECT_THROW(row_size((GgmlType)1000, 32), Error);
  EXPECT_STREQ(type_name((GgmlType)1000), "unknown");
}

TEST(QuantTable, StorageTypesHaveNoFloatView) {
  ASSERT_NE(find_quant_type((uint32_t)GgmlType::I32), nullptr);
  EXPECT_EQ(find_quant_type((uint32_t)GgmlType::I32)->dequantize_row, nullptr);
  const int32_t ints[4] = {1, 2, 3, 4};
  float out[4];
  EXPECT_THROW(dequantize_row(GgmlType::I32, ints, out, 4), Error);
  EXPECT_THROW(dot_row(GgmlType::I32, ints, out, 4), Error);
}

// ---- hand-computed blocks (no fixture needed) ------------------------------------------------

// Q4_0: x = d * (q - 8); value j in the low nibble of byte j, value j + 16 in the high nibble.
TEST(HandComputed, Q4_0) {
  uint8_t block[18];
  const uint16_t d = f32_to_fp16(0.5f);
  std::memcpy(block, &d, 2);
  for (int j = 0; j < 16; j++) block[2 + j] = (uint8_t)((j & 15) | ((15 - j) << 4));
  float y[32];
  dequantize_row(GgmlType::Q4_0, block, y, 32);
  for (int j = 0; j < 16; j++) {
    EXPECT_EQ(y[j], 0.5f * (float)(j - 8)) << j;
    EXPECT_EQ(y[j + 16], 0.5f * (float)(15 - j - 8)) << j;
  }
  float x[32];
  for (int j = 0; j < 32; j++) x[j] = 1.0f;
  float sum = 0;
  for (float v : y) sum += v;
  EXPECT_EQ(dot_row(GgmlType::Q4_0, block, x, 32), sum);
}

// Q8_0: x = d * q.
TEST(HandComputed, Q8_0) {
  uint8_t block[34];
  const uint16_t d = f32_to_fp16(0.25f);
  std::memcpy(block, &d, 2);
  for (int j = 0; j < 32; j++) block[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
  float y[32];
  dequantize_row(GgmlType::Q8_0, block, y, 32);
  for (int j = 0; j < 32; j++) EXPECT_EQ(y[j], 0.25f * (float)(j * 8 - 128)) << j;
}

// MXFP4: x = 2^(e-127) * E2M1(q); e = 128 scales by 2. Nibble 7 is +6, nibble 15 is -6.
TEST(HandComputed, MXFP4) {
  uint8_t block[17] = {};
  block[0] = 128;
  block[1] = 0xF7;  // value 0: nibble 7 (+6), value 16: nibble 15 (-6)
  block[2] = 0x91;  // value 1: nibble 1 (+0.5), value 17: nibble 9 (-0.5)
  float y[32];
  dequantize_row(GgmlType::MXFP4, block, y, 32);
  EXPECT_EQ(y[0], 12.0f);
  EXPECT_EQ(y[16], -12.0f);
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[17], -1.0f);
  EXPECT_EQ(y[2], 0.0f);
}

// Q4_K: sub-block s uses 6-bit (scale, min); x = d*scale*q - dmin*min.
TEST(HandComputed, Q4_K) {
  uint8_t block[144] = {};
  const uint16_t d = f32_to_fp16(0.125f), dmin = f32_to_fp16(0.0625f);
  std::memcpy(block, &d, 2);
  std::memcpy(block + 2, &dmin, 2);
  uint8_t* scales = block + 4;
  scales[0] = 3;        // sub-block 0 scale 3
  scales[4] = 5;        // sub-block 0 min 5
  scales[1] = 2;        // sub-block 1 scale 2, min 0
  scales[8] = 0x21;     // sub-block 4: scale low 4 bits 1, min low 4 bits 2
  scales[0] |= 1 << 6;  // sub-block 4 scale high bits 01 -> scale 17
  uint8_t* qs = block + 16;
  for (int l = 0; l < 32; l++) qs[l] = (uint8_t)((l & 15) | (((l + 1) & 15) << 4));
  for (int l = 0; l < 32; l++) qs[64 + l] = 0x0F;  // chunk 2: sub-block 4 (low) q = 15
  float y[256];
  dequantize_row(GgmlType::Q4_K, block, y, 256);
  for (int l = 0; l < 32; l++) {
    EXPECT_EQ(y[l], 0.125f * 3 * (float)(l & 15) - 0.0625f * 5) << l;
    EXPECT_EQ(y[32 + l], 0.125f * 2 * (float)((l + 1) & 15)) << l;
    EXPECT_EQ(y[128 + l], 0.125f * 17 * 15 - 0.0625f * 2) << l;
  }
}

}  // namespace
}  // namespace rl
