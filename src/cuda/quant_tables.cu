// The IQ codebooks on the device, copied from quant/iq_grids.h (the one source of the tables).
#include <cstring>
#include <memory>
#include <mutex>

#include "cuda/cuda_check.h"
#include "cuda/quant_device.cuh"
#include "quant/iq_grids.h"

namespace rl::cuda {

void upload_quant_tables() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto h = std::make_unique<QuantTablesHost>();
#define RL_COPY_TABLE(name)                          \
  static_assert(sizeof(h->name) == sizeof(name)); \
  std::memcpy(h->name, name, sizeof h->name)
    RL_COPY_TABLE(iq2xxs_grid);
    RL_COPY_TABLE(iq2xs_grid);
    RL_COPY_TABLE(iq2s_grid);
    RL_COPY_TABLE(iq3xxs_grid);
    RL_COPY_TABLE(iq3s_grid);
    RL_COPY_TABLE(iq1s_grid);
    RL_COPY_TABLE(ksigns_iq2xs);
    RL_COPY_TABLE(kvalues_iq4nl);
    RL_COPY_TABLE(kvalues_mxfp4);
#undef RL_COPY_TABLE
    upload_quant_tables_matvec(*h);
    upload_quant_tables_matmul(*h);
    upload_quant_tables_x24(*h);
    upload_quant_tables_bf16(*h);
    upload_quant_tables_matvec_q8(*h);
  });
}

bool device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the "no device" status
    return false;
  }
  return n > 0;
}

}  // namespace rl::cuda
