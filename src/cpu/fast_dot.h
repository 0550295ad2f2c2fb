// The fast tier's dot products: weight rows (in their ggml block format, read in place from the
// mapping) against a token's activations, accumulated in fp32. The tuned types (those of the
// project's files: Q4_K, Q5_K, Q6_K, Q8_0, IQ2_XXS, IQ2_XS, IQ1_M) take 8-bit activations
// (cpu/activation_quant.h) and form integer dot products with AVX2; F32 and F16 rows dot fp32
// activations; every other type is dequantised and dotted in fp32 (fast_products.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <immintrin.h>

#include "quant/quant.h"

namespace rl::cpu {

// Weights of the tuned types are read in one common integer form: per 32 values a 32-byte vector
// of int8 and small integer scales per 16 values, dotted with the 8-bit activations by one AVX2
// kernel (cpu/fast_kernel.h). Each type's cost is then its decoder.
//   w[i] = d[i / 32] * scale(i / 16) * q[i] - dmin * min[i / 32]
// A decode step decodes each block into registers and dots it at once (DotRowFn); a prefill
// decodes a tile of rows once to DecodedBlocks and dots them with every token (DecodeBlockFn,
// DotDecodedFn).

// The scales of one block of 256 values (a decoder's header), in registers.
struct BlockHeader {
  __m256 d;       // per 32 values
  __m256i scale;  // 16 int16 per 16 values: lane 0 those of values 32i..32i+15, lane 1 of 32i+16..32i+31
  __m256i min;    // 16 int16: per 32 values, each twice (min[2i] = min[2i + 1]); only where dmin != 0
  float dmin;     // 0: no min term (every type but Q4_K and Q5_K)
};

// A block decoded to memory. The scales are stored as the kernel multiplies by them: per 32
// values one vector of 16 int16, eight copies of the first 16 values' scale, then eight of the
// second's.
struct DecodedBlock {
  int8_t q[256];
  int16_t scale[8][16];
  float d[8];
  int16_t min[16];  // as BlockHeader::min
  float dmin;
};

// Decodes values [256 b, 256 b + 256) of a weight row.
using DecodeBlockFn = void (*)(const uint8_t* row, int64_t b, DecodedBlock* out);

// One packed row [n_blocks * 256 values] against the activations [n_blocks] of n_tokens tokens
// (1 to kDotTokens): out[t], fp32.
struct ActivationQ8K;
using DotRowFn = void (*)(const uint8_t* row, const ActivationQ8K* const* a, int n_tokens, int64_t n_blocks,
                          float* out);

// The decoded blocks of one row [n / 256] against the activations [n / 256] of n_tokens tokens
// (1 to kDotTokens: a prefill reuses each loaded weight vector for four tokens): out[t], fp32.
using DotDecodedFn = void (*)(const DecodedBlock* w, const ActivationQ8K* const* a, int n_tokens, int64_t n_blocks,
                              float* out);
constexpr int kDotTokens = 4;

struct FastKernels {
  DecodeBlockFn decode;
  DotRowFn dot_row;
  DotDecodedFn dot_decoded;
};

// nullptr: the type has no integer kernels; its rows are dequantised to fp32 (the reference
// dequantiser) and dotted with fp32 activations. F32 rows are read in place, F16 converted on the fly.
const FastKernels* fast_kernels(GgmlType type);

// sum a[i] * b[i] in fp32 (8 lanes, 4 accumulators).
float fast_dot_f32(const float* a, const float* b, int64_t n);
// An F16 row against fp32 values.
float fast_dot_f16(const uint16_t* row, const float* x, int64_t n);

// The kernels of the tuned types (fast_dot_k.cpp, fast_dot_iq.cpp, fast_dot_basic.cpp).
extern const FastKernels kQ8_0Kernels, kQ4_KKernels, kQ5_KKernels, kQ6_KKernels, kIQ2_XXSKernels, kIQ2_XSKernels,
    kIQ1_MKernels;

}  // namespace rl::cpu
