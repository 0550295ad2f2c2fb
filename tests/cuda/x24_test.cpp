// The X24 activations (quantize_x24) against their definition, computed here on the CPU, and the
// 8-bit tensor-core products of the IQ types (matmul_x24*) against the CPU reference dequantisation:
// each output the fp32 rounding of Σ w·x̃ for the X24 activations x̃, and within the X24 rounding of
// the exact fp32 product. The X32 form (quantize_x32) and the dense Q4_K products on it
// (matmul_x32) likewise, against the exact Q4_K values decoded here.
#include <cmath>
#include <cstring>
#include <limits>

#include "common/error.h"
#include "common/fp16.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"

namespace rl {
namespace {

using test::random_floats;
using test::random_rows;
using test::to_device;
using test::to_host;

const GgmlType kX24Types[] = {GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ1_M};

// The X24 (bits = 23) and X32 (bits = 31) forms by their definition: per row and 256 columns, e
// with max |x| < 2^e (frexp; 0 for an all-zero block), scale 2^(e-bits), n = round-to-nearest-even
// (x / scale) clamped to bits + 1 bits; a block with a NaN or an infinity: scale NaN, n = 0. The X8
// form (bits = 7, x8): scale max |x| / 127 (1 for an all-zero block), n clamped to [-128, 127].
struct X24Ref {
  std::vector<int32_t> n;      // [rows][cols]
  std::vector<double> scale;   // [rows][cols / 256]
  std::vector<double> value;   // n · scale (x̃)
};
X24Ref x24_reference(const std::vector<float>& x, int rows, int cols, int bits = 23, bool x8 = false) {
  const double lim = std::ldexp(1.0, bits);
  const int nsb = cols / 256;
  X24Ref r{std::vector<int32_t>(x.size()), std::vector<double>((size_t)rows * nsb), std::vector<double>(x.size())};
  for (int row = 0; row < rows; row++)
    for (int sb = 0; sb < nsb; sb++) {
      const float* p = x.data() + (size_t)row * cols + 256 * sb;
      float mx = 0;
      bool finite = true;
      for (int i = 0; i < 256; i++) {
        finite = finite && std::isfinite(p[i]);
        if (std::isfinite(p[i])) mx = std::max(mx, std::fabs(p[i]));
      }
      int e = 0;
      std::frexp(mx, &e);
      const double scale = !finite ? std::numeric_limits<double>::quiet_NaN()
                           : x8      ? (mx > 0 ? (double)mx / 127.0 : 1.0)
                                     : std::ldexp(1.0, e - bits);
      r.scale[(size_t)row * nsb + sb] = scale;
      for (int i = 0; i < 256; i++) {
        const size_t k = (size_t)row * cols + 256 * sb + i;
        double n = !finite ? 0.0 : x8 ? std::nearbyint((double)p[i] / scale) : std::nearbyint(std::ldexp((double)p[i], bits - e));
        n = std::min(std::max(n, -lim), lim - 1);
        r.n[k] = (int32_t)n;
        r.value[k] = n * scale;
      }
    }
  return r;
}

// A product test's activations: evenly spread, and with uneven magnitudes within blocks (every
// `every`-th value 30 times larger) for the X24 / X32 forms' rounding checks. Not for X8, whose
// NMSE bar is defined, as llama.cpp's backend tests define it, on evenly spread inputs: a 30x
// outlier coarsens its block's int8 step.
std::vector<float> product_inputs(size_t n, uint32_t seed, bool uneven, size_t every) {
  auto x = random_floats(n, seed);
  if (uneven)
    for (size_t i = 0; i < n; i += every) x[i] *= 30.0f;
  return x;
}

class CudaX24 : public ::testing::Test {
 protected:
  void SetUp() override {
    RL_REQUIRE_GPU();
    cuda::upload_quant_tables();
  }
  // xq, xscale and (X32) xsum of x [rows][cols] on the device, in the X24 or X8 form (form) or
  // (x32) the X32 one.
  struct Quantized {
    cuda::DeviceBuffer q, scale, sum;
  };
  // form: kX24 or kX8 for quantize_x24; for quantize_x32 (x32) kX24 stands for kX32.
  static Quantized quantize(const std::vector<float>& x, int rows, int cols, bool x32 = false,
                            cuda::XForm form = cuda::XForm::kX24) {
    if (x32 && form == cuda::XForm::kX24) form = cuda::XForm::kX32;
    auto dx = to_device(x);
    Quantized out{cuda::DeviceBuffer(x32 ? cuda::x32_bytes(rows, cols, form) : cuda::x24_bytes(rows, cols, form)),
                  cuda::DeviceBuffer((size_t)rows * cols / 256 * 8), cuda::DeviceBuffer((size_t)rows * cols / 32 * 8)};
    if (x32)
      cuda::quantize_x32(dx.f(), rows, cols, out.q.get<uint8_t>(), out.scale.get<double>(), out.sum.get<double>(),
                         nullptr, form);
    else
      cuda::quantize_x24(dx.f(), rows, cols, out.q.get<uint8_t>(), out.scale.get<double>(), nullptr, form);
    RL_CUDA_CHECK(cudaDeviceSynchronize());
    return out;
  }
};

// The three forms: the scales, every value's integer from its byte planes, and (X32) the 32-column
// sums.
TEST_F(CudaX24, QuantizeMatchesTheDefinition) {
  const int rows = 7, cols = 768;
  std::vector<float> x = random_floats((size_t)rows * cols, 5);
  // Row 1: large values; row 2: values around 1e-40 (subnormal fp32); row 3, block 1: all zeros;
  // row 4: the largest value an exact power of two, and one just below the next (rounds up to the
  // clamp); row 5, block 2: a NaN; row 6, block 0: an infinity.
  for (int c = 0; c < cols; c++) x[cols + c] *= 1e30f, x[2 * cols + c] *= 1e-40f;
  for (int c = 256; c < 512; c++) x[3 * cols + c] = 0.0f;
  for (int c = 0; c < 256; c++) x[4 * cols + c] = std::fmod(x[4 * cols + c], 1.0f);
  x[4 * cols + 17] = -2.0f;
  x[4 * cols + 256] = std::nextafter(4.0f, 0.0f);
  x[4 * cols + 300] = -std::nextafter(4.0f, 0.0f);
  x[5 * cols + 600] = std::numeric_limits<float>::quiet_NaN();
  x[6 * cols + 3] = std::numeric_limits<float>::infinity();
  for (const int planes : {3, 4, 1}) {
    const bool x32 = planes == 4, x8 = planes == 1;
    SCOPED_TRACE(x32 ? "X32" : x8 ? "X8" : "X24");
    const X24Ref ref = x24_reference(x, rows, cols, x32 ? 31 : x8 ? 7 : 23, x8);
    Quantized d = quantize(x, rows, cols, x32, x8 ? cuda::XForm::kX8 : cuda::XForm::kX24);
    const auto q = to_host<uint8_t>(d.q, (size_t)rows * cols * planes);
    const auto s = to_host<double>(d.scale, (size_t)rows * cols / 256);
    for (size_t i = 0; i < s.size(); i++) {
      if (std::isnan(ref.scale[i]))
        EXPECT_TRUE(std::isnan(s[i])) << "scale " << i;
      else
        EXPECT_EQ(s[i], ref.scale[i]) << "scale " << i;
    }
    if (x32) {
      EXPECT_EQ(ref.n[4 * cols + 17], -1073741824);  // -2 in a block whose largest magnitude is 2: -2^30
      EXPECT_EQ(ref.n[4 * cols + 256], 2147483520);  // 4 - 2^-22 exactly: 2^31 - 2^7
      const auto sums = to_host<double>(d.sum, (size_t)rows * cols / 32);
      for (int row = 0; row < rows; row++)
        for (int j = 0; j < cols / 32; j++) {
          int64_t want = 0;
          for (int c = 32 * j; c < 32 * j + 32; c++) want += ref.n[(size_t)row * cols + c];
          ASSERT_EQ(sums[(size_t)row * cols / 32 + j], (double)want) << "row " << row << " sub-block " << j;
        }
    } else if (x8) {
      EXPECT_EQ(ref.n[4 * cols + 17], -127);  // the block's largest magnitude
      EXPECT_EQ(ref.n[4 * cols + 256], 127);
      EXPECT_EQ(ref.n[4 * cols + 300], -127);
    } else {
      EXPECT_EQ(ref.n[4 * cols + 17], -4194304);  // -2^22
      EXPECT_EQ(ref.n[4 * cols + 256], 8388607);  // rounds to 2^23, clamped
      EXPECT_EQ(ref.n[4 * cols + 300], -8388608);
    }
    for (int row = 0; row < rows; row++)
      for (int c = 0; c < cols; c++) {
        const uint8_t* b = q.data() + (size_t)row * cols * planes + (size_t)(c / 32) * 32 * planes + c % 32;
        int64_t n = (int8_t)b[0];
        for (int l = 1; l < planes; l++) n = n * 256 + b[32 * l];
        ASSERT_EQ(n, ref.n[(size_t)row * cols + c]) << "row " << row << " col " << c;
      }
  }
}

// Dense and expert forms, token counts that leave partial 8- and 16-token tiles, rows that are not
// a multiple of the block's: every output is the fp32 rounding of Σ w·x̃, and within the form's
// rounding (half a unit of its scale per value) of the fp32 inputs' exact sum. The X8 form (the
// fast tier's) also meets the fast tier's kernel bar: NMSE <= 5e-4 against the fp32 inputs' exact
// products at each shape.
TEST_F(CudaX24, ProductsAreTheRoundingOfTheX24Sum) {
  struct Case {
    int rows, cols, T;
  };
  for (const cuda::XForm form : {cuda::XForm::kX24, cuda::XForm::kX8}) {
    const bool x8 = form == cuda::XForm::kX8;
    for (GgmlType t : kX24Types) {
      for (const Case& k : {Case{70, 512, 1}, Case{300, 2048, 17}, Case{130, 256, 37}, Case{64, 768, 16}}) {
        SCOPED_TRACE(std::string(x8 ? "X8 " : "X24 ") + type_name(t) + " " + std::to_string(k.rows) + "x" +
                     std::to_string(k.cols) + " T=" + std::to_string(k.T));
        const size_t rb = row_size(t, k.cols);
        auto w = random_rows(t, k.rows, k.cols, 300 + k.T);
        const auto x = product_inputs((size_t)k.T * k.cols, 301 + k.T, !x8, 97);
        const X24Ref ref = x24_reference(x, k.T, k.cols, x8 ? 7 : 23, x8);
        Quantized d = quantize(x, k.T, k.cols, false, form);
        auto dw = to_device(w);
        cuda::DeviceBuffer dy((size_t)k.T * k.rows * 4);
        cuda::matmul_x24(t, dw.get(), rb, k.rows, k.cols, d.q.get<uint8_t>(), d.scale.get<double>(), k.T, dy.f(),
                         nullptr, form);
        double err2 = 0, ref2 = 0;
        const auto y = to_host<float>(dy, (size_t)k.T * k.rows);
        std::vector<float> wr(k.cols);
        std::vector<double> xe(k.cols);
        for (int r = 0; r < k.rows; r++) {
          dequantize_row(t, w.data() + r * rb, wr.data(), k.cols);
          for (int tok = 0; tok < k.T; tok++) {
            const size_t o = (size_t)tok * k.rows + r;
            auto [want, mag] = test::exact_dot(wr.data(), ref.value.data() + (size_t)tok * k.cols, k.cols);
            test::expect_fp32_rounding(y[o], want, mag, "out", (int)o);
            // Against the fp32 inputs: the X24 rounding bound Σ |w_i| · 2^(e-24).
            double bound = 0;
            for (int c = 0; c < k.cols; c++) {
              xe[c] = x[(size_t)tok * k.cols + c];
              bound += std::fabs(wr[c]) * ref.scale[(size_t)tok * (k.cols / 256) + c / 256] * 0.5;
            }
            auto [exact, mag2] = test::exact_dot(wr.data(), xe.data(), k.cols);
            EXPECT_LE(std::fabs(y[o] - exact), bound + std::ldexp(std::fabs(exact), -23) + 1e-13 * mag2) << "out " << o;
            err2 += (y[o] - exact) * (y[o] - exact), ref2 += exact * exact;
          }
        }
        if (x8) {
          EXPECT_LE(err2 / ref2, 5e-4) << "NMSE";
        }
      }
    }
  }
}

// Experts through slot pointers (groups of 5, 1, 19, 16 and 8 gathered rows in shuffled slots)
// give bit for bit the dense product of each group's rows; the fused SwiGLU pair gives bit for bit
// the two products and swiglu.
TEST_F(CudaX24, ExpertsAndSwigluPairsMatchTheDenseProducts) {
  for (const cuda::XForm form : {cuda::XForm::kX24, cuda::XForm::kX8})
    for (GgmlType t : kX24Types) {
      SCOPED_TRACE(std::string(form == cuda::XForm::kX8 ? "X8 " : "X24 ") + type_name(t));
      const int rows = 70, cols = 512, n = 5;
      const std::vector<int> cnt = {5, 1, 19, 16, 8};
      std::vector<int> off(n);
      int total = 0;
      for (int e = 0; e < n; e++) off[e] = total, total += cnt[e];
      const size_t rb = row_size(t, cols), mat = rb * rows, slot = 2 * mat + 4096;
      const int slot_of[n] = {3, 0, 4, 1, 2};
      std::vector<uint8_t> pool(n * slot);
      std::vector<std::vector<uint8_t>> gs, us;
      for (int e = 0; e < n; e++) {
        gs.push_back(random_rows(t, rows, cols, 700 + e)), us.push_back(random_rows(t, rows, cols, 710 + e));
        std::memcpy(pool.data() + slot_of[e] * slot + 4096, gs[e].data(), mat);
        std::memcpy(pool.data() + slot_of[e] * slot + 4096 + mat, us[e].data(), mat);
      }
      auto dpool = to_device(pool);
      std::vector<const uint8_t*> ptrs(n);
      for (int e = 0; e < n; e++) ptrs[e] = dpool.get<uint8_t>() + slot_of[e] * slot;
      auto dptrs = to_device(ptrs);
      std::vector<int> offcnt = off;
      offcnt.insert(offcnt.end(), cnt.begin(), cnt.end());
      auto doc = to_device(offcnt);
      auto x = random_floats((size_t)total * cols, 720);
      Quantized d = quantize(x, total, cols, false, form);
      const auto* p = dptrs.get<const uint8_t*>();
      const int* oc = doc.get<int>();
      const uint8_t* q = d.q.get<uint8_t>();
      const double* s = d.scale.get<double>();
      const size_t out = (size_t)total * rows;
      cuda::DeviceBuffer ya(out * 4), yg(out * 4), yu(out * 4);
      cuda::matmul_x24_experts(t, p, 4096, rb, rows, cols, q, s, oc, oc + n, n, 19, yg.f(), nullptr, form);
      cuda::matmul_x24_experts(t, p, 4096 + mat, rb, rows, cols, q, s, oc, oc + n, n, 19, yu.f(), nullptr, form);
      cuda::matmul_x24_experts_gate_up(t, p, 4096, 4096 + mat, rb, rows, cols, q, s, oc, oc + n, n, 19, ya.f(), nullptr,
                                       form);
      const auto g = to_host<float>(yg, out), u = to_host<float>(yu, out);
      for (int e = 0; e < n; e++) {
        auto dg = to_device(gs[e]);
        cuda::DeviceBuffer dy((size_t)cnt[e] * rows * 4);
        const size_t xo = cuda::x24_bytes(off[e], cols, form);
        cuda::matmul_x24(t, dg.get(), rb, rows, cols, q + xo, s + (size_t)off[e] * cols / 256, cnt[e], dy.f(), nullptr,
                         form);
        const auto yd = to_host<float>(dy, (size_t)cnt[e] * rows);
        for (size_t i = 0; i < yd.size(); i++) ASSERT_EQ(g[(size_t)off[e] * rows + i], yd[i]) << "expert " << e << " value " << i;
      }
      cuda::swiglu(yg.f(), yu.f(), yg.f(), out, nullptr);
      const auto two = to_host<float>(yg, out), fused = to_host<float>(ya, out);
      for (size_t i = 0; i < out; i++) ASSERT_EQ(fused[i], two[i]) << "value " << i;

      // Dense SwiGLU pair: the same as the experts' for group 2 (19 tokens).
      auto dgate = to_device(gs[2]), dup = to_device(us[2]);
      cuda::DeviceBuffer da((size_t)19 * rows * 4);
      cuda::matmul_x24_gate_up(t, dgate.get(), dup.get(), rb, rows, cols, q + cuda::x24_bytes(off[2], cols, form),
                               s + (size_t)off[2] * cols / 256, 19, da.f(), nullptr, form);
      const auto dense = to_host<float>(da, (size_t)19 * rows);
      for (size_t i = 0; i < dense.size(); i++) ASSERT_EQ(dense[i], fused[(size_t)off[2] * rows + i]) << "dense pair " << i;
    }
}

// The Q4_K values of one row exactly, in double: d·sc·q − dmin·m, decoded here from the block
// format (d, dmin, 12 bytes of packed 6-bit scales and mins, 128 bytes of nibbles).
std::vector<double> q4k_exact_row(const uint8_t* row, int cols) {
  std::vector<double> w(cols);
  for (int b = 0; b < cols / 256; b++) {
    const uint8_t* blk = row + 144 * b;
    uint16_t dh, mh;
    std::memcpy(&dh, blk, 2);
    std::memcpy(&mh, blk + 2, 2);
    const double d = fp16_to_f32(dh), dmin = fp16_to_f32(mh);
    const uint8_t* sc = blk + 4;
    const uint8_t* qs = blk + 16;
    for (int j = 0; j < 8; j++) {
      const int s = j < 4 ? sc[j] & 63 : (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
      const int m = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
      for (int l = 0; l < 32; l++) {
        const uint8_t byte = qs[32 * (j / 2) + l];
        const int q = j % 2 ? byte >> 4 : byte & 15;
        w[256 * b + 32 * j + l] = d * s * q - dmin * m;
      }
    }
  }
  return w;
}

// Dense Q4_K products on X32: token counts that leave partial 8-, 24- and (the X8 form's) 32-token
// tiles (59: two sub-tiles of X32's last tile active, X8's fourth partial), rows that are
// not a multiple of the block's 128: every output the fp32 rounding of Σ w·x̂ for the exact Q4_K
// values w (which the library's fp32 dequantisation rounds once, checked here as well) and the X32
// activations x̂; a row of large mins and one of zero scales. The same on the X8 form (the fast
// tier's), which also meets the tier's kernel bar: NMSE <= 5e-4 against the fp32 inputs' products
// (evenly spread inputs, as for the X24 kernels' X8 form).
TEST_F(CudaX24, X32Q4KProductsAreTheRoundingOfTheExactSum) {
  if (cuda::device_info().cc_major < 9) GTEST_SKIP() << "matmul_x32 needs compute capability 9.0";
  const GgmlType t = GgmlType::Q4_K;
  struct Case {
    int rows, cols, T;
  };
  for (const cuda::XForm form : {cuda::XForm::kX32, cuda::XForm::kX8})
    for (const Case& k : {Case{130, 256, 37}, Case{300, 2048, 17}, Case{129, 768, 70}, Case{64, 512, 1},
                          Case{256, 1024, 96}, Case{130, 256, 59}}) {
      const bool x8 = form == cuda::XForm::kX8;
      SCOPED_TRACE(std::string(x8 ? "X8 " : "X32 ") + std::to_string(k.rows) + "x" + std::to_string(k.cols) +
                   " T=" + std::to_string(k.T));
      const size_t rb = row_size(t, k.cols);
      auto w = random_rows(t, k.rows, k.cols, 500 + k.T);
      // Row 1: every min 63 (the scale bytes' min fields all ones); row 2: every scale 0.
      for (int b = 0; b < k.cols / 256 && k.rows > 2; b++) {
        uint8_t* s1 = w.data() + rb + 144 * b + 4;
        for (int i = 4; i < 8; i++) s1[i] = 0xFF;   // mins 0..3, and the top bits of mins 4..7
        for (int i = 8; i < 12; i++) s1[i] |= 0xF0;  // the low bits of mins 4..7
        uint8_t* s2 = w.data() + 2 * rb + 144 * b + 4;
        for (int i = 0; i < 4; i++) s2[i] = 0;       // scales 0..3, and the top bits of scales 4..7
        for (int i = 8; i < 12; i++) s2[i] &= 0xF0;  // the low bits of scales 4..7
      }
      const auto x = product_inputs((size_t)k.T * k.cols, 501 + k.T, !x8, 89);
      const X24Ref ref = x24_reference(x, k.T, k.cols, x8 ? 7 : 31, x8);
      Quantized d = quantize(x, k.T, k.cols, true, form);
      auto dw = to_device(w);
      cuda::DeviceBuffer dy((size_t)k.T * k.rows * 4);
      cuda::matmul_x32(t, dw.get(), rb, k.rows, k.cols, d.q.get<uint8_t>(), d.scale.get<double>(), d.sum.get<double>(),
                       k.T, dy.f(), nullptr, form);
      const auto y = to_host<float>(dy, (size_t)k.T * k.rows);
      double err2 = 0, ref2 = 0;
      std::vector<float> wf(k.cols);
      for (int r = 0; r < k.rows; r++) {
        const std::vector<double> we = q4k_exact_row(w.data() + r * rb, k.cols);
        dequantize_row(t, w.data() + r * rb, wf.data(), k.cols);
        for (int c = 0; c < k.cols; c++) ASSERT_EQ((float)we[c], wf[c]) << "row " << r << " col " << c;
        for (int tok = 0; tok < k.T; tok++) {
          const size_t o = (size_t)tok * k.rows + r;
          double want = 0, mag = 0, exact = 0;
          for (int c = 0; c < k.cols; c++) {
            const double p = we[c] * ref.value[(size_t)tok * k.cols + c];
            want += p;
            mag += std::fabs(p);
            exact += we[c] * x[(size_t)tok * k.cols + c];
          }
          test::expect_fp32_rounding(y[o], want, mag, "out", (int)o);
          err2 += (y[o] - exact) * (y[o] - exact), ref2 += exact * exact;
        }
      }
      if (x8) {
        EXPECT_LE(err2 / ref2, 5e-4) << "NMSE";
      }
    }
}

// Gathering rows of the X24 form (gather_words, as the backend does for the routed experts) gives
// bit for bit the X24 form of the gathered rows, NaN scales included.
TEST_F(CudaX24, GatheredRowsEqualTheConvertedGatheredRows) {
  const int rows = 5, cols = 512;
  auto x = random_floats((size_t)rows * cols, 31);
  x[3 * cols + 7] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<int32_t> idx = {3, 0, 4, 4, 1, 3, 2};
  const int n = (int)idx.size();
  std::vector<float> xg((size_t)n * cols);
  for (int i = 0; i < n; i++) std::memcpy(&xg[(size_t)i * cols], &x[(size_t)idx[i] * cols], cols * sizeof(float));
  Quantized d = quantize(x, rows, cols), want = quantize(xg, n, cols);
  auto di = to_device(idx);
  cuda::DeviceBuffer q(cuda::x24_bytes(n, cols)), sc((size_t)n * cols / 256 * 8);
  cuda::gather_words(d.q.get(), di.get<int32_t>(), q.get(), n, (int)(cuda::x24_bytes(1, cols) / 4), nullptr);
  cuda::gather_words(d.scale.get(), di.get<int32_t>(), sc.get(), n, cols / 256 * 2, nullptr);
  EXPECT_EQ(to_host<uint8_t>(q, cuda::x24_bytes(n, cols)), to_host<uint8_t>(want.q, cuda::x24_bytes(n, cols)));
  const auto a = to_host<uint64_t>(sc, (size_t)n * cols / 256), b = to_host<uint64_t>(want.scale, (size_t)n * cols / 256);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(std::isnan(to_host<double>(sc, (size_t)n * cols / 256)[0]));  // row 3's first block
}

// A token whose activations hold a NaN gets NaN outputs; the other tokens are unaffected (X32 and
// the Q4_K products as well).
TEST_F(CudaX24, NanActivationsPropagate) {
  if (cuda::device_info().cc_major >= 9) {
    const GgmlType t = GgmlType::Q4_K;
    const int rows = 20, cols = 512, T = 3;
    const size_t rb = row_size(t, cols);
    auto w = random_rows(t, rows, cols, 13);
    auto x = random_floats((size_t)T * cols, 14);
    x[cols + 300] = std::numeric_limits<float>::quiet_NaN();
    Quantized d = quantize(x, T, cols, true);
    auto dw = to_device(w);
    cuda::DeviceBuffer dy((size_t)T * rows * 4);
    cuda::matmul_x32(t, dw.get(), rb, rows, cols, d.q.get<uint8_t>(), d.scale.get<double>(), d.sum.get<double>(), T,
                     dy.f(), nullptr);
    const auto y = to_host<float>(dy, (size_t)T * rows);
    for (int r = 0; r < rows; r++) {
      EXPECT_TRUE(std::isnan(y[rows + r])) << "X32 " << r;
      EXPECT_TRUE(std::isfinite(y[r]) && std::isfinite(y[2 * rows + r])) << "X32 " << r;
    }
  }
  const GgmlType t = GgmlType::IQ2_XS;
  const int rows = 20, cols = 512, T = 3;
  const size_t rb = row_size(t, cols);
  auto w = random_rows(t, rows, cols, 11);
  auto x = random_floats((size_t)T * cols, 12);
  x[cols + 400] = std::numeric_limits<float>::quiet_NaN();
  Quantized d = quantize(x, T, cols);
  auto dw = to_device(w);
  cuda::DeviceBuffer dy((size_t)T * rows * 4);
  cuda::matmul_x24(t, dw.get(), rb, rows, cols, d.q.get<uint8_t>(), d.scale.get<double>(), T, dy.f(), nullptr);
  const auto y = to_host<float>(dy, (size_t)T * rows);
  for (int r = 0; r < rows; r++) {
    EXPECT_TRUE(std::isnan(y[rows + r])) << r;
    EXPECT_TRUE(std::isfinite(y[r]) && std::isfinite(y[2 * rows + r])) << r;
  }
}

// Which types have X24 products: exactly the three IQ types, and X32 ones: Q4_K, among
// every raw type id (host only: runs without a GPU).
TEST(X24Support, ExactlyTheIqTypesOfTheRecipes) {
  int supported = 0, dense = 0;
  for (uint32_t raw = 0; raw < 64; raw++) {
    const QuantType* q = find_quant_type(raw);
    if (!q) continue;
    const bool want = q->type == GgmlType::IQ2_XXS || q->type == GgmlType::IQ2_XS || q->type == GgmlType::IQ1_M;
    EXPECT_EQ(cuda::x24_supported(q->type), want) << type_name(q->type);
    EXPECT_EQ(cuda::x32_supported(q->type), q->type == GgmlType::Q4_K) << type_name(q->type);
    supported += cuda::x24_supported(q->type);
    dense += cuda::x32_supported(q->type);
  }
  EXPECT_EQ(supported, 3);
  EXPECT_EQ(dense, 1);
}

TEST_F(CudaX24, RejectsOtherTypesAndShapes) {
  cuda::DeviceBuffer d(1 << 16);
  EXPECT_FALSE(cuda::x24_supported(GgmlType::Q4_K));
  EXPECT_TRUE(cuda::x24_supported(GgmlType::IQ1_M));
  EXPECT_THROW(cuda::matmul_x24(GgmlType::Q4_K, d.get(), 144, 1, 256, d.get<uint8_t>(), d.get<double>(), 1, d.f(),
                                nullptr),
               Error);
  EXPECT_THROW(cuda::matmul_x24(GgmlType::IQ2_XS, d.get(), 74, 1, 128, d.get<uint8_t>(), d.get<double>(), 1, d.f(),
                                nullptr),
               Error);
  EXPECT_THROW(cuda::quantize_x24(d.f(), 1, 100, d.get<uint8_t>(), d.get<double>(), nullptr), Error);
  const double* sum = d.get<double>();
  EXPECT_THROW(cuda::matmul_x32(GgmlType::IQ2_XS, d.get(), 74, 1, 256, d.get<uint8_t>(), d.get<double>(), sum, 1, d.f(),
                                nullptr),
               Error);
  EXPECT_THROW(cuda::matmul_x32(GgmlType::Q4_K, d.get(), 144, 1, 128, d.get<uint8_t>(), d.get<double>(), sum, 1, d.f(),
                                nullptr),
               Error);
  EXPECT_THROW(cuda::matmul_x32(GgmlType::Q4_K, d.get<uint8_t>() + 4, 144, 1, 256, d.get<uint8_t>(), d.get<double>(),
                                sum, 1, d.f(), nullptr),
               Error);
  EXPECT_THROW(cuda::matmul_x32(GgmlType::Q4_K, d.get(), 152, 1, 256, d.get<uint8_t>(), d.get<double>(), sum, 1, d.f(),
                                nullptr),
               Error);  // rows 8 bytes off 16-byte alignment
  EXPECT_THROW(cuda::matmul_x32(GgmlType::Q4_K, d.get(), 144, 1, 256, d.get<uint8_t>() + 8, d.get<double>(), sum, 1,
                                d.f(), nullptr),
               Error);  // activations off 16-byte alignment
  EXPECT_THROW(cuda::quantize_x32(d.f(), 1, 100, d.get<uint8_t>(), d.get<double>(), d.get<double>(), nullptr), Error);
}

}  // namespace
}  // namespace rl
