// Sessions of the CUDA backend: per-session device state (KV caches, DeltaNet states), prefill in
// chunks of kMaxChunk tokens, decode (GPU-routed graph first, else the synchronous path), and
// snapshots (device copies of the state up to the position).
#include <algorithm>
#include <memory>
#include <vector>

#include "common/error.h"
#include "cuda/engine.h"

namespace rl::cuda {

namespace {

class CudaSnapshot final : public SessionSnapshot {
 public:
  const Engine* owner = nullptr;  // the loaded model whose sessions may restore it
  int pos = 0;
  KvType kv_type = KvType::kF32;
  std::vector<DeviceBuffer> k_cache, v_cache, conv, ssm;  // KV: positions [0, pos) (kv_prefix, packed)
  size_t total = 0;
  size_t bytes() const override { return total; }
  int position() const override { return pos; }
};

// The parts of a layer's K (or V) cache that hold positions [0, pos): one range of the plain
// types, a q8_0 cache's values and its scales (KvCacheRef's layout). {offset, bytes} each.
struct KvRange {
  size_t offset, bytes;
};
std::vector<KvRange> kv_prefix(KvType type, int n_ctx, size_t width, int pos) {
  if (type != KvType::kQ8_0) return {{0, kv_bytes(type, (size_t)pos * width)}};
  const size_t values = (size_t)pos * width;
  return {{0, values}, {(size_t)n_ctx * width, kv_bytes(type, values) - values}};
}

// The decode attention's split buffers of the attention kernels in use.
size_t split_bytes(const Config& c, int n_ctx, bool fast) {
  return fast ? AttentionSplitsF::bytes(n_ctx, c.n_head, c.head_dim)
              : AttentionSplits::bytes(n_ctx, c.n_head, c.head_dim);
}

class CudaSessionImpl final : public Session {
 public:
  CudaSessionImpl(Engine& engine, int n_ctx) : e_(engine) {
    const Config& c = e_.config();
    st_.n_ctx = n_ctx;
    st_.kv_type = e_.forms.kv_type;
    st_.k_cache.resize(c.n_layer);
    st_.v_cache.resize(c.n_layer);
    st_.conv.resize(c.n_layer);
    st_.ssm.resize(c.n_layer);
    check_session_fits(e_, n_ctx);
    const size_t kv_layer_bytes = kv_bytes(st_.kv_type, (size_t)n_ctx * c.kv_dim());
    for (int L = 0; L < c.n_layer; L++) {
      if (c.is_recurrent[L]) {
        st_.conv[L].allocate((size_t)(c.ssm_conv_kernel - 1) * c.ssm_conv_dim() * sizeof(float));
        st_.ssm[L].allocate((size_t)c.ssm_n_v_heads * c.ssm_head_dim * c.ssm_head_dim * sizeof(float));
      } else {
        st_.k_cache[L].allocate(kv_layer_bytes);
        st_.v_cache[L].allocate(kv_layer_bytes);
      }
    }
    st_.attn_split_storage.allocate(split_bytes(c, n_ctx, e_.forms.fast_attention));
    if (e_.forms.fast_attention)
      st_.attn_splits_f = AttentionSplitsF::within(st_.attn_split_storage.get(), n_ctx, c.n_head, c.head_dim);
    else
      st_.attn_splits = AttentionSplits::within(st_.attn_split_storage.get(), n_ctx, c.n_head, c.head_dim);
    reset();
  }

  std::vector<float> prefill(std::span<const int32_t> tokens, std::vector<float>* all_logits) override {
    check_tokens(tokens);
    const size_t n_vocab = (size_t)e_.config().n_vocab;
    if (all_logits) all_logits->assign(tokens.size() * n_vocab, 0.0f);
    std::vector<float> last(n_vocab);
    for (size_t begin = 0; begin < tokens.size(); begin += kMaxChunk) {
      const size_t n = std::min(tokens.size() - begin, (size_t)kMaxChunk);
      float* dst = all_logits ? all_logits->data() + begin * n_vocab : last.data();
      run_pass(e_, st_, tokens.subspan(begin, n), all_logits != nullptr, dst, trace_);
      if (all_logits && begin + n == tokens.size())
        std::copy(dst + (n - 1) * n_vocab, dst + n * n_vocab, last.begin());
    }
    return last;
  }

  std::vector<float> decode(int32_t token) override {
    check_tokens(std::span(&token, 1));
    e_.stats.tokens_decoded++;
    std::vector<float> logits((size_t)e_.config().n_vocab);
    if (decode_gpu_routed(e_, st_, token, logits.data(), trace_)) return logits;
    return prefill(std::span(&token, 1), nullptr);
  }

  int position() const override { return st_.position; }
  int n_ctx() const override { return st_.n_ctx; }
  int n_vocab() const override { return e_.config().n_vocab; }

  std::unique_ptr<SessionSnapshot> snapshot() const override {
    auto s = std::make_unique<CudaSnapshot>();
    s->owner = &e_;
    s->pos = st_.position;
    const Config& c = e_.config();
    s->kv_type = st_.kv_type;
    // Each buffer's ranges, one after another in the snapshot's buffer.
    auto copy = [&](const DeviceBuffer& src, const std::vector<KvRange>& ranges, std::vector<DeviceBuffer>& dst) {
      size_t bytes = 0;
      for (const KvRange& r : ranges) bytes += r.bytes;
      dst.emplace_back(bytes);
      size_t at = 0;
      for (const KvRange& r : ranges) {
        if (r.bytes)
          RL_CUDA_CHECK(cudaMemcpy(dst.back().get<uint8_t>() + at, src.get<uint8_t>() + r.offset, r.bytes,
                                   cudaMemcpyDeviceToDevice));
        at += r.bytes;
      }
      s->total += bytes;
    };
    const std::vector<KvRange> kv = kv_prefix(st_.kv_type, st_.n_ctx, c.kv_dim(), st_.position);
    for (int L = 0; L < c.n_layer; L++) {
      const bool attention = st_.k_cache[L].bytes() != 0;
      copy(st_.k_cache[L], attention ? kv : std::vector<KvRange>{}, s->k_cache);
      copy(st_.v_cache[L], attention ? kv : std::vector<KvRange>{}, s->v_cache);
      copy(st_.conv[L], {{0, st_.conv[L].bytes()}}, s->conv);
      copy(st_.ssm[L], {{0, st_.ssm[L].bytes()}}, s->ssm);
    }
    return s;
  }

  void restore(const SessionSnapshot& snap) override {
    const auto* s = dynamic_cast<const CudaSnapshot*>(&snap);
    if (!s) fail("restore: the snapshot was not taken from a cuda session");
    if (s->owner != &e_) fail("restore: the snapshot was taken from a session of another loaded model");
    if (s->pos > st_.n_ctx)
      fail("restore: the snapshot is at position {}, past this session's context of {} tokens", s->pos,
           st_.n_ctx);
    if (s->kv_type != st_.kv_type) fail("restore: the snapshot's KV cache is of another type");
    // The snapshot's KV ranges go where this session's layout puts positions [0, pos).
    const std::vector<KvRange> kv = kv_prefix(st_.kv_type, st_.n_ctx, e_.config().kv_dim(), s->pos);
    auto put = [](const DeviceBuffer& src, const std::vector<KvRange>& ranges, DeviceBuffer& dst) {
      size_t at = 0;
      for (const KvRange& r : ranges) {
        if (r.bytes)
          RL_CUDA_CHECK(cudaMemcpy(dst.get<uint8_t>() + r.offset, src.get<uint8_t>() + at, r.bytes,
                                   cudaMemcpyDeviceToDevice));
        at += r.bytes;
      }
    };
    for (size_t L = 0; L < st_.conv.size(); L++) {
      if (s->k_cache[L].bytes()) {
        put(s->k_cache[L], kv, st_.k_cache[L]);
        put(s->v_cache[L], kv, st_.v_cache[L]);
      }
      put(s->conv[L], {{0, s->conv[L].bytes()}}, st_.conv[L]);
      put(s->ssm[L], {{0, s->ssm[L].bytes()}}, st_.ssm[L]);
    }
    st_.position = s->pos;
  }

  void reset() override {
    for (size_t L = 0; L < st_.conv.size(); L++) {
      if (st_.conv[L].bytes()) RL_CUDA_CHECK(cudaMemset(st_.conv[L].get(), 0, st_.conv[L].bytes()));
      if (st_.ssm[L].bytes()) RL_CUDA_CHECK(cudaMemset(st_.ssm[L].get(), 0, st_.ssm[L].bytes()));
    }
    st_.position = 0;
  }

  void set_trace(TraceSink* sink) override { trace_ = sink; }

  bool of(const Engine& e) const { return &e_ == &e; }

 private:
  void check_tokens(std::span<const int32_t> tokens) const {
    if (tokens.empty()) fail("prefill: no tokens given");
    if ((int64_t)st_.position + (int64_t)tokens.size() > st_.n_ctx)
      fail("context full: {} tokens at position {} would run past the context of {} tokens (--ctx)",
           tokens.size(), st_.position, st_.n_ctx);
    for (size_t i = 0; i < tokens.size(); i++)
      if (tokens[i] < 0 || tokens[i] >= e_.config().n_vocab)
        fail("token id {} (input index {}) is out of range: the vocabulary has {} tokens", tokens[i], i,
             e_.config().n_vocab);
  }

  Engine& e_;
  SessionState st_;
  TraceSink* trace_ = nullptr;
};

}  // namespace

size_t session_bytes(const Config& c, const NumericForms& forms, int n_ctx) {
  // The recurrent states twice: the GPU-routed token's backups.
  return c.kv_bytes_per_token(forms.kv_type) * n_ctx + 2 * c.recurrent_state_bytes() +
         split_bytes(c, n_ctx, forms.fast_attention);
}

void check_session_fits(const Engine& e, int n_ctx) {
  const Config& c = e.config();
  const size_t need = session_bytes(c, e.forms, n_ctx);
  size_t free_bytes = 0, total_bytes = 0;
  RL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (need > free_bytes)
    fail("--ctx {}: a session of {} tokens needs {} bytes ({:.1f} MiB) of device memory (KV cache {} in {}: {} "
         "bytes a token), but only {:.1f} MiB are free", n_ctx, n_ctx, need, need / 1048576.0,
         c.kv_bytes_per_token(e.forms.kv_type) * (size_t)n_ctx, kv_type_name(e.forms.kv_type),
         c.kv_bytes_per_token(e.forms.kv_type), free_bytes / 1048576.0);
}

void check_session_of(const Engine& e, Session& s, size_t index) {
  auto* cs = dynamic_cast<CudaSessionImpl*>(&s);
  if (!cs || !cs->of(e)) fail("decode_batch: session {} is not a session of this loaded model", index);
}

std::unique_ptr<Session> new_cuda_session(Engine& e, int n_ctx) {
  if (n_ctx <= 0) fail("context size {} must be positive (--ctx)", n_ctx);
  return std::make_unique<CudaSessionImpl>(e, n_ctx);
}

}  // namespace rl::cuda
