#include "cpu/cpu_backend.h"

#include <memory>

#include "common/error.h"
#include "cpu/forward.h"
#include "gguf/gguf.h"
#include "model/kv_share.h"

namespace rl::cpu {
namespace {

// Everything sessions share: the model, its small vectors in fp32, the thread pool and the
// tier's products.
struct Shared {
  Shared(std::shared_ptr<const Model> model, int n_threads, Numerics numerics, KvType kv)
      : weights(std::move(model)), pool(n_threads), products(make_products(numerics, pool)), kv(kv) {}
  OracleWeights weights;
  ThreadPool pool;
  std::unique_ptr<Products> products;
  KvType kv;  // every session's KV cache type
};

// KV rows frozen for snapshots (model/kv_share.h): per layer, empty for the DeltaNet layers.
struct FrozenKv {
  std::vector<KvRows> k, v;  // [n_layer]
  size_t bytes() const {
    size_t n = 0;
    for (size_t L = 0; L < k.size(); L++) n += k[L].held_bytes() + v[L].held_bytes();
    return n;
  }
};
using KvLedgerCpu = KvLedger<FrozenKv, State>;

// The recurrent states copied; the KV rows shared with the session (kv_share.h).
class CpuSnapshot final : public KvSharingSnapshot<FrozenKv, State> {
 public:
  explicit CpuSnapshot(const Shared* owner) : owner(owner) {}
  const Shared* owner;  // snapshots restore only into sessions of the same loaded model
  std::vector<std::vector<float>> conv, ssm;  // [n_layer]: LayerState's, empty for attention layers
};

class CpuSession final : public Session {
 public:
  CpuSession(std::shared_ptr<Shared> shared, int n_ctx)
      : shared_(std::move(shared)),
        n_ctx_(n_ctx),
        state_(initial_state(config(), shared_->kv)),
        ledger_(state_, [this](size_t from, size_t to) { return freeze_rows(from, to); },
                [this] { return surrender_rows(); }) {}

  std::vector<float> prefill(std::span<const int32_t> tokens, std::vector<float>* all_logits) override {
    check_tokens(tokens);
    State& state = state_to_advance();
    const size_t n_vocab = (size_t)config().n_vocab;
    if (all_logits) all_logits->assign(tokens.size() * n_vocab, 0.0f);
    std::vector<float> last(n_vocab);
    for (size_t begin = 0; begin < tokens.size(); begin += kMaxBatch) {
      const size_t n = std::min(tokens.size() - begin, (size_t)kMaxBatch);
      const bool final_chunk = begin + n == tokens.size();
      float* dst = all_logits ? all_logits->data() + begin * n_vocab : last.data();
      forward(shared_->weights, *shared_->products, state, tokens.subspan(begin, n), all_logits != nullptr, dst,
              trace_);
      // Weights read from a file truncated meanwhile came back as zeros (mapped_file.h): this pass
      // and the session's state are garbage, so the call fails naming the file.
      shared_->weights.model->gguf().check_intact();
      if (all_logits && final_chunk)
        std::copy(dst + (n - 1) * n_vocab, dst + n * n_vocab, last.begin());
    }
    return last;
  }

  std::vector<float> decode(int32_t token) override { return prefill(std::span(&token, 1), nullptr); }

  int position() const override { return state_.position; }
  int n_ctx() const override { return n_ctx_; }
  int prefill_chunk() const override { return kMaxBatch; }  // prefill()'s passes
  int n_vocab() const override { return config().n_vocab; }

  std::unique_ptr<SessionSnapshot> snapshot() const override {
    auto s = std::make_unique<CpuSnapshot>(shared_.get());
    for (const LayerState& l : state_.layers) {
      s->conv.push_back(l.conv);
      s->ssm.push_back(l.ssm);
      s->recurrent_bytes += (l.conv.size() + l.ssm.size()) * sizeof(float);
    }
    ledger_.share(s->kv, (size_t)state_.position);
    return s;
  }

  // The KV rows come back through the ledger (only the frozen ones when the snapshot's rows are
  // live in this session), then the recurrent states.
  void restore(const SessionSnapshot& snap) override {
    const auto* s = dynamic_cast<const CpuSnapshot*>(&snap);
    if (!s) fail("restore: the snapshot was not taken from a cpu session");
    s->kv.check_restorable();
    if (s->owner != shared_.get()) fail("restore: the snapshot was taken from a session of another loaded model");
    if (s->position() > n_ctx_)
      fail("restore: the snapshot is at position {}, past this session's context of {} tokens", s->position(),
           n_ctx_);
    // A copy that fails part way (no memory) leaves the caches shorter than the position: the
    // session goes back to empty (position 0) before the error goes on, so nothing reads past them.
    try {
      adopt_rows(*s);
    } catch (...) {
      reset();
      throw;
    }
    for (size_t L = 0; L < state_.layers.size(); L++) {
      state_.layers[L].conv = s->conv[L];
      state_.layers[L].ssm = s->ssm[L];
    }
    state_.position = s->position();
  }

  // The KV rows stay (snapshots may reference them): the next pass, from position 0, freezes them.
  void reset() override {
    for (LayerState& l : state_.layers) {
      std::fill(l.conv.begin(), l.conv.end(), 0.0f);
      std::fill(l.ssm.begin(), l.ssm.end(), 0.0f);
    }
    state_.position = 0;
  }

 private:
  // restore's KV part: the snapshot's rows into this session's caches (kv_share.h adopt).
  void adopt_rows(const CpuSnapshot& s) {
    auto each_kv = [this](auto&& f) {
      for (size_t L = 0; L < state_.layers.size(); L++)
        if (!config().is_recurrent[L]) f(L, state_.layers[L]);
    };
    ledger_.adopt(
        s.kv,
        [&](const State& source, size_t n) {
          each_kv([&](size_t L, LayerState& l) {
            l.k_cache.copy_rows(source.layers[L].k_cache, 0, 0, n);
            l.v_cache.copy_rows(source.layers[L].v_cache, 0, 0, n);
          });
        },
        [&](const KvPiece<FrozenKv>& p) {
          each_kv([&](size_t L, LayerState& l) {
            l.k_cache.copy_rows(p.rows->k[L], 0, p.begin, p.end - p.begin);  // a piece's rows start at its begin
            l.v_cache.copy_rows(p.rows->v[L], 0, p.begin, p.end - p.begin);
          });
        });
  }

 public:
  void set_trace(TraceSink* sink) override { trace_ = sink; }

  void reserve_context() override {
    try {
      reserve_positions(config(), state_, n_ctx_);
    } catch (const std::bad_alloc&) {
      fail("cannot allocate {:.1f} MiB for a session of {} tokens", state_bytes(config(), n_ctx_, shared_->kv) / 1048576.0, n_ctx_);
    }
  }

  const Shared* shared() const { return shared_.get(); }
  bool traced() const { return trace_ != nullptr; }
  // The state, for a pass that writes KV rows from position() on: every snapshot still
  // referencing those rows gets its own copy of them first (the one way to the state that writes).
  State& state_to_advance() {
    ledger_.before_write((size_t)state_.position);
    return state_;
  }

  // Everything is checked before any state changes, so a refused call leaves the session as it was.
  void check_tokens(std::span<const int32_t> tokens) const {
    if (tokens.empty()) fail("prefill: no tokens given");
    if ((int64_t)state_.position + (int64_t)tokens.size() > n_ctx_)
      fail("context full: {} tokens at position {} would run past the context of {} tokens (--ctx)",
           tokens.size(), state_.position, n_ctx_);
    for (size_t i = 0; i < tokens.size(); i++)
      if (tokens[i] < 0 || tokens[i] >= config().n_vocab)
        fail("token id {} (input index {}) is out of range: the vocabulary has {} tokens", tokens[i], i,
             config().n_vocab);
  }

 private:
  const Config& config() const { return shared_->weights.model->config(); }

  // Rows [from, to) of every attention layer's cache, copied for the snapshots that reference them.
  std::shared_ptr<const FrozenKv> freeze_rows(size_t from, size_t to) const {
    auto f = std::make_shared<FrozenKv>();
    f->k.resize(state_.layers.size());
    f->v.resize(state_.layers.size());
    for (size_t L = 0; L < state_.layers.size(); L++) {
      if (config().is_recurrent[L]) continue;
      const LayerState& l = state_.layers[L];
      for (auto [dst, src] : {std::pair{&f->k[L], &l.k_cache}, {&f->v[L], &l.v_cache}}) {
        *dst = KvRows(src->type(), config().kv_dim());
        dst->reserve(to - from);
        dst->copy_rows(*src, from, 0, to - from);
      }
    }
    return f;
  }
  // The caches themselves, for the destructor when a copy cannot be allocated.
  std::shared_ptr<const FrozenKv> surrender_rows() {
    auto f = std::make_shared<FrozenKv>();
    for (LayerState& l : state_.layers) {
      f->k.push_back(std::move(l.k_cache));
      f->v.push_back(std::move(l.v_cache));
    }
    return f;
  }

  std::shared_ptr<Shared> shared_;
  int n_ctx_;
  State state_;
  TraceSink* trace_ = nullptr;
  // After state_: its destructor freezes the snapshots' rows while the caches still exist.
  mutable KvLedgerCpu ledger_;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(std::shared_ptr<const Model> model, int n_threads, Numerics numerics, KvType kv)
      : shared_(std::make_shared<Shared>(std::move(model), n_threads, numerics, kv)) {}
  std::string name() const override { return "cpu"; }
  std::unique_ptr<Session> new_session(int n_ctx) override {
    if (n_ctx <= 0) fail("context size {} must be positive (--ctx)", n_ctx);
    return std::make_unique<CpuSession>(shared_, n_ctx);
  }
  size_t session_bytes(int n_ctx) const override { return state_bytes(shared_->weights.model->config(), n_ctx, shared_->kv); }

  // One pass over every session's token: the products read each weight once for the whole batch
  // (forward.h); the sessions' states stay their own.
  void decode_batch_into(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                         std::span<std::vector<float>> out) override {
    check_decode_batch(sessions, tokens, out);
    if (sessions.size() > (size_t)kMaxBatch) fail("decode_batch: {} sessions, at most {}", sessions.size(), kMaxBatch);
    own_sessions("decode_batch", sessions);
    std::vector<std::span<const int32_t>> one(sessions.size());
    for (size_t i = 0; i < sessions.size(); i++) one[i] = tokens.subspan(i, 1);
    run_together(sessions, one, out);
  }

  // The chunks in passes of up to kMaxBatch tokens in all (prefill_in_passes; a traced session's
  // alone through its prefill).
  void prefill_batch_into(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> chunks,
                          std::span<std::vector<float>> out) override {
    check_prefill_batch(sessions, chunks, out);
    own_sessions("prefill_batch", sessions);
    prefill_in_passes(
        sessions, chunks, out, (size_t)kMaxBatch,
        [&](size_t i) { return !static_cast<const CpuSession*>(sessions[i])->traced(); },
        [&](size_t first, size_t end) {
          run_together(sessions.subspan(first, end - first), chunks.subspan(first, end - first),
                       out.subspan(first, end - first));
        });
  }

 private:
  // Every session is this backend's (their tokens check_decode_batch / check_prefill_batch checked),
  // before any state changes.
  void own_sessions(const char* what, std::span<Session* const> sessions) const {
    for (size_t i = 0; i < sessions.size(); i++) {
      auto* s = dynamic_cast<CpuSession*>(sessions[i]);
      if (!s || s->shared() != shared_.get()) fail("{}: session {} does not belong to this cpu backend", what, i);
    }
  }

  // One forward pass of every session's chunk (at most kMaxBatch tokens in all; the sessions and
  // chunks checked), out[i] the logits of session i's last token.
  void run_together(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> chunks,
                    std::span<std::vector<float>> out) {
    if (sessions.empty()) return;
    // Now their snapshots' rows are frozen where the pass writes.
    std::vector<SequenceTokens> seqs;
    for (size_t i = 0; i < sessions.size(); i++)
      seqs.push_back({&static_cast<CpuSession*>(sessions[i])->state_to_advance(), chunks[i]});
    // The LM head writes the pass's logits as one [n_seqs][n_vocab] block (its weights read once
    // for every sequence); each sequence's row is then copied out once. The block is not
    // zero-filled first: the product writes every value.
    const size_t n_vocab = (size_t)shared_->weights.model->config().n_vocab;
    const auto all = std::make_unique_for_overwrite<float[]>(seqs.size() * n_vocab);
    forward(shared_->weights, *shared_->products, seqs, false, all.get(), nullptr);
    shared_->weights.model->gguf().check_intact();  // as prefill(): weights from a truncated file
    for (size_t i = 0; i < seqs.size(); i++) out[i].assign(all.get() + i * n_vocab, all.get() + (i + 1) * n_vocab);
  }

  std::shared_ptr<Shared> shared_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const Model> model, int n_threads, Numerics numerics,
                                          KvType kv) {
  if (!model) fail("make_cpu_backend: no model");
  check_kv_type(numerics, kv, model->config().head_dim);
  return std::make_unique<CpuBackend>(std::move(model), n_threads, numerics, kv);
}

}  // namespace rl::cpu
