// The server's model worker: up to --parallel sequences generate together (continuous batching).
//
// One thread owns the backend's sessions. Each iteration it admits waiting requests into free
// slots, runs one prefill chunk (at most Session::prefill_chunk() tokens) of one sequence still
// reading its prompt (round robin), then advances every sequence that is generating by one token
// in one batched pass (Backend::decode_batch). So a new request starts while others generate, and
// a long prompt delays the others by at most one chunk per step. With --step-prefill-tokens N a
// step prefills chunks of several sequences in turn while it has prefilled fewer than N tokens
// (the last may take it past N by up to a chunk): a burst of short prompts all start in one step,
// and the running sequences wait for their prefills once instead of the batch changing at every
// step (on the GPU a batch of a new size is a newly captured step). Sampling, stop conditions,
// constraints, streaming, cancellation and the deadline are per sequence (Generation).
//
// Memory: a slot's session is created (and its context reserved) when a request is admitted to
// it, sized to the budget's fair share (budget / --parallel, at most --ctx; so with the default
// budget every session holds the whole context) or to the request (prompt + max_tokens) when that
// is more, and kept while it serves: an idle slot keeps its session and history, so a
// conversation that continues in it prefills only its new tokens. The sessions together stay within the budget (--kv-mib; default --parallel full
// contexts): a request that does not fit next to the running ones waits at the head of the queue
// (idle slots' sessions are released first); one larger than the whole budget is refused with 400
// when it arrives. Admission is the only place a session allocates, so a step never fails for memory.
//
// State reuse across slots: one PromptCache of snapshots taken at prompt boundaries and at the
// end of every generation, as with one sequence.
#pragma once
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "generate/prompt_cache.h"
#include "server/job.h"

namespace rl {

class Backend;
class Tokenizer;
class TokenTrie;

struct SchedulerConfig {
  static constexpr int kMaxParallel = 16;
  int parallel = 1;           // sequences generating together (1..kMaxParallel)
  int n_ctx = 4096;           // context of a sequence at most
  int max_queue = 16;         // requests waiting beyond those admitted
  size_t memory_bytes = 0;    // the sessions' budget; 0: `parallel` sessions of n_ctx
  size_t prompt_cache_bytes = 1024u << 20;
  // Prompt tokens a step may prefill across the waiting sequences (a chunk each, in turn, while
  // the step has prefilled fewer); 0: one chunk of one sequence a step.
  int step_prefill_tokens = 0;
  static constexpr int kMaxStepPrefillTokens = 1 << 20;
  // Throws rl::Error naming the flag when parallel or step_prefill_tokens is out of range (the
  // server checks at start, before its model loads; the scheduler again when it is made).
  void check_limits() const;
};

// Counters for /metrics (a copy, taken under the scheduler's lock).
struct SchedulerStats {
  uint64_t rejected_busy = 0, cancelled = 0;
  uint64_t prompt_tokens = 0, prefill_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  double last_decode_tok_s = 0, last_prefill_tok_s = 0;
  uint64_t cache_hits = 0, cache_misses = 0, cache_bytes = 0;
  uint64_t batched_steps = 0, batched_tokens = 0;  // decode passes and the tokens they advanced
  size_t queue_depth = 0;
  int running = 0;
  size_t session_bytes = 0, memory_bytes = 0;  // held by the slots' sessions, and the budget
};

class Scheduler {
 public:
  // Throws rl::Error for a configuration out of range. Starts its thread.
  Scheduler(Backend& backend, const Tokenizer& tokenizer, SchedulerConfig config);
  ~Scheduler();  // stop(), then joins the thread
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a job (its prompt and max_tokens already fit n_ctx()). Throws ApiError 503 when the
  // queue is full or the server is stopping, 400 when the job needs more than the whole budget.
  void submit(const std::shared_ptr<Job>& job);
  // The client is gone: a queued job is dropped, a running one ends at its next step.
  void abandon(const std::shared_ptr<Job>& job);
  // Queued jobs end with 503; running ones are cancelled and end at their next step.
  void stop();

  int n_ctx() const { return cfg_.n_ctx; }
  int parallel() const { return cfg_.parallel; }
  SchedulerStats stats() const;

 private:
  struct Slot;
  void work();
  bool admit(std::unique_lock<std::mutex>& l);
  void start_job(Slot& slot, const std::shared_ptr<Job>& job, int job_ctx);
  void step();
  void prefill_step();
  void decode_all();
  void complete(Slot& slot);
  void fail_slot(Slot& slot, const std::string& what);
  int job_ctx(const Job& job) const;
  size_t held_bytes() const;

  Backend& backend_;
  const Tokenizer& tokenizer_;
  SchedulerConfig cfg_;
  std::shared_ptr<const TokenTrie> trie_;  // built on the first constrained request
  std::vector<std::unique_ptr<Slot>> slots_;
  // The worker's alone. After slots_, so it goes first: sessions that go before the snapshots
  // sharing their rows would copy those rows for them (model/kv_share.h).
  PromptCache prompt_cache_;
  size_t next_prefill_ = 0;                // round robin over prefilling slots
  int share_ctx_ = 1;                      // context of a session of memory_bytes / parallel
  std::vector<std::vector<float>> step_logits_;  // the worker's: a decode step's logits buffers

  mutable std::mutex m_;  // the queue, the slots' job pointers and bytes, the stats
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  SchedulerStats stats_;
  std::thread thread_;
};

}  // namespace rl
