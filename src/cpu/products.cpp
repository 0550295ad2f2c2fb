#include "cpu/products.h"

#include "cpu/ops.h"

namespace rl::cpu {
namespace {

// The oracle's products: each one exactly as cpu::matmul computes it, a batch one after another.
class ExactProducts final : public Products {
 public:
  using Products::Products;
  Numerics numerics() const override { return Numerics::kExact; }
  void matmul(const TensorView& W, const float* x, int n_tokens, float* out) const override {
    cpu::matmul(pool(), W, x, n_tokens, out);
  }
  void matmul_batch(std::span<const ProductJob> jobs) const override {
    for (const ProductJob& j : jobs) cpu::matmul(pool(), j.W, j.x, j.n_tokens, j.out);
  }
};

}  // namespace

std::unique_ptr<Products> make_products(Numerics numerics, ThreadPool& pool) {
  if (numerics == Numerics::kFast) return make_fast_products(pool);
  return std::make_unique<ExactProducts>(pool);
}

}  // namespace rl::cpu
