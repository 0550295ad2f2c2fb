#include "synth/random_blocks.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "quant/blocks.h"

namespace rl::synth {

void Rng::bytes(uint8_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = next();
    std::memcpy(dst + i, &v, 8);
  }
  if (i < n) {
    const uint64_t v = next();
    std::memcpy(dst + i, &v, n - i);
  }
}

float Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // uniform() can return 0; shift into (0, 1] so the logarithm stays finite.
  const float u1 = 1.0f - uniform();
  const float u2 = uniform();
  const float r = std::sqrt(-2.0f * std::log(u1));
  const float phi = 6.28318530718f * u2;
  spare_ = r * std::sin(phi);
  has_spare_ = true;
  return r * std::cos(phi);
}

uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c) {
  Rng r(a ^ 0x5851F42D4C957F2Dull);
  uint64_t h = r.next() ^ (b * 0xD6E8FEB86659FD93ull);
  Rng r2(h);
  h = r2.next() ^ (c * 0xA0761D6478BD642Full);
  Rng r3(h);
  return r3.next();
}

namespace {

// Sub-block scale ranges. They keep the per-block spread realistic (scales vary as in a real
// quantised tensor) while staying well inside the 6-bit / 4-bit / 3-bit fields, and they keep
// the fp16 super-block scale d in the normal fp16 range for the spreads this tool uses
// (std >= ~0.01 gives d >= 1e-4 for every type below).
constexpr int kQ4KScaleLo = 16, kQ4KScaleHi = 31;
constexpr int kQ5KScaleLo = 8, kQ5KScaleHi = 15;
constexpr int kQ6KScaleLo = 4, kQ6KScaleHi = 15;
constexpr int kQ2KScaleLo = 8, kQ2KScaleHi = 15;
constexpr int kIQ2ScaleLo = 4, kIQ2ScaleHi = 11;  // 4-bit scale ls: values * (0.5 + ls) / 4
constexpr int kIQ1MScaleLo = 2, kIQ1MScaleHi = 7;  // 3-bit scale s: values * (2 s + 1)

uint16_t half(float v) { return f32_to_fp16(v); }
// A byte of two 4-bit scales, each uniform in [lo, hi] (IQ2_XS, IQ2_S, IQ3_S).
uint8_t two_scale_nibbles(Rng& rng, int lo, int hi) { return (uint8_t)(rng.range(lo, hi) | (rng.range(lo, hi) << 4)); }
float as_float(uint16_t h) { return fp16_to_f32(h); }

// The 12-byte packing of eight 6-bit scales and eight 6-bit mins shared by Q4_K and Q5_K:
// sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 in the
// nibbles of bytes 8-11 with their top 2 bits in the top 2 bits of bytes 0-7.
void pack_k4_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t out[12]) {
  for (int j = 0; j < 4; j++) {
    out[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    out[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

void gen_q8_0(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(reinterpret_cast<uint8_t*>(b[i].qs), sizeof b[i].qs);
    b[i].d = half(scale * rng.sign());  // random sign cancels the -0.5 mean of uniform int8
  }
}

void gen_q4_0(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockQ4_0*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);
    b[i].d = half(scale * rng.sign());  // q - 8 has mean -0.5; the random sign cancels it
  }
}

void gen_q2_K(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockQ2_K*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);
    for (auto& s : b[i].scales) {
      const int v = rng.range(kQ2KScaleLo, kQ2KScaleHi);
      s = (uint8_t)(v | (v << 4));  // scale == min index: the min cancels the mean of q (1.5)
    }
    b[i].d = half(scale);
    b[i].dmin = half(1.5f * as_float(b[i].d));
  }
}

void gen_q4_K(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockQ4_K*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);
    uint8_t sc[8];
    for (auto& s : sc) s = (uint8_t)rng.range(kQ4KScaleLo, kQ4KScaleHi);
    pack_k4_scales(sc, sc, b[i].scales);  // min == scale and dmin = 7.5 d: x = d sc (q - 7.5)
    b[i].d = half(scale);
    b[i].dmin = half(7.5f * as_float(b[i].d));
  }
}

void gen_q5_K(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockQ5_K*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);
    rng.bytes(b[i].qh, sizeof b[i].qh);
    uint8_t sc[8];
    for (auto& s : sc) s = (uint8_t)rng.range(kQ5KScaleLo, kQ5KScaleHi);
    pack_k4_scales(sc, sc, b[i].scales);  // x = d sc (q - 15.5), q 5-bit
    b[i].d = half(scale);
    b[i].dmin = half(15.5f * as_float(b[i].d));
  }
}

void gen_q6_K(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockQ6_K*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].ql, sizeof b[i].ql);
    rng.bytes(b[i].qh, sizeof b[i].qh);
    // q - 32 has mean -0.5: random scale signs cancel it.
    for (auto& s : b[i].scales) s = (int8_t)(rng.range(kQ6KScaleLo, kQ6KScaleHi) * (int)rng.sign());
    b[i].d = half(scale);
  }
}

void gen_iq2_xxs(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockIQ2_XXS*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    auto* q = reinterpret_cast<uint8_t*>(b[i].qs);
    rng.bytes(q, sizeof b[i].qs);
    // Each 32 values: 4 grid-index bytes, then a 32-bit word of four 7-bit sign codes and the
    // 4-bit scale in its top nibble (byte 7 of the group, little-endian).
    for (int g = 0; g < kQK_K / 32; g++) {
      uint8_t& top = q[8 * g + 7];
      top = (uint8_t)((top & 0x0F) | (rng.range(kIQ2ScaleLo, kIQ2ScaleHi) << 4));
    }
    b[i].d = half(scale);
  }
}

void gen_iq2_xs(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockIQ2_XS*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    // Each 16-bit code: a 9-bit grid index and a 7-bit sign code; every value is valid.
    rng.bytes(reinterpret_cast<uint8_t*>(b[i].qs), sizeof b[i].qs);
    for (auto& s : b[i].scales) s = two_scale_nibbles(rng, kIQ2ScaleLo, kIQ2ScaleHi);
    b[i].d = half(scale);
  }
}

void gen_iq1_m(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockIQ1_M*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    // qs: low 8 bits of 11-bit grid indices; qh: the high 3 bits and the sign of the grid shift.
    rng.bytes(b[i].qs, sizeof b[i].qs);
    rng.bytes(b[i].qh, sizeof b[i].qh);
    // Four 16-bit words: each holds four 3-bit sub-block scales in bits 0-11 and one nibble of
    // the fp16 super-block scale in bits 12-15 (word w carries bits 4w..4w+3).
    const uint16_t d = half(scale);
    for (int w = 0; w < 4; w++) {
      uint16_t word = 0;
      for (int s = 0; s < 4; s++) word |= (uint16_t)(rng.range(kIQ1MScaleLo, kIQ1MScaleHi) << (3 * s));
      word |= (uint16_t)(((d >> (4 * w)) & 0xF) << 12);
      std::memcpy(b[i].scales + 2 * w, &word, 2);
    }
  }
}

// ---- the types without a tuned GPU form (the all-types recipe) ------------------------------

constexpr int kQ3KScaleLo = 8, kQ3KScaleHi = 15;    // |scale6 - 32|, random sign
constexpr int kIQ4XSScaleLo = 8, kIQ4XSScaleHi = 15;  // |scale6 - 32|, random sign
constexpr int kIQ3SScaleLo = 2, kIQ3SScaleHi = 7;   // 4-bit s: values * (1 + 2 s)
constexpr int kIQ1SScaleLo = 2, kIQ1SScaleHi = 7;   // 3-bit s: values * (2 s + 1)

// x = d * q + m with m = -mid * d: q uniform in 0..2 mid has mean mid, so x has mean ~0.
template <class Block>
void set_scale_and_min(Block& b, float scale, float mid) {
  b.d = half(scale);
  b.m = half(-mid * as_float(b.d));
}

void gen_q4_1(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockQ4_1*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);
    set_scale_and_min(b[i], scale, 7.5f);
  }
}

void gen_q5_0(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockQ5_0*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);
    rng.bytes(b[i].qh, sizeof b[i].qh);
    b[i].d = half(scale * rng.sign());  // q - 16 has mean -0.5; the random sign cancels it
  }
}

void gen_q5_1(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockQ5_1*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);
    rng.bytes(b[i].qh, sizeof b[i].qh);
    set_scale_and_min(b[i], scale, 15.5f);
  }
}

void gen_iq4_nl(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockIQ4_NL*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);
    b[i].d = half(scale * rng.sign());  // the codebook's mean (-5.9) cancels with the sign
  }
}

// MXFP4's scale is a power of two 2^(e - 128): e is drawn between the two powers around `scale`
// with the odds that make the mean square d^2 equal scale^2, so unit_rms still calibrates it.
void gen_mxfp4(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockMXFP4*>(dst);
  const int lo = (int)std::floor(std::log2(scale));
  const double s2 = (double)scale * scale, lo2 = std::ldexp(1.0, 2 * lo);
  const double p_lo = (4 * lo2 - s2) / (3 * lo2);  // p lo2 + (1 - p) 4 lo2 = s2
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);  // the codebook is symmetric: mean 0
    const int e = 128 + lo + (rng.uniform() < p_lo ? 0 : 1);
    b[i].e = (uint8_t)std::clamp(e, 2, 253);
  }
}

void gen_q3_K(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockQ3_K*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].hmask, sizeof b[i].hmask);
    rng.bytes(b[i].qs, sizeof b[i].qs);
    // 16 six-bit scales stored + 32: low nibbles in bytes 0-7 (sub-blocks 8-15 in the high
    // nibbles), the 2 high bits of sub-block s at bits 2 (s/4) of byte 8 + s%4. q has mean -0.5:
    // the random scale signs cancel it.
    std::memset(b[i].scales, 0, sizeof b[i].scales);
    for (int sub = 0; sub < 16; sub++) {
      const int v = rng.range(kQ3KScaleLo, kQ3KScaleHi) * (int)rng.sign() + 32;
      b[i].scales[sub % 8] |= (uint8_t)((v & 0xF) << (sub < 8 ? 0 : 4));
      b[i].scales[8 + sub % 4] |= (uint8_t)((v >> 4) << (2 * (sub / 4)));
    }
    b[i].d = half(scale);
  }
}

void gen_iq4_xs(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockIQ4_XS*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);
    // Eight six-bit scales stored + 32: low nibbles in scales_l, high bit pairs in scales_h.
    std::memset(b[i].scales_l, 0, sizeof b[i].scales_l);
    uint16_t high = 0;
    for (int sub = 0; sub < 8; sub++) {
      const int v = rng.range(kIQ4XSScaleLo, kIQ4XSScaleHi) * (int)rng.sign() + 32;
      b[i].scales_l[sub / 2] |= (uint8_t)((v & 0xF) << (4 * (sub % 2)));
      high |= (uint16_t)((v >> 4) << (2 * sub));
    }
    b[i].scales_h = high;
    b[i].d = half(scale);
  }
}

void gen_iq2_s(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockIQ2_S*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);  // grid index low bits and full sign bytes
    rng.bytes(b[i].qh, sizeof b[i].qh);
    for (auto& s : b[i].scales) s = two_scale_nibbles(rng, kIQ2ScaleLo, kIQ2ScaleHi);
    b[i].d = half(scale);
  }
}

void gen_iq3_xxs(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockIQ3_XXS*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);
    // The 4-bit scale is the top nibble of each 32-value group's sign word (its byte 3).
    for (int g = 0; g < kQK_K / 32; g++) {
      uint8_t& top = b[i].qs[64 + 4 * g + 3];
      top = (uint8_t)((top & 0x0F) | (rng.range(kIQ2ScaleLo, kIQ2ScaleHi) << 4));
    }
    b[i].d = half(scale);
  }
}

void gen_iq3_s(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockIQ3_S*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);
    rng.bytes(b[i].qh, sizeof b[i].qh);
    rng.bytes(b[i].signs, sizeof b[i].signs);
    for (auto& s : b[i].scales) s = two_scale_nibbles(rng, kIQ3SScaleLo, kIQ3SScaleHi);
    b[i].d = half(scale);
  }
}

void gen_iq1_s(uint8_t* dst, int64_t nb, float scale, Rng& rng) {
  auto* b = reinterpret_cast<BlockIQ1_S*>(dst);
  for (int64_t i = 0; i < nb; i++) {
    rng.bytes(b[i].qs, sizeof b[i].qs);
    // qh per 32 values: 4 x 3 high index bits, the 3-bit scale in bits 12-14, the delta's sign on top.
    for (auto& h : b[i].qh)
      h = (uint16_t)((rng.next() & 0x0FFF) | (rng.range(kIQ1SScaleLo, kIQ1SScaleHi) << 12) |
                     ((rng.next() >> 63) << 15));
    b[i].d = half(scale);
  }
}

using BlockGen = void (*)(uint8_t* dst, int64_t n_blocks, float scale, Rng& rng);

BlockGen block_generator(GgmlType type) {
  switch (type) {
    case GgmlType::Q8_0: return gen_q8_0;
    case GgmlType::Q4_0: return gen_q4_0;
    case GgmlType::Q2_K: return gen_q2_K;
    case GgmlType::Q4_K: return gen_q4_K;
    case GgmlType::Q5_K: return gen_q5_K;
    case GgmlType::Q6_K: return gen_q6_K;
    case GgmlType::IQ2_XXS: return gen_iq2_xxs;
    case GgmlType::IQ2_XS: return gen_iq2_xs;
    case GgmlType::IQ1_M: return gen_iq1_m;
    case GgmlType::Q4_1: return gen_q4_1;
    case GgmlType::Q5_0: return gen_q5_0;
    case GgmlType::Q5_1: return gen_q5_1;
    case GgmlType::IQ4_NL: return gen_iq4_nl;
    case GgmlType::MXFP4: return gen_mxfp4;
    case GgmlType::Q3_K: return gen_q3_K;
    case GgmlType::IQ4_XS: return gen_iq4_xs;
    case GgmlType::IQ2_S: return gen_iq2_s;
    case GgmlType::IQ3_XXS: return gen_iq3_xxs;
    case GgmlType::IQ3_S: return gen_iq3_s;
    case GgmlType::IQ1_S: return gen_iq1_s;
    default: return nullptr;
  }
}

bool is_float_type(GgmlType type) {
  return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16;
}

constexpr GgmlType kGeneratable[] = {
    GgmlType::F32,  GgmlType::F16,     GgmlType::BF16,   GgmlType::Q4_0,    GgmlType::Q4_1,  GgmlType::Q5_0,
    GgmlType::Q5_1, GgmlType::Q8_0,    GgmlType::IQ4_NL, GgmlType::MXFP4,   GgmlType::Q2_K,  GgmlType::Q3_K,
    GgmlType::Q4_K, GgmlType::Q5_K,    GgmlType::Q6_K,   GgmlType::IQ4_XS,  GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
    GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ1_S,   GgmlType::IQ1_M};

}  // namespace

bool can_generate(GgmlType type) { return is_float_type(type) || block_generator(type) != nullptr; }

std::string generatable_type_names() {
  std::string s;
  for (GgmlType t : kGeneratable) {
    if (!s.empty()) s += ", ";
    s += type_name(t);
  }
  return s;
}

double unit_rms(GgmlType type) {
  if (is_float_type(type)) return 1.0;
  const BlockGen gen = block_generator(type);
  if (!gen) fail("synth: cannot generate tensors of type {} (supported: {})", type_name(type), generatable_type_names());
  static std::array<std::once_flag, 64> once;
  static std::array<double, 64> cache{};
  const uint32_t id = (uint32_t)type;
  if (id >= cache.size()) fail("synth: type id {} out of range", id);
  std::call_once(once[id], [&] {
    // 1024 blocks (256k values for the 256-value types): the estimate is within ~0.5 %.
    const QuantType& qt = quant_type(type);
    const int64_t n_blocks = 1024;
    std::vector<uint8_t> blocks((size_t)n_blocks * qt.type_size);
    std::vector<float> values((size_t)(n_blocks * qt.block_size));
    Rng rng(0xCA11B2A7E5EEDull + id);
    gen(blocks.data(), n_blocks, 1.0f, rng);
    dequantize_row(type, blocks.data(), values.data(), (int64_t)values.size());
    double sum_sq = 0;
    for (float v : values) sum_sq += (double)v * v;
    cache[id] = std::sqrt(sum_sq / (double)values.size());
  });
  return cache[id];
}

void store_float_row(GgmlType type, const float* values, int64_t n, uint8_t* dst) {
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, values, (size_t)n * 4);
      return;
    case GgmlType::F16:
      store_rounded<f32_to_fp16>(values, n, dst);
      return;
    case GgmlType::BF16:
      store_rounded<f32_to_bf16>(values, n, dst);
      return;
    default:
      fail("synth: values of type {} cannot be stored directly (float types only)", type_name(type));
  }
}

void fill_normal_row(GgmlType type, uint8_t* dst, int64_t n, float std, Rng& rng) {
  if (is_float_type(type)) {
    std::vector<float> values((size_t)n);
    for (auto& v : values) v = std * rng.normal();
    store_float_row(type, values.data(), n, dst);
    return;
  }
  const BlockGen gen = block_generator(type);
  if (!gen) fail("synth: cannot generate tensors of type {} (supported: {})", type_name(type), generatable_type_names());
  const QuantType& qt = quant_type(type);
  if (n % qt.block_size != 0) fail("synth: row of {} values is not a multiple of {}'s block of {}", n, qt.name, qt.block_size);
  gen(dst, n / qt.block_size, (float)(std / unit_rms(type)), rng);
}

}  // namespace rl::synth
