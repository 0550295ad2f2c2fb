// ggml tensor types: one table entry per type (name, block size, bytes per block, and the
// reference fp32 dequantisation and dot product). Adding a type is one entry in quant.cpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace rl {

// Numeric ids are ggml's (they are stored in GGUF tensor infos).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

// Dequantise n values (n a multiple of block_size) from src into dst.
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
// Dot product of n quantised values with an fp32 vector, accumulated in fp32: dequantise block by
// block, multiply-add into 16 partial sums (index mod 16), add those pairwise (quant/block_dot.h).
using DotRowFn = float (*)(const void* src, const float* x, int64_t n);

struct QuantType {
  GgmlType type;
  const char* name;        // ggml's name: "f32", "q4_K", "iq2_xxs", ...
  int64_t block_size;      // values per block
  size_t type_size;        // bytes per block
  DequantizeRowFn dequantize_row;  // nullptr: storage type without a float view (I8..I64)
  DotRowFn dot_row;
};

// nullptr for ids that are not ggml types this build knows.
const QuantType* find_quant_type(uint32_t raw_type);
// Throws rl::Error for unknown types.
const QuantType& quant_type(GgmlType type);
const char* type_name(GgmlType type);
// Parses a ggml type name, case-insensitive ("Q4_K", "iq2_xxs"); nullptr when unknown.
const QuantType* find_quant_type_by_name(std::string_view name);

// Bytes of a row of n values; n must be a multiple of the block size (throws otherwise).
size_t row_size(GgmlType type, int64_t n);

// Convenience wrappers over the table (throw rl::Error on types without a float view).
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);
float dot_row(GgmlType type, const void* src, const float* x, int64_t n);

}  // namespace rl
