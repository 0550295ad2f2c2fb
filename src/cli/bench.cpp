// redlite bench: the bench protocol of DESIGN.md §6.
//   decode  = 256 greedy tokens (255 decode passes) after a fixed prompt  -> decode_tok_s
//   prefill = the first 1100 tokens of the long-context prompt -> prefill_tok_s, in the backend's
//             passes (Session::prefill_chunk: the CUDA backend's --prefill-chunk, default 2048;
//             DESIGN.md's protocol says 512, which --prefill-chunk 512 reproduces)
// Median of --reps runs with min and max. On the CUDA backend it adds what a decode token reads
// (bytes, achieved GB/s, percent of the H200's 4.8 TB/s), and over the decode passes the
// expert-cache hit rate, the bytes copied per token and the copy rate, and with
// --profile the per-stage GPU milliseconds of the last decode run.
//
// The prompts are fixed token-id sequences (a xorshift stream over the vocabulary): the bench
// models are synthetic, so text carries no meaning, and ids make runs identical on any vocabulary.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "cli/command.h"
#include "cli/common_options.h"
#include "common/error.h"
#include "model/parity.h"
#include "model/routing_record.h"
#ifdef REDLITE_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace rl::cli {
namespace {

constexpr double kH200PeakBytesPerSecond = 4.8e12;  // vendor datasheet, HBM3e

struct BenchOptions {
  CommonOptions common;
  int reps = 3;
  int decode_tokens = 256;
  int prefill_tokens = 1100;
  int prompt_tokens = 16;
  std::vector<int> depths;  // --depths: the protocol at depth instead (DESIGN.md §6)
  int batch = 0;            // --batch: batched decode steps of this many sequences instead
  bool batch_prefill = false;  // --batch-prefill: the batch's prompts in one prefill_batch_into call
  int depth_decode_tokens = 128;
  bool json = false;
  std::string record_routing;  // --record-routing: every pass's selections to this file
};

std::vector<int32_t> token_stream(int n, int n_vocab, uint64_t seed) {
  std::vector<int32_t> t(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int i = 0; i < n; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    t[i] = (int32_t)(s % (uint64_t)n_vocab);
  }
  return t;
}

struct Summary {
  double median = 0, min = 0, max = 0;
};
Summary summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Summary s;
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

// The recording is written as PATH.tmp and renamed: refuses a path where that cannot be created.
void check_writable(const std::string& path) {
  const std::string tmp = path + ".tmp";
  if (!std::ofstream(tmp, std::ios::binary | std::ios::trunc)) fail("{}: cannot create the routing recording", tmp);
  std::remove(tmp.c_str());
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The fields every protocol's JSON starts with: what ran, where and how often.
nlohmann::json run_header(const BenchOptions& o, const LoadedModel& lm) {
  nlohmann::json j;
  j["model"] = o.common.model_path;
  j["backend"] = lm.backend->name();
  j["numerics"] = numerics_name(lm.numerics);
  j["threads"] = o.common.threads;
  j["build"] = std::string("redlite ") + REDLITE_VERSION;
  j["reps"] = o.reps;
  return j;
}

// The protocol at depth: for each depth D, the prefill of D tokens (the backend's passes; D = 0 is the
// 16-token prompt of the main protocol) and then depth_decode_tokens greedy tokens after it, each
// timed; median of --reps per depth. One session of the largest depth's context serves them all.
int run_depth_bench(const BenchOptions& o, LoadedModel& lm) {
  const Config& c = lm.model->config();
  int max_ctx = 0;
  for (int d : o.depths) max_ctx = std::max(max_ctx, std::max(d, o.prompt_tokens) + o.depth_decode_tokens);
  if (c.n_ctx_train > 0 && max_ctx > c.n_ctx_train)
    fail("--depths: depth {} plus {} decode tokens needs {} tokens of context, past the model's context_length "
         "of {}", *std::max_element(o.depths.begin(), o.depths.end()), o.depth_decode_tokens, max_ctx,
         c.n_ctx_train);
  auto session = lm.backend->new_session(max_ctx);
  nlohmann::json rows = nlohmann::json::array();
  for (int depth : o.depths) {
    const auto prompt = token_stream(depth > 0 ? depth : o.prompt_tokens, c.n_vocab, depth > 0 ? 2 : 1);
    std::vector<double> prefill_rates, decode_rates;
    for (int rep = 0; rep < o.reps; rep++) {
      session->reset();
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<float> logits = session->prefill(prompt);
      prefill_rates.push_back(prompt.size() / seconds_since(t0));
      const auto t1 = std::chrono::steady_clock::now();
      for (int i = 0; i < o.depth_decode_tokens; i++) logits = session->decode(argmax(logits));
      decode_rates.push_back(o.depth_decode_tokens / seconds_since(t1));
    }
    const Summary pre = summarize(prefill_rates), dec = summarize(decode_rates);
    rows.push_back({{"depth", depth},
                    {"prompt_tokens", prompt.size()},
                    {"prefill_tok_s", pre.median},
                    {"prefill_tok_s_min", pre.min},
                    {"prefill_tok_s_max", pre.max},
                    {"decode_tokens", o.depth_decode_tokens},
                    {"decode_tok_s", dec.median},
                    {"decode_tok_s_min", dec.min},
                    {"decode_tok_s_max", dec.max}});
    if (!o.json)
      std::printf("depth %7d: prefill %8.1f tok/s (min %.1f, max %.1f), decode %7.1f tok/s (min %.1f, max %.1f)\n",
                  depth, pre.median, pre.min, pre.max, dec.median, dec.min, dec.max);
    std::fflush(stdout);
  }
  const size_t kv_per_token = c.kv_bytes_per_token(lm.kv_type);
  if (o.json) {
    nlohmann::json j = run_header(o, lm);
    j["kv_type"] = kv_type_name(lm.kv_type);
    j["kv_bytes_per_token"] = kv_per_token;
    j["prefill_chunk"] = session->prefill_chunk();
    j["context"] = max_ctx;
    j["cache_mib"] = o.common.cache_mib;
    j["depths"] = rows;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("  KV cache %s, %zu bytes per token; context %d tokens; prefill passes of %d tokens\n",
                kv_type_name(lm.kv_type), kv_per_token, max_ctx, session->prefill_chunk());
  }
  return 0;
}

// Batched decoding without a server: `batch` sequences, each prefilled with its own prompt of
// prompt_tokens tokens (one after another, or with batch_prefill in one Backend::prefill_batch_into
// call, as serve --step-prefill-tokens does), then decode_tokens - 1 steps of Backend::decode_batch
// over all of them (each sequence's next token its greedy one), timed; median of --reps. The
// engine's step as the server's scheduler calls it, without the HTTP, sampling and streaming
// around it.
int run_batch_bench(const BenchOptions& o, LoadedModel& lm) {
  const Config& c = lm.model->config();
  const int n_ctx = o.prompt_tokens + o.decode_tokens;
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<Session*> ptrs;
  for (int i = 0; i < o.batch; i++) {
    sessions.push_back(lm.backend->new_session(n_ctx));
    ptrs.push_back(sessions.back().get());
  }
  const int steps = o.decode_tokens - 1;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::span<const int32_t>> chunks;
  for (int i = 0; i < o.batch; i++) prompts.push_back(token_stream(o.prompt_tokens, c.n_vocab, 10 + (uint64_t)i));
  for (const auto& p : prompts) chunks.push_back(p);
  std::vector<double> rates, step_ms, prefill_ms;
  std::vector<int32_t> next(o.batch);
  std::vector<std::vector<float>> logits(o.batch);  // kept from step to step, as the server keeps them
  // Where a step's time goes, over every rep: the first step (a batched graph is captured there),
  // the later steps' calls, and the greedy picks between them.
  double first_step_s = 0, later_steps_s = 0, argmax_s = 0;
  for (int rep = 0; rep < o.reps; rep++) {
    for (int i = 0; i < o.batch; i++) sessions[i]->reset();
    const auto tp = std::chrono::steady_clock::now();
    if (o.batch_prefill) {
      lm.backend->prefill_batch_into(ptrs, chunks, logits);
    } else {
      for (int i = 0; i < o.batch; i++) logits[i] = sessions[i]->prefill(chunks[i]);
    }
    prefill_ms.push_back(1000.0 * seconds_since(tp));
    for (int i = 0; i < o.batch; i++) next[i] = argmax(logits[i]);
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; s++) {
      const auto ts = std::chrono::steady_clock::now();
      lm.backend->decode_batch_into(ptrs, next, logits);
      (s == 0 ? first_step_s : later_steps_s) += seconds_since(ts);
      const auto ta = std::chrono::steady_clock::now();
      for (int i = 0; i < o.batch; i++) next[i] = argmax(logits[i]);
      argmax_s += seconds_since(ta);
    }
    const double seconds = seconds_since(t0);
    rates.push_back((double)o.batch * steps / seconds);
    step_ms.push_back(1000.0 * seconds / steps);
  }
  const Summary r = summarize(rates), ms = summarize(step_ms), pms = summarize(prefill_ms);
  const double later_steps = (double)o.reps * (steps - 1);
  if (o.json) {
    nlohmann::json j = run_header(o, lm);
    j["batch"] = o.batch;
    j["prompt_tokens"] = o.prompt_tokens;
    j["batch_prefill"] = o.batch_prefill;
    j["prefill_ms"] = pms.median;  // the batch's prompts, all of them
    j["steps"] = steps;
    j["tokens"] = (int64_t)o.batch * steps;
    j["decode_tok_s"] = r.median;
    j["decode_tok_s_min"] = r.min;
    j["decode_tok_s_max"] = r.max;
    j["step_ms"] = ms.median;
    j["first_step_ms"] = 1000.0 * first_step_s / o.reps;
    if (later_steps > 0) j["later_step_call_ms"] = 1000.0 * later_steps_s / later_steps;
    j["argmax_ms"] = 1000.0 * argmax_s / ((double)o.reps * steps);
    j["cache_mib"] = o.common.cache_mib;
#ifdef REDLITE_HAVE_CUDA
    if (auto* cb = dynamic_cast<cuda::CudaBackend*>(lm.backend.get())) {
      const cuda::EngineStats st = cb->stats();
      j["batched_steps"] = st.batched_steps;
      j["batched_captures"] = st.batched_captures;
      if (st.batched_steps) {
        j["batched_graph_ms"] = st.batched_graph_ms / (double)st.batched_steps;
        j["batched_copy_ms"] = st.batched_copy_ms / (double)st.batched_steps;
      }
    }
#endif
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s on %s (%s numerics): %d sequences, prompts prefilled in %.1f ms (%s), decode %.1f tok/s in all "
                "(min %.1f, max %.1f), %.2f ms a step, median of %d\n",
                o.common.model_path.c_str(), lm.backend->name().c_str(), numerics_name(lm.numerics), o.batch,
                pms.median, o.batch_prefill ? "one call" : "one after another", r.median, r.min, r.max, ms.median,
                o.reps);
  }
  return 0;
}

int run_bench(const BenchOptions& o) {
  if (!o.record_routing.empty() && !o.depths.empty())
    fail("--record-routing records the main protocol; it does not combine with --depths");
  if (o.batch_prefill && !o.batch) fail("--batch-prefill goes with --batch N");
  if (o.batch && (!o.depths.empty() || !o.record_routing.empty()))
    fail("--batch is a protocol of its own; it does not combine with --depths or --record-routing");
  if (!o.record_routing.empty()) check_writable(o.record_routing);  // before a run of minutes, not after
  LoadedModel lm = open_model(o.common);
  if (!o.depths.empty()) return run_depth_bench(o, lm);
  if (o.batch) return run_batch_bench(o, lm);
  const Config& c = lm.model->config();
  const int n_ctx = std::max(o.prefill_tokens, o.prompt_tokens + o.decode_tokens) + 1;
  auto session = lm.backend->new_session(n_ctx);
  // Recording observes every pass (the trace costs the CUDA backend a host copy per layer, so a
  // recorded run's timings are not the bench's figures).
  std::unique_ptr<RoutingRecorder> recorder;
  if (!o.record_routing.empty()) {
    recorder = std::make_unique<RoutingRecorder>(c.n_layer, c.n_expert, c.n_expert_used,
                                                 expert_slot_bytes(*lm.model));
    session->set_trace(recorder.get());
  }
  const auto prompt = token_stream(o.prompt_tokens, c.n_vocab, 1);
  const auto long_prompt = token_stream(o.prefill_tokens, c.n_vocab, 2);

#ifdef REDLITE_HAVE_CUDA
  // Cache statistics and the profile cover the decode passes only (the bytes a decode token
  // reads and copies); the prefill runs are timed but not counted there.
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(lm.backend.get());
  ExpertCache::Stats decode_cache;
  std::string profile;
#endif
  std::vector<double> decode_rates, prefill_rates;
  double decode_argmax_s = 0;  // the timed decode loop's greedy picks on the host, over every rep
  uint64_t gpu_routed_tokens = 0, gpu_routed_fallbacks = 0;  // over the timed decode passes
  uint64_t misses_in_place = 0;                              // of their selections, read from host memory
  uint64_t prefill_grouped_layers = 0, prefill_x32 = 0;  // the last timed prefill's
  (void)gpu_routed_tokens;
  (void)gpu_routed_fallbacks;
  (void)misses_in_place;
  (void)prefill_grouped_layers;
  (void)prefill_x32;
  for (int rep = 0; rep < o.reps; rep++) {
    // Decode: prompt, then decode_tokens greedy tokens; the first comes from the prompt's logits,
    // so decode_tokens - 1 decode passes are timed.
    session->reset();
    std::vector<float> logits = session->prefill(prompt);
#ifdef REDLITE_HAVE_CUDA
    if (cuda_backend) cuda_backend->reset_stats();
#endif
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i + 1 < o.decode_tokens; i++) {
      const auto ta = std::chrono::steady_clock::now();
      const int32_t next = argmax(logits);
      decode_argmax_s += seconds_since(ta);
      logits = session->decode(next);
    }
    decode_rates.push_back((o.decode_tokens - 1) / seconds_since(t0));
#ifdef REDLITE_HAVE_CUDA
    if (cuda_backend) {
      const ExpertCache::Stats s = cuda_backend->stats().cache;
      decode_cache += s;
      gpu_routed_tokens += cuda_backend->stats().gpu_routed_tokens;
      gpu_routed_fallbacks += cuda_backend->stats().gpu_routed_fallbacks;
      misses_in_place += cuda_backend->stats().misses_read_in_place;
      profile = cuda_backend->profile_report();  // the last decode run
    }
#endif

    session->reset();
    const auto t1 = std::chrono::steady_clock::now();
    session->prefill(long_prompt);  // the session splits it into its passes
    prefill_rates.push_back(o.prefill_tokens / seconds_since(t1));
#ifdef REDLITE_HAVE_CUDA
    // (reset with the decode statistics above; decode groups nothing)
    if (cuda_backend) {
      prefill_grouped_layers = cuda_backend->stats().gpu_grouped_layers;
      prefill_x32 = cuda_backend->stats().x32_products;
    }
#endif
  }
  const Summary dec = summarize(decode_rates), pre = summarize(prefill_rates);
  if (recorder) {
    session->set_trace(nullptr);
    write_routing_recording(o.record_routing, recorder->recording());
  }

  nlohmann::json j = run_header(o, lm);
  j["decode_tokens"] = o.decode_tokens;
  j["prefill_tokens"] = o.prefill_tokens;
  j["prefill_chunk"] = session->prefill_chunk();
  j["kv_type"] = kv_type_name(lm.kv_type);
  j["kv_bytes_per_token"] = c.kv_bytes_per_token(lm.kv_type);
  j["decode_tok_s"] = dec.median;
  j["decode_tok_s_min"] = dec.min;
  j["decode_tok_s_max"] = dec.max;
  // Of a decode token's wall time, the host's greedy pick of it (the rest is the backend's pass).
  j["decode_argmax_ms"] = o.decode_tokens > 1 ? 1000.0 * decode_argmax_s / ((double)o.reps * (o.decode_tokens - 1)) : 0.0;
  j["prefill_tok_s"] = pre.median;
  j["prefill_tok_s_min"] = pre.min;
  j["prefill_tok_s_max"] = pre.max;
  j["cache_mib"] = o.common.cache_mib;
  if (recorder) {
    j["routing_recording"] = o.record_routing;
    j["routing_passes"] = recorder->recording().passes.size();
  }
#ifdef REDLITE_HAVE_CUDA
  if (cuda_backend) {
    cuda::EngineStats s = cuda_backend->stats();
    s.cache = decode_cache;
    const double bytes = (double)s.decode_bytes_per_token;
    j["gpu"] = s.gpu_name;
    j["cache_slots"] = s.n_slots;
    j["experts_total"] = s.n_experts_total;
    j["cache_budget_mib"] = s.cache_bytes >> 20;
    j["cache_policy"] = cache_policy_name(o.common.cuda.cache_policy);
    j["fully_resident"] = s.fully_resident;
    j["pinned_copies"] = s.pinned_copies;
    j["dense_mib"] = s.dense_bytes >> 20;
    j["working_set_mib"] = s.working_bytes >> 20;
    j["preload_s"] = s.preload_seconds;
    j["bytes_per_token"] = s.decode_bytes_per_token;
    j["achieved_gb_s"] = bytes * dec.median / 1e9;
    j["percent_of_peak"] = 100.0 * bytes * dec.median / kH200PeakBytesPerSecond;
    j["hit_rate"] = s.cache.hit_rate();
    j["cache_hits"] = s.cache.hits;
    j["cache_misses"] = s.cache.misses;
    const double tokens = (double)o.reps * (o.decode_tokens - 1);  // decode passes
    j["bytes_copied"] = s.cache.bytes_copied;
    j["bytes_copied_per_token"] = s.cache.bytes_copied / std::max(tokens, 1.0);
    j["copy_gb_s"] = s.cache.copy_seconds > 0 ? s.cache.bytes_copied / s.cache.copy_seconds / 1e9 : 0.0;
    // Prefetch (--prefetch): experts predicted, the share of them the layer then selected, the
    // predicted misses copied ahead, of those the ones then selected and the ones copied for nothing.
    j["prefetch"] = cuda::prefetch_name(o.common.cuda.prefetch);
    j["prefetch_experts"] = s.prefetch_experts;
    j["predicted"] = s.cache.predicted;
    j["prediction_accuracy"] = s.cache.predicted ? (double)s.cache.predicted_used / (double)s.cache.predicted : 0.0;
    j["prefetched"] = s.cache.prefetched;
    j["prefetch_hits"] = s.cache.prefetch_hits;
    j["prefetch_wasted"] = s.cache.prefetch_wasted;
    // --miss-reads host: the decode tokens' misses read in place from host memory, of which those
    // not then copied into the cache (bypassed).
    j["miss_reads"] = s.host_misses ? "host" : "copy";
    // -1: adaptive (cache/admission.h); miss_admit_last: the count of the last token that read misses.
    j["miss_admit"] = o.common.cuda.miss_admit;
    j["miss_admit_last"] = s.miss_admit_last;
    j["misses_read_in_place"] = misses_in_place;
    j["misses_bypassed"] = s.cache.bypassed;
    j["gpu_routed_tokens"] = gpu_routed_tokens;
    j["gpu_routed_fallbacks"] = gpu_routed_fallbacks;
    j["prefill_gpu_grouped_layers"] = prefill_grouped_layers;
    j["prefill_x32_products"] = prefill_x32;
    if (!profile.empty()) j["profile_decode"] = profile;
  }
#endif
  if (o.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s on %s (%s numerics): decode %.1f tok/s (min %.1f, max %.1f), prefill %.0f tok/s (min %.0f, "
                "max %.0f), median of %d\n",
                o.common.model_path.c_str(), lm.backend->name().c_str(), numerics_name(lm.numerics), dec.median, dec.min, dec.max,
                pre.median, pre.min, pre.max, o.reps);
    std::printf("  KV cache %s, %zu bytes per token\n", kv_type_name(lm.kv_type), c.kv_bytes_per_token(lm.kv_type));
    if (j.contains("bytes_per_token"))
      std::printf("  %.1f MB/token, %.0f GB/s (%.1f%% of 4.8 TB/s), hit rate %.3f, %.2f MB copied/token, "
                  "copy %.1f GB/s\n",
                  j["bytes_per_token"].get<double>() / 1e6, j["achieved_gb_s"].get<double>(),
                  j["percent_of_peak"].get<double>(), j["hit_rate"].get<double>(),
                  j["bytes_copied_per_token"].get<double>() / 1e6, j["copy_gb_s"].get<double>());
    if (j.contains("predicted") && j["predicted"].get<uint64_t>() > 0)
      std::printf("  prefetch %s: prediction accuracy %.3f, %llu prefetched, %llu hits, %llu wasted\n",
                  j["prefetch"].get<std::string>().c_str(), j["prediction_accuracy"].get<double>(),
                  (unsigned long long)j["prefetched"].get<uint64_t>(),
                  (unsigned long long)j["prefetch_hits"].get<uint64_t>(),
                  (unsigned long long)j["prefetch_wasted"].get<uint64_t>());
    if (j.contains("miss_reads") && j["miss_reads"] == "host")
      std::printf("  misses read in place from host memory: %llu (%llu not then copied into the cache)\n",
                  (unsigned long long)j["misses_read_in_place"].get<uint64_t>(),
                  (unsigned long long)j["misses_bypassed"].get<uint64_t>());
    if (j.contains("profile_decode"))
      std::printf("decode profile (%d passes):\n%s", o.decode_tokens - 1, j["profile_decode"].get<std::string>().c_str());
  }
  return 0;
}

const Registrar registrar("bench", "decode and prefill throughput (DESIGN.md §6 bench protocol)", [](CLI::App& sub) {
  auto o = std::make_shared<BenchOptions>();
  add_common_options(sub, o->common);
  sub.add_option("--reps", o->reps, "runs; the median is reported with min and max")->check(CLI::PositiveNumber);
  sub.add_option("--decode-tokens", o->decode_tokens, "greedy tokens per decode run (protocol: 256)")
      ->check(CLI::Range(2, 1 << 20));
  sub.add_option("--prompt-tokens", o->prompt_tokens, "prompt tokens before each decode run (protocol: 16)")
      ->check(CLI::PositiveNumber);
  sub.add_option("--prefill-tokens", o->prefill_tokens, "prompt tokens of the prefill run (protocol: 1100)")
      ->check(CLI::PositiveNumber);
  sub.add_option("--depths", o->depths,
                 "comma-separated depths D: for each, prefill D tokens, then decode --depth-decode-tokens after them "
                 "(0: the 16-token prompt); instead of the main protocol")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--depth-decode-tokens", o->depth_decode_tokens, "greedy tokens decoded after each depth (128)")
      ->check(CLI::Range(1, 1 << 20));
  sub.add_option("--batch", o->batch,
                 "N sequences (2-16), each with its own --prompt-tokens prompt, decoded together in "
                 "--decode-tokens - 1 batched steps (Backend::decode_batch, as serve --parallel N): aggregate tok/s "
                 "and ms a step; instead of the main protocol")
      ->check(CLI::Range(2, 16));
  sub.add_flag("--batch-prefill", o->batch_prefill,
               "with --batch: the N prompts prefilled in one Backend::prefill_batch_into call (as serve "
               "--step-prefill-tokens), not one after another; prefill_ms times them either way");
  sub.add_flag("--json", o->json, "print the result as JSON");
  sub.add_option("--record-routing", o->record_routing,
                 "write every pass's router selections (prefill chunks and decode tokens, in order) to FILE, "
                 "for bench/cache_policy_sim (docs/cache.md)");
  return [o] { return run_bench(*o); };
});

}  // namespace
}  // namespace rl::cli
