#include "cuda/workspace.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/error.h"
#include "cuda/kernels.h"
#include "cuda/products.h"

namespace rl::cuda {

void PinnedBuffer::allocate(size_t bytes) {
  release();
  if (bytes) RL_CUDA_CHECK(cudaMallocHost(&ptr_, bytes));
  bytes_ = bytes;
}

void PinnedBuffer::release() {
  if (ptr_) cudaFreeHost(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

void StagingArea::allocate() {
  host_.allocate(kStagingBytes);
  dev_.allocate(kStagingBytes);
}

std::pair<void*, void*> StagingArea::stage_bytes(size_t count_bytes) {
  const size_t bytes = align_up(count_bytes);
  // A layer stages a few hundred KiB at most (T·k ids, weights, assignments; slot pointers).
  if (used_ + bytes > kStagingBytes)
    fail("CUDA backend: {} bytes of per-layer tables exceed the {} MiB staging area", used_ + bytes,
         kStagingBytes >> 20);
  void* h = host_.get<uint8_t>() + used_;
  void* d = dev_.get<uint8_t>() + used_;
  used_ += bytes;
  return {h, d};
}

Workspace::Workspace(const Config& c, const NumericForms& forms, int max_tokens_) : max_tokens(max_tokens_) {
  const size_t T = max_tokens;  // 1 .. kMaxPrefillChunk (make_cuda_backend checks)
  const size_t n_embd = c.n_embd;
  const size_t wide = std::max<size_t>({(size_t)c.ssm_conv_dim(), 2 * (size_t)c.q_dim(), 1});
  const size_t narrow =
      std::max<size_t>({(size_t)c.ssm_value_dim(), (size_t)c.q_dim(), 2 * (size_t)c.ssm_n_v_heads, 1});
  const size_t n_assign = T * c.n_expert_used;
  const size_t ff = std::max(c.n_ff_exp, 1), ff_sh = std::max(c.n_ff_shexp, 1);
  auto alloc_bytes = [&](DeviceBuffer& b, size_t bytes) {
    b.allocate(bytes);
    bytes_ += bytes;
  };
  auto alloc = [&](DeviceBuffer& b, size_t floats) { alloc_bytes(b, floats * sizeof(float)); };
  alloc(x, T * n_embd);
  alloc(h, T * n_embd);
  alloc(block_out, T * std::max<size_t>({n_embd, (size_t)c.kv_dim(), 2 * (size_t)c.ssm_n_v_heads}));
  alloc(mixer_wide_a, T * wide);
  alloc(mixer_wide_b, T * wide);
  alloc(mixer_narrow_c, T * narrow);
  alloc(mixer_narrow_a, T * narrow);
  alloc(mixer_narrow_b, T * narrow);
  alloc(router_logits, T * c.n_expert);
  alloc(expert_act, n_assign * ff);
  alloc(expert_up, n_assign * ff);
  alloc(expert_out, n_assign * n_embd);
  alloc(expert_in, n_assign * n_embd);
  if (forms.routed_x24) {
    alloc_bytes(expert_in_x24.q, x24_bytes(n_assign, n_embd));
    alloc_bytes(expert_in_x24.scale, n_assign * (n_embd / 256) * sizeof(double));
    alloc_bytes(expert_act_x24.q, x24_bytes(n_assign, ff));
    alloc_bytes(expert_act_x24.scale, n_assign * (ff / 256) * sizeof(double));
  }
  if (forms.h2_x24) {
    alloc_bytes(moe_input_x24.q, x24_bytes(T, n_embd));
    alloc_bytes(moe_input_x24.scale, T * (n_embd / 256) * sizeof(double));
  }
  if (forms.x32_cols > 0) {
    const size_t cols = forms.x32_cols;
    alloc_bytes(dense_input_x32.q, x32_bytes(T, cols));
    alloc_bytes(dense_input_x32.scale, T * (cols / 256) * sizeof(double));
    alloc_bytes(dense_input_x32.sum, T * (cols / 32) * sizeof(double));
  }
  if (forms.q8) {
    auto alloc_q8 = [&](Q8Rows& b, size_t rows, size_t cols) {
      alloc_bytes(b.q, rows * cols);
      alloc_bytes(b.ds, rows * (cols / 32) * sizeof(float2));
      b.rows = (int)rows;
    };
    const size_t dense = std::max<size_t>({n_embd, (size_t)c.ssm_value_dim(), (size_t)c.q_dim(), ff_sh});
    // A pass of up to kQ8PassTokens tokens takes matvec-q8 for its dense products (plan.h).
    alloc_q8(q8_input, kQ8PassTokens, dense);
    alloc_q8(q8_side_input, 1, std::max(n_embd, ff_sh));
    alloc_q8(q8_predict_input, 1, n_embd);
    alloc_q8(q8_moe_input, kQ8PassTokens, n_embd);
    const size_t pairs = (size_t)kQ8PassTokens * std::max(c.n_expert_used, 1);
    alloc_q8(q8_expert_act, pairs, ff);
  }
  if (forms.bf16) alloc(split_k, kSplitKFloats);
  alloc(shared_act, T * ff_sh);
  alloc(shared_up, T * ff_sh);
  alloc(shared_out, T * n_embd);
  alloc(shared_scalar, T);
  alloc_bytes(ids, T * sizeof(int32_t));
  alloc_bytes(pos, T * sizeof(int32_t));
  alloc(logits, c.n_vocab);  // grows when all positions' logits are asked for
  logits_rows = 1;
  router_host.allocate(T * c.n_expert * sizeof(float));
  alloc_bytes(route_ids, n_assign * sizeof(int32_t));
  alloc_bytes(route_weights, n_assign * sizeof(float));
  route_ids_host.allocate(n_assign * sizeof(int32_t));
  alloc(predict_input, n_embd);
  alloc(predict_logits, c.n_expert);
  alloc_bytes(predict_ids, c.n_expert_used * sizeof(int32_t));
  alloc(predict_weights, c.n_expert_used);
  predict_ids_host.allocate(c.n_expert_used * sizeof(int32_t));
  staging.allocate();
  bytes_ += kStagingBytes;
  const size_t n_groups = (size_t)expert_group_bound((int)n_assign, c.n_expert);
  alloc_bytes(grouped_gather, n_assign * sizeof(int32_t));
  alloc_bytes(grouped_assign, n_assign * sizeof(int32_t));
  alloc_bytes(grouped_slot_ptrs, n_groups * sizeof(void*));
  alloc_bytes(grouped_groups, 2 * n_groups * sizeof(int32_t));
  alloc_bytes(grouped_distinct, (size_t)c.n_layer * sizeof(int32_t));
  grouped_distinct_host.allocate((size_t)c.n_layer * sizeof(int32_t));

  // The GPU-routed token.
  const size_t LK = (size_t)c.n_layer * c.n_expert_used;
  alloc_bytes(token_position, 2 * sizeof(int32_t));
  alloc_bytes(routed_io, (LK + c.n_layer) * sizeof(int32_t));
  alloc_bytes(routed_weights, LK * sizeof(float));
  alloc_bytes(routed_slot_ptrs, LK * sizeof(void*));
  alloc_bytes(routed_router, (size_t)c.n_layer * c.n_expert * sizeof(float));
  const size_t n_pairs = (size_t)kQ8PassTokens * c.n_expert_used;
  alloc_bytes(assign_identity, n_pairs * sizeof(int32_t));
  alloc_bytes(pair_slot_ptrs, n_pairs * sizeof(void*));
  alloc_bytes(routed_logits, (size_t)c.n_vocab * sizeof(float));
  std::vector<int32_t> identity(n_pairs);
  std::iota(identity.begin(), identity.end(), 0);
  RL_CUDA_CHECK(cudaMemcpy(assign_identity.get(), identity.data(), identity.size() * sizeof(int32_t),
                           cudaMemcpyHostToDevice));
  token_position_host.allocate(2 * sizeof(int32_t));
  routed_io_host.allocate((LK + c.n_layer) * sizeof(int32_t));
  routed_router_host.allocate((size_t)c.n_layer * c.n_expert * sizeof(float));
  // The GPU-routed path copies the logits here without a prefill having sized it.
  logits_host.allocate((size_t)c.n_vocab * sizeof(float));

  // The batched decode step.
  alloc_bytes(batch_io, 2 * kMaxBatchRows * sizeof(int32_t));
  alloc_bytes(batch_logits, (size_t)kMaxBatchRows * c.n_vocab * sizeof(float));
  batch_io_host.allocate(2 * kMaxBatchRows * sizeof(int32_t));
  batch_logits_host.allocate((size_t)kMaxBatchRows * c.n_vocab * sizeof(float));
}

void Workspace::reserve_logits(size_t rows, int n_vocab) {
  if (rows > logits_rows) {
    logits.allocate(rows * n_vocab * sizeof(float));
    logits_rows = rows;
  }
  const size_t bytes = rows * n_vocab * sizeof(float);
  if (bytes > logits_host.bytes()) {
    logits_host.release();
    logits_host.allocate(bytes);
  }
}

DeltaNetViews Workspace::deltanet_views(const Config& c, int T) const {
  const size_t nv = c.ssm_n_v_heads;
  return {mixer_wide_a.f(),   mixer_wide_b.f(), mixer_narrow_a.f(), mixer_narrow_b.f(),
          mixer_narrow_c.f(), block_out.f(),    block_out.f() + (size_t)T * nv};
}

AttentionViews Workspace::attention_views() const {
  return {mixer_wide_a.f(),   mixer_wide_b.f(), mixer_narrow_a.f(), mixer_narrow_b.f(),
          mixer_narrow_c.f(), block_out.f()};
}

}  // namespace rl::cuda
