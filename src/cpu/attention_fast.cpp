#include "cpu/attention_fast.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "cpu/fast_dot.h"
#include "cpu/fast_simd.h"
#include "cpu/ops.h"

namespace rl::cpu {
namespace {

constexpr int kMinSplitKeys = 256;  // shortest split: below it a task's fixed costs dominate
constexpr int kTasksPerThread = 4;  // splits are made until the pool has this many tasks a thread

// y += w·x over n values.
void axpy_f32(float w, const float* x, float* y, int n) {
  const __m256 wv = _mm256_set1_ps(w);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; i++) y[i] += w * x[i];
}

}  // namespace

void gated_attention_fast(ThreadPool& pool, std::span<const AttentionRow> rows, const float* q, const float* gate,
                          int n_head, int n_kv, int hd, float* out) {
  if (rows.empty()) return;
  if (n_kv <= 0 || n_head % n_kv != 0) fail("attention (fast): {} query heads over {} KV heads", n_head, n_kv);
  const int T = (int)rows.size(), group = n_head / n_kv;
  int max_keys = 0;
  for (const AttentionRow& r : rows) {
    if (r.n_keys < 1) fail("attention (fast): a query row that sees {} keys", r.n_keys);
    max_keys = std::max(max_keys, r.n_keys);
  }
  const int64_t base = (int64_t)T * n_kv;
  const int64_t want = (kTasksPerThread * (int64_t)pool.size() + base - 1) / base;
  const int n_splits = (int)std::clamp<int64_t>(want, 1, std::max(1, max_keys / kMinSplitKeys));
  const float scale = 1.0f / std::sqrt((float)hd);

  // Partials of (row, query head, split): the maximum score and the sum of exp(score - maximum),
  // and the weighted values.
  // Kept by the calling thread from call to call (a decode step's partials are 512 KiB at the 80B's
  // shape: allocated every layer, they would be mapped and unmapped every time).
  const size_t n_part = (size_t)T * n_head * n_splits;
  thread_local std::vector<float> part_m_store, part_l_store, part_acc_store;
  part_m_store.resize(n_part), part_l_store.resize(n_part), part_acc_store.resize(n_part * hd);
  float* const part_m = part_m_store.data();
  float* const part_l = part_l_store.data();
  float* const part_acc = part_acc_store.data();
  pool.run(base * n_splits, [&](int64_t task) {
    const int split = (int)(task % n_splits), t = (int)(task / n_splits / n_kv), kh = (int)(task / n_splits % n_kv);
    const AttentionRow& r = rows[t];
    // Split s of a row's keys: [n·s/ns, n·(s+1)/ns), empty when the row has fewer keys than splits.
    const int j0 = (int)((int64_t)split * r.n_keys / n_splits), j1 = (int)((int64_t)(split + 1) * r.n_keys / n_splits);
    const int n = j1 - j0;
    // Scratch of this thread (the pointers taken once: a thread_local's every use may go through
    // its initialisation check).
    thread_local std::vector<float> p_store, decoded_store;
    p_store.resize((size_t)group * std::max(n, 1));
    decoded_store.resize(hd);
    float* const p = p_store.data();
    float* const decoded = decoded_store.data();
    const int h0 = kh * group;
    const float* qh = q + ((size_t)t * n_head + h0) * hd;
    for (int j = 0; j < n; j++) {
      const float* key = r.k->read((size_t)(j0 + j), kh * hd, hd, decoded);
      for (int g = 0; g < group; g++) p[(size_t)g * n + j] = fast_dot_f32(qh + (size_t)g * hd, key, hd) * scale;
    }
    // The split's weighted values of head g at acc + g·n_splits·hd (its partials are n_splits apart).
    float* const acc = part_acc + (((size_t)t * n_head + h0) * n_splits + split) * hd;
    const size_t head_stride = (size_t)n_splits * hd;
    for (int g = 0; g < group; g++) {
      const size_t at = ((size_t)t * n_head + h0 + g) * n_splits + split;
      float* pg = p + (size_t)g * n;
      float m = -INFINITY, l = 0.0f;
      for (int j = 0; j < n; j++) m = std::max(m, pg[j]);
      for (int j = 0; j < n; j++) l += (pg[j] = std::exp(pg[j] - m));
      part_m[at] = m;
      part_l[at] = l;
      std::fill_n(acc + g * head_stride, hd, 0.0f);
    }
    for (int j = 0; j < n; j++) {
      const float* value = r.v->read((size_t)(j0 + j), kh * hd, hd, decoded);
      for (int g = 0; g < group; g++) axpy_f32(p[(size_t)g * n + j], value, acc + g * head_stride, hd);
    }
  });

  // The fold of each (row, head)'s splits: weights 2^... = exp(m_s - M), M the largest m_s (finite:
  // the last split of a row is never empty); then the gate.
  pool.run((int64_t)T * n_head, [&](int64_t rh) {
    const size_t first = (size_t)rh * n_splits;
    float mx = -INFINITY;
    for (int s = 0; s < n_splits; s++) mx = std::max(mx, part_m[first + s]);
    float* o = out + (size_t)rh * hd;
    std::fill_n(o, hd, 0.0f);
    float l = 0.0f;
    for (int s = 0; s < n_splits; s++) {
      const float w = part_l[first + s] > 0.0f ? std::exp(part_m[first + s] - mx) : 0.0f;
      l += w * part_l[first + s];
      if (w != 0.0f) axpy_f32(w, part_acc + (first + s) * hd, o, hd);
    }
    const float inv = 1.0f / l, *g = gate + (size_t)rh * hd;
    for (int i = 0; i < hd; i++) o[i] = o[i] * inv * sigmoid(g[i]);
  });
}

}  // namespace rl::cpu
