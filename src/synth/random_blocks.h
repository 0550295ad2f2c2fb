// Random but valid ggml blocks with a chosen spread: the payload bits (quant indices, grid
// indices, sign codes) are uniform random, and the scale fields are set so that the dequantised
// values have mean ~0 and the requested standard deviation. Nothing is quantised from fp32, so a
// model of any size is produced at the speed of the random number generator.
#pragma once
#include <cstdint>
#include <string>

#include "quant/quant.h"

namespace rl::synth {

// SplitMix64: tiny state, so every row gets its own generator seeded from (seed, tensor, row) and
// the bytes do not depend on how rows are split across threads or write chunks.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  void bytes(uint8_t* dst, size_t n);
  float uniform() { return (float)(next() >> 40) * 0x1p-24f; }  // [0, 1)
  int range(int lo, int hi) { return lo + (int)((next() >> 33) % (uint64_t)(hi - lo + 1)); }  // [lo, hi]
  float sign() { return (next() >> 63) ? -1.0f : 1.0f; }
  float normal();  // N(0, 1), Box-Muller

 private:
  uint64_t state_;
  bool has_spare_ = false;
  float spare_ = 0;
};

// A well-mixed 64-bit hash of a few integers (seeds per tensor and row).
uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c = 0);

// Types that fill_normal_row can produce.
bool can_generate(GgmlType type);
std::string generatable_type_names();  // "f32, f16, ..." for error messages

// Writes one row of n values (n a multiple of the type's block size) whose dequantised values are
// zero-mean with standard deviation `std` (random signs or mins that cancel the quant offset).
// F32/F16/BF16 rows are Gaussian; quantised rows are random valid blocks.
void fill_normal_row(GgmlType type, uint8_t* dst, int64_t n, float std, Rng& rng);

// Stores n given values in a float type (F32, F16 or BF16).
void store_float_row(GgmlType type, const float* values, int64_t n, uint8_t* dst);

// RMS of the dequantised values of random blocks generated with scale 1 (measured once per type
// with the reference dequantisation, then cached): the factor that turns a target std into the
// block scale.
double unit_rms(GgmlType type);

}  // namespace rl::synth
