// Writes a split GGUF model in llama.cpp's gguf-split layout from an opened file, with the
// project's GGUF writer: NAME-0000i-of-0000N.gguf, the first shard carrying all metadata, every
// shard split.no / split.count / split.tensors.count and a contiguous run of the tensors.
#pragma once
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

namespace rl::test {

inline std::string shard_path(const std::string& prefix, int i, int n) {
  return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, i + 1, n);
}

// Shard i of n; `split_no` >= 0 writes that split.no instead (a foreign shard for error tests).
inline void write_shard(const GgufFile& src, const std::string& prefix, int i, int n, int split_no = -1) {
  GgufWriter w(src.alignment());
  if (i == 0)
    for (const GgufKV& kv : src.metadata()) w.add_value(kv.key, kv.value);
  w.add_u16("split.no", (uint16_t)(split_no >= 0 ? split_no : i));
  w.add_u16("split.count", (uint16_t)n);
  w.add_i32("split.tensors.count", (int32_t)src.tensors().size());
  const size_t total = src.tensors().size(), begin = total * i / n, end = total * (i + 1) / n;
  for (size_t k = begin; k < end; ++k) {
    const GgufTensorInfo& t = src.tensors()[k];
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    w.add_tensor_bytes(t.name, t.type, ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  }
  w.write(shard_path(prefix, i, n));
}

inline void write_split(const GgufFile& src, const std::string& prefix, int n) {
  for (int i = 0; i < n; ++i) write_shard(src, prefix, i, n);
}

}  // namespace rl::test
