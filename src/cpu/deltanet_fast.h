// The fast tier's gated delta rule on the CPU (docs/cpu-fast.md): one token of one value head,
//   S = S·decay;  d = (v − S·k)·beta;  S += d·kᵀ;  o = S·q          S: [dv][dk], row i = value dim i
// in fp32 with AVX2, each row of S read and written once for all four steps (the oracle's form in
// forward.cpp walks S four times and sums in double).
//
// Accuracy: the same operations as the oracle's with fp32 dot products over dk terms (relative
// error ~2^-24·√dk each) where the oracle rounds double sums to fp32; the state is rounded to fp32
// at every step in both, so the two drift apart by ~1e-7 relative a token, and the state's decay
// keeps that from growing without bound (tests/cpu/deltanet_fast_test.cpp).
#pragma once

namespace rl::cpu {

void delta_rule_step_fast(float* S, const float* q, const float* k, const float* v, float decay, float beta, int dk,
                          int dv, float* o);

}  // namespace rl::cpu
