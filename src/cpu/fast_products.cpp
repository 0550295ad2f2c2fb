// The fast tier's products. Each product's activations are quantised once per token; the work is
// then split into tiles of weight rows, and a tile decodes its rows once (cpu/fast_dot.h) and
// dots them with every token (the decoded tile stays in L1/L2 while the tokens of a prefill pass).
// A batch of products (the selected experts of a decode step) is one set of tiles, so the pool
// spreads experts x rows over its threads instead of running the small products one by one.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/activation_quant.h"
#include "cpu/fast_dot.h"
#include "cpu/ops.h"
#include "cpu/products.h"

namespace rl::cpu {
namespace {

// Rows per task, as the oracle's tile: 16 decoded rows of 2,048 values are about 70 KiB (L2), and one
// expert of the fixtures is 16 tasks, so a decode step's 10 experts give the pool 160 (not tuned
// by measurement).
constexpr int64_t kRowTile = 16;
// The products of a batch of at most kDotTokens tokens (a decode step's) read in place (tuned,
// F32 and F16 rows) take tiles of up to kMaxDecodeTile rows, about kTilesPerThread a thread: every tile is one fetch-and-add on the
// pool's task counter, which all threads share, and a tile of 16 rows of 2,048 Q4_K values is about
// a microsecond, so at 16 threads the counter's cache line would be taken every few dozen
// nanoseconds.
constexpr int64_t kMaxDecodeTile = 128;
constexpr int64_t kTilesPerThread = 32;
// Below this many multiply-adds a batch runs on the calling thread: waking the pool costs more.
constexpr int64_t kMinParallelWork = 1 << 15;

// How one product's rows are dotted.
enum class RowPath {
  kDecoded,      // tuned type: rows decoded to the integer form, 8-bit activations
  kF32,          // F32 rows in place, fp32 activations
  kF16,          // F16 rows converted on the fly, fp32 activations
  kDequantised,  // any other type (or fp32 inputs asked for): the reference dequantiser, fp32
};

struct PreparedJob {
  const ProductJob* job;
  RowPath path;
  const FastKernels* kernels = nullptr;
  const ActivationQ8K* acts = nullptr;  // [n_tokens][n_in / 256] when kDecoded (maybe an earlier job's)
  int64_t first_tile, n_tiles;
  int64_t tile_rows;
};

// A batch's preparation, kept by each calling thread from one batch to the next so a decode
// step allocates nothing once the buffers have grown to its largest batch.
struct BatchScratch {
  std::vector<PreparedJob> prepared;       // [jobs]
  std::vector<size_t> acts_offset;         // [jobs]: into acts (a shared input: the first job's)
  std::vector<char> shared;                // [jobs]: the input is an earlier job's
  std::vector<ActivationQ8K> acts;         // every decoded job's quantised activations, in job order
};

// Whether a job takes the decode step's larger tiles (kMaxDecodeTile).
bool decode_tiled(const PreparedJob& p) { return p.job->n_tokens <= kDotTokens && p.path != RowPath::kDequantised; }

RowPath row_path(const TensorView& W, bool quantize_inputs) {
  if (W.type == GgmlType::F32) return RowPath::kF32;
  if (W.type == GgmlType::F16) return RowPath::kF16;
  if (quantize_inputs && fast_kernels(W.type) && W.row_length() % 256 == 0) return RowPath::kDecoded;
  return RowPath::kDequantised;
}

// Rows [r0, r0 + nr) of one product, for every token.
void run_tile(const PreparedJob& p, int64_t r0, int64_t nr) {
  const TensorView& W = p.job->W;
  const int64_t n_in = W.row_length(), n_out = W.n_rows();
  const int n_tokens = p.job->n_tokens;
  if (p.path == RowPath::kDecoded) {
    const int64_t n_blocks = n_in / 256;
    if (n_tokens <= kDotTokens) {
      // A decode step: each row is read once, its blocks decoded into registers and dotted.
      const ActivationQ8K* act[kDotTokens];
      for (int t = 0; t < n_tokens; t++) act[t] = p.acts + (size_t)t * n_blocks;
      for (int64_t r = 0; r < nr; r++) {
        float dots[kDotTokens];
        p.kernels->dot_row(W.row(r0 + r), act, n_tokens, n_blocks, dots);
        for (int t = 0; t < n_tokens; t++) p.job->out[(int64_t)t * n_out + r0 + r] = dots[t];
      }
      return;
    }
    // A prefill: the tile's rows decoded once, then dotted with every token.
    thread_local std::vector<DecodedBlock> decoded;  // [nr][n_blocks]
    decoded.resize((size_t)(nr * n_blocks));
    for (int64_t r = 0; r < nr; r++)
      for (int64_t b = 0; b < n_blocks; b++) p.kernels->decode(W.row(r0 + r), b, &decoded[(size_t)(r * n_blocks + b)]);
    for (int t0 = 0; t0 < n_tokens; t0 += kDotTokens) {
      const int nt = std::min(kDotTokens, n_tokens - t0);
      const ActivationQ8K* act[kDotTokens];
      for (int t = 0; t < nt; t++) act[t] = p.acts + (size_t)(t0 + t) * n_blocks;
      for (int64_t r = 0; r < nr; r++) {
        float dots[kDotTokens];
        p.kernels->dot_decoded(&decoded[(size_t)(r * n_blocks)], act, nt, n_blocks, dots);
        for (int t = 0; t < nt; t++) p.job->out[(int64_t)(t0 + t) * n_out + r0 + r] = dots[t];
      }
    }
    return;
  }
  // fp32 activations; other types' rows dequantised once per tile (quant/quant.h reference).
  thread_local std::vector<float> rows;
  if (p.path == RowPath::kDequantised) {
    rows.resize((size_t)(nr * n_in));
    const DequantizeRowFn dequantize = quant_type(W.type).dequantize_row;
    for (int64_t r = 0; r < nr; r++) dequantize(W.row(r0 + r), rows.data() + r * n_in, n_in);
  }
  for (int t = 0; t < n_tokens; t++) {
    const float* xt = p.job->x + (int64_t)t * n_in;
    float* o = p.job->out + (int64_t)t * n_out + r0;
    for (int64_t r = 0; r < nr; r++) {
      const uint8_t* row = W.row(r0 + r);
      switch (p.path) {
        case RowPath::kF32: o[r] = fast_dot_f32(reinterpret_cast<const float*>(row), xt, n_in); break;
        case RowPath::kF16: o[r] = fast_dot_f16(reinterpret_cast<const uint16_t*>(row), xt, n_in); break;
        default: o[r] = fast_dot_f32(rows.data() + r * n_in, xt, n_in); break;
      }
    }
  }
}

// A job's fp32_input: fp32 activations for every weight type (dequantised rows where the type's
// tuned kernel takes 8-bit ones).
void run_batch(ThreadPool& pool, std::span<const ProductJob> jobs) {
  thread_local BatchScratch scratch;
  std::vector<PreparedJob>& prepared = scratch.prepared;
  prepared.resize(jobs.size());
  scratch.acts_offset.resize(jobs.size());
  scratch.shared.resize(jobs.size());
  // First the paths and where each job's activations go, so the buffer is sized once.
  int64_t n_tiles = 0, work = 0, decode_rows = 0;
  size_t n_acts = 0;
  const PreparedJob* last_quantised = nullptr;  // the last job whose input gets quantised
  for (size_t j = 0; j < jobs.size(); j++) {
    PreparedJob& p = prepared[j];
    const ProductJob& job = jobs[j];
    const int64_t n_in = job.W.row_length();
    p.job = &job;
    p.path = row_path(job.W, !job.fp32_input);
    p.kernels = nullptr;
    p.acts = nullptr;
    if (p.path == RowPath::kDecoded) {
      p.kernels = fast_kernels(job.W.type);
      // Jobs in a row on one input (a gate and an up product; a decode step's experts, which all
      // read the token's row) quantise it once.
      const PreparedJob* prev = last_quantised;
      if (prev && prev->job->x == job.x && prev->job->n_tokens == job.n_tokens && prev->job->W.row_length() == n_in) {
        scratch.acts_offset[j] = scratch.acts_offset[(size_t)(prev - prepared.data())];  // its quantised input
        scratch.shared[j] = true;
      } else {
        scratch.acts_offset[j] = n_acts;
        scratch.shared[j] = false;
        n_acts += (size_t)(n_in / 256 * job.n_tokens);
        last_quantised = &p;
      }
    }
    decode_rows += decode_tiled(p) ? job.W.n_rows() : 0;
    work += n_in * job.W.n_rows() * job.n_tokens;
  }
  // Tiles: kRowTile rows, or, for the decode step's jobs, rows enough for about kTilesPerThread
  // tiles a thread (a multiple of kRowTile, at most kMaxDecodeTile).
  const int64_t decode_tile = std::clamp(decode_rows / (kTilesPerThread * pool.size()) / kRowTile * kRowTile,
                                         kRowTile, kMaxDecodeTile);
  for (PreparedJob& p : prepared) {
    p.tile_rows = decode_tiled(p) ? decode_tile : kRowTile;
    p.first_tile = n_tiles;
    p.n_tiles = (p.job->W.n_rows() + p.tile_rows - 1) / p.tile_rows;
    n_tiles += p.n_tiles;
  }
  if (scratch.acts.size() < n_acts) scratch.acts.resize(n_acts);
  for (size_t j = 0; j < jobs.size(); j++) {
    PreparedJob& p = prepared[j];
    if (p.path != RowPath::kDecoded) continue;
    ActivationQ8K* acts = scratch.acts.data() + scratch.acts_offset[j];
    p.acts = acts;
    if (scratch.shared[j]) continue;  // an earlier job's input, already quantised there
    const ProductJob& job = jobs[j];
    const int64_t n_in = job.W.row_length(), n_blocks = n_in / 256;
    for (int t = 0; t < job.n_tokens; t++)
      quantize_activation_q8k(job.x + (int64_t)t * n_in, n_in, acts + (size_t)t * n_blocks);
  }
  auto tile = [&](int64_t i) {
    // The job owning tile i: the last whose first tile is <= i.
    const auto it = std::upper_bound(prepared.begin(), prepared.end(), i,
                                     [](int64_t v, const PreparedJob& p) { return v < p.first_tile; });
    const PreparedJob& p = *(it - 1);
    const int64_t r0 = (i - p.first_tile) * p.tile_rows;
    run_tile(p, r0, std::min(p.tile_rows, p.job->W.n_rows() - r0));
  };
  if (work < kMinParallelWork) {
    for (int64_t i = 0; i < n_tiles; i++) tile(i);
  } else {
    pool.run(n_tiles, tile);
  }
}

class FastProducts final : public Products {
 public:
  using Products::Products;
  Numerics numerics() const override { return Numerics::kFast; }
  void matmul(const TensorView& W, const float* x, int n_tokens, float* out) const override {
    fast_matmul(pool(), W, x, n_tokens, out);
  }
  void matmul_batch(std::span<const ProductJob> jobs) const override { run_batch(pool(), jobs); }
};

}  // namespace

std::unique_ptr<Products> make_fast_products(ThreadPool& pool) { return std::make_unique<FastProducts>(pool); }

void fast_matmul(ThreadPool& pool, const TensorView& W, const float* x, int n_tokens, float* out) {
  const ProductJob job{W, x, n_tokens, out};
  run_batch(pool, std::span(&job, 1));
}

}  // namespace rl::cpu
