// The numeric tier a backend computes in (--numerics). exact: the oracle's arithmetic (fp32
// values, sums in double), the project's ground truth. fast: 8-bit quantised activations with
// integer dot products and fp32 accumulation, as llama.cpp's own kernels compute
// (docs/cpu-fast.md); its accuracy bar is llama.cpp's native path against llama.cpp's f32 one.
#pragma once
#include <optional>
#include <string_view>

namespace rl {

enum class Numerics { kFast, kExact };

inline const char* numerics_name(Numerics n) { return n == Numerics::kFast ? "fast" : "exact"; }

inline std::optional<Numerics> parse_numerics(std::string_view s) {
  if (s == "fast") return Numerics::kFast;
  if (s == "exact") return Numerics::kExact;
  return std::nullopt;
}

}  // namespace rl
