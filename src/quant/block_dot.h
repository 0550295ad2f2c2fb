// Shared shape of every dot_row_<type>: dequantise one block at a time into a stack buffer and
// multiply-add it against x. No allocation; the row is read once.
//
// Summation order: kDotLanes = 16 independent fp32 partial sums (lane l takes the products whose
// index within the row is l mod 16), combined by a pairwise tree at the end. Several accumulators
// keep the FMA units busy; they are also more accurate than one running sum.
#pragma once
#include <cstdint>
#include <cstring>

// Put before a short fixed-count loop (16 or 32 values) in a block dequantiser: it keeps the loop
// a loop, so GCC's loop vectoriser handles it; fully unrolled, the straight-line code vectorised
// poorly (Q4_0 dequantisation measured 3-4x slower with GCC 12).
#define RL_VECTORIZE_LOOP _Pragma("GCC unroll 1")

namespace rl {

constexpr int kDotLanes = 16;

// The 16 lanes as four 16-byte vectors (GCC/Clang vector extension). 16 bytes on purpose: the
// block dequantisers store their stack buffer 16 bytes at a time, and a 32-byte load of data
// stored in two 16-byte halves cannot be forwarded from the store buffer (the stall made the Q4_0
// dot product 3x slower than its dequantisation).
typedef float Float4 __attribute__((vector_size(16)));

struct DotLanes {
  Float4 acc[kDotLanes / 4] = {};

  // lane (i mod 16) += a * b, for one product outside the vector loop.
  void add_one(int i, float a, float b) { acc[(i % kDotLanes) / 4][i % 4] += a * b; }

  // Pairwise: (0+2) + (1+3), then across the four lanes of the vector.
  float total() const {
    const Float4 v = (acc[0] + acc[2]) + (acc[1] + acc[3]);
    return (v[0] + v[2]) + (v[1] + v[3]);
  }
};

// values, x: [count], count a multiple of kDotLanes.
inline void accumulate_dot_lanes(DotLanes& lanes, const float* values, const float* x, int count) {
  for (int i = 0; i < count; i += kDotLanes) {
    for (int k = 0; k < kDotLanes / 4; k++) {
      Float4 v, w;
      std::memcpy(&v, values + i + 4 * k, 16);
      std::memcpy(&w, x + i + 4 * k, 16);
      lanes.acc[k] += v * w;
    }
  }
}

// src: n / kBlockValues blocks of type Block; x: [n]. dequantize_block(const Block&, float* [kBlockValues]).
template <class Block, int kBlockValues, class DequantizeBlock>
inline float dot_by_blocks(const void* src, const float* x, int64_t n, DequantizeBlock dequantize_block) {
  static_assert(kBlockValues % kDotLanes == 0, "a block must fill whole lanes");
  const Block* blocks = static_cast<const Block*>(src);
  DotLanes lanes;
  alignas(32) float values[kBlockValues];
  const int64_t n_blocks = n / kBlockValues;
  for (int64_t b = 0; b < n_blocks; b++) {
    dequantize_block(blocks[b], values);
    accumulate_dot_lanes(lanes, values, x + b * kBlockValues, kBlockValues);
  }
  return lanes.total();
}

}  // namespace rl
