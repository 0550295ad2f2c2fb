// Decoders of the K-quant super-blocks (Q4_K, Q5_K, Q6_K) to the fast tier's integer form
// (cpu/fast_kernel.h):
//   Q4_K/Q5_K: x = d*sc*q - dmin*m, q 4 or 5 bits unsigned, (sc, m) 6-bit per 32 values;
//   Q6_K:      x = d*sc*(q - 32), q 6 bits, sc int8 per 16 values (q - 32 is stored signed).
// Layouts: quant/blocks.h and the dequantisers in quant/quant_k.cpp.
#include <cstring>

#include "cpu/fast_dot.h"
#include "cpu/fast_kernel.h"
#include "quant/blocks.h"

namespace rl::cpu {
namespace {

using namespace simd;

// The 6-bit scales and mins of the 8 sub-blocks of a Q4_K/Q5_K block (12 packed bytes: sub-blocks
// 0..3 in the low 6 bits of bytes 0..3 / 4..7, sub-blocks 4..7 in bytes 8..11 plus the top 2
// bits of bytes 0..7), unpacked four bytes at a time: the scales once in each lane (a sub-block's
// two halves share one), the mins each twice (BlockHeader::min).
void unpack_k4_scales(const uint8_t* packed, BlockHeader* h) {
  uint32_t u[3];
  std::memcpy(u, packed, sizeof(u));
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  const uint32_t scales_lo = u[0] & kLow6, mins_lo = u[1] & kLow6;
  const uint32_t scales_hi = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  const uint32_t mins_hi = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  const __m128i scales = _mm_cvtsi64_si128((int64_t)(((uint64_t)scales_hi << 32) | scales_lo));
  const __m128i mins = _mm_cvtsi64_si128((int64_t)(((uint64_t)mins_hi << 32) | mins_lo));
  h->scale = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scales));
  h->min = kernel::scales_from_bytes(_mm_unpacklo_epi8(mins, mins), false);
}

// Bit `from` of every byte to bit `to`, by a 16-bit shift (other bits move too, some across a byte
// boundary; the caller masks).
__m256i shift_bit(__m256i v, int from, int to) {
  return from <= to ? _mm256_slli_epi16(v, to - from) : _mm256_srli_epi16(v, from - to);
}

// Q4_K and Q5_K share everything but the fifth bit; AddHighBits::add(w, chunk, lo, hi) adds it.
template <class Block, class AddHighBits>
struct K4Decoder {
  static constexpr bool kSigned = false, kHasMin = true;
  static const Block& block(const uint8_t* row, int64_t b) { return reinterpret_cast<const Block*>(row)[b]; }
  static void header(const uint8_t* row, int64_t b, BlockHeader* h) {
    const Block& w = block(row, b);
    unpack_k4_scales(w.scales, h);
    h->d = _mm256_set1_ps(half_to_f32(w.d));
    h->dmin = half_to_f32(w.dmin);
  }
  template <class Emit>
  static void groups(const uint8_t* row, int64_t b, Emit&& emit) {
    const Block& w = block(row, b);
    const __m256i low_nibble = _mm256_set1_epi8(0x0F);
    for (int chunk = 0; chunk < 4; chunk++) {
      // 32 bytes: low nibbles are sub-block 2*chunk, high nibbles sub-block 2*chunk + 1.
      const __m256i q = load32(w.qs + 32 * chunk);
      __m256i lo = _mm256_and_si256(q, low_nibble);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low_nibble);
      AddHighBits::add(w, chunk, lo, hi);
      emit(2 * chunk, lo, lo);
      emit(2 * chunk + 1, hi, hi);
    }
  }
};

struct NoHighBits {
  static void add(const BlockQ4_K&, int, __m256i&, __m256i&) {}
};

struct Q5HighBits {
  // Bit 2*chunk of qh[l] is the fifth bit of low-nibble value l, bit 2*chunk + 1 of high-nibble value l.
  // Each bit is shifted to bit 4 and masked: the 16-bit shifts (at most 4 left, 3 right) carry
  // bits across a byte boundary only into bits the mask clears.
  static void add(const BlockQ5_K& w, int chunk, __m256i& lo, __m256i& hi) {
    const __m256i qh = load32(w.qh), sixteen = _mm256_set1_epi8(16);
    lo = _mm256_or_si256(lo, _mm256_and_si256(shift_bit(qh, 2 * chunk, 4), sixteen));
    hi = _mm256_or_si256(hi, _mm256_and_si256(shift_bit(qh, 2 * chunk + 1, 4), sixteen));
  }
};

struct Q6_KDecoder {
  static constexpr bool kSigned = true, kHasMin = false;
  static const BlockQ6_K& block(const uint8_t* row, int64_t b) { return reinterpret_cast<const BlockQ6_K*>(row)[b]; }
  static void header(const uint8_t* row, int64_t b, BlockHeader* h) {
    const BlockQ6_K& w = block(row, b);
    h->d = _mm256_set1_ps(half_to_f32(w.d));
    // scales[k] for values 16k..16k+15: the even k to the low lane, the odd to the high one.
    const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales));
    h->scale = _mm256_cvtepi8_epi16(
        _mm_shuffle_epi8(scales, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)));
  }
  template <class Emit>
  static void groups(const uint8_t* row, int64_t b, Emit&& emit) {
    const BlockQ6_K& w = block(row, b);
    const __m256i low_nibble = _mm256_set1_epi8(0x0F), high_bits = _mm256_set1_epi8(0x30), offset = _mm256_set1_epi8(32);
    for (int half = 0; half < 2; half++) {
      // Per 128-value half: ql[l] low/high nibble = values l / l+64, ql[l+32] = values l+32 / l+96,
      // qh[l] bit pairs 0, 2, 4, 6 = the high bits of values l, l+32, l+64, l+96 (each pair shifted
      // to bits 4-5 and masked: what crosses a byte in the 16-bit shift is masked off).
      const uint8_t* ql = w.ql + 64 * half;
      const __m256i qh = load32(w.qh + 32 * half);
      const __m256i ql0 = load32(ql), ql1 = load32(ql + 32);
      const __m256i low[4] = {_mm256_and_si256(ql0, low_nibble), _mm256_and_si256(ql1, low_nibble),
                              _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low_nibble),
                              _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low_nibble)};
      for (int k = 0; k < 4; k++) {
        const __m256i high = _mm256_and_si256(shift_bit(qh, 2 * k, 4), high_bits);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low[k], high), offset);
        emit(4 * half + k, _mm256_abs_epi8(q), q);
      }
    }
  }
};

}  // namespace

const FastKernels kQ4_KKernels = kernel::kernels_of<K4Decoder<BlockQ4_K, NoHighBits>>();
const FastKernels kQ5_KKernels = kernel::kernels_of<K4Decoder<BlockQ5_K, Q5HighBits>>();
const FastKernels kQ6_KKernels = kernel::kernels_of<Q6_KDecoder>();

}  // namespace rl::cpu
