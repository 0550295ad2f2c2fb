// Packed block layouts of ggml's IQ codebook types, byte for byte as stored in GGUF tensor data.
// Every block holds 256 values as 32 groups of 8 (IQ3: 64 groups of 4 for the grid lookups).
// A group's values are a point of a codebook grid (quant/iq_grids.h) times a scale, with signs
// either stored (IQ2/IQ3) or part of the grid (IQ1). fp16 fields are raw IEEE half bits.
// Blocks are read in place from the mapping: members are bytes or 16-bit words at even offsets,
// and each size is pinned to ggml's.
#pragma once
#include <cstdint>

namespace rl {

// 2.06 bits per weight. Per 32 values (ib32), qs[4*ib32 .. 4*ib32+3] as 8 bytes:
// bytes 0..3 = 4 grid indices (iq2xxs_grid), bits 32..59 = 4 x 7 sign bits (ksigns_iq2xs),
// bits 60..63 = 4-bit scale s. x = d * (0.5 + s) * 0.25 * grid * sign.
struct BlockIQ2_XXS {
  uint16_t d;
  uint16_t qs[32];
};
static_assert(sizeof(BlockIQ2_XXS) == 66);

// 2.31 bits per weight. qs[g] (one per group of 8): bits 0..8 grid index (iq2xs_grid), bits
// 9..15 sign index (ksigns_iq2xs). scales[ib32]: low nibble for groups 0-1, high for 2-3 of that
// 32; x = d * (0.5 + s) * 0.25 * grid * sign.
struct BlockIQ2_XS {
  uint16_t d;
  uint16_t qs[32];
  uint8_t scales[8];
};
static_assert(sizeof(BlockIQ2_XS) == 74);

// 2.56 bits per weight. qs[0..31]: low 8 bits of the grid index (iq2s_grid) per group;
// qs[32..63]: the 8 sign bits per group, stored in full; qh[ib32]: 2 high index bits per group;
// scales as IQ2_XS.
struct BlockIQ2_S {
  uint16_t d;
  uint8_t qs[64];
  uint8_t qh[8];
  uint8_t scales[8];
};
static_assert(sizeof(BlockIQ2_S) == 82);

// 3.06 bits per weight. qs[0..63]: one iq3xxs_grid index per group of 4; qs[64..95]: per 32
// values a little-endian uint32 with 4 x 7 sign bits (ksigns_iq2xs) and the 4-bit scale in bits
// 28..31; x = d * (0.5 + s) * 0.5 * grid * sign.
struct BlockIQ3_XXS {
  uint16_t d;
  uint8_t qs[96];
};
static_assert(sizeof(BlockIQ3_XXS) == 98);

// 3.44 bits per weight. qs: low 8 bits of an iq3s_grid index per group of 4; qh[ib32]: the 9th
// index bit of its 8 groups; signs: 8 full sign bits per group of 8; scales: one 4-bit scale s per
// 32 values (low nibble first); x = d * (1 + 2s) * grid * sign.
struct BlockIQ3_S {
  uint16_t d;
  uint8_t qs[64];
  uint8_t qh[8];
  uint8_t signs[32];
  uint8_t scales[4];
};
static_assert(sizeof(BlockIQ3_S) == 110);

// 1.56 bits per weight. qs: low 8 bits of an iq1s_grid index per group of 8; qh[ib32]: bits
// 3l..3l+2 = high index bits of group l, bits 12..14 = 3-bit scale s, bit 15 = delta sign.
// x = d * (2s + 1) * (grid ± IQ1S_DELTA).
struct BlockIQ1_S {
  uint16_t d;
  uint8_t qs[32];
  uint16_t qh[8];
};
static_assert(sizeof(BlockIQ1_S) == 50);

// 1.75 bits per weight, no explicit d: the fp16 super-scale is spread over the top nibbles of the
// four little-endian 16-bit words of scales (word k holds bits 4k..4k+3). Below them, each word
// holds four 3-bit scales, one per 16 values. qs: low 8 index bits per group of 8; qh: one nibble
// per group, 3 high index bits plus the delta sign bit (bit 3).
// x = d * (2s + 1) * (grid ± IQ1M_DELTA).
struct BlockIQ1_M {
  uint8_t qs[32];
  uint8_t qh[16];
  uint8_t scales[8];
};
static_assert(sizeof(BlockIQ1_M) == 56);

}  // namespace rl
