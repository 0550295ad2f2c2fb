// Scans of a row of logits. argmax: the index of a row's largest value (greedy sampling, top-1 agreement): the lowest index among
// equal largest values (+0 and -0 are equal), NaNs never the largest (a row of NaNs gives 0).
#pragma once
#include <cstdint>
#include <span>

namespace rl {

// Throws rl::Error on an empty row.
int32_t argmax(std::span<const float> values);
// The first index from `from` on whose value is larger than x (NaNs never are); values.size() when
// none is.
size_t first_above(std::span<const float> values, size_t from, float x);

}  // namespace rl
