// The element type of a session's KV cache (--kv-type). Every backend stores keys and values in
// it and computes attention in fp32 (or double) on the values read back: f32 keeps them as they
// are (the exact tier's only type), f16 and bf16 round each value to nearest even, q8_0 keeps
// blocks of 32 values of one row as 8-bit integers with one fp16 scale, as ggml's Q8_0
// (d = max|x| / 127, q = round(x / d)).
#pragma once
#include <cstddef>
#include <optional>
#include <string_view>

#include "model/numerics.h"

namespace rl {

enum class KvType { kF32, kF16, kBF16, kQ8_0 };

// Values per q8_0 block: a row of the cache (one token's KV heads) holds whole blocks.
constexpr int kKvQ8Block = 32;

inline const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::kF32: return "f32";
    case KvType::kF16: return "f16";
    case KvType::kBF16: return "bf16";
    case KvType::kQ8_0: return "q8_0";
  }
  return "?";
}

inline std::optional<KvType> parse_kv_type(std::string_view s) {
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kBF16, KvType::kQ8_0})
    if (s == kv_type_name(t)) return t;
  return std::nullopt;
}

// Bytes of n values (n a multiple of kKvQ8Block for q8_0: 32 one-byte values and a 2-byte scale).
inline size_t kv_bytes(KvType t, size_t n) {
  switch (t) {
    case KvType::kF32: return 4 * n;
    case KvType::kF16: case KvType::kBF16: return 2 * n;
    case KvType::kQ8_0: return n + 2 * (n / kKvQ8Block);
  }
  return 0;
}

// The type a tier takes when --kv-type is not given. The fast tier's f16: its chunk attention
// rounds keys and values to fp16 for the tensor cores already, and llama.cpp's native path, its
// accuracy bar, keeps an f16 cache (docs/cuda.md "KV cache types").
inline KvType default_kv_type(Numerics n) { return n == Numerics::kExact ? KvType::kF32 : KvType::kF16; }

// Throws rl::Error, naming --kv-type and --numerics, unless the tier takes this KV type (exact:
// f32 only).
void check_kv_tier(Numerics numerics, KvType kv);
// check_kv_tier, and a head of `head_dim` values holds whole q8_0 blocks.
void check_kv_type(Numerics numerics, KvType kv, int head_dim);

}  // namespace rl
