// Q6_K weights as the int8 tensor cores take them (matmul_q8.cu's mma-q8 of Q6_K): a lane's A
// fragment of one 32-value activation block, from the words the lane loads. Host and device code
// (constexpr, --expt-relaxed-constexpr), so a test checks the packing on the CPU against the
// reference dequantisation.
//
// Q6_K (ggml): a 256-value super-block is ql[128] (low 4 bits), qh[64] (top 2 bits), 16 int8
// scales (one per 16 values) at byte 192 and the fp16 d at 208, 210 bytes. Half n (values
// 128n..128n + 127) holds activation blocks 4n + g (g < 4): value l (< 32) of block g has its low
// bits in ql[64n + 32(g & 1) + l] (the high nibble for g ≥ 2), its top bits in bits 2g, 2g + 1 of
// qh[32n + l], and the scale sc[8n + 2g + l / 16]; the weight is d · scale · (q − 32).
//
// The m16n8k32 fragment layout (math_device.cuh, imma_16x8x32): lane (g, q) holds k = 4q..4q + 3
// and 16 + 4q..16 + 4q + 3 of its rows, here values l in the natural order, so each half of k has
// one scale: 4q..4q + 3 is the first 16 values' scale, 16 + 4q.. the second's.
#pragma once

#include <cstdint>

namespace rl::cuda {

// Four bytes 0..63 as the signed bytes q − 32 (no carry crosses a byte: the top three bits of a
// byte below 32 become 0xE0, of one from 32 up 0).
constexpr uint32_t q6k_signed(uint32_t v) { return (v & 0x1F1F1F1Fu) | ((~v & 0x20202020u) * 7u); }

// The words a lane (q = lane % 4) loads of half n of its row's super-block: ql at byte offsets
// 64n + 4q, 64n + 16 + 4q, 64n + 32 + 4q, 64n + 48 + 4q, and qh at 128 + 32n + 4q, 128 + 32n + 16 + 4q.
struct Q6kHalfWords {
  uint32_t ql[4];
  uint32_t qh[2];
};
constexpr int q6k_ql_offset(int n, int i, int q) { return 64 * n + 16 * i + 4 * q; }
constexpr int q6k_qh_offset(int n, int i, int q) { return 128 + 32 * n + 16 * i + 4 * q; }

// Activation block 4n + g of the half: `lo`, the signed values l = 4q..4q + 3 (k = 4q..); `hi`, l =
// 16 + 4q..16 + 4q + 3 (k = 16 + 4q..).
struct Q6kFragment {
  uint32_t lo, hi;
};
constexpr Q6kFragment q6k_fragment(const Q6kHalfWords& w, int g) {
  const int sh = g >= 2 ? 4 : 0;
  const uint32_t top0 = ((w.qh[0] >> (2 * g)) & 0x03030303u) << 4;
  const uint32_t top1 = ((w.qh[1] >> (2 * g)) & 0x03030303u) << 4;
  return {q6k_signed(((w.ql[2 * (g & 1)] >> sh) & 0x0F0F0F0Fu) | top0),
          q6k_signed(((w.ql[2 * (g & 1) + 1] >> sh) & 0x0F0F0F0Fu) | top1)};
}
// The scale byte of the first (second: + 1) 16 values of block 4n + g.
constexpr int q6k_scale_offset(int n, int g) { return 192 + 8 * n + 2 * g; }
constexpr int kQ6kBytes = 210, kQ6kD = 208;

}  // namespace rl::cuda
