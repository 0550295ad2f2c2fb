// The one interface every backend implements (DESIGN.md §3): a Session holds one sequence's
// state (KV cache, conv and SSM states, position) and turns tokens into logits.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rl {

// Receives intermediate tensors of a forward pass (names as in the llama.cpp trace fixtures:
// "attn_residual-L", "ffn_moe_logits-L", "ffn_moe_topk-L", "l_out-L", "result_norm").
// Shapes are [n_tokens][width], row-major.
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void tensor(std::string_view name, int n_tokens, int width, const float* data) = 0;
  virtual void ids(std::string_view name, int n_tokens, int width, const int32_t* data) = 0;
};

// A session's state at position(), opaque: its own copy of the recurrent states, and its KV rows
// shared with the session it was taken from (or last restored into) until that session overwrites
// them (model/kv_share.h). It never changes what it holds, and stays valid after its session is
// gone. bytes() is what it holds alone, so it can grow (rows frozen for it) after it is taken.
// Snapshots and sessions are used from one thread.
class SessionSnapshot {
 public:
  virtual ~SessionSnapshot() = default;
  virtual size_t bytes() const = 0;
  virtual int position() const = 0;
  // Its KV rows could not be kept (no memory to copy them when its session overwrote them):
  // restore() throws rl::Error.
  virtual bool lost() const { return false; }
};

class Session {
 public:
  virtual ~Session() = default;

  // Runs `tokens` at positions position()..position()+n-1 and returns the logits of the last one
  // [n_vocab]. When all_logits is given it receives [n_tokens][n_vocab]. Throws rl::Error (and
  // leaves the state unchanged) when the tokens would run past n_ctx() or an id is out of range.
  virtual std::vector<float> prefill(std::span<const int32_t> tokens,
                                     std::vector<float>* all_logits = nullptr) = 0;
  // One token; same as prefill({token}).
  virtual std::vector<float> decode(int32_t token) = 0;

  virtual int position() const = 0;
  virtual int n_ctx() const = 0;
  // The most tokens one prefill pass of the backend takes (a longer prefill() runs in passes of
  // this many): the piece a caller that prefills piecewise (Generation, the server's scheduler)
  // hands over at once, so that it neither splits a pass nor waits on more than one. At least 1
  // (the backends check theirs); 512 for a session that does not say.
  virtual int prefill_chunk() const { return 512; }
  virtual int n_vocab() const = 0;

  // Copies the recurrent states; the KV rows stay shared with this session.
  virtual std::unique_ptr<SessionSnapshot> snapshot() const = 0;
  // Copies into this session the KV rows it does not hold (none when the snapshot's rows are this
  // session's and intact), then the recurrent states. Throws rl::Error when the snapshot came from
  // another kind of session.
  virtual void restore(const SessionSnapshot& snap) = 0;
  virtual void reset() = 0;

  // Optional observation of intermediate tensors and router selections (nullptr: off).
  virtual void set_trace(TraceSink* sink) = 0;

  // Allocates now the memory the state needs for all n_ctx() positions, so that no later call
  // allocates for it (the server does this when it admits a request, so a request that does not
  // fit fails there, not in the middle of a step). Throws rl::Error when the memory is not there.
  // Backends that allocate at construction need nothing.
  virtual void reserve_context() {}
};

// A loaded model on one backend; sessions share its weights.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"
  virtual std::unique_ptr<Session> new_session(int n_ctx) = 0;
  // Bytes a session of n_ctx positions holds once its context is reserved (KV rows of every
  // position, recurrent states): what the server counts against its budget at admission.
  virtual size_t session_bytes(int n_ctx) const = 0;
  // Throws rl::Error naming --ctx and the bytes a session of n_ctx tokens needs when the memory
  // the backend keeps sessions in cannot hold them: the command line calls it at load. A backend
  // whose sessions live in host memory checks nothing here (reserve_context reports a failure).
  virtual void check_session_fits(int /*n_ctx*/) const {}

  // Advances several sequences by one token each in one pass: sessions[i] (distinct sessions of
  // this backend) decodes tokens[i] at its own position, and out[i] becomes its logits [n_vocab],
  // as sessions[i]->decode(tokens[i]) would give them. Where the step runs as one pass (the cpu
  // backend's, the CUDA batched graph) a buffer of that size is written in place, not reallocated,
  // so buffers kept from step to step are not allocated again; where the sessions decode one after
  // another (decode_one_after_another: on CUDA the exact tier, a bounded cache, --profile, a traced
  // session, a lone session or a step's remainder of one) out[i] takes the buffer decode() returns.
  // Throws rl::Error, with no session changed, when a session is full, an id is out of range, a
  // session is given twice, the spans or out differ in length, or (where the backend can tell:
  // cpu, CUDA) a session is another's.
  virtual void decode_batch_into(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                                 std::span<std::vector<float>> out) = 0;
  // decode_batch_into with new buffers: the result's [i] is sessions[i]'s logits.
  std::vector<std::vector<float>> decode_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens);

  // Prefills several sequences' prompt pieces: sessions[i] (distinct sessions of this backend)
  // reads chunks[i] at its own position, and out[i] becomes the logits of its last token, as
  // sessions[i]->prefill(chunks[i]) would give them. This default prefills them one after another;
  // the cpu and cuda backends run them together in passes of up to prefill_chunk() tokens in all,
  // each weight read once a pass (the server's scheduler with --step-prefill-tokens). Throws rl::Error,
  // with no session changed, when a chunk is empty or runs past its session's context, an id is out
  // of range, a session is given twice, the spans or out differ in length, or (cpu) a session is
  // another's.
  virtual void prefill_batch_into(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> chunks,
                                  std::span<std::vector<float>> out);
};

// decode_batch for a backend without a batched pass: the sessions decode one after another, out[i]
// taking the buffer sessions[i]->decode returns (not written in place). Checks the arguments as
// decode_batch promises before any session runs.
void decode_one_after_another(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                              std::span<std::vector<float>> out);

// The checks decode_batch makes on its arguments, common to every backend: equal lengths, no
// session twice, each session with room for one more token and its id in range.
void check_decode_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens);
// As check_decode_batch, and one output buffer a session.
void check_decode_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                        std::span<std::vector<float>> out);
// The checks prefill_batch_into makes on its arguments, common to every backend.
void check_prefill_batch(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> chunks,
                         std::span<std::vector<float>> out);
// A backend's prefill_batch_into in passes, its arguments checked: consecutive pieces that may share
// a pass (joins(i)) go together while they fit max_tokens in all, two or more by together(first,
// end); any other piece alone through its session's prefill (a piece longer than a pass, one of a
// session that may not share one, one left without a partner).
template <class Joins, class Together>
void prefill_in_passes(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> chunks,
                       std::span<std::vector<float>> out, size_t max_tokens, Joins&& joins, Together&& together) {
  for (size_t first = 0; first < sessions.size();) {
    size_t end = first, tokens = 0;
    while (end < sessions.size() && tokens + chunks[end].size() <= max_tokens && joins(end))
      tokens += chunks[end++].size();
    if (end - first >= 2) {
      together(first, end);
      first = end;
    } else {
      out[first] = sessions[first]->prefill(chunks[first]);
      first++;
    }
  }
}

}  // namespace rl
