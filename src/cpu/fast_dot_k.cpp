// Decoders of the K-quant super-blocks (Q4_K, Q5_K, Q6_K) to the fast tier's integer form
// (cpu/fast_kernel.h):
//   Q4_K/Q5_K: x = d*sc*q - dmin*m, q 4 or 5 bits unsigned, (sc, m) 6-bit per 32 values;
//   Q6_K:      x = d*sc*(q - 32), q 6 bits, sc int8 per 16 values (q - 32 is stored signed).
// Layouts: quant/blocks.h and the dequantisers in quant/quant_k.cpp.
#include "cpu/fast_dot.h"
#include "cpu/fast_kernel.h"
#include "quant/blocks.h"

namespace rl::cpu {
namespace {

using namespace simd;

// The 6-bit scales and mins of the 8 sub-blocks of a Q4_K/Q5_K block (12 packed bytes: sub-blocks
// 0..3 in the low 6 bits of bytes 0..3 / 4..7, sub-blocks 4..7 in bytes 8..11 plus the top 2
// bits of bytes 0..7).
void unpack_k4_scales(const uint8_t* packed, BlockHeader* h) {
  for (int s = 0; s < 4; s++) {
    const int16_t sc_lo = packed[s] & 63;
    const int16_t sc_hi = (int16_t)((packed[s + 8] & 0x0F) | ((packed[s] >> 6) << 4));
    h->scale[2 * s] = h->scale[2 * s + 1] = sc_lo;
    h->scale[2 * (s + 4)] = h->scale[2 * (s + 4) + 1] = sc_hi;
    h->min[s] = packed[s + 4] & 63;
    h->min[s + 4] = (int16_t)((packed[s + 8] >> 4) | ((packed[s + 4] >> 6) << 4));
  }
}

// Q4_K and Q5_K share everything but the fifth bit; AddHighBits::add(w, chunk, lo, hi) adds it.
template <class Block, class AddHighBits>
struct K4Decoder {
  static const Block& block(const uint8_t* row, int64_t b) { return reinterpret_cast<const Block*>(row)[b]; }
  static void header(const uint8_t* row, int64_t b, BlockHeader* h) {
    const Block& w = block(row, b);
    unpack_k4_scales(w.scales, h);
    const float d = half_to_f32(w.d);
    for (int i = 0; i < 8; i++) h->d[i] = d;
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
      emit(2 * chunk, lo);
      emit(2 * chunk + 1, hi);
    }
  }
};

struct NoHighBits {
  static void add(const BlockQ4_K&, int, __m256i&, __m256i&) {}
};

struct Q5HighBits {
  // Bit 2*chunk of qh[l] is the fifth bit of low-nibble value l, bit 2*chunk + 1 of high-nibble value l.
  static void add(const BlockQ5_K& w, int chunk, __m256i& lo, __m256i& hi) {
    const __m256i qh = load32(w.qh);
    const __m256i bit_lo = _mm256_set1_epi8((char)(1 << (2 * chunk)));
    const __m256i bit_hi = _mm256_set1_epi8((char)(2 << (2 * chunk)));
    const __m256i sixteen = _mm256_set1_epi8(16);
    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_lo), bit_lo), sixteen));
    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_hi), bit_hi), sixteen));
  }
};

struct Q6_KDecoder {
  static const BlockQ6_K& block(const uint8_t* row, int64_t b) { return reinterpret_cast<const BlockQ6_K*>(row)[b]; }
  static void header(const uint8_t* row, int64_t b, BlockHeader* h) {
    const BlockQ6_K& w = block(row, b);
    const float d = half_to_f32(w.d);
    for (int i = 0; i < 8; i++) h->d[i] = d, h->min[i] = 0;
    for (int s = 0; s < 16; s++) h->scale[s] = w.scales[s];
    h->dmin = 0.0f;
  }
  template <class Emit>
  static void groups(const uint8_t* row, int64_t b, Emit&& emit) {
    const BlockQ6_K& w = block(row, b);
    const __m256i low_nibble = _mm256_set1_epi8(0x0F), two_bits = _mm256_set1_epi8(3), offset = _mm256_set1_epi8(32);
    for (int half = 0; half < 2; half++) {
      // Per 128-value half: ql[l] low/high nibble = values l / l+64, ql[l+32] = values l+32 / l+96,
      // qh[l] bit pairs 0, 2, 4, 6 = the high bits of values l, l+32, l+64, l+96.
      const uint8_t* ql = w.ql + 64 * half;
      const __m256i qh = load32(w.qh + 32 * half);
      const __m256i ql0 = load32(ql), ql1 = load32(ql + 32);
      const __m256i low[4] = {_mm256_and_si256(ql0, low_nibble), _mm256_and_si256(ql1, low_nibble),
                              _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low_nibble),
                              _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low_nibble)};
      for (int k = 0; k < 4; k++) {
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), two_bits), 4);
        emit(4 * half + k, _mm256_sub_epi8(_mm256_or_si256(low[k], high), offset));
      }
    }
  }
};

}  // namespace

const FastKernels kQ4_KKernels = kernel::kernels_of<K4Decoder<BlockQ4_K, NoHighBits>>();
const FastKernels kQ5_KKernels = kernel::kernels_of<K4Decoder<BlockQ5_K, Q5HighBits>>();
const FastKernels kQ6_KKernels = kernel::kernels_of<Q6_KDecoder>();

}  // namespace rl::cpu
