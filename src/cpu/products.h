// How a CPU forward pass forms its matrix products (out[t][r] = W[r] . x[t]); the stages of
// cpu/forward.cpp are the same for both tiers and call only this (and, by its numerics(), the
// tier's attention core).
//   exact: the oracle's matmul (cpu/ops.h): fp32 values, every sum in double.
//   fast:  activations quantised to 8 bits per block, integer dot products, fp32 accumulation
//          (cpu/fast_dot.h), threads over rows and, for a batch, over products x rows.
#pragma once
#include <memory>
#include <span>

#include "cpu/thread_pool.h"
#include "model/model.h"
#include "model/numerics.h"

namespace rl::cpu {

// One product of a batch: out [n_tokens][W.n_rows()] = W x, x: [n_tokens][W.row_length()].
// fp32_input: x is never quantised, for the few small products whose error the model amplifies
// (the DeltaNet gates, whose decay is exponentiated and compounded over every later token).
struct ProductJob {
  TensorView W;
  const float* x;
  int n_tokens;
  float* out;
  bool fp32_input = false;
};

class Products {
 public:
  explicit Products(ThreadPool& pool) : pool_(pool) {}
  virtual ~Products() = default;
  ThreadPool& pool() const { return pool_; }
  // The tier these products are: forward.cpp takes the tier's attention core with them (the
  // oracle's in double, or the fast tier's, cpu/attention_fast.h).
  virtual Numerics numerics() const = 0;
  virtual void matmul(const TensorView& W, const float* x, int n_tokens, float* out) const = 0;
  // Independent products (the routed and shared experts of a layer, a layer's input projections),
  // free to run in any order or together: the fast tier runs them as one set of row tiles over the
  // threads, so a decode step waits for the pool once per batch instead of once per product.
  virtual void matmul_batch(std::span<const ProductJob> jobs) const = 0;

 private:
  ThreadPool& pool_;
};

std::unique_ptr<Products> make_products(Numerics numerics, ThreadPool& pool);
std::unique_ptr<Products> make_fast_products(ThreadPool& pool);  // fast_products.cpp

// The fast tier's product alone (tests and the kernel bench compare it with the oracle's).
void fast_matmul(ThreadPool& pool, const TensorView& W, const float* x, int n_tokens, float* out);

}  // namespace rl::cpu
