// The fast tier's integer dot kernel, shared by its two forms (cpu/fast_dot.h):
//   - from decoded blocks (a prefill tile decodes its rows once for all its tokens);
//   - straight from the packed row (a decode step: each block decoded into registers and dotted at
//     once, so a weight is read once from memory and nothing is written back).
// Each type's decoder (fast_dot_k.cpp, fast_dot_iq.cpp, fast_dot_basic.cpp) is a struct with
//   static constexpr bool kSigned;   // false: every q >= 0 (Q4_K, Q5_K), multiplied as it is
//   static constexpr bool kHasMin;   // a min term (dmin, Q4_K and Q5_K)
//   static void header(const uint8_t* row, int64_t b, BlockHeader* h);   // scales of block b
//   template <class Emit> static void groups(const uint8_t* row, int64_t b, Emit&& emit);
// where groups calls emit(ib32, m, s) for ib32 = 0..7 in order: the 32 int8 weights q have the
// magnitudes m (unsigned, <= 128) and the signs of s (nonzero wherever m is; unused when !kSigned).
// Both forms run the same integer operations on the same values and accumulate in the same order,
// so a token's dot is bit-identical whichever form computed it (a batched decode step may take
// either, tests/cpu/fast_products_test.cpp).
#pragma once
#include "cpu/activation_quant.h"
#include "cpu/fast_dot.h"
#include "cpu/fast_simd.h"

namespace rl::cpu::kernel {

using namespace simd;

// The per-16 scale vector of values [32 ib32, 32 ib32 + 32), as madd_epi16 multiplies by it: eight
// copies of scale 2 ib32, then eight of scale 2 ib32 + 1. BlockHeader::scale holds the first
// halves' scales in its low lane and the second halves' in its high lane, so one in-lane shuffle
// picks word ib32 of each.
inline __m256i scale_vector(__m256i scales, int ib32) {
  return _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)((2 * ib32) | (2 * ib32 + 1) << 8)));
}

// BlockHeader::scale from 16 bytes (the 8 first halves' scales, then the 8 second halves'), each
// byte's value (unsigned) times 2 plus 1 when odd_scales (the IQ types' 2s + 1).
inline __m256i scales_from_bytes(__m128i bytes, bool odd_scales) {
  const __m256i s = _mm256_cvtepu8_epi16(bytes);
  return odd_scales ? _mm256_or_si256(_mm256_slli_epi16(s, 1), _mm256_set1_epi16(1)) : s;
}

// dd[t][i] = d_w * d_x of values [32 i, 32 i + 32) of block b, in memory: a group's factor is then one
// broadcast load instead of a lane permute of a register (3 % less CPU time on a prefill, PERF.md).
template <int kTokens>
inline void block_scales(__m256 wd, const ActivationQ8K* const* a, int64_t b, float (*dd)[8]) {
  for (int t = 0; t < kTokens; t++) _mm256_store_ps(dd[t], _mm256_mul_ps(wd, _mm256_loadu_ps(a[t][b].d)));
}

// acc[t] += d * (q . x[t]) over values [32 ib32, 32 ib32 + 32) of block b, q = m with the signs of
// s (kSigned) or m itself.
template <int kTokens, bool kSigned>
inline void accumulate_group(__m256i m, __m256i s, __m256i scale, const float (*dd)[8], const ActivationQ8K* const* a,
                             int64_t b, int ib32, __m256* acc) {
  for (int t = 0; t < kTokens; t++) {
    // |q| (<= 128) times x with q's sign: maddubs cannot saturate.
    __m256i x = load32(a[t][b].qs + 32 * ib32);
    if constexpr (kSigned) x = _mm256_sign_epi8(x, s);
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(m, x), scale);
    acc[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[t][ib32]), _mm256_cvtepi32_ps(p), acc[t]);
  }
}

// The min term of block b, per 32 values: dmin * d_x * m * (sum of the 32 activations it
// multiplies), into eight lanes (min: as BlockHeader::min; the pair sums of bsums come out of one
// madd).
template <int kTokens>
inline void accumulate_min(float dmin, __m256i min, const ActivationQ8K* const* a, int64_t b, __m256* mins) {
  const __m256 dm = _mm256_set1_ps(dmin);
  for (int t = 0; t < kTokens; t++) {
    const __m256i sums = _mm256_madd_epi16(load32(a[t][b].bsums), min);
    mins[t] = _mm256_fmadd_ps(_mm256_mul_ps(dm, _mm256_loadu_ps(a[t][b].d)), _mm256_cvtepi32_ps(sums), mins[t]);
  }
}

// The one dot of both forms: a row of n_blocks blocks against kTokens tokens. Src gives block b's
// scales (header: d, and dmin where kHasMin; min(b, h): the mins, asked only where dmin != 0) and
// its groups (groups: emit(ib32, m, s, scale) for ib32 = 0..7), from the packed row (PackedRow) or
// from decoded blocks (DecodedRow); the steps and their order are this function's, so a token's dot
// has the same bits in either form.
template <class Src, int kTokens>
void dot_blocks(const Src& src, const ActivationQ8K* const* a, int64_t n_blocks, float* out) {
  __m256 acc[kTokens], mins[kTokens];
  for (int t = 0; t < kTokens; t++) acc[t] = _mm256_setzero_ps(), mins[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; b++) {
    BlockHeader h;
    src.header(b, &h);
    alignas(32) float dd[kTokens][8];
    block_scales<kTokens>(h.d, a, b, dd);
    src.groups(b, h, [&](int ib32, __m256i m, __m256i s, __m256i scale) {
      accumulate_group<kTokens, Src::kSigned>(m, s, scale, dd, a, b, ib32, acc);
    });
    if constexpr (Src::kHasMin) {
      if (h.dmin != 0.0f) accumulate_min<kTokens>(h.dmin, src.min(b, h), a, b, mins);
    }
  }
  for (int t = 0; t < kTokens; t++) out[t] = hsum(acc[t]) - hsum(mins[t]);
}

// A packed row, each block decoded into registers (a decode step).
template <class Decoder>
struct PackedRow {
  static constexpr bool kSigned = Decoder::kSigned, kHasMin = Decoder::kHasMin;
  const uint8_t* row;
  void header(int64_t b, BlockHeader* h) const { Decoder::header(row, b, h); }
  __m256i min(int64_t, const BlockHeader& h) const { return h.min; }
  template <class Emit>
  void groups(int64_t b, const BlockHeader& h, Emit&& emit) const {
    Decoder::groups(row, b, [&](int ib32, __m256i m, __m256i s) { emit(ib32, m, s, scale_vector(h.scale, ib32)); });
  }
};

// A row's blocks decoded to memory by decode_block (a prefill tile). Where the type's q are never
// negative (Q4_K, Q5_K: !kSigned) the stored bytes are m itself, dotted without the activations'
// sign, as PackedRow dots them.
template <class Decoder>
struct DecodedRow {
  static constexpr bool kSigned = Decoder::kSigned, kHasMin = Decoder::kHasMin;
  const DecodedBlock* w;
  void header(int64_t b, BlockHeader* h) const {
    h->d = _mm256_loadu_ps(w[b].d);
    if constexpr (kHasMin) h->dmin = w[b].dmin;
  }
  __m256i min(int64_t b, const BlockHeader&) const { return load32(w[b].min); }
  template <class Emit>
  void groups(int64_t b, const BlockHeader&, Emit&& emit) const {
    for (int ib32 = 0; ib32 < 8; ib32++) {
      const __m256i q = load32(w[b].q + 32 * ib32);
      emit(ib32, kSigned ? _mm256_abs_epi8(q) : q, q, load32(w[b].scale[ib32]));
    }
  }
};

// f.template operator()<N>() for N = n_tokens (1 to 3), else 4: a call's token count as a constant.
template <class F>
void with_tokens(int n_tokens, F&& f) {
  switch (n_tokens) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 3: return f.template operator()<3>();
    default: return f.template operator()<4>();
  }
}

template <class Decoder>
void dot_row(const uint8_t* row, const ActivationQ8K* const* a, int n_tokens, int64_t n_blocks, float* out) {
  with_tokens(n_tokens, [&]<int N>() { dot_blocks<PackedRow<Decoder>, N>({row}, a, n_blocks, out); });
}

template <class Decoder>
void dot_decoded(const DecodedBlock* w, const ActivationQ8K* const* a, int n_tokens, int64_t n_blocks, float* out) {
  with_tokens(n_tokens, [&]<int N>() { dot_blocks<DecodedRow<Decoder>, N>({w}, a, n_blocks, out); });
}

// Block b of a row to the decoded form (prefill tiles).
template <class Decoder>
void decode_block(const uint8_t* row, int64_t b, DecodedBlock* out) {
  BlockHeader h;
  Decoder::header(row, b, &h);
  _mm256_storeu_ps(out->d, h.d);
  store32(out->min, Decoder::kHasMin ? h.min : _mm256_setzero_si256());
  out->dmin = Decoder::kHasMin ? h.dmin : 0.0f;
  for (int ib32 = 0; ib32 < 8; ib32++) store32(out->scale[ib32], scale_vector(h.scale, ib32));
  Decoder::groups(row, b, [&](int ib32, __m256i m, __m256i s) {
    store32(out->q + 32 * ib32, Decoder::kSigned ? _mm256_sign_epi8(m, s) : m);
  });
}

template <class Decoder>
constexpr FastKernels kernels_of() {
  return {decode_block<Decoder>, dot_row<Decoder>, dot_decoded<Decoder>};
}

}  // namespace rl::cpu::kernel
