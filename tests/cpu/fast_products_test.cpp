// The fast tier's products (cpu/fast_products.cpp, cpu/fast_dot_*.cpp) against the CPU reference:
// every ggml type of quant-zoo.gguf (ggml's own quantizer), dequantised by the reference
// (quant/quant.h, bit-exact with ggml) and dotted in double, at three shapes per type. The bar is
// the normalised mean squared error llama.cpp's backend tests use for quantised products:
// NMSE = sum((fast - ref)^2) / sum(ref^2) <= 5e-4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/fast_dot.h"
#include "cpu/products.h"
#include "gguf/gguf.h"
#include "test_util.h"

namespace rl::cpu {
namespace {

constexpr double kMaxNmse = 5e-4;

const char* const kZooTypes[] = {"f32",   "f16",   "bf16",   "q4_0",   "q4_1",    "q5_0",   "q5_1",  "q8_0",
                                 "q2_K",  "q3_K",  "q4_K",   "q5_K",   "q6_K",    "iq1_s",  "iq1_m", "iq2_xxs",
                                 "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_nl",  "iq4_xs", "mxfp4"};

// The quantised types of the project's files run on integer kernels, not the generic
// dequantising path.
const GgmlType kTunedTypes[] = {GgmlType::Q8_0,    GgmlType::Q4_K,   GgmlType::Q5_K, GgmlType::Q6_K,
                                GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ1_M};

// [n_tokens][n] activations shaped like hidden states: uniform in [-1, 1) from a 32-bit LCG, with
// every 37th value 8x larger (outliers are what 8-bit activations handle worst).
std::vector<float> activations(int n_tokens, int64_t n, uint32_t seed) {
  std::vector<float> x((size_t)n_tokens * n);
  uint32_t s = seed;
  for (size_t i = 0; i < x.size(); i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)((double)(s >> 8) / (double)(1u << 24) * 2.0 - 1.0) * (i % 37 == 5 ? 8.0f : 1.0f);
  }
  return x;
}

// The first n_in values of the first n_rows rows of a zoo tensor, as a matrix view (a prefix of
// whole blocks of a row is a valid row).
TensorView zoo_matrix(const GgufTensorInfo& t, int64_t n_in, int64_t n_rows) {
  TensorView v;
  v.name = t.name;
  v.type = t.type;
  v.ne = {n_in, n_rows, 1, 1};
  v.data = t.data;
  v.row_bytes = t.row_bytes();
  v.nbytes = v.row_bytes * (size_t)n_rows;
  return v;
}

// out[t][r] = W[r] . x[t] with W dequantised by the reference and every sum in double.
std::vector<double> reference_product(const TensorView& W, const std::vector<float>& x, int n_tokens) {
  const int64_t n_in = W.row_length(), n_out = W.n_rows();
  std::vector<double> out((size_t)n_tokens * n_out);
  std::vector<float> row(n_in);
  for (int64_t r = 0; r < n_out; r++) {
    dequantize_row(W.type, W.row(r), row.data(), n_in);
    for (int t = 0; t < n_tokens; t++) {
      double sum = 0.0;
      for (int64_t i = 0; i < n_in; i++) sum += (double)row[i] * x[(size_t)t * n_in + i];
      out[(size_t)t * n_out + r] = sum;
    }
  }
  return out;
}

double nmse(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < want.size(); i++) {
    err += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
    ref += want[i] * want[i];
  }
  return err / ref;
}

class FastProduct : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    path_ = test::fixture("quant/quant-zoo.gguf");
    RL_REQUIRE_FIXTURE(path_);
    zoo_ = GgufFile::open(path_);
    tensor_ = zoo_->find_tensor(std::string("zoo.") + GetParam());
    ASSERT_NE(tensor_, nullptr) << "quant-zoo.gguf has no tensor zoo." << GetParam();
  }
  std::string path_;
  std::unique_ptr<GgufFile> zoo_;
  const GgufTensorInfo* tensor_ = nullptr;
};

TEST_P(FastProduct, MatchesDoubleReferenceAtThreeShapes) {
  ThreadPool pool(2);
  struct Shape {
    int64_t n_in, n_rows;
    int n_tokens;
  };
  for (const Shape s : {Shape{256, 32, 1}, Shape{512, 17, 3}, Shape{1024, 32, 7}}) {
    const TensorView W = zoo_matrix(*tensor_, s.n_in, s.n_rows);
    const std::vector<float> x = activations(s.n_tokens, s.n_in, (uint32_t)(s.n_in + s.n_tokens));
    std::vector<float> got((size_t)s.n_tokens * s.n_rows);
    fast_matmul(pool, W, x.data(), s.n_tokens, got.data());
    const double e = nmse(got, reference_product(W, x, s.n_tokens));
    EXPECT_LE(e, kMaxNmse) << GetParam() << " at " << s.n_rows << " x " << s.n_in << ", " << s.n_tokens << " tokens";
    EXPECT_TRUE(std::isfinite(e));
  }
}

INSTANTIATE_TEST_SUITE_P(EveryZooType, FastProduct, ::testing::ValuesIn(kZooTypes),
                         [](const testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

TEST(FastKernels, ProjectTypesHaveTunedKernels) {
  for (GgmlType t : kTunedTypes) EXPECT_NE(fast_kernels(t), nullptr) << type_name(t);
}

// The zoo and the fast tier's products on two threads, for the tests of batches and forms.
class FastProducts : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = test::fixture("quant/quant-zoo.gguf");
    RL_REQUIRE_FIXTURE(path);
    zoo = GgufFile::open(path);
  }
  TensorView matrix(const char* type, int64_t n_in) const {
    return zoo_matrix(zoo->tensor(std::string("zoo.") + type), n_in, 32);
  }
  std::unique_ptr<GgufFile> zoo;
  ThreadPool pool{2};
  std::unique_ptr<Products> products = make_products(Numerics::kFast, pool);
};

// A batch (the routed experts of a decode step) computes each product exactly as alone.
TEST_F(FastProducts, BatchEqualsProductsOneByOne) {
  std::vector<ProductJob> jobs;
  std::vector<std::vector<float>> inputs, alone, batched;
  for (const char* type : {"iq2_xxs", "q4_K", "q8_0", "q3_K"}) {
    const TensorView W = matrix(type, 1024);
    inputs.push_back(activations(2, 1024, (uint32_t)inputs.size() + 7));
    alone.emplace_back(2 * 32);
    batched.emplace_back(2 * 32);
    products->matmul(W, inputs.back().data(), 2, alone.back().data());
    jobs.push_back({W, inputs.back().data(), 2, batched.back().data()});
  }
  products->matmul_batch(jobs);
  for (size_t j = 0; j < jobs.size(); j++) EXPECT_EQ(batched[j], alone[j]) << jobs[j].W.name;
}

// Jobs on one input quantise it once (a decode step's experts all read the token's row), past jobs
// that take fp32 inputs; an earlier quantisation is not taken where the pointer matches but it
// holds fewer tokens or shorter rows than the job reads, nor after a job on another input.
TEST_F(FastProducts, BatchSharesAQuantisedInputOnlyWhereItIsTheSame) {
  const std::vector<float> a = activations(2, 1024, 3), b = activations(2, 1024, 5);
  struct Case {
    const char* type;
    const std::vector<float>* x;
    int n_tokens;
    int64_t n_in;
  };
  const Case cases[] = {
      {"iq2_xxs", &a, 2, 1024}, {"q4_K", &a, 2, 1024},  {"f32", &a, 2, 1024}, {"q8_0", &a, 2, 1024},
      {"q6_K", &b, 2, 1024},    {"iq2_xs", &a, 2, 1024}, {"iq1_m", &a, 1, 512}, {"q5_K", &a, 1, 1024},
      {"q4_K", &b, 1, 1024},    {"q8_0", &b, 2, 1024},
  };
  std::vector<ProductJob> jobs;
  std::vector<std::vector<float>> alone, batched;
  alone.reserve(std::size(cases));
  batched.reserve(std::size(cases));
  for (const Case& c : cases) {
    const TensorView W = matrix(c.type, c.n_in);
    alone.emplace_back((size_t)c.n_tokens * 32);
    batched.emplace_back((size_t)c.n_tokens * 32);
    std::vector<float> x((size_t)c.n_tokens * c.n_in);  // token t's first n_in values of *c.x
    for (int t = 0; t < c.n_tokens; t++)
      std::copy_n(c.x->data() + (size_t)t * 1024, c.n_in, x.data() + (size_t)t * c.n_in);
    products->matmul(W, x.data(), c.n_tokens, alone.back().data());
    jobs.push_back({W, c.x->data(), c.n_tokens, batched.back().data()});
  }
  products->matmul_batch(jobs);
  for (size_t j = 0; j < jobs.size(); j++) EXPECT_EQ(batched[j], alone[j]) << "job " << j << " " << jobs[j].W.name;
}

// A decode step's batch takes tiles of more rows than a prefill's (fast_products.cpp): over a
// matrix of 2,064 rows (the zoo's 32 rows 64 times, then 16 more: a last, partial tile), with
// every path in the batch, each row's output is the same bits as the row's in the 32-row matrix.
TEST_F(FastProducts, DecodeTilesCoverEveryRow) {
  constexpr int64_t kRows = 64 * 32 + 16;
  const std::vector<float> x = activations(1, 1024, 13);
  std::vector<std::vector<uint8_t>> data;
  std::vector<ProductJob> jobs;
  std::vector<std::vector<float>> small, big;
  data.reserve(3);
  small.reserve(3);
  big.reserve(3);
  for (const char* type : {"q4_K", "f32", "q3_K"}) {
    const TensorView W = matrix(type, 1024);
    small.emplace_back(32);
    products->matmul(W, x.data(), 1, small.back().data());
    TensorView tall = W;  // the 32 rows repeated
    data.emplace_back(W.row_bytes * kRows);
    for (int64_t r = 0; r < kRows; r++) std::copy_n(W.row(r % 32), W.row_bytes, data.back().data() + r * W.row_bytes);
    tall.data = data.back().data();
    tall.ne[1] = kRows;
    tall.nbytes = data.back().size();
    big.emplace_back(kRows);
    jobs.push_back({tall, x.data(), 1, big.back().data()});
  }
  products->matmul_batch(jobs);
  for (size_t j = 0; j < jobs.size(); j++)
    for (int64_t r = 0; r < kRows; r++) ASSERT_EQ(big[j][r], small[j][r % 32]) << jobs[j].W.name << " row " << r;
}

}  // namespace
// A decode step dots each packed row in registers, a prefill dots rows decoded to memory once per
// tile; a token's outputs must be the same bits either way (a batched decode step may give an
// expert more tokens than kDotTokens, and then takes the prefill form).
TEST_F(FastProducts, PackedRowAndDecodedTileGiveTheSameBits) {
  constexpr int kTokens = 7;
  for (const char* type : {"q8_0", "q4_K", "q5_K", "q6_K", "iq2_xxs", "iq2_xs", "iq1_m"}) {
    const TensorView W = matrix(type, 1024);
    const std::vector<float> x = activations(kTokens, 1024, 11);
    std::vector<float> tile((size_t)kTokens * 32);
    fast_matmul(pool, W, x.data(), kTokens, tile.data());
    for (int t = 0; t < kTokens; t++) {
      std::vector<float> one(32);
      fast_matmul(pool, W, x.data() + (size_t)t * 1024, 1, one.data());
      EXPECT_EQ(one, std::vector<float>(tile.begin() + 32 * t, tile.begin() + 32 * (t + 1))) << type << " token " << t;
    }
  }
}

}  // namespace rl::cpu
