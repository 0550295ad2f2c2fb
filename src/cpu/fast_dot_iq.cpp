// Decoders of the IQ codebook types of the project's files (IQ2_XXS, IQ2_XS, IQ1_M) to the fast
// tier's integer form (cpu/fast_kernel.h). Each group of 8 weights is a grid point
// (8 bytes, quant/iq_grids.h); four groups make one 32-byte vector:
//   IQ2: magnitudes with the group's signs applied, x = d * (2s + 1) / 8 * value;
//   IQ1: 8 * grid + the delta's sign (grid bytes are -1, 0, +1), so the grid's shift by ±1/8 is
//        exact in integers: x = d * (2s + 1) * (grid ± 1/8) = d * (2s + 1) / 8 * value.
// Layouts: quant/blocks_iq.h and the dequantisers in quant/quant_iq.cpp.
#include <cstring>

#include "quant/blocks.h"
#include "cpu/fast_dot.h"
#include "cpu/fast_kernel.h"
#include "quant/blocks_iq.h"
#include "quant/iq_grids.h"

namespace rl::cpu {
namespace {

using namespace simd;

// The 8-bit sign masks of ksigns_iq2xs as byte multipliers: byte j = -1 where bit j is set, +1
// elsewhere (for _mm256_sign_epi8).
struct SignBytes {
  uint64_t of[128];
  SignBytes() {
    for (int k = 0; k < 128; k++) {
      uint64_t v = 0;
      for (int j = 0; j < 8; j++) v |= (uint64_t)((ksigns_iq2xs[k] >> j) & 1 ? 0xFF : 0x01) << (8 * j);
      of[k] = v;
    }
  }
};
const SignBytes kSignBytes;

inline __m256i four_points(uint64_t p0, uint64_t p1, uint64_t p2, uint64_t p3) {
  return _mm256_set_epi64x((int64_t)p3, (int64_t)p2, (int64_t)p1, (int64_t)p0);
}

void set_super_scale(float d, BlockHeader* h) { h->d = _mm256_set1_ps(d * 0.125f); }

// 16 4-bit scales s, 8 bytes of two (byte i: values 32 i .. 32 i + 15 in the low nibble, 32 i + 16
// .. 32 i + 31 in the high one), to the per-16 scales 2s + 1 (BlockHeader::scale: the low nibbles'
// to the low lane).
__m256i nibble_scales(uint64_t packed) {
  const __m128i v = _mm_cvtsi64_si128((int64_t)packed), low_nibble = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(v, low_nibble), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low_nibble);
  return kernel::scales_from_bytes(_mm_unpacklo_epi64(lo, hi), true);
}

struct IQ2_XXSDecoder {
  static constexpr bool kSigned = true, kHasMin = false;
  static const BlockIQ2_XXS& block(const uint8_t* row, int64_t b) {
    return reinterpret_cast<const BlockIQ2_XXS*>(row)[b];
  }
  // Per 32 values: 4 grid indices (bytes), then 4 x 7 sign bits and the 4-bit scale s in the top bits.
  static void header(const uint8_t* row, int64_t b, BlockHeader* h) {
    const BlockIQ2_XXS& w = block(row, b);
    set_super_scale(half_to_f32(w.d), h);
    const uint8_t* q = reinterpret_cast<const uint8_t*>(w.qs);
    uint64_t packed = 0;  // one scale per 32 values: both nibbles of its byte
    for (int ib32 = 0; ib32 < 8; ib32++) packed |= (uint64_t)((load_u32(q + 8 * ib32 + 4) >> 28) * 0x11) << (8 * ib32);
    h->scale = nibble_scales(packed);
  }
  template <class Emit>
  static void groups(const uint8_t* row, int64_t b, Emit&& emit) {
    const uint8_t* q = reinterpret_cast<const uint8_t*>(block(row, b).qs);
    for (int ib32 = 0; ib32 < 8; ib32++, q += 8) {
      const uint32_t idx = load_u32(q), ss = load_u32(q + 4);
      emit(ib32,
           four_points(iq2xxs_grid[idx & 255], iq2xxs_grid[(idx >> 8) & 255], iq2xxs_grid[(idx >> 16) & 255],
                       iq2xxs_grid[idx >> 24]),
           four_points(kSignBytes.of[ss & 127], kSignBytes.of[(ss >> 7) & 127], kSignBytes.of[(ss >> 14) & 127],
                       kSignBytes.of[(ss >> 21) & 127]));
    }
  }
};

struct IQ2_XSDecoder {
  static constexpr bool kSigned = true, kHasMin = false;
  static const BlockIQ2_XS& block(const uint8_t* row, int64_t b) { return reinterpret_cast<const BlockIQ2_XS*>(row)[b]; }
  // One 4-bit scale per 16 values.
  static void header(const uint8_t* row, int64_t b, BlockHeader* h) {
    const BlockIQ2_XS& w = block(row, b);
    set_super_scale(half_to_f32(w.d), h);
    uint64_t packed;
    std::memcpy(&packed, w.scales, sizeof(packed));
    h->scale = nibble_scales(packed);
  }
  // Per group of 8: 9-bit grid index, 7-bit sign index.
  template <class Emit>
  static void groups(const uint8_t* row, int64_t b, Emit&& emit) {
    const BlockIQ2_XS& w = block(row, b);
    for (int ib32 = 0; ib32 < 8; ib32++) {
      const uint16_t* q = w.qs + 4 * ib32;
      emit(ib32,
           four_points(iq2xs_grid[q[0] & 511], iq2xs_grid[q[1] & 511], iq2xs_grid[q[2] & 511], iq2xs_grid[q[3] & 511]),
           four_points(kSignBytes.of[q[0] >> 9], kSignBytes.of[q[1] >> 9], kSignBytes.of[q[2] >> 9],
                       kSignBytes.of[q[3] >> 9]));
    }
  }
};

struct IQ1_MDecoder {
  static constexpr bool kSigned = true, kHasMin = false;
  static const BlockIQ1_M& block(const uint8_t* row, int64_t b) { return reinterpret_cast<const BlockIQ1_M*>(row)[b]; }
  // 3-bit scales per 16 values, the fp16 super-scale in the top nibbles of the four scale words.
  static void header(const uint8_t* row, int64_t b, BlockHeader* h) {
    uint16_t words[4];
    std::memcpy(words, block(row, b).scales, sizeof(words));
    const uint16_t d_bits = (uint16_t)((words[0] >> 12) | ((words[1] >> 8) & 0x00f0) | ((words[2] >> 4) & 0x0f00) |
                                       (words[3] & 0xf000));
    set_super_scale(half_to_f32(d_bits), h);
    // Word w holds the scales of values 64 w .. 64 w + 63 in bits 0..11, three bits each.
    uint64_t packed = 0;
    for (int w = 0; w < 4; w++)
      packed |= (uint64_t)((words[w] & 7) | ((words[w] >> 3) & 7) << 4 | ((words[w] >> 6) & 7) << 8 |
                           ((words[w] >> 9) & 7) << 12)
                << (16 * w);
    h->scale = nibble_scales(packed);
  }
  template <class Emit>
  static void groups(const uint8_t* row, int64_t b, Emit&& emit) {
    const BlockIQ1_M& w = block(row, b);
    const __m256i eight = _mm256_set1_epi8(8), one = _mm256_set1_epi8(1);
    // The delta signs of groups 0..3 (bits 3 and 7 of qh[0], then of qh[1]) spread over their 8
    // bytes each: qh[0] to the low lane, qh[1] to the high one, one bit tested per group.
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                            1, 1, 1, 1, 1, 1);
    const __m256i delta_bit = _mm256_setr_epi8(8, 8, 8, 8, 8, 8, 8, 8, -128, -128, -128, -128, -128, -128, -128, -128,
                                               8, 8, 8, 8, 8, 8, 8, 8, -128, -128, -128, -128, -128, -128, -128, -128);
    for (int ib32 = 0; ib32 < 8; ib32++) {
      const uint32_t qs = load_u32(w.qs + 4 * ib32);
      uint16_t qh;
      std::memcpy(&qh, w.qh + 2 * ib32, sizeof(qh));
      // Group l: index qs byte l plus the 3 low bits of qh nibble l.
      const __m256i points = four_points(iq1s_grid[(qs & 0xff) | ((qh & 7) << 8)],
                                         iq1s_grid[((qs >> 8) & 0xff) | ((qh >> 4) & 7) << 8],
                                         iq1s_grid[((qs >> 16) & 0xff) | ((qh >> 8) & 7) << 8],
                                         iq1s_grid[(qs >> 24) | ((qh >> 12) & 7) << 8]);
      const __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi16((short)qh), spread);
      const __m256i negative = _mm256_cmpeq_epi8(_mm256_and_si256(h, delta_bit), delta_bit);
      // 8 * grid plus the group's delta sign (-1 where negative, else +1): values in [-9, 9].
      const __m256i q = _mm256_add_epi8(_mm256_sign_epi8(eight, points), _mm256_or_si256(negative, one));
      emit(ib32, _mm256_abs_epi8(q), q);
    }
  }
};

}  // namespace

const FastKernels kIQ2_XXSKernels = kernel::kernels_of<IQ2_XXSDecoder>();
const FastKernels kIQ2_XSKernels = kernel::kernels_of<IQ2_XSDecoder>();
const FastKernels kIQ1_MKernels = kernel::kernels_of<IQ1_MDecoder>();

}  // namespace rl::cpu
