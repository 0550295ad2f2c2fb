#include "server/job.h"

#include <algorithm>
#include <cmath>

namespace rl {

TokenLogprob token_logprob(int32_t token, std::span<const float> logits, int top_n) {
  float mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, v);
  double sum = 0;
  for (float v : logits) sum += std::exp((double)v - mx);
  const float log_z = mx + (float)std::log(sum);
  TokenLogprob t{token, logits[token] - log_z, {}};
  if (top_n > 0) {
    std::vector<int32_t> idx(logits.size());
    for (size_t i = 0; i < idx.size(); i++) idx[i] = (int32_t)i;
    const size_t n = std::min<size_t>(top_n, idx.size());
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (size_t i = 0; i < n; i++) t.top.emplace_back(idx[i], logits[idx[i]] - log_z);
  }
  return t;
}

}  // namespace rl
