// Sessions of the CUDA backend: per-session device state (KV caches, DeltaNet states), prefill in
// chunks of --prefill-chunk tokens, decode (GPU-routed graph first, else the synchronous path), and
// snapshots (device copies of the recurrent states; the KV rows shared with the session until it
// overwrites them, model/kv_share.h).
#include <algorithm>
#include <memory>
#include <vector>

#include "common/error.h"
#include "cuda/engine.h"
#include "model/kv_share.h"

namespace rl::cuda {

namespace {

// KV rows frozen for snapshots (model/kv_share.h): per attention layer its K and V rows in the
// session's layout for `capacity` rows (KvCacheRef: a q8_0 cache's values, then their scales).
struct FrozenKvDevice {
  KvType type = KvType::kF32;
  size_t capacity = 0;
  std::vector<DeviceBuffer> k, v;  // [n_layer]; empty for the DeltaNet layers
  size_t bytes() const {
    size_t n = 0;
    for (size_t L = 0; L < k.size(); L++) n += k[L].bytes() + v[L].bytes();
    return n;
  }
};
using KvLedgerCuda = KvLedger<FrozenKvDevice, SessionState>;

// The recurrent states copied; the KV rows shared with the session (kv_share.h).
class CudaSnapshot final : public KvSharingSnapshot<FrozenKvDevice, SessionState> {
 public:
  const Engine* owner = nullptr;  // the loaded model whose sessions may restore it
  KvType kv_type = KvType::kF32;
  std::vector<DeviceBuffer> conv, ssm;  // [n_layer]: SessionState's, empty for attention layers
};

// Rows [src_row, src_row + n) of a K or V cache laid out for src_capacity rows into rows
// [dst_row, dst_row + n) of one laid out for dst_capacity rows, enqueued on `stream` (in order
// with the passes that read and write the caches). A q8_0 cache's values and scales are two ranges.
void copy_kv_rows(KvType type, size_t width, const DeviceBuffer& src, size_t src_capacity, size_t src_row,
                  DeviceBuffer& dst, size_t dst_capacity, size_t dst_row, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const size_t row_bytes = kv_bytes(type, width);
  auto copy = [&](size_t src_offset, size_t dst_offset, size_t bytes_a_row) {
    RL_CUDA_CHECK(cudaMemcpyAsync(dst.get<uint8_t>() + dst_offset + dst_row * bytes_a_row,
                                  src.get<uint8_t>() + src_offset + src_row * bytes_a_row, n * bytes_a_row,
                                  cudaMemcpyDeviceToDevice, stream));
  };
  if (type != KvType::kQ8_0) return copy(0, 0, row_bytes);
  copy(0, 0, width);                                                    // int8 values
  copy(src_capacity * width, dst_capacity * width, row_bytes - width);  // fp16 scales
}

// The decode attention's split buffers of the attention kernels in use.
size_t split_bytes(const Config& c, int n_ctx, bool fast) {
  return fast ? AttentionSplitsF::bytes(n_ctx, c.n_head, c.head_dim)
              : AttentionSplits::bytes(n_ctx, c.n_head, c.head_dim);
}

class CudaSessionImpl final : public Session {
 public:
  CudaSessionImpl(Engine& engine, int n_ctx)
      : e_(engine),
        ledger_(st_, [this](size_t from, size_t to) { return freeze_rows(from, to); },
                [this] { return surrender_rows(); }) {
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

  ~CudaSessionImpl() override {
    forget_batch_graphs(e_, st_);
    ledger_.close();  // while the caches exist; the frozen copies run before they are freed
    cudaStreamSynchronize(e_.streams.compute);
  }

  std::vector<float> prefill(std::span<const int32_t> tokens, std::vector<float>* all_logits) override {
    check_tokens(tokens);
    ledger_.before_write((size_t)st_.position);
    const size_t n_vocab = (size_t)e_.config().n_vocab;
    if (all_logits) all_logits->assign(tokens.size() * n_vocab, 0.0f);
    std::vector<float> last(n_vocab);
    // Every position's logits: passes of at most kAllLogitsPassTokens, which bounds the device
    // logits buffer (cuda_options.h).
    const size_t chunk = (size_t)(all_logits ? std::min(e_.ws.max_tokens, kAllLogitsPassTokens) : e_.ws.max_tokens);
    for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
      const size_t n = std::min(tokens.size() - begin, chunk);
      float* dst = all_logits ? all_logits->data() + begin * n_vocab : last.data();
      run_pass(e_, st_, tokens.subspan(begin, n), all_logits != nullptr, dst, trace_);
      if (all_logits && begin + n == tokens.size())
        std::copy(dst + (n - 1) * n_vocab, dst + n * n_vocab, last.begin());
    }
    return last;
  }

  std::vector<float> decode(int32_t token) override {
    check_tokens(std::span(&token, 1));
    ledger_.before_write((size_t)st_.position);  // the GPU-routed token writes its KV rows too
    e_.stats.tokens_decoded++;
    std::vector<float> logits((size_t)e_.config().n_vocab);
    if (decode_gpu_routed(e_, st_, token, logits.data(), trace_)) return logits;
    return prefill(std::span(&token, 1), nullptr);
  }

  int position() const override { return st_.position; }
  int n_ctx() const override { return st_.n_ctx; }
  int prefill_chunk() const override { return e_.ws.max_tokens; }
  int n_vocab() const override { return e_.config().n_vocab; }

  std::unique_ptr<SessionSnapshot> snapshot() const override {
    auto s = std::make_unique<CudaSnapshot>();
    s->owner = &e_;
    s->kv_type = st_.kv_type;
    for (size_t L = 0; L < st_.conv.size(); L++) {
      for (auto [src, dst] : {std::pair{&st_.conv[L], &s->conv}, {&st_.ssm[L], &s->ssm}}) {
        dst->emplace_back(src->bytes());
        copy_device(*src, dst->back());
        s->recurrent_bytes += src->bytes();
      }
    }
    ledger_.share(s->kv, (size_t)st_.position);
    return s;
  }

  // The KV rows come back through the ledger (only the frozen ones when the snapshot's rows are
  // live in this session), then the recurrent states.
  void restore(const SessionSnapshot& snap) override {
    const auto* s = dynamic_cast<const CudaSnapshot*>(&snap);
    if (!s) fail("restore: the snapshot was not taken from a cuda session");
    s->kv.check_restorable();
    if (s->owner != &e_) fail("restore: the snapshot was taken from a session of another loaded model");
    if (s->position() > st_.n_ctx)
      fail("restore: the snapshot is at position {}, past this session's context of {} tokens", s->position(),
           st_.n_ctx);
    if (s->kv_type != st_.kv_type) fail("restore: the snapshot's KV cache is of another type");
    // The pieces the copies read stay allocated until the copies are done (adopt drops them).
    const std::vector<KvPiece<FrozenKvDevice>> reading = s->kv.pieces();
    const size_t width = (size_t)e_.config().kv_dim(), cap = (size_t)st_.n_ctx;
    const cudaStream_t stream = e_.streams.compute;
    ledger_.adopt(
        s->kv,
        [&](const SessionState& source, size_t n) {
          each_kv([&](size_t L) {
            copy_kv_rows(st_.kv_type, width, source.k_cache[L], source.n_ctx, 0, st_.k_cache[L], cap, 0, n, stream);
            copy_kv_rows(st_.kv_type, width, source.v_cache[L], source.n_ctx, 0, st_.v_cache[L], cap, 0, n, stream);
          });
        },
        [&](const KvPiece<FrozenKvDevice>& p) {
          const size_t n = p.end - p.begin;  // a piece's rows start at its begin: row 0 of p.rows
          each_kv([&](size_t L) {
            copy_kv_rows(st_.kv_type, width, p.rows->k[L], p.rows->capacity, 0, st_.k_cache[L], cap, p.begin, n,
                         stream);
            copy_kv_rows(st_.kv_type, width, p.rows->v[L], p.rows->capacity, 0, st_.v_cache[L], cap, p.begin, n,
                         stream);
          });
        });
    for (size_t L = 0; L < st_.conv.size(); L++) {
      copy_device(s->conv[L], st_.conv[L]);
      copy_device(s->ssm[L], st_.ssm[L]);
    }
    st_.position = s->position();
    if (!reading.empty()) RL_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  // The KV rows stay (snapshots may reference them): the next pass, from position 0, freezes them.
  // On the compute stream, after any restore's copies into the same states.
  void reset() override {
    for (auto* states : {&st_.conv, &st_.ssm})
      for (DeviceBuffer& b : *states)
        if (b.bytes()) RL_CUDA_CHECK(cudaMemsetAsync(b.get(), 0, b.bytes(), e_.streams.compute));
    st_.position = 0;
  }

  void set_trace(TraceSink* sink) override { trace_ = sink; }

  bool of(const Engine& e) const { return &e_ == &e; }

  // batch_row (engine.h): the state of a session about to decode a token in a batched step.
  SessionState* batch_row() {
    if (trace_) return nullptr;
    ledger_.before_write((size_t)st_.position);
    return &st_;
  }

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

  // f(L) for each attention layer.
  template <class F>
  void each_kv(F&& f) const {
    for (size_t L = 0; L < st_.k_cache.size(); L++)
      if (st_.k_cache[L].bytes()) f(L);
  }
  // One state buffer into another of its size, in order with the passes.
  void copy_device(const DeviceBuffer& src, DeviceBuffer& dst) const {
    if (src.bytes())
      RL_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), src.bytes(), cudaMemcpyDeviceToDevice, e_.streams.compute));
  }
  // Rows [from, to) of every attention layer's caches, copied for the snapshots that reference them.
  std::shared_ptr<const FrozenKvDevice> freeze_rows(size_t from, size_t to) const {
    auto f = std::make_shared<FrozenKvDevice>();
    f->type = st_.kv_type;
    f->capacity = to - from;
    f->k.resize(st_.k_cache.size());
    f->v.resize(st_.v_cache.size());
    const size_t width = (size_t)e_.config().kv_dim(), bytes = kv_bytes(st_.kv_type, f->capacity * width);
    // Every buffer before any copy: a failed allocation frees only buffers no copy writes.
    try {
      each_kv([&](size_t L) {
        f->k[L].allocate(bytes);
        f->v[L].allocate(bytes);
      });
    } catch (...) {
      cudaGetLastError();  // a failed cudaMalloc must not surface at the next kernel launch's check
      throw;
    }
    each_kv([&](size_t L) {
      copy_kv_rows(f->type, width, st_.k_cache[L], st_.n_ctx, from, f->k[L], f->capacity, 0, f->capacity,
                   e_.streams.compute);
      copy_kv_rows(f->type, width, st_.v_cache[L], st_.n_ctx, from, f->v[L], f->capacity, 0, f->capacity,
                   e_.streams.compute);
    });
    return f;
  }
  // The caches themselves, for the destructor when a copy cannot be allocated.
  std::shared_ptr<const FrozenKvDevice> surrender_rows() {
    auto f = std::make_shared<FrozenKvDevice>();
    f->type = st_.kv_type;
    f->capacity = (size_t)st_.n_ctx;
    f->k = std::move(st_.k_cache);
    f->v = std::move(st_.v_cache);
    return f;
  }

  Engine& e_;
  SessionState st_;
  TraceSink* trace_ = nullptr;
  // After st_: the ledger refers to the caches.
  mutable KvLedgerCuda ledger_;
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

SessionState* batch_row(Session& s) { return static_cast<CudaSessionImpl&>(s).batch_row(); }

std::unique_ptr<Session> new_cuda_session(Engine& e, int n_ctx) {
  if (n_ctx <= 0) fail("context size {} must be positive (--ctx)", n_ctx);
  return std::make_unique<CudaSessionImpl>(e, n_ctx);
}

}  // namespace rl::cuda
