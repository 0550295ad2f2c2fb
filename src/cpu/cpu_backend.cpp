#include "cpu/cpu_backend.h"

#include <memory>

#include "common/error.h"
#include "cpu/forward.h"
#include "gguf/gguf.h"

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

class CpuSnapshot final : public SessionSnapshot {
 public:
  CpuSnapshot(const Shared* owner, State state) : owner(owner), state(std::move(state)) {}
  size_t bytes() const override { return state.bytes(); }
  int position() const override { return state.position; }
  const Shared* owner;  // snapshots restore only into sessions of the same loaded model
  State state;
};

class CpuSession final : public Session {
 public:
  CpuSession(std::shared_ptr<Shared> shared, int n_ctx)
      : shared_(std::move(shared)), n_ctx_(n_ctx), state_(initial_state(config(), shared_->kv)) {}

  std::vector<float> prefill(std::span<const int32_t> tokens, std::vector<float>* all_logits) override {
    check_tokens(tokens);
    const size_t n_vocab = (size_t)config().n_vocab;
    if (all_logits) all_logits->assign(tokens.size() * n_vocab, 0.0f);
    std::vector<float> last(n_vocab);
    for (size_t begin = 0; begin < tokens.size(); begin += kMaxBatch) {
      const size_t n = std::min(tokens.size() - begin, (size_t)kMaxBatch);
      const bool final_chunk = begin + n == tokens.size();
      float* dst = all_logits ? all_logits->data() + begin * n_vocab : last.data();
      forward(shared_->weights, *shared_->products, state_, tokens.subspan(begin, n), all_logits != nullptr,
              dst, trace_);
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
  int n_vocab() const override { return config().n_vocab; }

  std::unique_ptr<SessionSnapshot> snapshot() const override {
    return std::make_unique<CpuSnapshot>(shared_.get(), state_);
  }

  void restore(const SessionSnapshot& snap) override {
    const auto* s = dynamic_cast<const CpuSnapshot*>(&snap);
    if (!s) fail("restore: the snapshot was not taken from a cpu session");
    if (s->owner != shared_.get()) fail("restore: the snapshot was taken from a session of another loaded model");
    if (s->state.position > n_ctx_)
      fail("restore: the snapshot is at position {}, past this session's context of {} tokens",
           s->state.position, n_ctx_);
    state_ = s->state;  // a copy holds only the snapshot's rows
    if (reserved_) reserve_context();
  }

  void reset() override {
    state_ = initial_state(config(), shared_->kv);
    if (reserved_) reserve_context();
  }
  void set_trace(TraceSink* sink) override { trace_ = sink; }

  void reserve_context() override {
    try {
      reserve_positions(config(), state_, n_ctx_);
    } catch (const std::bad_alloc&) {
      fail("cannot allocate {:.1f} MiB for a session of {} tokens", state_bytes(config(), n_ctx_, shared_->kv) / 1048576.0, n_ctx_);
    }
    reserved_ = true;
  }

  const Shared* shared() const { return shared_.get(); }
  State& state() { return state_; }

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

  std::shared_ptr<Shared> shared_;
  int n_ctx_;
  State state_;
  TraceSink* trace_ = nullptr;
  bool reserved_ = false;  // reserve_context() was called: restore() and reset() keep the capacity
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
  std::vector<std::vector<float>> decode_batch(std::span<Session* const> sessions,
                                               std::span<const int32_t> tokens) override {
    check_decode_batch(sessions, tokens);
    if (sessions.empty()) return {};
    if (sessions.size() > (size_t)kMaxBatch) fail("decode_batch: {} sessions, at most {}", sessions.size(), kMaxBatch);
    std::vector<SequenceTokens> seqs;
    for (size_t i = 0; i < sessions.size(); i++) {
      auto* s = dynamic_cast<CpuSession*>(sessions[i]);
      if (!s || s->shared() != shared_.get())
        fail("decode_batch: session {} does not belong to this cpu backend", i);
      s->check_tokens(tokens.subspan(i, 1));
      seqs.push_back({&s->state(), tokens.subspan(i, 1)});
    }
    // The LM head writes the batch's logits as one [n_seqs][n_vocab] block (its weights read once
    // for every sequence); each sequence's row is then copied out once. The block is not
    // zero-filled first: the product writes every value.
    const size_t n_vocab = (size_t)shared_->weights.model->config().n_vocab;
    const auto all = std::make_unique_for_overwrite<float[]>(seqs.size() * n_vocab);
    forward(shared_->weights, *shared_->products, seqs, false, all.get(), nullptr);
    shared_->weights.model->gguf().check_intact();  // as prefill(): weights from a truncated file
    std::vector<std::vector<float>> logits(seqs.size());
    for (size_t i = 0; i < seqs.size(); i++) logits[i].assign(all.get() + i * n_vocab, all.get() + (i + 1) * n_vocab);
    return logits;
  }

 private:
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
