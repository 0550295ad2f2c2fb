// GGUF v3 writer: metadata, tensor infos and aligned tensor data, streamed to disk so that a
// model larger than memory can be written. Files it writes load in this reader and in llama.cpp.
#pragma once
#include <bit>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "gguf/gguf.h"

namespace rl {

class GgufWriter {
 public:
  explicit GgufWriter(uint64_t alignment = 32);

  // Metadata, kept in insertion order. Adding a key twice throws.
  void add_u8(const std::string& key, uint8_t v);
  void add_i8(const std::string& key, int8_t v);
  void add_u16(const std::string& key, uint16_t v);
  void add_i16(const std::string& key, int16_t v);
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_u64(const std::string& key, uint64_t v);
  void add_i64(const std::string& key, int64_t v);
  void add_f32(const std::string& key, float v);
  void add_f64(const std::string& key, double v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_array_i32(const std::string& key, const std::vector<int32_t>& v);
  void add_array_u32(const std::string& key, const std::vector<uint32_t>& v);
  void add_array_f32(const std::string& key, const std::vector<float>& v);
  void add_array_bool(const std::string& key, const std::vector<bool>& v);
  void add_array_string(const std::string& key, const std::vector<std::string>& v);
  // Copies a value read from another file (any type, nested arrays included).
  void add_value(const std::string& key, const GgufValue& v);

  // An encoded array value of any element type, nested arrays included: build one with array(),
  // then add it with add_array() or nest it in another array().
  struct Array {
    GgufValueType elem_type = GgufValueType::UINT8;
    uint64_t count = 0;
    std::vector<uint8_t> payload;  // the elements as GGUF encodes them, back to back
  };
  template <class T>
  static Array array(const std::vector<T>& v) {
    static_assert(std::endian::native == std::endian::little, "GGUF is little-endian");
    if constexpr (std::is_same_v<T, bool>) {
      std::vector<uint8_t> bytes(v.begin(), v.end());
      return scalar_array(GgufValueType::BOOL, bytes.size(), bytes.data(), 1);
    } else if constexpr (std::is_same_v<T, std::string>) {
      return string_array(v);
    } else if constexpr (std::is_same_v<T, Array>) {
      return nested_array(v);
    } else {
      return scalar_array(scalar_type_of<T>(), v.size(), v.data(), sizeof(T));
    }
  }
  void add_array(const std::string& key, const Array& a);

  // Tensors, in file order. The data is produced at write time by `fill`, which must write exactly
  // row_size(type, ne[0]) * rows bytes into `dst` (called once per tensor, possibly in chunks of
  // whole rows: fill(dst, first_row, n_rows)).
  using FillFn = std::function<void(uint8_t* dst, int64_t first_row, int64_t n_rows)>;
  void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne, FillFn fill);
  // A tensor whose bytes are given now (copied).
  void add_tensor_bytes(const std::string& name, GgmlType type, std::vector<int64_t> ne,
                        std::vector<uint8_t> bytes);

  // Writes PATH.tmp, then renames it to PATH; on any failure the partial file is removed and an
  // rl::Error names the path and the cause (disk full, unwritable directory, ...).
  // `chunk_bytes` bounds the buffer handed to one fill call (at least one row is always passed).
  void write(const std::string& path, size_t chunk_bytes = 64u << 20) const;

  // Byte size of the file write() would produce.
  uint64_t file_size() const;

  uint64_t alignment() const { return alignment_; }

 private:
  template <class T>
  static constexpr GgufValueType scalar_type_of() {
    if constexpr (std::is_same_v<T, uint8_t>) return GgufValueType::UINT8;
    else if constexpr (std::is_same_v<T, int8_t>) return GgufValueType::INT8;
    else if constexpr (std::is_same_v<T, uint16_t>) return GgufValueType::UINT16;
    else if constexpr (std::is_same_v<T, int16_t>) return GgufValueType::INT16;
    else if constexpr (std::is_same_v<T, uint32_t>) return GgufValueType::UINT32;
    else if constexpr (std::is_same_v<T, int32_t>) return GgufValueType::INT32;
    else if constexpr (std::is_same_v<T, uint64_t>) return GgufValueType::UINT64;
    else if constexpr (std::is_same_v<T, int64_t>) return GgufValueType::INT64;
    else if constexpr (std::is_same_v<T, float>) return GgufValueType::FLOAT32;
    else if constexpr (std::is_same_v<T, double>) return GgufValueType::FLOAT64;
    else static_assert(sizeof(T) == 0, "no GGUF element type for this C++ type");
  }
  static Array scalar_array(GgufValueType elem_type, size_t count, const void* le_bytes,
                            size_t elem_size);
  static Array string_array(const std::vector<std::string>& v);
  static Array nested_array(const std::vector<Array>& v);

  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    FillFn fill;
    uint64_t nbytes;
    uint64_t offset;
  };
  void add_kv(const std::string& key, std::vector<uint8_t> encoded);
  uint64_t alignment_;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> kv_;  // key, encoded (type + value)
  std::vector<Tensor> tensors_;
  uint64_t data_size_ = 0;
};

}  // namespace rl
