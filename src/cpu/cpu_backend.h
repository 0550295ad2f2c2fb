// The CPU oracle as an rl::Backend: fp32 ground truth for every other backend.
#pragma once
#include <memory>

#include "model/model.h"
#include "model/session.h"

namespace rl::cpu {

// n_threads <= 0: every hardware thread. Sessions share the model's weights and the thread pool
// (they keep both alive, so a session may outlive its backend object).
std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const Model> model, int n_threads = 0);

}  // namespace rl::cpu
