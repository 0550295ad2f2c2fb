// The fast tier's products. Each product's activations are quantised once per token into the
// weight type's format; the work is then split into tiles of weight rows, and a tile dots its
// rows with every token (a tile of rows stays in L1 while the tokens of a prefill pass it).
// A batch of products (the selected experts of a decode step) is one set of tiles, so the pool
// spreads experts x rows over its threads instead of running the small products one by one.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/fast_dot.h"
#include "cpu/ops.h"
#include "cpu/products.h"

namespace rl::cpu {
namespace {

// Rows per task: 16 rows of 256 values are 2-4 KiB of quantised weights (one expert of the
// fixtures is 16 tasks, so a decode step's 10 experts give the pool 160); measured on the 2-core
// dev machine against 8 and 64 rows.
constexpr int64_t kRowTile = 16;
// Below this many multiply-adds a batch runs on the calling thread: waking the pool costs more.
constexpr int64_t kMinParallelWork = 1 << 15;

struct PreparedJob {
  const ProductJob* job;
  FastKernel kernel;
  size_t act_stride;          // bytes of one token's activations
  std::vector<uint8_t> acts;  // [n_tokens][act_stride]
  int64_t first_tile, n_tiles;
};

// Rows [r0, r0 + nr) of one product, for every token.
void run_tile(const PreparedJob& p, int64_t r0, int64_t nr) {
  const TensorView& W = p.job->W;
  const int64_t n_in = W.row_length(), n_out = W.n_rows();
  if (p.kernel.dot) {
    for (int t = 0; t < p.job->n_tokens; t++) {
      const uint8_t* act = p.acts.data() + (size_t)t * p.act_stride;
      float* o = p.job->out + (int64_t)t * n_out;
      for (int64_t r = r0; r < r0 + nr; r++) o[r] = p.kernel.dot(W.row(r), act, n_in);
    }
    return;
  }
  // fp32 rows: F32 in place, other types dequantised once per tile (quant/quant.h reference).
  thread_local std::vector<float> rows;
  const bool in_place = W.type == GgmlType::F32;
  if (!in_place) {
    rows.resize((size_t)(nr * n_in));
    const DequantizeRowFn dequantize = quant_type(W.type).dequantize_row;
    for (int64_t r = 0; r < nr; r++) dequantize(W.row(r0 + r), rows.data() + r * n_in, n_in);
  }
  for (int t = 0; t < p.job->n_tokens; t++) {
    const float* xt = p.job->x + (int64_t)t * n_in;
    float* o = p.job->out + (int64_t)t * n_out;
    for (int64_t r = 0; r < nr; r++) {
      const float* row = in_place ? reinterpret_cast<const float*>(W.row(r0 + r)) : rows.data() + r * n_in;
      o[r0 + r] = fast_dot_f32(row, xt, n_in);
    }
  }
}

// quantize_inputs false: fp32 activations for every weight type (dequantised rows where the
// type's tuned kernel takes 8-bit ones).
void run_batch(ThreadPool& pool, std::span<const ProductJob> jobs, bool quantize_inputs) {
  std::vector<PreparedJob> prepared(jobs.size());
  int64_t n_tiles = 0, work = 0;
  for (size_t j = 0; j < jobs.size(); j++) {
    PreparedJob& p = prepared[j];
    const ProductJob& job = jobs[j];
    const int64_t n_in = job.W.row_length();
    p.job = &job;
    p.kernel = fast_kernel(job.W.type);
    if (!quantize_inputs && p.kernel.format != ActivationFormat::kF32) p.kernel = FastKernel{};
    if (p.kernel.dot) {
      p.act_stride = activation_bytes(p.kernel.format, n_in);
      p.acts.resize(p.act_stride * (size_t)job.n_tokens);
      for (int t = 0; t < job.n_tokens; t++)
        quantize_activation(p.kernel.format, job.x + (int64_t)t * n_in, n_in, p.acts.data() + (size_t)t * p.act_stride);
    }
    p.first_tile = n_tiles;
    p.n_tiles = (job.W.n_rows() + kRowTile - 1) / kRowTile;
    n_tiles += p.n_tiles;
    work += n_in * job.W.n_rows() * job.n_tokens;
  }
  auto tile = [&](int64_t i) {
    // The job owning tile i: the last whose first tile is <= i.
    const auto it = std::upper_bound(prepared.begin(), prepared.end(), i,
                                     [](int64_t v, const PreparedJob& p) { return v < p.first_tile; });
    const PreparedJob& p = *(it - 1);
    const int64_t r0 = (i - p.first_tile) * kRowTile;
    run_tile(p, r0, std::min(kRowTile, p.job->W.n_rows() - r0));
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
  void matmul(const TensorView& W, const float* x, int n_tokens, float* out) const override {
    fast_matmul(pool(), W, x, n_tokens, out);
  }
  void matmul_fp32_input(const TensorView& W, const float* x, int n_tokens, float* out) const override {
    const ProductJob job{W, x, n_tokens, out};
    run_batch(pool(), std::span(&job, 1), false);
  }
  void matmul_batch(std::span<const ProductJob> jobs) const override { run_batch(pool(), jobs, true); }
};

}  // namespace

std::unique_ptr<Products> make_fast_products(ThreadPool& pool) { return std::make_unique<FastProducts>(pool); }

void fast_matmul(ThreadPool& pool, const TensorView& W, const float* x, int n_tokens, float* out) {
  const ProductJob job{W, x, n_tokens, out};
  run_batch(pool, std::span(&job, 1), true);
}

}  // namespace rl::cpu
