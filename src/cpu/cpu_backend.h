// The CPU oracle as an rl::Backend: fp32 ground truth for every other backend.
#pragma once
#include <memory>

#include "model/kv_type.h"
#include "model/model.h"
#include "model/numerics.h"
#include "model/session.h"

namespace rl::cpu {

// n_threads <= 0: every hardware thread. Sessions share the model's weights and the thread pool
// (they keep both alive, so a session may outlive its backend object). numerics: the oracle's
// products (exact, the default of the library: other backends are tested against it) or the fast
// tier's (cpu/products.h); the command line's default is fast. kv: the type sessions keep their
// KV caches in (cpu/kv_cache.h); refused (rl::Error) where check_kv_type refuses it.
std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const Model> model, int n_threads = 0,
                                          Numerics numerics = Numerics::kExact, KvType kv = KvType::kF32);

}  // namespace rl::cpu
