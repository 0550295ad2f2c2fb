// GGUF v2/v3 reader: memory-mapped, validated before use. Every value and tensor view points
// into the mapping; a GgufFile must outlive everything read from it.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "quant/quant.h"

namespace rl {

class MappedFile;

enum class GgufValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* gguf_value_type_name(GgufValueType t);
// Encoded bytes of one value of a scalar type; 0 for STRING, ARRAY and unknown types.
size_t gguf_value_size(GgufValueType t);

// One metadata value. Scalars are stored widened; arrays of scalars keep a pointer to their raw
// little-endian elements in the mapping; arrays of strings and nested arrays hold items.
class GgufValue {
 public:
  GgufValueType type() const { return type_; }
  bool is_array() const { return type_ == GgufValueType::ARRAY; }
  bool is_integer() const;  // any integer scalar type (not bool)
  bool is_float() const { return type_ == GgufValueType::FLOAT32 || type_ == GgufValueType::FLOAT64; }

  // Scalar accessors; throw rl::Error when the value has an incompatible type. Integers convert
  // between signed and unsigned only when the value fits.
  uint64_t as_uint() const;
  int64_t as_int() const;
  double as_float() const;  // integers are accepted too
  bool as_bool() const;
  std::string_view as_string() const;

  // Arrays.
  GgufValueType elem_type() const { return elem_type_; }
  size_t size() const { return count_; }
  int64_t int_at(size_t i) const;     // integer (or bool) elements
  double float_at(size_t i) const;    // float or integer elements
  std::string_view str_at(size_t i) const;  // string elements
  const GgufValue& array_at(size_t i) const;  // nested array elements
  // Raw element bytes of a scalar array (little-endian, element size per elem_type()).
  const uint8_t* raw_data() const { return raw_; }

  // A short human rendering: scalars in full, arrays as "[a, b, c, ... N items]".
  std::string to_string(size_t max_items = 8) const;

 private:
  friend class GgufParser;
  GgufValueType type_ = GgufValueType::UINT8;
  GgufValueType elem_type_ = GgufValueType::UINT8;
  uint64_t u_ = 0;
  int64_t i_ = 0;
  double f_ = 0;
  std::string_view str_;
  size_t count_ = 0;
  const uint8_t* raw_ = nullptr;
  std::vector<std::string_view> strings_;
  std::vector<GgufValue> items_;
};

struct GgufKV {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  std::array<int64_t, 4> ne{1, 1, 1, 1};  // ne[0] = row length (fastest)
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;  // relative to the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  size_t row_bytes() const { return nbytes / (size_t)n_rows(); }
  std::string shape_string() const;  // "2048 x 512 x 512"
};

class GgufFile {
 public:
  // Maps and validates the file. Throws rl::Error naming the path and the offset, key or tensor.
  // A split model (llama.cpp gguf-split: NAME-00001-of-0000N.gguf, keys split.no, split.count,
  // split.tensors.count) is opened from its first shard: every shard is mapped and validated
  // (a missing or mismatched shard is named), and tensors() lists the tensors of all shards,
  // each viewing its own shard's mapping. Metadata comes from the first shard.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Validates an in-memory image (no copy; the bytes must outlive the result). For tests and fuzzing.
  static std::unique_ptr<GgufFile> from_bytes(std::span<const uint8_t> bytes, std::string name = "<memory>");
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return bytes_.size(); }
  const uint8_t* base() const { return bytes_.data(); }  // of this (the first) file

  // Every mapped file the tensors view: this one, then the other shards of a split model.
  struct Mapping {
    std::string path;
    const uint8_t* base = nullptr;
    uint64_t size = 0;
  };
  std::vector<Mapping> mappings() const;
  // Throws rl::Error naming the file when one of the mapped files was truncated while mapped
  // (MappedFile::check_intact).
  void check_intact() const;

  const std::vector<GgufKV>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  // Throw rl::Error "PATH: missing metadata key KEY" / wrong type.
  const GgufValue& get(std::string_view key) const;
  uint64_t get_uint(std::string_view key) const { return get(key).as_uint(); }
  uint64_t get_uint(std::string_view key, uint64_t def) const;
  double get_float(std::string_view key) const { return get(key).as_float(); }
  double get_float(std::string_view key, double def) const;
  std::string get_string(std::string_view key) const { return std::string(get(key).as_string()); }
  std::string get_string(std::string_view key, std::string_view def) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  // Throws "PATH: missing tensor NAME".
  const GgufTensorInfo& tensor(std::string_view name) const;

 private:
  friend class GgufParser;
  GgufFile() = default;
  static std::unique_ptr<GgufFile> open_one(const std::string& path);
  void open_split_shards();  // gguf_split.cpp
  void build_tensor_index();
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKV> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::vector<std::pair<std::string_view, size_t>> kv_index_;      // sorted by key
  std::vector<std::pair<std::string_view, size_t>> tensor_index_;  // sorted by name
  std::vector<std::unique_ptr<GgufFile>> shards_;  // split model: shards 2..N
};

}  // namespace rl
