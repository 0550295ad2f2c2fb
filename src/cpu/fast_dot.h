// The fast tier's dot products: one weight row of n values (in its ggml block format, read in
// place from the mapping) against one token's activations, accumulated in fp32. The tuned types
// (those of the project's files: Q4_K, Q5_K, Q6_K, Q8_0, IQ2_XXS, IQ2_XS, IQ1_M) take 8-bit
// activations and form integer dot products per block with AVX2; F32 and F16 rows dot fp32
// activations; every other type is dequantised row by row and dotted in fp32 (fast_products.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/quant.h"

namespace rl::cpu {

enum class ActivationFormat {
  kF32,   // the fp32 values as they are
  kQ8K,   // ActivationQ8K blocks of 256 (K and IQ types)
  kQ8_0,  // ActivationQ8_0 blocks of 32 (Q8_0)
};

// row: one weight row; activation: the token's activations in the kernel's format; n: values.
using FastDotFn = float (*)(const void* row, const void* activation, int64_t n);

struct FastKernel {
  ActivationFormat format = ActivationFormat::kF32;
  FastDotFn dot = nullptr;  // nullptr: rows are dequantised to fp32 and dotted with fast_dot_f32
};

// The kernel for a weight type (F32 rows are read in place, other untuned types dequantised).
FastKernel fast_kernel(GgmlType type);

// Bytes of one token's activations of n values in `format`.
size_t activation_bytes(ActivationFormat format, int64_t n);
// x: [n] -> out: activation_bytes(format, n) bytes.
void quantize_activation(ActivationFormat format, const float* x, int64_t n, void* out);

// sum a[i] * b[i] in fp32 (8 lanes, 4 accumulators).
float fast_dot_f32(const float* a, const float* b, int64_t n);

// Tuned kernels, activation format in the comment.
float fast_dot_f16(const void* row, const void* x, int64_t n);      // kF32
float fast_dot_q8_0(const void* row, const void* x, int64_t n);     // kQ8_0
float fast_dot_q4_K(const void* row, const void* x, int64_t n);     // kQ8K
float fast_dot_q5_K(const void* row, const void* x, int64_t n);     // kQ8K
float fast_dot_q6_K(const void* row, const void* x, int64_t n);     // kQ8K
float fast_dot_iq2_xxs(const void* row, const void* x, int64_t n);  // kQ8K
float fast_dot_iq2_xs(const void* row, const void* x, int64_t n);   // kQ8K
float fast_dot_iq1_m(const void* row, const void* x, int64_t n);    // kQ8K

}  // namespace rl::cpu
