#include "server/scheduler.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "generate/generation.h"
#include "generate/token_trie.h"
#include "model/session.h"
#include "tokenizer/tokenizer.h"

namespace rl {

using api::ApiError;

namespace {
// Alternatives reported per token at most (OpenAI's limit for top_logprobs).
constexpr int kMaxTopLogprobs = 20;

double mib(size_t bytes) { return bytes / 1048576.0; }
}  // namespace

// One sequence's place: its session (null until a request needs one), the generator that knows
// what the session holds, and the running generation.
struct Scheduler::Slot {
  std::unique_ptr<Session> session;
  std::unique_ptr<Generator> generator;
  size_t bytes = 0;                       // backend.session_bytes(session->n_ctx())
  std::shared_ptr<Job> job;               // null: idle
  std::unique_ptr<Generation> generation;

  void release() {
    generator.reset();
    session.reset();
    bytes = 0;
  }
  // Tokens of the history a prompt starts with (0 when the history is not a prefix of it).
  size_t reusable(const std::vector<int32_t>& prompt) const {
    if (!generator) return 0;
    const auto& h = generator->history();
    return h.size() <= prompt.size() && std::equal(h.begin(), h.end(), prompt.begin()) ? h.size() : 0;
  }
};

void SchedulerConfig::check_limits() const {
  if (parallel < 1 || parallel > kMaxParallel) fail("--parallel: must be between 1 and {}, got {}", kMaxParallel, parallel);
  if (step_prefill_tokens < 0 || step_prefill_tokens > kMaxStepPrefillTokens)
    fail("--step-prefill-tokens: must be between 0 and {}, got {}", kMaxStepPrefillTokens, step_prefill_tokens);
}

Scheduler::Scheduler(Backend& backend, const Tokenizer& tokenizer, SchedulerConfig config)
    : backend_(backend), tokenizer_(tokenizer), cfg_(config), prompt_cache_(config.prompt_cache_bytes) {
  cfg_.check_limits();
  if (cfg_.memory_bytes == 0) cfg_.memory_bytes = (size_t)cfg_.parallel * backend_.session_bytes(cfg_.n_ctx);
  if (cfg_.memory_bytes < backend_.session_bytes(2))
    fail("--kv-mib: {:.1f} MiB holds no session (the smallest needs {:.2f} MiB)", mib(cfg_.memory_bytes),
         mib(backend_.session_bytes(2)));
  stats_.memory_bytes = cfg_.memory_bytes;
  // The largest context whose session is a fair share of the budget (session_bytes grows with it).
  for (int lo = 1, hi = cfg_.n_ctx; lo <= hi;) {
    const int mid = lo + (hi - lo) / 2;
    if (backend_.session_bytes(mid) <= cfg_.memory_bytes / cfg_.parallel) {
      share_ctx_ = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  for (int i = 0; i < cfg_.parallel; i++) slots_.push_back(std::make_unique<Slot>());
  thread_ = std::thread([this] { work(); });
}

Scheduler::~Scheduler() {
  stop();
  if (thread_.joinable()) thread_.join();
}

// The context a job's session needs: the prompt and every token it may generate (the last one
// sampled is never decoded), at least one position past the prompt.
int Scheduler::job_ctx(const Job& job) const {
  return std::min(cfg_.n_ctx, (int)job.prompt.size() + std::max(job.gen.max_tokens, 1));
}

size_t Scheduler::held_bytes() const {
  size_t n = 0;
  for (const auto& s : slots_) n += s->bytes;
  return n;
}

void Scheduler::submit(const std::shared_ptr<Job>& job) {
  const int ctx = job_ctx(*job);
  const size_t need = backend_.session_bytes(ctx);
  if (need > cfg_.memory_bytes)
    throw ApiError(400,
                   fmt::format("the request needs {:.1f} MiB for its KV cache and state ({} tokens: the prompt and "
                               "max_tokens), more than the server's budget of {:.1f} MiB for all sequences "
                               "(--kv-mib); lower max_tokens or shorten the prompt",
                               mib(need), ctx, mib(cfg_.memory_bytes)),
                   "invalid_request_error", "max_tokens", "request_too_large");
  std::lock_guard<std::mutex> l(m_);
  if (stopping_) throw ApiError(503, "the server is shutting down", "server_error");
  int idle = 0;
  for (const auto& s : slots_) idle += !s->job;
  if ((int)queue_.size() >= cfg_.max_queue + idle) {
    stats_.rejected_busy++;
    throw ApiError(503, fmt::format("the server is busy: {} requests are waiting; retry later", queue_.size()),
                   "server_busy", {}, "queue_full");
  }
  queue_.push_back(job);
  wake_.notify_one();
}

void Scheduler::abandon(const std::shared_ptr<Job>& job) {
  job->cancel = true;
  std::lock_guard<std::mutex> l(m_);
  auto it = std::find(queue_.begin(), queue_.end(), job);
  if (it != queue_.end()) {
    queue_.erase(it);
    stats_.cancelled++;
  }
}

void Scheduler::stop() {
  std::lock_guard<std::mutex> l(m_);
  stopping_ = true;
  for (auto& job : queue_) {
    job->cancel = true;
    job->fail_with(ApiError(503, "the server is shutting down", "server_error"));
  }
  queue_.clear();
  for (auto& s : slots_)
    if (s->job) s->job->cancel = true;
  wake_.notify_all();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> l(m_);
  SchedulerStats s = stats_;
  s.queue_depth = queue_.size();
  s.running = 0;
  for (const auto& slot : slots_) s.running += slot->job != nullptr;
  s.session_bytes = held_bytes();
  return s;
}

void Scheduler::work() {
  for (;;) {
    {
      std::unique_lock<std::mutex> l(m_);
      for (;;) {
        const bool admitted = admit(l);
        const bool busy = std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->job != nullptr; });
        if (busy || admitted) break;
        if (stopping_) return;
        wake_.wait(l);
      }
    }
    step();
  }
}

// Moves jobs from the head of the queue into idle slots while their sessions fit the budget.
// Returns whether any was admitted. Called with m_ held; unlocks it while a session is made.
bool Scheduler::admit(std::unique_lock<std::mutex>& l) {
  bool admitted = false;
  while (!queue_.empty() && !stopping_) {
    std::shared_ptr<Job> job = queue_.front();
    const int ctx = job_ctx(*job);
    // The idle slot to take: one whose session holds the request, the one whose history the
    // prompt continues furthest first; else any idle slot (its session is replaced).
    auto rank = [&](const Slot& s) {
      const bool fits = s.session && s.session->n_ctx() >= ctx;
      return std::pair<bool, size_t>(fits, fits ? s.reusable(job->prompt) : 0);
    };
    Slot* best = nullptr;
    for (auto& s : slots_)
      if (!s->job && (!best || rank(*s) > rank(*best))) best = s.get();
    if (!best) break;  // every slot is busy
    const bool keep_session = rank(*best).first;
    // A new session gets the budget's fair share of context when that holds the request, so the
    // conversation can grow in it (a later turn then prefills only its new tokens); else just
    // what the request needs, if the fair share does not fit next to the running sequences.
    int new_ctx = std::max(ctx, share_ctx_);
    if (!keep_session) {
      // Make room: this slot's old session goes, then idle slots' sessions, largest first.
      const size_t others = held_bytes() - best->bytes;
      if (others + backend_.session_bytes(new_ctx) > cfg_.memory_bytes) new_ctx = ctx;
      const size_t need = backend_.session_bytes(new_ctx);
      if (others + need > cfg_.memory_bytes) {
        std::vector<Slot*> idle;
        for (auto& s : slots_)
          if (!s->job && s.get() != best && s->session) idle.push_back(s.get());
        std::sort(idle.begin(), idle.end(), [](Slot* a, Slot* b) { return a->bytes > b->bytes; });
        size_t freed = 0;
        for (Slot* s : idle) {
          if (others - freed + need <= cfg_.memory_bytes) break;
          freed += s->bytes;
          s->release();
        }
        if (others - freed + need > cfg_.memory_bytes) break;  // waits for a running sequence to end
      }
    }
    queue_.pop_front();
    best->job = job;
    {
      std::lock_guard<std::mutex> j(job->m);
      job->started = true;
    }
    l.unlock();
    start_job(*best, job, keep_session ? 0 : new_ctx);
    l.lock();
    admitted = true;
  }
  return admitted;
}

// Runs on the worker without m_. new_ctx > 0: the slot gets a new session of that many positions.
void Scheduler::start_job(Slot& slot, const std::shared_ptr<Job>& job, int new_ctx) {
  try {
    if (new_ctx > 0) {
      {
        std::lock_guard<std::mutex> l(m_);
        slot.release();
      }
      // The released sessions froze the rows their snapshots shared: the cache goes back within
      // its budget before the new session takes the memory the releases made.
      prompt_cache_.trim();
      auto session = backend_.new_session(new_ctx);
      session->reserve_context();
      std::lock_guard<std::mutex> l(m_);
      slot.session = std::move(session);
      slot.bytes = backend_.session_bytes(new_ctx);
      slot.generator = std::make_unique<Generator>(*slot.session, tokenizer_);
    }
    // One token trie for every slot, made at the first constrained request.
    if (job->gen.constraint) {
      if (!trie_) trie_ = std::make_shared<const TokenTrie>(tokenizer_);
      slot.generator->use_token_trie(trie_);
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> l(m_);
    slot.release();
    slot.job.reset();
    job->fail_with(ApiError(503, fmt::format("no memory for this request's session: {}", e.what()), "server_error"));
    return;
  }
  GenerationConfig gen = job->gen;
  if (job->top_logprobs >= 0) {
    const int top = std::min(job->top_logprobs, kMaxTopLogprobs);
    Job* j = job.get();
    const Tokenizer* tok = &tokenizer_;
    gen.on_token = [j, top, tok](int32_t token, std::span<const float> logits) {
      if (tok->is_eog(token)) return;  // the end token is not part of the reply
      TokenLogprob t = token_logprob(token, logits, top);
      std::lock_guard<std::mutex> l(j->m);
      j->logprobs.push_back(std::move(t));
    };
  }
  Job* j = job.get();
  auto on_text = [j](std::string_view piece) {
    std::lock_guard<std::mutex> l(j->m);
    j->text += piece;
    j->cv.notify_all();
  };
  try {
    slot.generation = std::make_unique<Generation>(*slot.generator, job->prompt, gen, on_text, &job->cancel,
                                                   &prompt_cache_);
  } catch (const std::exception& e) {
    fail_slot(slot, e.what());
  }
}

void Scheduler::step() {
  prefill_step();
  decode_all();
}

// One chunk of one sequence's prompt, the sequences taking turns; with step_prefill_tokens, more
// chunks of the next sequences while the step has prefilled fewer tokens. A cancelled one ends
// here at once.
void Scheduler::prefill_step() {
  const size_t n = slots_.size();
  for (auto& s : slots_)
    if (s->generation && s->generation->prefilling() && s->generation->cancelled()) s->generation->prefill_chunk();
  // The step's chunks, one a sequence in turn, in one Backend::prefill_batch_into call (one pass
  // over them all on either backend while they fit a pass). A call that fails fails every
  // sequence of it, as a failed decode pass does.
  std::vector<Slot*> batch;
  std::vector<Session*> sessions;
  std::vector<std::span<const int32_t>> chunks;
  int tokens = 0;
  const size_t first = next_prefill_;
  for (size_t k = 0; k < n && (batch.empty() || tokens < cfg_.step_prefill_tokens); k++) {
    Slot& s = *slots_[(first + k) % n];
    if (!s.generation || !s.generation->prefilling()) continue;
    next_prefill_ = (first + k + 1) % n;  // the next step starts after the last one served
    const std::span<const int32_t> chunk = s.generation->next_prefill_chunk();
    if (chunk.empty()) continue;
    batch.push_back(&s);
    sessions.push_back(s.session.get());
    chunks.push_back(chunk);
    tokens += (int)chunk.size();
  }
  if (batch.empty()) return;
  std::vector<std::vector<float>> out(batch.size());
  try {
    backend_.prefill_batch_into(sessions, chunks, out);
  } catch (const std::exception& e) {
    for (Slot* s : batch) fail_slot(*s, e.what());
    return;
  }
  for (size_t i = 0; i < batch.size(); i++) {
    try {
      batch[i]->generation->prefilled(chunks[i], std::move(out[i]));
    } catch (const std::exception& e) {
      fail_slot(*batch[i], e.what());
    }
  }
}

// Every sequence past its prompt samples; those that go on decode their tokens in one pass.
void Scheduler::decode_all() {
  std::vector<Slot*> batch;
  std::vector<Session*> sessions;
  std::vector<int32_t> tokens;
  for (auto& s : slots_) {
    if (!s->generation || s->generation->prefilling()) continue;
    std::optional<int32_t> token;
    try {
      token = s->generation->next_token();
    } catch (const std::exception& e) {
      fail_slot(*s, e.what());
      continue;
    }
    if (!token) {
      complete(*s);
      continue;
    }
    batch.push_back(s.get());
    sessions.push_back(s->session.get());
    tokens.push_back(*token);
  }
  if (batch.empty()) return;
  // The step's logits go into step_logits_'s buffers, which the generations swap for their
  // previous ones: after the first steps nothing is allocated (the list only grows, so a smaller
  // batch keeps the buffers of a larger one for later).
  if (step_logits_.size() < batch.size()) step_logits_.resize(batch.size());
  const std::span<std::vector<float>> out = std::span(step_logits_).first(batch.size());
  try {
    backend_.decode_batch_into(sessions, tokens, out);
  } catch (const std::exception& e) {
    for (Slot* s : batch) fail_slot(*s, e.what());
    return;
  }
  for (size_t i = 0; i < batch.size(); i++) batch[i]->generation->take_logits(out[i]);
  std::lock_guard<std::mutex> l(m_);
  stats_.batched_steps++;
  stats_.batched_tokens += batch.size();
}

void Scheduler::complete(Slot& slot) {
  GenerationResult r;
  try {
    r = slot.generation->finish();  // stores a snapshot in the prompt cache: may run out of memory
  } catch (const std::exception& e) {
    fail_slot(slot, e.what());
    return;
  }
  slot.generation.reset();
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> l(m_);
    stats_.prompt_tokens += r.prompt_tokens;
    stats_.prefill_tokens += r.prefill_tokens;
    stats_.cached_tokens += r.reused_tokens;
    stats_.generated_tokens += r.decode_passes + (r.tokens.empty() ? 0 : 1);
    stats_.prefill_seconds += r.prefill_seconds;
    stats_.decode_seconds += r.decode_seconds;
    if (r.prefill_tokens > 0) stats_.last_prefill_tok_s = r.prefill_tok_s();
    if (r.decode_passes > 0) stats_.last_decode_tok_s = r.decode_tok_s();
    if (r.finish == FinishReason::Cancelled) stats_.cancelled++;
    stats_.cache_hits = prompt_cache_.hits();
    stats_.cache_misses = prompt_cache_.misses();
    stats_.cache_bytes = prompt_cache_.bytes();
    job = std::move(slot.job);
    wake_.notify_all();
  }
  std::lock_guard<std::mutex> l(job->m);
  job->result = std::move(r);
  job->done = true;
  job->cv.notify_all();
}

// The sequence failed mid-token: its session starts over, so the slot's next request sees a clean state.
void Scheduler::fail_slot(Slot& slot, const std::string& what) {
  slot.generation.reset();
  try {
    if (slot.generator) slot.generator->reset();
  } catch (...) {
    std::lock_guard<std::mutex> l(m_);
    slot.release();
  }
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> l(m_);
    job = std::move(slot.job);
    wake_.notify_all();
  }
  if (job) job->fail_with(ApiError(500, fmt::format("generation failed: {}", what), "server_error"));
}

}  // namespace rl
