// The job lists of n routed experts' decode products through slot pointers (job e reads slot e),
// shared by the launchers of both decode forms (matvec.cu, matvec_q8.cu): everything but the
// jobs' inputs, which the caller sets (x, or the Q8 form's xq / xds).
#pragma once
#include <vector>

#include "cuda/kernels.h"

namespace rl::cuda {

// Expert e: W = slot_ptrs[e] + w_offset, y_e = y + e * rows.
inline std::vector<MatvecJob> expert_matvec_jobs(const uint8_t* const* slot_ptrs, size_t w_offset, size_t row_bytes,
                                                 int rows, float* y, int n) {
  std::vector<MatvecJob> jobs(n);
  for (int e = 0; e < n; e++) {
    MatvecJob& j = jobs[e];
    j.slot_ptrs = slot_ptrs;
    j.slot = e;
    j.w_offset = w_offset;
    j.row_bytes = row_bytes;
    j.rows = rows;
    j.y = y + (size_t)e * rows;
  }
  return jobs;
}

// Expert e's SwiGLU pair: gate at slot_ptrs[e], up at slot_ptrs[e] + up_offset, act_e = act + e * rows.
inline std::vector<GateUpJob> expert_gate_up_jobs(const uint8_t* const* slot_ptrs, size_t up_offset,
                                                  size_t row_bytes_gate, size_t row_bytes_up, int rows, float* act,
                                                  int n) {
  std::vector<GateUpJob> jobs(n);
  for (int e = 0; e < n; e++) {
    GateUpJob& j = jobs[e];
    j.slot_ptrs = slot_ptrs;
    j.slot = e;
    j.up_offset = up_offset;
    j.row_bytes_gate = row_bytes_gate;
    j.row_bytes_up = row_bytes_up;
    j.rows = rows;
    j.act = act + (size_t)e * rows;
  }
  return jobs;
}

}  // namespace rl::cuda
