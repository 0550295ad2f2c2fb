// Packed ggml block layouts, byte for byte as they are stored in GGUF tensor data.
// Every struct is read in place from the (unaligned) mapping, so all members are byte arrays or
// 16-bit fields at even offsets and every size is pinned by a static_assert against ggml's.
// fp16 fields are raw IEEE half bits (decode with half_to_f32 below).
#pragma once
#include <cstdint>

#include "quant/blocks_iq.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "common/fp16.h"

namespace rl {

// An fp16 block scale as fp32. Exact either way; the F16C instruction saves the branches of the
// portable conversion once per block.
inline float half_to_f32(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return fp16_to_f32(h);
#endif
}

constexpr int kQK_K = 256;  // values per "super-block" of the K and IQ families
constexpr int kQK32 = 32;   // values per block of the legacy 32-value families (Q4_0 ... Q8_0, IQ4_NL, MXFP4)

// ---- 32-value blocks --------------------------------------------------------------------------

// x = d * (q - 8), q 4-bit; value j in the low nibble of qs[j], value j+16 in the high nibble.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK32 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// x = d * q + m, q 4-bit; nibble layout as Q4_0.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK32 / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// x = d * (q - 16), q 5-bit: low 4 bits as Q4_0, bit 4 of value j is bit j of the 32-bit qh.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK32 / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// x = d * q + m, q 5-bit; bit layout as Q5_0.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK32 / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// x = d * q, q int8.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK32];
};
static_assert(sizeof(BlockQ8_0) == 34);

// x = d * kvalues_iq4nl[q], q 4-bit index; nibble layout as Q4_0.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK32 / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// x = 2^(e-128) * kvalues_mxfp4[q] (E8M0 shared exponent, E2M1 values stored doubled);
// nibble layout as Q4_0.
struct BlockMXFP4 {
  uint8_t e;
  uint8_t qs[kQK32 / 2];
};
static_assert(sizeof(BlockMXFP4) == 17);

// ---- 256-value K-quant super-blocks ----------------------------------------------------------

// 16 sub-blocks of 16: x = d * (scales[s] & 15) * q - dmin * (scales[s] >> 4), q 2-bit.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// 16 sub-blocks of 16: x = d * (scale6 - 32) * (q2 - (high bit ? 0 : 4)); 6-bit scales packed in 12 bytes.
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// 8 sub-blocks of 32: x = d * sc * q - dmin * m, q 4-bit, (sc, m) 6-bit each packed in 12 bytes.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// As Q4_K with a fifth bit per value in qh.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// 16 sub-blocks of 16: x = d * scales[s] * (q - 32), q 6-bit (low 4 bits in ql, high 2 in qh).
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// ---- 256-value IQ codebook super-blocks (IQ1/IQ2/IQ3): quant/blocks_iq.h --------------------

// 8 sub-blocks of 32: x = d * (scale6 - 32) * kvalues_iq4nl[q]; scale low 4 bits in scales_l,
// high 2 bits in scales_h.
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

}  // namespace rl
