// How many Q4_K / Q5_K sub-blocks of a GGUF file have every value d*sc*q - dmin*m exactly
// representable in fp32 — the condition under which a K-quant dot product can be taken in the exact
// factored form (d*sc) * Σ q x - (dmin*m) * Σ x that the GPU's IQ products use (docs/perf/cuda.md).
// Counted with quant.h's constant-time test (k_sub_block_factorable: it never accepts a sub-block
// that rounds, so the counts are lower bounds), per sub-block, super-block and tensor. A study
// tool, not a benchmark.
//
//   build-x/kquant_exactness MODEL.gguf [MODEL.gguf ...]
#include <cstdio>
#include <cstring>
#include <exception>

#include "common/fp16.h"
#include "gguf/gguf.h"
#include "quant/blocks.h"
#include "quant/quant.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [MODEL.gguf ...]\n", argv[0]);
    return 2;
  }
  try {
    for (int i = 1; i < argc; i++) {
      auto file = rl::GgufFile::open(argv[i]);
      long long sub = 0, sub_exact = 0, blocks = 0, blocks_exact = 0, tensors = 0, tensors_exact = 0;
      for (const rl::GgufTensorInfo& t : file->tensors()) {
        if (t.type != rl::GgmlType::Q4_K && t.type != rl::GgmlType::Q5_K) continue;
        const bool q5 = t.type == rl::GgmlType::Q5_K;
        const size_t block_bytes = q5 ? sizeof(rl::BlockQ5_K) : sizeof(rl::BlockQ4_K);
        bool tensor_exact = true;
        for (size_t b = 0; b < t.nbytes / block_bytes; b++) {
          const uint8_t* blk = t.data + b * block_bytes;  // d, dmin, scales[12] lead both layouts
          uint16_t dh, mh;
          std::memcpy(&dh, blk, 2);
          std::memcpy(&mh, blk + 2, 2);
          bool all = true;
          for (int s = 0; s < 8; s++) {
            int sc, m;
            rl::k4_scale_min(s, blk + 4, &sc, &m);
            const bool ok = rl::k_sub_block_factorable(rl::fp16_to_f32(dh), rl::fp16_to_f32(mh), sc, m, q5 ? 31 : 15);
            sub++, sub_exact += ok, all = all && ok;
          }
          blocks++, blocks_exact += all, tensor_exact = tensor_exact && all;
        }
        tensors++, tensors_exact += tensor_exact;
      }
      std::printf("%s: Q4_K/Q5_K tensors wholly exact %lld / %lld, super-blocks %lld / %lld, sub-blocks %lld / %lld\n",
                  argv[i], tensors_exact, tensors, blocks_exact, blocks, sub_exact, sub);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kquant_exactness: %s\n", e.what());
    return 1;
  }
  return 0;
}
