// The sample GGUF used by the writer and corruption tests: every metadata value type (nested
// arrays and string arrays included) and four tensors of different types and ranks. It is built
// two independent ways: with GgufWriter, and field by field with RawGguf (from the spec), so the
// writer's bytes can be compared with a layout computed by hand.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "gguf_test_util.h"

namespace rl::test {

struct SampleTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
};

inline const std::vector<SampleTensor>& sample_tensors() {
  static const std::vector<SampleTensor> t = {
      {"w.f32", GgmlType::F32, {5}},                 // 20 bytes: padding after it
      {"w.q8_0", GgmlType::Q8_0, {64, 2}},           // 2 rows x 68 bytes
      {"w.f16", GgmlType::F16, {4, 3, 2}},           // 48 bytes, 3-D
      {"w.q4_K", GgmlType::Q4_K, {256, 1, 1, 2}},    // 288 bytes, 4-D
  };
  return t;
}

inline size_t sample_rows(const SampleTensor& t) {
  size_t rows = 1;
  for (size_t d = 1; d < t.ne.size(); d++) rows *= (size_t)t.ne[d];
  return rows;
}
inline size_t sample_nbytes(const SampleTensor& t) { return row_size(t.type, t.ne[0]) * sample_rows(t); }

// Byte `i` of tensor `ti`: a pattern that differs between tensors and positions.
inline uint8_t sample_byte(size_t ti, size_t i) { return (uint8_t)(ti * 31 + i * 7 + 3 + (i >> 8)); }

inline const std::string& sample_name_value() {
  static const std::string s("h\xc3\xa9llo\0world", 12);  // UTF-8 and an embedded NUL
  return s;
}
inline const std::vector<std::string>& sample_tokens() {
  static const std::vector<std::string> t = {"a", "", "<|im_end|>", "\xe6\x97\xa5\xe6\x9c\xac"};
  return t;
}

// Metadata (after general.alignment, which the writer adds itself when alignment != 32).
inline void add_sample_metadata(GgufWriter& w) {
  w.add_string("general.architecture", "sample");
  w.add_u8("sample.u8", 200);
  w.add_i8("sample.i8", -100);
  w.add_u16("sample.u16", 60000);
  w.add_i16("sample.i16", -30000);
  w.add_u32("sample.u32", 4000000000u);
  w.add_i32("sample.i32", -2000000000);
  w.add_u64("sample.u64", 0xFEDCBA9876543210ull);
  w.add_i64("sample.i64", -0x123456789ABCDEFll);
  w.add_f32("sample.f32", 3.25f);
  w.add_f64("sample.f64", -1e300);
  w.add_bool("sample.bool", true);
  w.add_string("sample.name", sample_name_value());
  w.add_array_string("sample.tokens", sample_tokens());
  w.add_array_f32("sample.scores", {0.5f, -1.25f, 1e-3f});
  w.add_array_i32("sample.types", {1, 3, -7});
  w.add_array_bool("sample.flags", {true, false, true});
  w.add_array("sample.nested",
              GgufWriter::array(std::vector<GgufWriter::Array>{
                  GgufWriter::array(std::vector<int32_t>{1, 2}),
                  GgufWriter::array(std::vector<std::string>{"x"}),
                  GgufWriter::array(std::vector<GgufWriter::Array>{GgufWriter::array(std::vector<uint8_t>{9})}),
              }));
  w.add_array("sample.empty", GgufWriter::array(std::vector<uint64_t>{}));
}

inline GgufWriter sample_writer(uint64_t alignment) {
  GgufWriter w(alignment);
  add_sample_metadata(w);
  const auto& ts = sample_tensors();
  for (size_t ti = 0; ti < ts.size(); ti++) {
    const size_t row_bytes = row_size(ts[ti].type, ts[ti].ne[0]);
    w.add_tensor(ts[ti].name, ts[ti].type, ts[ti].ne, [ti, row_bytes](uint8_t* dst, int64_t first, int64_t n) {
      for (size_t j = 0; j < (size_t)n * row_bytes; j++) dst[j] = sample_byte(ti, (size_t)first * row_bytes + j);
    });
  }
  return w;
}

// The same file, field by field from the GGUF spec.
inline RawGguf raw_sample(uint64_t alignment) {
  RawGguf r;
  const auto& ts = sample_tensors();
  const bool has_alignment_key = alignment != 32;
  r.header(3, ts.size(), 19 + (has_alignment_key ? 1 : 0));
  int kv = 0;
  auto key = [&](const std::string& k, GgufValueType type) {
    const std::string p = "kv[" + std::to_string(kv++) + "]";
    r.str(p + ".key", k);
    r.u32(p + ".type", (uint32_t)type);
    return p;
  };
  auto scalar = [&](const std::string& k, GgufValueType type, const void* v, size_t n) {
    const std::string p = key(k, type);
    r.fields.push_back({p + ".value", r.bytes.size(), n});
    r.raw(v, n);
  };
  if (has_alignment_key) {
    uint32_t a = (uint32_t)alignment;
    scalar("general.alignment", GgufValueType::UINT32, &a, 4);
  }
  r.str(key("general.architecture", GgufValueType::STRING) + ".str", "sample");
  uint8_t u8 = 200; scalar("sample.u8", GgufValueType::UINT8, &u8, 1);
  int8_t i8 = -100; scalar("sample.i8", GgufValueType::INT8, &i8, 1);
  uint16_t u16 = 60000; scalar("sample.u16", GgufValueType::UINT16, &u16, 2);
  int16_t i16 = -30000; scalar("sample.i16", GgufValueType::INT16, &i16, 2);
  uint32_t u32 = 4000000000u; scalar("sample.u32", GgufValueType::UINT32, &u32, 4);
  int32_t i32 = -2000000000; scalar("sample.i32", GgufValueType::INT32, &i32, 4);
  uint64_t u64 = 0xFEDCBA9876543210ull; scalar("sample.u64", GgufValueType::UINT64, &u64, 8);
  int64_t i64 = -0x123456789ABCDEFll; scalar("sample.i64", GgufValueType::INT64, &i64, 8);
  float f32 = 3.25f; scalar("sample.f32", GgufValueType::FLOAT32, &f32, 4);
  double f64 = -1e300; scalar("sample.f64", GgufValueType::FLOAT64, &f64, 8);
  uint8_t b = 1; scalar("sample.bool", GgufValueType::BOOL, &b, 1);
  r.str(key("sample.name", GgufValueType::STRING) + ".str", sample_name_value());
  {
    const std::string p = key("sample.tokens", GgufValueType::ARRAY);
    r.u32(p + ".elem_type", (uint32_t)GgufValueType::STRING);
    r.u64(p + ".count", sample_tokens().size());
    for (size_t i = 0; i < sample_tokens().size(); i++) r.str(p + ".item[" + std::to_string(i) + "]", sample_tokens()[i]);
  }
  {
    const std::string p = key("sample.scores", GgufValueType::ARRAY);
    r.u32(p + ".elem_type", (uint32_t)GgufValueType::FLOAT32);
    r.u64(p + ".count", 3);
    const float v[] = {0.5f, -1.25f, 1e-3f};
    r.raw(v, sizeof(v));
  }
  {
    const std::string p = key("sample.types", GgufValueType::ARRAY);
    r.u32(p + ".elem_type", (uint32_t)GgufValueType::INT32);
    r.u64(p + ".count", 3);
    const int32_t v[] = {1, 3, -7};
    r.raw(v, sizeof(v));
  }
  {
    const std::string p = key("sample.flags", GgufValueType::ARRAY);
    r.u32(p + ".elem_type", (uint32_t)GgufValueType::BOOL);
    r.u64(p + ".count", 3);
    r.u8(p + ".item[0]", 1);
    r.u8(p + ".item[1]", 0);
    r.u8(p + ".item[2]", 1);
  }
  {
    const std::string p = key("sample.nested", GgufValueType::ARRAY);
    r.u32(p + ".elem_type", (uint32_t)GgufValueType::ARRAY);
    r.u64(p + ".count", 3);
    r.u32(p + ".item[0].elem_type", (uint32_t)GgufValueType::INT32);
    r.u64(p + ".item[0].count", 2);
    const int32_t v[] = {1, 2};
    r.raw(v, sizeof(v));
    r.u32(p + ".item[1].elem_type", (uint32_t)GgufValueType::STRING);
    r.u64(p + ".item[1].count", 1);
    r.str(p + ".item[1].item[0]", "x");
    r.u32(p + ".item[2].elem_type", (uint32_t)GgufValueType::ARRAY);
    r.u64(p + ".item[2].count", 1);
    r.u32(p + ".item[2].item[0].elem_type", (uint32_t)GgufValueType::UINT8);
    r.u64(p + ".item[2].item[0].count", 1);
    r.u8(p + ".item[2].item[0].item[0]", 9);
  }
  {
    const std::string p = key("sample.empty", GgufValueType::ARRAY);
    r.u32(p + ".elem_type", (uint32_t)GgufValueType::UINT64);
    r.u64(p + ".count", 0);
  }
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (size_t ti = 0; ti < ts.size(); ti++) {
    std::vector<uint64_t> ne(ts[ti].ne.begin(), ts[ti].ne.end());
    r.tensor_info((int)ti, ts[ti].name, ne, (uint32_t)ts[ti].type, offset);
    offsets.push_back(offset);
    offset = (offset + sample_nbytes(ts[ti]) + alignment - 1) / alignment * alignment;
  }
  r.pad(alignment);
  const size_t data_start = r.bytes.size();
  for (size_t ti = 0; ti < ts.size(); ti++) {
    r.bytes.resize(data_start + offsets[ti], 0);
    for (size_t i = 0; i < sample_nbytes(ts[ti]); i++) r.bytes.push_back(sample_byte(ti, i));
  }
  r.bytes.resize(data_start + offset, 0);
  return r;
}

// Checks that `f` holds exactly the sample's metadata and tensors.
inline void expect_sample_contents(const GgufFile& f, uint64_t alignment) {
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), alignment);
  EXPECT_EQ(f.data_offset() % alignment, 0u);
  const auto& kv = f.metadata();
  const size_t first = alignment != 32 ? 1 : 0;
  ASSERT_EQ(kv.size(), 19 + first);
  if (first) {
    EXPECT_EQ(kv[0].key, "general.alignment");
    EXPECT_EQ(kv[0].value.type(), GgufValueType::UINT32);
    EXPECT_EQ(kv[0].value.as_uint(), alignment);
  }
  const std::vector<std::string> keys = {
      "general.architecture", "sample.u8", "sample.i8", "sample.u16", "sample.i16",
      "sample.u32", "sample.i32", "sample.u64", "sample.i64", "sample.f32",
      "sample.f64", "sample.bool", "sample.name", "sample.tokens", "sample.scores",
      "sample.types", "sample.flags", "sample.nested", "sample.empty"};
  for (size_t i = 0; i < keys.size(); i++) EXPECT_EQ(kv[first + i].key, keys[i]) << "insertion order";

  EXPECT_EQ(f.get("general.architecture").as_string(), "sample");
  EXPECT_EQ(f.get("sample.u8").type(), GgufValueType::UINT8);
  EXPECT_EQ(f.get("sample.u8").as_uint(), 200u);
  EXPECT_EQ(f.get("sample.i8").type(), GgufValueType::INT8);
  EXPECT_EQ(f.get("sample.i8").as_int(), -100);
  EXPECT_EQ(f.get("sample.u16").type(), GgufValueType::UINT16);
  EXPECT_EQ(f.get("sample.u16").as_uint(), 60000u);
  EXPECT_EQ(f.get("sample.i16").type(), GgufValueType::INT16);
  EXPECT_EQ(f.get("sample.i16").as_int(), -30000);
  EXPECT_EQ(f.get("sample.u32").type(), GgufValueType::UINT32);
  EXPECT_EQ(f.get("sample.u32").as_uint(), 4000000000u);
  EXPECT_EQ(f.get("sample.i32").type(), GgufValueType::INT32);
  EXPECT_EQ(f.get("sample.i32").as_int(), -2000000000);
  EXPECT_EQ(f.get("sample.u64").type(), GgufValueType::UINT64);
  EXPECT_EQ(f.get("sample.u64").as_uint(), 0xFEDCBA9876543210ull);
  EXPECT_EQ(f.get("sample.i64").type(), GgufValueType::INT64);
  EXPECT_EQ(f.get("sample.i64").as_int(), -0x123456789ABCDEFll);
  EXPECT_EQ(f.get("sample.f32").type(), GgufValueType::FLOAT32);
  EXPECT_EQ(f.get("sample.f32").as_float(), 3.25);
  EXPECT_EQ(f.get("sample.f64").type(), GgufValueType::FLOAT64);
  EXPECT_EQ(f.get("sample.f64").as_float(), -1e300);
  EXPECT_EQ(f.get("sample.bool").type(), GgufValueType::BOOL);
  EXPECT_TRUE(f.get("sample.bool").as_bool());
  EXPECT_EQ(f.get("sample.name").as_string(), sample_name_value());

  const GgufValue& tokens = f.get("sample.tokens");
  ASSERT_TRUE(tokens.is_array());
  ASSERT_EQ(tokens.elem_type(), GgufValueType::STRING);
  ASSERT_EQ(tokens.size(), sample_tokens().size());
  for (size_t i = 0; i < tokens.size(); i++) EXPECT_EQ(tokens.str_at(i), sample_tokens()[i]);

  const GgufValue& scores = f.get("sample.scores");
  ASSERT_EQ(scores.elem_type(), GgufValueType::FLOAT32);
  ASSERT_EQ(scores.size(), 3u);
  EXPECT_EQ(scores.float_at(0), 0.5);
  EXPECT_EQ(scores.float_at(1), -1.25);
  EXPECT_EQ((float)scores.float_at(2), 1e-3f);

  const GgufValue& types = f.get("sample.types");
  ASSERT_EQ(types.elem_type(), GgufValueType::INT32);
  ASSERT_EQ(types.size(), 3u);
  EXPECT_EQ(types.int_at(0), 1);
  EXPECT_EQ(types.int_at(1), 3);
  EXPECT_EQ(types.int_at(2), -7);

  const GgufValue& flags = f.get("sample.flags");
  ASSERT_EQ(flags.elem_type(), GgufValueType::BOOL);
  ASSERT_EQ(flags.size(), 3u);
  EXPECT_EQ(flags.int_at(0), 1);
  EXPECT_EQ(flags.int_at(1), 0);
  EXPECT_EQ(flags.int_at(2), 1);

  const GgufValue& nested = f.get("sample.nested");
  ASSERT_EQ(nested.elem_type(), GgufValueType::ARRAY);
  ASSERT_EQ(nested.size(), 3u);
  ASSERT_EQ(nested.array_at(0).elem_type(), GgufValueType::INT32);
  ASSERT_EQ(nested.array_at(0).size(), 2u);
  EXPECT_EQ(nested.array_at(0).int_at(0), 1);
  EXPECT_EQ(nested.array_at(0).int_at(1), 2);
  ASSERT_EQ(nested.array_at(1).elem_type(), GgufValueType::STRING);
  ASSERT_EQ(nested.array_at(1).size(), 1u);
  EXPECT_EQ(nested.array_at(1).str_at(0), "x");
  ASSERT_EQ(nested.array_at(2).elem_type(), GgufValueType::ARRAY);
  ASSERT_EQ(nested.array_at(2).size(), 1u);
  ASSERT_EQ(nested.array_at(2).array_at(0).elem_type(), GgufValueType::UINT8);
  ASSERT_EQ(nested.array_at(2).array_at(0).size(), 1u);
  EXPECT_EQ(nested.array_at(2).array_at(0).int_at(0), 9);

  const GgufValue& empty = f.get("sample.empty");
  EXPECT_EQ(empty.elem_type(), GgufValueType::UINT64);
  EXPECT_EQ(empty.size(), 0u);

  const auto& ts = sample_tensors();
  ASSERT_EQ(f.tensors().size(), ts.size());
  uint64_t expected_offset = 0;
  for (size_t ti = 0; ti < ts.size(); ti++) {
    const GgufTensorInfo& t = f.tensors()[ti];
    SCOPED_TRACE(ts[ti].name);
    EXPECT_EQ(t.name, ts[ti].name);
    EXPECT_EQ(t.type, ts[ti].type);
    ASSERT_EQ(t.n_dims, ts[ti].ne.size());
    for (size_t d = 0; d < 4; d++) EXPECT_EQ(t.ne[d], d < ts[ti].ne.size() ? ts[ti].ne[d] : 1);
    // llama.cpp requires each offset to be the padded end of the previous tensor.
    EXPECT_EQ(t.offset, expected_offset);
    const size_t nbytes = sample_nbytes(ts[ti]);
    ASSERT_EQ(t.nbytes, nbytes);
    expected_offset = (t.offset + nbytes + alignment - 1) / alignment * alignment;
    for (size_t i = 0; i < nbytes; i++)
      if (t.data[i] != sample_byte(ti, i)) {
        ADD_FAILURE() << "byte " << i << " differs";
        break;
      }
  }
  EXPECT_EQ(f.file_size(), f.data_offset() + expected_offset);
}

}  // namespace rl::test
