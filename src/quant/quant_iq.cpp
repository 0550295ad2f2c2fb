// Reference dequantisation and dot products of ggml's IQ codebook types: IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M. Each value is computed with the same float operations, in the
// same order, as ggml's dequantize_row_<type> (ggml-quants.c), so results match it bit for bit.
// None of these expressions has the a*b+c shape, so -mfma cannot fuse (and change) anything here.
// Every type reduces to two 8-value group decoders (decode_signed8, decode_shifted8), which have
// an AVX2 form; test_quant checks the zoo bit for bit with it, and the scalar form passes the same
// tests when this file is compiled without AVX2.
//
// Block layouts: quant/blocks_iq.h. Grids and sign tables: quant/iq_grids.h.
#include <bit>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "common/fp16.h"
#include "quant/block_dot.h"
#include "quant/blocks_iq.h"
#include "quant/iq_grids.h"
#include "quant/quant_kernels.h"

namespace rl {

namespace {

constexpr int kIQBlockValues = 256;

// Value j of a grid point is byte j of its entry in memory (the grids are little-endian data, as
// in ggml), so a point is read as 8 (or 4) consecutive bytes.
static_assert(std::endian::native == std::endian::little, "IQ grids are read as little-endian bytes");

inline const uint8_t* grid_bytes(const uint64_t& entry) { return reinterpret_cast<const uint8_t*>(&entry); }
inline const uint8_t* grid_bytes(const uint32_t& entry) { return reinterpret_cast<const uint8_t*>(&entry); }

// The two group decoders every IQ type reduces to. The scalar loops state the arithmetic (ggml's,
// operation for operation); the AVX2 versions compute the same operations on 8 lanes, because the
// compiler does not vectorise the byte widening and the per-value sign select on its own, and
// the oracle spends most of its time here. Flipping the sign bit of a product is exactly ggml's
// multiplication by -1.f.

// y: [8] = scale * magnitudes[j] * (bit j of signs ? -1 : 1).
inline void decode_signed8(float scale, const uint8_t* magnitudes, uint8_t signs, float* y) {
#if defined(__AVX2__)
  const __m256 values = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)magnitudes)));
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i negative = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(signs), bit), bit);
  const __m256 sign_bits = _mm256_castsi256_ps(_mm256_slli_epi32(negative, 31));
  _mm256_storeu_ps(y, _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(scale), values), sign_bits));
#else
  for (int j = 0; j < 8; j++) y[j] = scale * (float)magnitudes[j] * ((signs >> j) & 1 ? -1.f : 1.f);
#endif
}

// y: [8] = scale * (values[j] + delta), values int8 in {-1, 0, 1} (the IQ1 grid).
inline void decode_shifted8(float scale, float delta, const uint8_t* values, float* y) {
#if defined(__AVX2__)
  const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)values)));
  _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_set1_ps(scale), _mm256_add_ps(v, _mm256_set1_ps(delta))));
#else
  for (int j = 0; j < 8; j++) y[j] = scale * ((float)(int8_t)values[j] + delta);
#endif
}

// y: [8] from one 2-bit grid point (64-bit entry).
inline void decode_group8(float scale, const uint64_t& entry, uint8_t signs, float* y) {
  decode_signed8(scale, grid_bytes(entry), signs, y);
}

// y: [8] from two IQ3 grid points of 4 (signs bits 0-3 for the first, 4-7 for the second).
inline void decode_group4x2(float scale, const uint32_t& first, const uint32_t& second, uint8_t signs, float* y) {
  uint8_t magnitudes[8];
  std::memcpy(magnitudes, grid_bytes(first), 4);
  std::memcpy(magnitudes + 4, grid_bytes(second), 4);
  decode_signed8(scale, magnitudes, signs, y);
}

// y: [8] = scale * (grid point + delta), for the ternary IQ1 grid.
inline void decode_group_iq1(float scale, float delta, const uint64_t& entry, float* y) {
  decode_shifted8(scale, delta, grid_bytes(entry), y);
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- one block: y[0..255] ----------------------------------------------------------------------

void dequantize_block_iq2_xxs(const BlockIQ2_XXS& b, float* y) {
  const float d = fp16_to_f32(b.d);
  const uint8_t* q = reinterpret_cast<const uint8_t*>(b.qs);
  for (int ib32 = 0; ib32 < 8; ib32++, q += 8, y += 32) {
    const uint32_t indices = load_u32(q);  // 4 grid indices, one per byte
    const uint32_t signs_and_scale = load_u32(q + 4);
    const float db = d * (0.5f + (float)(signs_and_scale >> 28)) * 0.25f;
    for (int l = 0; l < 4; l++) {
      const uint8_t signs = ksigns_iq2xs[(signs_and_scale >> (7 * l)) & 127];
      decode_group8(db, iq2xxs_grid[(indices >> (8 * l)) & 255], signs, y + 8 * l);
    }
  }
}

void dequantize_block_iq2_xs(const BlockIQ2_XS& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int ib32 = 0; ib32 < 8; ib32++, y += 32) {
    const float db[2] = {d * (0.5f + (float)(b.scales[ib32] & 0xf)) * 0.25f,
                         d * (0.5f + (float)(b.scales[ib32] >> 4)) * 0.25f};
    for (int l = 0; l < 4; l++) {
      const uint16_t q = b.qs[4 * ib32 + l];
      decode_group8(db[l / 2], iq2xs_grid[q & 511], ksigns_iq2xs[q >> 9], y + 8 * l);
    }
  }
}

void dequantize_block_iq2_s(const BlockIQ2_S& b, float* y) {
  const float d = fp16_to_f32(b.d);
  const uint8_t* index_low = b.qs;
  const uint8_t* signs = b.qs + 32;
  for (int ib32 = 0; ib32 < 8; ib32++, y += 32) {
    const float db[2] = {d * (0.5f + (float)(b.scales[ib32] & 0xf)) * 0.25f,
                         d * (0.5f + (float)(b.scales[ib32] >> 4)) * 0.25f};
    for (int l = 0; l < 4; l++) {
      const int g = 4 * ib32 + l;
      const int index = index_low[g] | ((b.qh[ib32] << (8 - 2 * l)) & 0x300);
      decode_group8(db[l / 2], iq2s_grid[index], signs[g], y + 8 * l);
    }
  }
}

void dequantize_block_iq3_xxs(const BlockIQ3_XXS& b, float* y) {
  const float d = fp16_to_f32(b.d);
  const uint8_t* indices = b.qs;
  const uint8_t* scales_and_signs = b.qs + 64;
  for (int ib32 = 0; ib32 < 8; ib32++, indices += 8, y += 32) {
    const uint32_t aux = load_u32(scales_and_signs + 4 * ib32);
    const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
    for (int l = 0; l < 4; l++) {
      const uint8_t signs = ksigns_iq2xs[(aux >> (7 * l)) & 127];
      decode_group4x2(db, iq3xxs_grid[indices[2 * l]], iq3xxs_grid[indices[2 * l + 1]], signs, y + 8 * l);
    }
  }
}

void dequantize_block_iq3_s(const BlockIQ3_S& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int ib32 = 0; ib32 < 8; ib32++, y += 32) {
    const int s = (b.scales[ib32 / 2] >> (4 * (ib32 % 2))) & 0xf;
    const float db = d * (float)(1 + 2 * s);
    const uint8_t* indices = b.qs + 8 * ib32;
    const uint8_t high = b.qh[ib32];  // bit k: 9th index bit of group-of-4 k
    for (int l = 0; l < 4; l++) {
      const int first = indices[2 * l + 0] | ((high << (8 - 2 * l)) & 256);
      const int second = indices[2 * l + 1] | ((high << (7 - 2 * l)) & 256);
      decode_group4x2(db, iq3s_grid[first], iq3s_grid[second], b.signs[4 * ib32 + l], y + 8 * l);
    }
  }
}

void dequantize_block_iq1_s(const BlockIQ1_S& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int ib32 = 0; ib32 < 8; ib32++, y += 32) {
    const uint16_t qh = b.qh[ib32];
    const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
    const float delta = (qh & 0x8000) ? -IQ1S_DELTA : IQ1S_DELTA;
    for (int l = 0; l < 4; l++) {
      const int index = b.qs[4 * ib32 + l] | (((qh >> (3 * l)) & 7) << 8);
      decode_group_iq1(dl, delta, iq1s_grid[index], y + 8 * l);
    }
  }
}

// The fp16 super-scale of an IQ1_M block: the top nibble of scale word k is bits 4k..4k+3.
inline float iq1m_super_scale(const uint16_t words[4]) {
  const uint16_t bits = (uint16_t)((words[0] >> 12) | ((words[1] >> 8) & 0x00f0) |
                                   ((words[2] >> 4) & 0x0f00) | (words[3] & 0xf000));
  return fp16_to_f32(bits);
}

void dequantize_block_iq1_m(const BlockIQ1_M& b, float* y) {
  uint16_t words[4];  // scales as little-endian 16-bit words
  std::memcpy(words, b.scales, sizeof(words));
  const float d = iq1m_super_scale(words);
  for (int ib32 = 0; ib32 < 8; ib32++, y += 32) {
    // Two 3-bit scales per 32 values: the first 16 values use dl[0], the last 16 dl[1].
    const int shift = 6 * (ib32 % 2);
    const float dl[2] = {d * (float)(2 * ((words[ib32 / 2] >> (shift + 0)) & 7) + 1),
                         d * (float)(2 * ((words[ib32 / 2] >> (shift + 3)) & 7) + 1)};
    const uint8_t* qs = b.qs + 4 * ib32;
    const uint8_t* qh = b.qh + 2 * ib32;
    for (int l = 0; l < 4; l++) {
      // Group l's nibble: the low nibble of qh[l/2] for even l, the high nibble for odd l.
      const uint8_t nibble = (uint8_t)((qh[l / 2] >> (4 * (l % 2))) & 0xf);
      const int index = qs[l] | ((nibble & 7) << 8);
      const float delta = (nibble & 8) ? -IQ1M_DELTA : IQ1M_DELTA;
      decode_group_iq1(dl[l / 2], delta, iq1s_grid[index], y + 8 * l);
    }
  }
}

// ---- rows ------------------------------------------------------------------------------------

template <class Block, class DequantizeBlock>
void dequantize_by_blocks(const void* src, float* dst, int64_t n, DequantizeBlock dequantize_block) {
  const Block* blocks = static_cast<const Block*>(src);
  const int64_t n_blocks = n / kIQBlockValues;
  for (int64_t b = 0; b < n_blocks; b++) dequantize_block(blocks[b], dst + b * kIQBlockValues);
}

}  // namespace

#define RL_DEFINE_IQ_ROWS(name, Block)                                                   \
  void dequantize_row_##name(const void* src, float* dst, int64_t n) {                   \
    dequantize_by_blocks<Block>(src, dst, n, dequantize_block_##name);                   \
  }                                                                                      \
  float dot_row_##name(const void* src, const float* x, int64_t n) {                     \
    return dot_by_blocks<Block, kIQBlockValues>(src, x, n, dequantize_block_##name);     \
  }

RL_DEFINE_IQ_ROWS(iq2_xxs, BlockIQ2_XXS)
RL_DEFINE_IQ_ROWS(iq2_xs, BlockIQ2_XS)
RL_DEFINE_IQ_ROWS(iq2_s, BlockIQ2_S)
RL_DEFINE_IQ_ROWS(iq3_xxs, BlockIQ3_XXS)
RL_DEFINE_IQ_ROWS(iq3_s, BlockIQ3_S)
RL_DEFINE_IQ_ROWS(iq1_s, BlockIQ1_S)
RL_DEFINE_IQ_ROWS(iq1_m, BlockIQ1_M)

#undef RL_DEFINE_IQ_ROWS

}  // namespace rl
