#include "cpu/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/fp16.h"
#include "quant/blocks.h"
#include "quant/quant_kernels.h"

namespace rl::cpu {

void quantize_kv_block_q8_0(const float* x, uint16_t* d, int8_t* qs) {
  float amax = 0.0f;
  for (int j = 0; j < kKvQ8Block; j++) amax = std::max(amax, std::fabs(x[j]));
  const float scale = amax / 127.0f;
  const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
  *d = f32_to_fp16(scale);
  for (int j = 0; j < kKvQ8Block; j++) qs[j] = (int8_t)std::roundf(x[j] * inverse);
}

KvRows::KvRows(KvType type, int width) : type_(type), width_(width), row_bytes_(kv_bytes(type, (size_t)width)) {
  if (type == KvType::kQ8_0 && width % kKvQ8Block != 0)
    fail("--kv-type q8_0: a KV row of {} values is not whole {}-value blocks", width, kKvQ8Block);
}

void KvRows::write(size_t pos, const float* src, size_t n) {
  data_.resize((pos + n) * row_bytes_);
  for (size_t r = 0; r < n; r++) {
    const float* x = src + r * width_;
    uint8_t* row = data_.data() + (pos + r) * row_bytes_;
    switch (type_) {
      case KvType::kF32: std::memcpy(row, x, row_bytes_); break;
      case KvType::kF16: store_rounded<f32_to_fp16>(x, width_, row); break;
      case KvType::kBF16: store_rounded<f32_to_bf16>(x, width_, row); break;
      case KvType::kQ8_0: {
        auto* blocks = reinterpret_cast<BlockQ8_0*>(row);
        for (int b = 0; b < width_ / kKvQ8Block; b++) quantize_kv_block_q8_0(x + b * kKvQ8Block, &blocks[b].d, blocks[b].qs);
        break;
      }
    }
  }
}

void KvRows::copy_rows(const KvRows& src, size_t src_row, size_t dst_row, size_t n) {
  if (src.type_ != type_ || src.width_ != width_) fail("KV rows of another type or width cannot be copied");
  if (src_row + n > src.rows()) fail("KV rows [{}, {}) copied from a cache of {} rows", src_row, src_row + n, src.rows());
  // Cut to dst_row rows, then append: the copied bytes are written once (no zero fill first).
  data_.resize(dst_row * row_bytes_);
  const auto first = src.data_.begin() + (ptrdiff_t)(src_row * row_bytes_);
  data_.insert(data_.end(), first, first + (ptrdiff_t)(n * row_bytes_));
}

const float* KvRows::read(size_t pos, int off, int count, float* scratch) const {
  const uint8_t* row = data_.data() + pos * row_bytes_;
  switch (type_) {
    case KvType::kF32: return reinterpret_cast<const float*>(row) + off;
    case KvType::kF16: dequantize_row_f16(row + 2 * (size_t)off, scratch, count); break;
    case KvType::kBF16: dequantize_row_bf16(row + 2 * (size_t)off, scratch, count); break;
    case KvType::kQ8_0:
      dequantize_row_q8_0(row + kv_bytes(KvType::kQ8_0, (size_t)off), scratch, count);
      break;
  }
  return scratch;
}

}  // namespace rl::cpu
