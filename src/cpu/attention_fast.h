// The fast tier's attention core on the CPU (docs/cpu-fast.md): for each query row (a token of one
// sequence), out = softmax(q·Kᵀ / √hd)·V · sigmoid(gate) over its sequence's cache rows
// 0 .. n_keys - 1, query head h on KV head h / (n_head / n_kv), in fp32 with AVX2 (the oracle's
// own core, in forward.cpp, sums in double and reads each key row once per query head).
//
// A task takes one KV head of one row and a split of its keys: each key and value row is read
// (decoded from the cache's type) once for all the query heads that share the KV head; the
// split's scores, its softmax (maximum and sum) and its weighted values are kept as a partial,
// and the partials of a head are folded afterwards (flash-decoding). A row is split only as far
// as the pool needs tasks (a decode step has a task per KV head otherwise: 2 for the 80B), each
// split at least kMinSplitKeys keys.
//
// Accuracy: fp32 throughout; a score's dot product over hd values and a split's sums over its keys
// round with u = 2^-24 per operation, ~u·√n relative for n terms of one sign: ~1e-6 relative RMS at
// the lengths a split holds.
#pragma once
#include <span>

#include "cpu/kv_cache.h"
#include "cpu/thread_pool.h"

namespace rl::cpu {

// A query row's cache (its sequence's keys and values of the layer) and how many of its rows it
// sees (causal: its position + 1).
struct AttentionRow {
  const KvRows* k;
  const KvRows* v;
  int n_keys;
};

// q, gate, out: [rows][n_head][hd]. n_head a multiple of n_kv; every row sees at least one key.
void gated_attention_fast(ThreadPool& pool, std::span<const AttentionRow> rows, const float* q, const float* gate,
                          int n_head, int n_kv, int hd, float* out);

}  // namespace rl::cpu
