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
    static_assert(sizeof(h->iq2xxs_grid) == sizeof(iq2xxs_grid));
    static_assert(sizeof(h->iq2xs_grid) == sizeof(iq2xs_grid));
    static_assert(sizeof(h->iq1s_grid) == sizeof(iq1s_grid));
    static_assert(sizeof(h->ksigns_iq2xs) == sizeof(ksigns_iq2xs));
    std::memcpy(h->iq2xxs_grid, iq2xxs_grid, sizeof h->iq2xxs_grid);
    std::memcpy(h->iq2xs_grid, iq2xs_grid, sizeof h->iq2xs_grid);
    std::memcpy(h->iq1s_grid, iq1s_grid, sizeof h->iq1s_grid);
    std::memcpy(h->ksigns_iq2xs, ksigns_iq2xs, sizeof h->ksigns_iq2xs);
    upload_quant_tables_matvec(*h);
    upload_quant_tables_matmul(*h);
    upload_quant_tables_x24(*h);
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
