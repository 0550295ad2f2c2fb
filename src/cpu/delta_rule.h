// One token of one value head's gated delta rule, in each tier's arithmetic:
//   S = S·decay;  d = (v − S·k)·beta;  S += d·kᵀ;  o = S·q          S: [dv][dk], row i = value dim i
// The state is fp32 in both and rounded at every step.
//   exact (the oracle, forward.cpp's recurrence): four walks over S, each dot product in double.
//   fast: each row of S read and written once for all four steps, in fp32 with AVX2.
//
// The fast step's accuracy: the same operations with fp32 dot products over dk terms (relative
// error ~2^-24·√dk each) where the oracle rounds double sums to fp32; the two drift apart by ~1e-7
// relative a token, and the state's decay keeps that from growing without bound
// (tests/cpu/delta_rule_test.cpp).
#pragma once

namespace rl::cpu {

void delta_rule_step_exact(float* S, const float* q, const float* k, const float* v, double decay, double beta,
                           int dk, int dv, float* o);
void delta_rule_step_fast(float* S, const float* q, const float* k, const float* v, float decay, float beta, int dk,
                          int dv, float* o);

}  // namespace rl::cpu
