#include "quant/quant.h"

#include <cctype>

#include "common/error.h"
#include "quant/quant_kernels.h"

namespace rl {

namespace {

// clang-format off
const QuantType kTypes[] = {
  // type              name       block bytes  dequantize_row              dot_row
  {GgmlType::F32,     "f32",      1,    4,    dequantize_row_f32,     dot_row_f32},
  {GgmlType::F16,     "f16",      1,    2,    dequantize_row_f16,     dot_row_f16},
  {GgmlType::BF16,    "bf16",     1,    2,    dequantize_row_bf16,    dot_row_bf16},
  {GgmlType::Q4_0,    "q4_0",     32,   18,   dequantize_row_q4_0,    dot_row_q4_0},
  {GgmlType::Q4_1,    "q4_1",     32,   20,   dequantize_row_q4_1,    dot_row_q4_1},
  {GgmlType::Q5_0,    "q5_0",     32,   22,   dequantize_row_q5_0,    dot_row_q5_0},
  {GgmlType::Q5_1,    "q5_1",     32,   24,   dequantize_row_q5_1,    dot_row_q5_1},
  {GgmlType::Q8_0,    "q8_0",     32,   34,   dequantize_row_q8_0,    dot_row_q8_0},
  {GgmlType::Q8_1,    "q8_1",     32,   36,   nullptr,                nullptr},
  {GgmlType::Q2_K,    "q2_K",     256,  84,   dequantize_row_q2_K,    dot_row_q2_K},
  {GgmlType::Q3_K,    "q3_K",     256,  110,  dequantize_row_q3_K,    dot_row_q3_K},
  {GgmlType::Q4_K,    "q4_K",     256,  144,  dequantize_row_q4_K,    dot_row_q4_K},
  {GgmlType::Q5_K,    "q5_K",     256,  176,  dequantize_row_q5_K,    dot_row_q5_K},
  {GgmlType::Q6_K,    "q6_K",     256,  210,  dequantize_row_q6_K,    dot_row_q6_K},
  {GgmlType::Q8_K,    "q8_K",     256,  292,  nullptr,                nullptr},
  {GgmlType::IQ2_XXS, "iq2_xxs",  256,  66,   dequantize_row_iq2_xxs, dot_row_iq2_xxs},
  {GgmlType::IQ2_XS,  "iq2_xs",   256,  74,   dequantize_row_iq2_xs,  dot_row_iq2_xs},
  {GgmlType::IQ3_XXS, "iq3_xxs",  256,  98,   dequantize_row_iq3_xxs, dot_row_iq3_xxs},
  {GgmlType::IQ1_S,   "iq1_s",    256,  50,   dequantize_row_iq1_s,   dot_row_iq1_s},
  {GgmlType::IQ4_NL,  "iq4_nl",   32,   18,   dequantize_row_iq4_nl,  dot_row_iq4_nl},
  {GgmlType::IQ3_S,   "iq3_s",    256,  110,  dequantize_row_iq3_s,   dot_row_iq3_s},
  {GgmlType::IQ2_S,   "iq2_s",    256,  82,   dequantize_row_iq2_s,   dot_row_iq2_s},
  {GgmlType::IQ4_XS,  "iq4_xs",   256,  136,  dequantize_row_iq4_xs,  dot_row_iq4_xs},
  {GgmlType::I8,      "i8",       1,    1,    nullptr,                nullptr},
  {GgmlType::I16,     "i16",      1,    2,    nullptr,                nullptr},
  {GgmlType::I32,     "i32",      1,    4,    nullptr,                nullptr},
  {GgmlType::I64,     "i64",      1,    8,    nullptr,                nullptr},
  {GgmlType::F64,     "f64",      1,    8,    nullptr,                nullptr},
  {GgmlType::IQ1_M,   "iq1_m",    256,  56,   dequantize_row_iq1_m,   dot_row_iq1_m},
  {GgmlType::TQ1_0,   "tq1_0",    256,  54,   nullptr,                nullptr},
  {GgmlType::TQ2_0,   "tq2_0",    256,  66,   nullptr,                nullptr},
  {GgmlType::MXFP4,   "mxfp4",    32,   17,   dequantize_row_mxfp4,   dot_row_mxfp4},
};
// clang-format on

}  // namespace

const QuantType* find_quant_type(uint32_t raw_type) {
  for (const auto& t : kTypes)
    if ((uint32_t)t.type == raw_type) return &t;
  return nullptr;
}

const QuantType& quant_type(GgmlType type) {
  const QuantType* t = find_quant_type((uint32_t)type);
  if (!t) fail("unknown ggml type id {}", (uint32_t)type);
  return *t;
}

const char* type_name(GgmlType type) {
  const QuantType* t = find_quant_type((uint32_t)type);
  return t ? t->name : "unknown";
}

const QuantType* find_quant_type_by_name(std::string_view name) {
  for (const auto& t : kTypes) {
    std::string_view n = t.name;
    if (n.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < n.size() && eq; i++)
      eq = std::tolower((unsigned char)n[i]) == std::tolower((unsigned char)name[i]);
    if (eq) return &t;
  }
  return nullptr;
}

size_t row_size(GgmlType type, int64_t n) {
  const QuantType& t = quant_type(type);
  if (n < 0 || n % t.block_size != 0)
    fail("a row of {} values is not a multiple of the {} block size {}", n, t.name, t.block_size);
  return (size_t)(n / t.block_size) * t.type_size;
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const QuantType& t = quant_type(type);
  if (!t.dequantize_row) fail("type {} has no float view", t.name);
  t.dequantize_row(src, dst, n);
}

float dot_row(GgmlType type, const void* src, const float* x, int64_t n) {
  const QuantType& t = quant_type(type);
  if (!t.dot_row) fail("type {} has no dot product", t.name);
  return t.dot_row(src, x, n);
}

}  // namespace rl
