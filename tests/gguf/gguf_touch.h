// Reads everything a parsed GgufFile exposes (every value, array item and tensor byte) and checks
// the reader's promises about tensor placement. Used on corrupted inputs that still parsed, so a
// reader that accepted something it should not have is caught here (or by AddressSanitizer).
#pragma once
#include <cstdint>
#include <string>

#include "gguf/gguf.h"

namespace rl::test {

inline volatile uint64_t touch_sink;  // keeps the reads from being optimised away

inline uint64_t touch_value(const GgufValue& v, int depth = 0) {
  uint64_t h = (uint64_t)v.type() + v.to_string(3).size();
  if (!v.is_array()) return h;
  for (size_t i = 0; i < v.size(); i++) {
    switch (v.elem_type()) {
      case GgufValueType::STRING: h += v.str_at(i).size(); break;
      case GgufValueType::ARRAY: h += touch_value(v.array_at(i), depth + 1); break;
      case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: h += (uint64_t)(v.float_at(i) != 0); break;
      default: h += (uint64_t)v.int_at(i); break;
    }
  }
  return h;
}

// Returns an empty string when every promise holds, else what was broken. Reading every tensor
// byte can be skipped for large files (their placement is still checked).
inline std::string touch_everything(const GgufFile& f, bool read_tensor_bytes = true) {
  uint64_t h = 0;
  for (const auto& kv : f.metadata()) {
    h += touch_value(kv.value);
    if (f.find(kv.key) != &kv.value) return "find() does not return the entry for key " + kv.key;
  }
  if (f.alignment() == 0 || (f.alignment() & (f.alignment() - 1)) != 0) return "alignment not a power of two";
  for (const auto& t : f.tensors()) {
    h += t.shape_string().size() + (uint64_t)t.n_elements();
    if (t.n_dims < 1 || t.n_dims > 4) return "tensor " + t.name + ": bad n_dims";
    for (int d = 0; d < 4; d++)
      if (t.ne[d] < 1) return "tensor " + t.name + ": empty dimension";
    const QuantType* qt = find_quant_type((uint32_t)t.type);
    if (!qt) return "tensor " + t.name + ": unknown type accepted";
    if (t.ne[0] % qt->block_size != 0) return "tensor " + t.name + ": partial block accepted";
    if (t.nbytes != row_size(t.type, t.ne[0]) * (uint64_t)t.n_rows()) return "tensor " + t.name + ": nbytes";
    if (t.row_bytes() * (uint64_t)t.n_rows() != t.nbytes) return "tensor " + t.name + ": row_bytes";
    if (t.offset % f.alignment() != 0) return "tensor " + t.name + ": misaligned offset accepted";
    if (t.data != f.base() + f.data_offset() + t.offset) return "tensor " + t.name + ": data pointer";
    if (f.data_offset() + t.offset + t.nbytes > f.file_size()) return "tensor " + t.name + ": data past the end";
    if (read_tensor_bytes)
      for (uint64_t i = 0; i < t.nbytes; i++) h += t.data[i];
    if (f.find_tensor(t.name) != &t) return "find_tensor() does not return tensor " + t.name;
  }
  touch_sink = h;
  return "";
}

}  // namespace rl::test
