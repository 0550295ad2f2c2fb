#include "model/kv_type.h"

#include "common/error.h"

namespace rl {

void check_kv_tier(Numerics numerics, KvType kv) {
  if (numerics == Numerics::kExact && kv != KvType::kF32)
    fail("--kv-type {} with --numerics exact: the exact tier keeps its KV cache in f32 (its values are the "
         "oracle's); use --kv-type f32 or --numerics fast", kv_type_name(kv));
}

void check_kv_type(Numerics numerics, KvType kv, int head_dim) {
  check_kv_tier(numerics, kv);
  if (kv == KvType::kQ8_0 && head_dim % kKvQ8Block != 0)
    fail("--kv-type q8_0: the model's head dim {} is not a multiple of the {}-value q8_0 block", head_dim,
         kKvQ8Block);
}

}  // namespace rl
