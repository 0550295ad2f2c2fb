// One attention layer's keys or values of one sequence, stored in the session's KV type
// (model/kv_type.h) and read back in fp32: the oracle's attention runs on the values the cache
// holds, so an f16, bf16 or q8_0 cache changes only what is stored.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/kv_type.h"

namespace rl::cpu {

// Rows [position][width] of one type. q8_0 rows are ggml's blocks (an fp16 scale, then 32 int8
// values), so width must be a multiple of 32 (check_kv_type); the other types are plain arrays.
class KvRows {
 public:
  KvRows() = default;
  KvRows(KvType type, int width);

  KvType type() const { return type_; }
  size_t rows() const { return row_bytes_ ? data_.size() / row_bytes_ : 0; }
  size_t bytes() const { return data_.size(); }
  size_t held_bytes() const { return data_.capacity(); }  // what the rows' memory takes, reserved room included
  // Room for n rows without reallocating (std::bad_alloc when the memory is not there).
  void reserve(size_t n) { data_.reserve(n * row_bytes_); }
  // Rows [pos, pos + n) from src [n][width], each value rounded to the type (q8_0: quantised per
  // block as ggml's quantize_row_q8_0_ref); the cache then holds pos + n rows.
  void write(size_t pos, const float* src, size_t n);
  // Rows [src_row, src_row + n) of src (of this type and width) copied as stored into rows
  // [dst_row, dst_row + n); the cache then holds dst_row + n rows, as after write().
  void copy_rows(const KvRows& src, size_t src_row, size_t dst_row, size_t n);
  // Values [off, off + count) of row pos in fp32: the stored floats themselves (f32), else decoded
  // into scratch [count]. q8_0: off and count multiples of 32.
  const float* read(size_t pos, int off, int count, float* scratch) const;

 private:
  KvType type_ = KvType::kF32;
  int width_ = 0;
  size_t row_bytes_ = 0;
  std::vector<uint8_t> data_;  // [rows][row_bytes_]
};

// ggml's q8_0 of one block of 32 values: d = max|x| / 127 (stored as fp16), q = round(x / d).
void quantize_kv_block_q8_0(const float* x, uint16_t* d, int8_t* qs);

}  // namespace rl::cpu
