// Codebooks (grids) and sign tables of ggml's IQ quantisation types. They are part of the format:
// an IQ block stores, per group of 8 (or 4) values, an index into one of these grids, a scale and
// sign bits, so a decoder needs ggml's exact numbers. Values live in iq_grids.cpp.
//
// Reading an entry: byte j of the entry, (entry >> 8*j) & 0xff, is value j of that grid point
// (the grids are stored little-endian in ggml, so this is also its memory order on x86).
#pragma once
#include <cstdint>

namespace rl {

// kmask_iq2xs[j] = 1 << j: the bit of value j in an 8-bit sign mask.
extern const uint8_t kmask_iq2xs[8];
// 7 stored sign bits -> 8-bit sign mask with even parity (the 8th sign is implied).
extern const uint8_t ksigns_iq2xs[128];

// 8 unsigned magnitudes per point, each one of 0x08, 0x19, 0x2b.
extern const uint64_t iq2xxs_grid[256];  // IQ2_XXS: 8-bit index
extern const uint64_t iq2xs_grid[512];   // IQ2_XS: 9-bit index
extern const uint64_t iq2s_grid[1024];   // IQ2_S: 10-bit index

// 4 unsigned magnitudes per point.
extern const uint32_t iq3xxs_grid[256];  // IQ3_XXS: values from {4, 12, 20, 28, 36, 44, 52, 62}
extern const uint32_t iq3s_grid[512];    // IQ3_S: odd values 1..15

// IQ1_S and IQ1_M: 8 signed values per point, each byte an int8 of -1, 0 or +1; 11-bit index.
extern const uint64_t iq1s_grid[2048];

// The 16 IQ4_NL / IQ4_XS levels (ggml's kvalues_iq4nl): a non-uniform 4-bit codebook.
extern const int8_t kvalues_iq4nl[16];
// The E2M1 (fp4) values of MXFP4, doubled so they are integers (ggml's kvalues_mxfp4); the block
// scale is halved to compensate.
extern const int8_t kvalues_mxfp4[16];

// The shift added to every IQ1_S / IQ1_M grid value before scaling, its sign chosen per group of
// 8 by one stored bit: x = scale * (grid value ± delta).
constexpr float IQ1S_DELTA = 0.125f;
constexpr float IQ1M_DELTA = 0.125f;

}  // namespace rl
