// Dequant<T>::chunk8 of the types that run only through the generic exact products (no tuned
// decode or prefill form): the legacy 32-value blocks Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4,
// Q3_K, IQ4_XS, and the codebook types IQ2_S, IQ3_XXS, IQ3_S and IQ1_S. Each value is formed with
// the CPU reference's float operations in its order (quant/quant_basic.cpp, quant_k.cpp,
// quant_iq.cpp), so get_rows returns the oracle's values bit for bit and the products differ from
// it only in the order of their double sums. Included by quant_device.cuh (its helpers and tables).
//
// Alignment: a row starts at a multiple of its block size from an allocation (or a 256-byte slot),
// so loads are as wide as the block size allows: Q4_1 (20), Q5_1 (24) and IQ4_XS (136) take 32-bit
// loads, Q4_0 and IQ4_NL (18), Q5_0 (22), Q3_K and IQ3_S (110), IQ2_S (82), IQ3_XXS (98) and IQ1_S
// (50) 16-bit ones, and MXFP4 (17) bytes only.
#pragma once

namespace rl::cuda {

// Eight bytes from any address.
__device__ __forceinline__ uint2 load8_a1(const uint8_t* p) {
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) lo |= (uint32_t)p[i] << (8 * i), hi |= (uint32_t)p[4 + i] << (8 * i);
  return make_uint2(lo, hi);
}

// The alignment an offset n from a 4-byte aligned address keeps (4, 2 or 1).
constexpr int alignment_of(int n) { return n % 4 == 0 ? 4 : n % 2 == 0 ? 2 : 1; }

// Eight bytes from an address aligned to kAlign (4, 2 or 1).
template <int kAlign>
__device__ __forceinline__ uint2 load8(const uint8_t* p) {
  if constexpr (kAlign >= 4) return load8_a4(p);
  else if constexpr (kAlign == 2) return load8_a2(p);
  else return load8_a1(p);
}

// Nibble i of eight packed bytes: the high ones for chunks k >= 2 of a 32-value nibble layout.
__device__ __forceinline__ int nibble8(uint2 qs, int i, int k) {
  const int v = byte8(qs, i);
  return k >= 2 ? v >> 4 : v & 0xF;
}

// Chunk c of a row of 32-value blocks, which keep value j in the low nibble of qs[j] and value
// j + 16 in the high nibble: chunk k (0..3) of its block is the nibbles (k >= 2: high) of
// qs[8 (k & 1) .. 8 (k & 1) + 7]. kQs: where qs starts in the block; the loads are as wide as the
// block size allows.
template <int kBytes, int kQs>
struct Chunk32 {
  const uint8_t* b;  // the block
  int k;
  uint2 qs;
  __device__ Chunk32(const uint8_t* row, int c) : b(row + (c >> 2) * kBytes), k(c & 3) {
    constexpr int kAlign = alignment_of(kBytes) < alignment_of(kQs) ? alignment_of(kBytes) : alignment_of(kQs);
    qs = load8<kAlign>(b + kQs + 8 * (k & 1));
  }
  __device__ int q(int i) const { return nibble8(qs, i, k); }  // the 4-bit value i of the chunk
  __device__ int index(int i) const { return 8 * k + i; }  // its place in the block
};

// x = (q - 8) * d
template <>
struct Dequant<GgmlType::Q4_0> {
  static constexpr int kValues = 32, kBytes = 18;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const Chunk32<kBytes, 2> k(row, c);
    const float d = half_bits_to_f32(load_u16(k.b));
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = small_int_to_float(k.q(i) - 8) * d;
  }
};

// x = q * d + m (q * d is exact, so a fused multiply-add rounds as the separate operations do).
template <>
struct Dequant<GgmlType::Q4_1> {
  static constexpr int kValues = 32, kBytes = 20;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const Chunk32<kBytes, 4> k(row, c);
    const uint32_t dm = load_u32(k.b);
    const float d = half_bits_to_f32((uint16_t)(dm & 0xFFFF)), m = half_bits_to_f32((uint16_t)(dm >> 16));
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = small_uint_to_float(k.q(i)) * d + m;
  }
};

// Q4_0 / Q4_1 plus a fifth bit: bit j of the little-endian 32-bit qh is bit 4 of value j.
__device__ __forceinline__ int fifth_bit(uint32_t qh, int j) { return (int)((qh >> j) & 1) << 4; }

// x = (q - 16) * d
template <>
struct Dequant<GgmlType::Q5_0> {
  static constexpr int kValues = 32, kBytes = 22;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const Chunk32<kBytes, 6> k(row, c);
    const float d = half_bits_to_f32(load_u16(k.b));
    const uint32_t qh = (uint32_t)load_u16(k.b + 2) | ((uint32_t)load_u16(k.b + 4) << 16);
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = small_int_to_float((k.q(i) | fifth_bit(qh, k.index(i))) - 16) * d;
  }
};

// x = q * d + m, q 5-bit
template <>
struct Dequant<GgmlType::Q5_1> {
  static constexpr int kValues = 32, kBytes = 24;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const Chunk32<kBytes, 8> k(row, c);
    const uint32_t dm = load_u32(k.b);
    const float d = half_bits_to_f32((uint16_t)(dm & 0xFFFF)), m = half_bits_to_f32((uint16_t)(dm >> 16));
    const uint32_t qh = load_u32(k.b + 4);
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = small_uint_to_float(k.q(i) | fifth_bit(qh, k.index(i))) * d + m;
  }
};

// x = d * kvalues_iq4nl[q]
template <>
struct Dequant<GgmlType::IQ4_NL> {
  static constexpr int kValues = 32, kBytes = 18;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const Chunk32<kBytes, 2> k(row, c);
    const float d = half_bits_to_f32(load_u16(k.b));
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = d * (float)g_kvalues_iq4nl[k.q(i)];
  }
};

// 2^(e - 128), half the E8M0 scale (the values are stored doubled); e = 0 and 1 give subnormals,
// which the device multiplies exactly (the build does not flush them).
__device__ __forceinline__ float e8m0_to_f32_half(uint32_t e) {
  return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// x = kvalues_mxfp4[q] * 2^(e - 128)
template <>
struct Dequant<GgmlType::MXFP4> {
  static constexpr int kValues = 32, kBytes = 17;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const Chunk32<kBytes, 1> k(row, c);
    const float d = e8m0_to_f32_half(k.b[0]);
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = (float)g_kvalues_mxfp4[k.q(i)] * d;
  }
};

// 16 sub-blocks of 16: x = (d * (scale6 - 32)) * q, q = low 2 bits - (high bit clear ? 4 : 0).
// Value v: half n = v/128, k = (v%128)/32, l = v%32: low bits (qs[32n + l] >> 2k) & 3, high bit
// (hmask[l] >> (4n + k)) & 1; sub-block s = v/16, whose scale has its low 4 bits in the nibbles of
// scales[0..7] (s >= 8: high nibbles of scales[s - 8]) and 2 high bits at scales[8 + s%4] >> 2(s/4).
template <>
struct Dequant<GgmlType::Q3_K> {
  static constexpr int kValues = 256, kBytes = 110;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int v0 = (c & 31) * 8;
    const int n = v0 >> 7, k = (v0 & 127) >> 5, l0 = v0 & 31, s = v0 >> 4;
    const uint8_t* sc = b + 96;
    const int low = s < 8 ? sc[s] & 0xF : sc[s - 8] >> 4;
    const int high = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
    const float dl = half_bits_to_f32(load_u16(b + 108)) * small_int_to_float((low | (high << 4)) - 32);
    const uint2 qs = load8_a2(b + 32 + 32 * n + l0);
    const uint2 hm = load8_a2(b + l0);
    const int bit = 4 * n + k;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const int q = ((byte8(qs, i) >> (2 * k)) & 3) - (((byte8(hm, i) >> bit) & 1) ? 0 : 4);
      out[i] = dl * small_int_to_float(q);
    }
  }
};

// 8 sub-blocks of 32: x = (d * (scale6 - 32)) * kvalues_iq4nl[q]; sub-block s keeps its values in
// qs[16 s .. 16 s + 15] in the 32-value nibble layout, its scale's low 4 bits in nibble s%2 of
// scales_l[s/2] and its high 2 bits at scales_h >> 2s.
template <>
struct Dequant<GgmlType::IQ4_XS> {
  static constexpr int kValues = 256, kBytes = 136;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int s = (c & 31) >> 2, k = c & 3;
    const uint32_t head = load_u32(b);  // d, scales_h
    const int lo = (b[4 + s / 2] >> (4 * (s % 2))) & 0xF, hi = (int)((head >> (16 + 2 * s)) & 3);
    const float dl = half_bits_to_f32((uint16_t)(head & 0xFFFF)) * small_int_to_float((lo | (hi << 4)) - 32);
    const uint2 qs = load8_a4(b + 8 + 16 * s + 8 * (k & 1));
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = dl * (float)g_kvalues_iq4nl[nibble8(qs, i, k)];
  }
};

// x = db * magnitude_j * (bit j of signs ? -1 : 1), the IQ2/IQ3 group decode (quant_iq.cpp).
__device__ __forceinline__ void signed8(float db, uint2 magnitudes, uint32_t signs, float* out) {
#pragma unroll
  for (int j = 0; j < 8; j++) out[j] = db * (float)byte8(magnitudes, j) * ((signs >> j) & 1 ? -1.f : 1.f);
}

// Like IQ2_XS with 10-bit grid indices (low 8 bits in qs[g], 2 high bits in qh[g/4]) and the 8
// sign bits of each group stored in full (qs[32 + g]).
template <>
struct Dequant<GgmlType::IQ2_S> {
  static constexpr int kValues = 256, kBytes = 82;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int g = c & 31, ib = g >> 2, l = g & 3;
    const float d = half_bits_to_f32(load_u16(b));
    const uint8_t s = b[74 + ib];
    const float db = d * (0.5f + (float)((l < 2) ? (s & 0xF) : (s >> 4))) * 0.25f;
    const int index = b[2 + g] | ((b[66 + ib] << (8 - 2 * l)) & 0x300);
    const uint64_t grid = g_iq2s_grid[index];
    signed8(db, make_uint2((uint32_t)grid, (uint32_t)(grid >> 32)), b[34 + g], out);
  }
};

// 8 groups of 32, each eight 4-value grid points (byte indices into iq3xxs_grid) and a 32-bit word
// of four 7-bit sign codes with the 4-bit scale on top: x = d*(0.5+s)*0.5 * grid * sign.
template <>
struct Dequant<GgmlType::IQ3_XXS> {
  static constexpr int kValues = 256, kBytes = 98;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int ib = (c & 31) >> 2, l = c & 3;
    const uint8_t* aux_p = b + 66 + 4 * ib;
    const uint32_t aux = (uint32_t)load_u16(aux_p) | ((uint32_t)load_u16(aux_p + 2) << 16);
    const float db = half_bits_to_f32(load_u16(b)) * (0.5f + (float)(aux >> 28)) * 0.5f;
    const uint16_t idx = load_u16(b + 2 + 8 * ib + 2 * l);
    const uint2 mags = make_uint2(g_iq3xxs_grid[idx & 0xFF], g_iq3xxs_grid[idx >> 8]);
    signed8(db, mags, g_ksigns_iq2xs[(aux >> (7 * l)) & 127], out);
  }
};

// 8 groups of 32: eight 4-value points of iq3s_grid (9-bit indices: low 8 bits in qs, the 9th in
// qh[ib]), 8 stored sign bits per group of 8, one 4-bit scale s per 32: x = d*(1+2s) * grid * sign.
template <>
struct Dequant<GgmlType::IQ3_S> {
  static constexpr int kValues = 256, kBytes = 110;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int ib = (c & 31) >> 2, l = c & 3;
    const int s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 0xF;
    const float db = half_bits_to_f32(load_u16(b)) * (float)(1 + 2 * s);
    const uint16_t idx = load_u16(b + 2 + 8 * ib + 2 * l);
    const int high = b[66 + ib];
    const int first = (idx & 0xFF) | ((high << (8 - 2 * l)) & 256);
    const int second = (idx >> 8) | ((high << (7 - 2 * l)) & 256);
    signed8(db, make_uint2(g_iq3s_grid[first], g_iq3s_grid[second]), b[74 + 4 * ib + l], out);
  }
};

// 8 groups of 32: four 11-bit iq1s_grid indices (low 8 bits in qs, 3 high bits per group in the
// 16-bit qh[ib], which also holds the 3-bit scale s and the delta's sign): x = d*(2s+1) * (grid ± 1/8).
template <>
struct Dequant<GgmlType::IQ1_S> {
  static constexpr int kValues = 256, kBytes = 50;
  __device__ static void chunk8(const uint8_t* row, int c, float* out) {
    const uint8_t* b = row + (c >> 5) * kBytes;
    const int ib = (c & 31) >> 2, l = c & 3;
    const uint32_t qh = load_u16(b + 34 + 2 * ib);
    const float dl = half_bits_to_f32(load_u16(b)) * (float)(2 * ((qh >> 12) & 7) + 1);
    const float delta = (qh & 0x8000) ? -0.125f : 0.125f;
    const uint64_t grid = g_iq1s_grid[b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
#pragma unroll
    for (int j = 0; j < 8; j++) out[j] = dl * ((float)(int8_t)((grid >> (8 * j)) & 0xFF) + delta);
  }
};

}  // namespace rl::cuda
