#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>

#include <fmt/format.h>

#include "common/error.h"
#include "generate/chat_choice.h"
#include "generate/chat_template.h"
#include "generate/generator.h"
#include "generate/tool_call_grammar.h"
#include "server/api.h"
#include "server/http_server.h"
#include "server/job.h"
#include "server/origin_policy.h"
#include "server/reasoning_split.h"
#include "server/scheduler.h"
#include "server/tool_call_split.h"
#include "tokenizer/tokenizer.h"

namespace rl {

using nlohmann::json;
using api::ApiError;
using Clock = std::chrono::steady_clock;

namespace {

// How often a waiting HTTP thread wakes to check its client and deadline.
constexpr auto kPollInterval = std::chrono::milliseconds(100);
constexpr double kMaxTimeoutSeconds = ServerConfig::kMaxTimeoutSeconds;
constexpr int kMaxQueue = ServerConfig::kMaxQueue;
constexpr int kMaxHttpThreads = 512;  // HTTP threads at most when sized from max_queue
constexpr int kMaxConnections = ServerConfig::kMaxConnections;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct Server::Impl {
  ServerConfig cfg;
  ModelLoader loader;
  std::unique_ptr<http::HttpServer> http;
  OriginPolicy origins;
  std::thread load_thread;

  // Model state (set once by the loader).
  std::atomic<bool> is_ready{false};
  std::atomic<bool> load_failed{false};
  std::atomic<float> load_progress{0};
  std::string load_error;
  ServedModel model;
  std::optional<ChatTemplate> chat_template;
  std::string chat_template_error;
  SamplingParams default_sampling;

  // The model worker: sessions, their prompt cache, the queue (scheduler.h).
  std::unique_ptr<Scheduler> scheduler;
  bool stopping = false;  // under stop_m

  // Metrics.
  std::mutex metrics_m;
  std::map<std::pair<std::string, int>, uint64_t> requests;  // (endpoint, status) -> count
  uint64_t timed_out = 0;
  std::atomic<uint64_t> next_id{1};

  std::mutex stop_m;
  std::condition_variable stop_cv;
  bool stopped = false;

  void count(const std::string& endpoint, int status) {
    std::lock_guard<std::mutex> l(metrics_m);
    requests[{endpoint, status}]++;
  }

  // ---- loading and the worker ------------------------------------------------------------

  void load() {
    try {
      model = loader([this](float p) { load_progress = p; });
      if (!model.backend || !model.tokenizer) fail("the model loader returned no backend or tokenizer");
      try {
        chat_template = choose_chat_template(cfg.chat_template, model.tokenizer->chat_template());
      } catch (const Error& e) {
        chat_template_error = e.what();  // completions still work; chat requests get this error
        fmt::print(stderr, "warning: /v1/chat/completions disabled: {}\n", e.what());
      }
      int n_ctx = cfg.n_ctx;
      if (model.n_ctx_train > 0) n_ctx = std::min(n_ctx, model.n_ctx_train);
      SchedulerConfig sc;
      sc.parallel = cfg.parallel;
      sc.n_ctx = n_ctx;
      sc.max_queue = cfg.max_queue;
      sc.memory_bytes = cfg.kv_mib * (size_t)1048576;
      sc.prompt_cache_bytes = cfg.prompt_cache_bytes;
      sc.step_prefill_tokens = cfg.step_prefill_tokens;
      {
        std::lock_guard<std::mutex> l(stop_m);
        if (stopping) return;
        scheduler = std::make_unique<Scheduler>(*model.backend, *model.tokenizer, sc);
      }
      load_progress = 1;
      is_ready = true;
      const SchedulerStats st = scheduler->stats();
      fmt::print(stderr, "redlite serve: model '{}' ready, context {} tokens, {} parallel sequences in {:.1f} MiB\n",
                 model.id, n_ctx, cfg.parallel, st.memory_bytes / 1048576.0);
    } catch (const std::exception& e) {
      load_error = e.what();
      load_failed = true;
      fmt::print(stderr, "error: loading the model failed: {}\n", e.what());
    }
  }

  void enqueue(const std::shared_ptr<Job>& job) { scheduler->submit(job); }
  void abandon(const std::shared_ptr<Job>& job) { scheduler->abandon(job); }

  // ---- request helpers ----------------------------------------------------------------------

  void require_ready() {
    if (load_failed) throw ApiError(500, "the model failed to load: " + load_error, "server_error");
    if (!is_ready)
      throw ApiError(503, fmt::format("the model is loading ({:.0f}%)", load_progress * 100), "server_busy", {},
                     "loading");
  }

  void check_auth(const http::Request& req) {
    if (cfg.api_key.empty()) return;
    const std::string h = req.get_header_value("Authorization");
    const std::string expected = "Bearer " + cfg.api_key;
    // Compare in constant time so the key cannot be guessed byte by byte from response times.
    bool ok = h.size() == expected.size();
    unsigned char diff = 0;
    for (size_t i = 0; i < expected.size(); i++) diff |= (unsigned char)(i < h.size() ? h[i] : 0) ^ expected[i];
    if (!ok || diff != 0)
      throw ApiError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                     "authentication_error", {}, "invalid_api_key");
  }

  // Fits the prompt and max_tokens into the context; 400 when the prompt alone does not fit.
  void fit_context(Job& job, bool max_tokens_given) {
    const int n_ctx = scheduler->n_ctx();
    const int n_prompt = (int)job.prompt.size();
    if (n_prompt == 0) throw ApiError(400, "the prompt is empty", "invalid_request_error", "prompt");
    if (n_prompt >= n_ctx)
      throw ApiError(400,
                     fmt::format("the prompt is {} tokens long, but the context holds {} tokens (prompt and "
                                 "reply together); shorten the prompt or start the server with a larger --ctx",
                                 n_prompt, n_ctx),
                     "invalid_request_error", "messages", "context_length_exceeded");
    const int room = n_ctx - n_prompt;
    if (!max_tokens_given || job.gen.max_tokens > room) job.gen.max_tokens = room;
    for (int32_t t : job.prompt)
      if (t < 0 || t >= model.tokenizer->n_vocab())
        throw ApiError(400, fmt::format("token id {} is out of range (vocabulary of {})", t, model.tokenizer->n_vocab()),
                       "invalid_request_error", "prompt");
  }

  std::shared_ptr<Job> make_job(std::vector<int32_t> prompt, const api::CommonRequest& c) {
    auto job = std::make_shared<Job>();
    job->prompt = std::move(prompt);
    job->gen = c.gen;
    job->top_logprobs = c.top_logprobs;
    job->deadline = Clock::now() + std::chrono::milliseconds((int64_t)(cfg.request_timeout_s * 1000));
    fit_context(*job, c.max_tokens_given);
    return job;
  }

  // Waits for more output. Returns false when the deadline passed (the job is then cancelled).
  bool wait_for_output(Job& job, std::unique_lock<std::mutex>& l) {
    job.cv.wait_for(l, kPollInterval);
    if (!job.done && Clock::now() > job.deadline) {
      job.cancel = true;
      return false;
    }
    return true;
  }

  // Blocks until the job ends; 504 when it runs past its deadline. A client that closes its
  // connection meanwhile cancels the job (its answer has nowhere to go).
  GenerationResult wait_result(const std::shared_ptr<Job>& job, const http::Request& req) {
    std::unique_lock<std::mutex> l(job->m);
    while (!job->done) {
      if (req.client_gone()) {
        l.unlock();
        abandon(job);
        throw ApiError(499, "the client closed the connection", "cancelled");
      }
      if (!wait_for_output(*job, l)) {
        l.unlock();
        abandon(job);
        l.lock();
        while (!job->done && job->started) job->cv.wait_for(l, kPollInterval);
        std::lock_guard<std::mutex> m(metrics_m);
        timed_out++;
        throw ApiError(504, fmt::format("the request ran past its {} s timeout", cfg.request_timeout_s),
                       "timeout_error");
      }
    }
    if (job->error) throw *job->error;
    return *job->result;
  }

  static bool send_event(http::DataSink& sink, const json& j) {
    const std::string s = "data: " + api::dump(j) + "\n\n";
    return sink.write(s.data(), s.size());
  }

  // Streams a job as server-sent events: on_output(text, logprobs) for each batch of new text
  // (false: the client is gone, the job is cancelled and false returned), then on_finish(result)
  // when it ends well, or an error event for a failure or a timeout; always closes with [DONE].
  bool stream_job(const std::shared_ptr<Job>& job, http::DataSink& sink,
                  const std::function<bool(const std::string&, const std::vector<TokenLogprob>&)>& on_output,
                  const std::function<void(const GenerationResult&)>& on_finish) {
    std::unique_lock<std::mutex> l(job->m);
    bool expired = false;
    for (;;) {
      std::string text;
      text.swap(job->text);
      // Logprobs travel with the text they produced: tokens whose text is held back (an
      // incomplete character, a possible stop string) keep theirs until that text is released.
      std::vector<TokenLogprob> lps;
      if (!text.empty()) lps.swap(job->logprobs);
      const bool done = job->done;
      l.unlock();
      bool client_ok = true;
      try {
        client_ok = text.empty() || on_output(text, lps);
      } catch (const std::exception& e) {  // must not escape into the HTTP layer
        abandon(job);
        send_event(sink, api::error_body(ApiError(500, e.what(), "server_error")));
        sink.write("data: [DONE]\n\n", 14);
        sink.done();
        return true;
      }
      if (!client_ok) {
        abandon(job);
        return false;
      }
      if (done) break;
      l.lock();
      if (!job->done && job->text.empty() && !wait_for_output(*job, l)) {
        expired = true;
        l.unlock();
        break;
      }
    }
    std::optional<ApiError> error;
    std::optional<GenerationResult> result;
    if (expired) {
      abandon(job);
      std::lock_guard<std::mutex> m(metrics_m);
      timed_out++;
      error = ApiError(504, fmt::format("the request ran past its {} s timeout", cfg.request_timeout_s),
                       "timeout_error");
    } else {
      std::lock_guard<std::mutex> m(job->m);
      if (job->error) error = job->error;
      else result = job->result;
    }
    try {
      if (error) send_event(sink, api::error_body(*error));
      else on_finish(*result);
    } catch (const std::exception& e) {
      send_event(sink, api::error_body(ApiError(500, e.what(), "server_error")));
    }
    sink.write("data: [DONE]\n\n", 14);
    sink.done();
    return true;
  }

  json usage_json(const GenerationResult& r) const {
    const int completion = (int)r.tokens.size() - (r.stop_token ? 1 : 0);
    return json{{"prompt_tokens", r.prompt_tokens},
                {"completion_tokens", completion},
                {"total_tokens", r.prompt_tokens + completion},
                {"prompt_tokens_details", {{"cached_tokens", r.reused_tokens}}}};
  }

  static json timings_json(const GenerationResult& r) {
    return json{{"prompt_n", r.prefill_tokens},
                {"prompt_ms", r.prefill_seconds * 1000},
                {"prompt_per_second", r.prefill_tok_s()},
                {"cached_n", r.reused_tokens},
                {"predicted_n", r.decode_passes},
                {"predicted_ms", r.decode_seconds * 1000},
                {"predicted_per_second", r.decode_tok_s()}};
  }

  json bytes_json(const std::string& s) const {
    json b = json::array();
    for (unsigned char c : s) b.push_back((int)c);
    return b;
  }

  // Chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}
  json chat_logprobs_json(const std::vector<TokenLogprob>& lps) const {
    json content = json::array();
    for (const TokenLogprob& t : lps) {
      const std::string piece = model.tokenizer->piece(t.token);
      json top = json::array();
      for (auto [id, lp] : t.top) {
        const std::string p = model.tokenizer->piece(id);
        top.push_back({{"token", p}, {"logprob", lp}, {"bytes", bytes_json(p)}});
      }
      content.push_back({{"token", piece}, {"logprob", t.logprob}, {"bytes", bytes_json(piece)}, {"top_logprobs", top}});
    }
    return json{{"content", content}};
  }

  // Completions logprobs: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
  json completion_logprobs_json(const std::vector<TokenLogprob>& lps, size_t text_offset0) const {
    json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
    size_t off = text_offset0;
    for (const TokenLogprob& t : lps) {
      const std::string piece = model.tokenizer->piece(t.token);
      tokens.push_back(piece);
      token_lps.push_back(t.logprob);
      json top = json::object();
      for (auto [id, lp] : t.top) top[model.tokenizer->piece(id)] = lp;
      tops.push_back(top);
      offsets.push_back(off);
      off += piece.size();
    }
    return json{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  // ---- endpoints ----------------------------------------------------------------------------

  void chat_completions(const http::Request& req, http::Response& res) {
    const nlohmann::ordered_json body = api::parse_body(req.body);
    api::ChatRequest cr = api::parse_chat_request(body, default_sampling);
    require_ready();
    if (!chat_template) throw ApiError(500, chat_template_error, "server_error");
    ChatRenderOptions opt;
    opt.tools = cr.tools;
    opt.enable_thinking = cr.enable_thinking;
    std::string prompt_text;
    try {
      prompt_text = chat_template->render(cr.messages, opt);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "invalid_request_error", "messages");
    }
    auto job = make_job(model.tokenizer->encode(prompt_text, /*parse_special=*/true), cr.common);
    const std::string id = fmt::format("chatcmpl-{}", next_id++);
    const int64_t created = unix_now();
    const bool has_tools = !cr.tools.empty();
    const ReplyStart split_reasoning = reply_start(prompt_text, chat_template->format());
    // A required tool call replaces response_format's constraint; either starts after the reasoning
    // when the prompt opened it (a reply that may open <think> itself is held to the document).
    if (cr.require_tool_call) {
      try {
        job->gen.constraint.grammar = std::make_shared<const Grammar>(tool_call_grammar(cr.tools, chat_template->format()));
      } catch (const Error& e) {
        throw ApiError(400, e.what(), "invalid_request_error", "tools");
      }
    }
    job->gen.constraint.after_reasoning = split_reasoning == ReplyStart::Reasoning;
    auto finish_name = [&](const GenerationResult& r, const ParsedReply& parsed) -> std::string {
      if (!parsed.tool_calls.empty()) return "tool_calls";
      return r.finish == FinishReason::Length ? "length" : "stop";
    };
    auto tool_calls_json = [id](const ParsedReply& parsed) {
      json calls = json::array();
      for (size_t i = 0; i < parsed.tool_calls.size(); i++) {
        const ToolCall& c = parsed.tool_calls[i];
        calls.push_back({{"index", i},
                         {"id", fmt::format("call_{}_{}", id, i)},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      return calls;
    };

    enqueue(job);
    if (!cr.common.stream) {
      GenerationResult r = wait_result(job, req);
      ReasoningSplitter split(split_reasoning);
      auto [reasoning, content] = split.push(r.text);
      auto [held_reasoning, held_content] = split.finish();
      reasoning += held_reasoning;
      content += held_content;
      ParsedReply parsed;
      if (has_tools) parsed = chat_template->parse_tool_calls(content, cr.tools);
      else parsed.content = content;
      json message = {{"role", "assistant"}, {"content", parsed.content}};
      if (!reasoning.empty()) message["reasoning_content"] = reasoning;
      if (!parsed.tool_calls.empty()) {
        message["tool_calls"] = tool_calls_json(parsed);
        if (parsed.content.empty()) message["content"] = nullptr;
      }
      json choice = {{"index", 0}, {"message", message}, {"finish_reason", finish_name(r, parsed)}};
      choice["logprobs"] = job->top_logprobs >= 0 ? chat_logprobs_json(job->logprobs) : json(nullptr);
      json out = {{"id", id},          {"object", "chat.completion"}, {"created", created},
                  {"model", model.id}, {"system_fingerprint", "redlite-" REDLITE_VERSION},
                  {"choices", json::array({choice})}, {"usage", usage_json(r)}, {"timings", timings_json(r)}};
      res.set_content(api::dump(out), "application/json");
      return;
    }

    auto chunk = [&, id, created](json delta, json finish, json logprobs) {
      json choice = {{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", std::move(finish)}};
      choice["logprobs"] = std::move(logprobs);
      json c = {{"id", id},          {"object", "chat.completion.chunk"}, {"created", created},
                {"model", model.id}, {"system_fingerprint", "redlite-" REDLITE_VERSION},
                {"choices", json::array({choice})}};
      return c;
    };
    const bool include_usage = cr.common.include_usage;
    auto tools = cr.tools;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, chunk, include_usage, has_tools, split_reasoning, tools, tool_calls_json, finish_name, id,
         created](size_t, http::DataSink& sink) {
          ReasoningSplitter split(split_reasoning);
          // With tools, content streams up to the first <tool_call>; the rest is parsed at the end.
          ToolCallSplitter calls(has_tools);
          std::vector<TokenLogprob> pending_lps;  // of tokens whose text is still held back
          if (!send_event(sink, chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr))) {
            abandon(job);
            return false;
          }
          auto lps_json = [&]() -> json {
            if (job->top_logprobs < 0) return nullptr;
            json lp = chat_logprobs_json(pending_lps);
            pending_lps.clear();
            return lp;
          };
          auto on_output = [&](const std::string& text, const std::vector<TokenLogprob>& lps) {
            auto [reasoning, content] = split.push(text);
            bool ok = reasoning.empty() || send_event(sink, chunk({{"reasoning_content", reasoning}}, nullptr, nullptr));
            // Content logprobs go out with the content they belong to (held text: with a later delta).
            if (!content.empty()) pending_lps.insert(pending_lps.end(), lps.begin(), lps.end());
            if (std::string out = calls.push(content); !out.empty())
              ok = ok && send_event(sink, chunk({{"content", out}}, nullptr, lps_json()));
            return ok;
          };
          auto on_finish = [&](const GenerationResult& r) {
            auto [rest, held_content] = split.finish();
            if (!rest.empty()) send_event(sink, chunk({{"reasoning_content", rest}}, nullptr, nullptr));
            if (std::string out = calls.push(held_content); !out.empty())
              send_event(sink, chunk({{"content", out}}, nullptr, lps_json()));
            ParsedReply parsed;
            if (has_tools) {
              parsed = chat_template->parse_tool_calls(calls.finish(), tools);
              if (!parsed.content.empty())
                send_event(sink, chunk({{"content", parsed.content}}, nullptr, lps_json()));
              if (!parsed.tool_calls.empty())
                send_event(sink, chunk({{"tool_calls", tool_calls_json(parsed)}}, nullptr,
                                       pending_lps.empty() ? json(nullptr) : lps_json()));
            }
            send_event(sink, chunk(json::object(), finish_name(r, parsed), nullptr));
            if (include_usage)
              send_event(sink, json{{"id", id},          {"object", "chat.completion.chunk"}, {"created", created},
                                    {"model", model.id}, {"choices", json::array()},          {"usage", usage_json(r)},
                                    {"timings", timings_json(r)}});
          };
          return stream_job(job, sink, on_output, on_finish);
        });
  }

  void completions(const http::Request& req, http::Response& res) {
    const nlohmann::ordered_json body = api::parse_body(req.body);
    api::CompletionRequest cr = api::parse_completion_request(body, default_sampling);
    require_ready();
    std::vector<int32_t> prompt = cr.prompt_text ? model.tokenizer->encode(*cr.prompt_text, /*parse_special=*/true)
                                                 : cr.prompt_tokens;
    if (model.tokenizer->add_bos() && model.tokenizer->bos_id() >= 0 && cr.prompt_text)
      prompt.insert(prompt.begin(), model.tokenizer->bos_id());
    auto job = make_job(std::move(prompt), cr.common);
    const std::string id = fmt::format("cmpl-{}", next_id++);
    const int64_t created = unix_now();
    auto make_choice = [](json text, json finish, json logprobs) {
      return json{{"index", 0}, {"text", std::move(text)}, {"logprobs", std::move(logprobs)},
                  {"finish_reason", std::move(finish)}};
    };
    auto finish_name = [](const GenerationResult& r) { return r.finish == FinishReason::Length ? "length" : "stop"; };

    enqueue(job);
    if (!cr.common.stream) {
      GenerationResult r = wait_result(job, req);
      json lp = job->top_logprobs >= 0 ? completion_logprobs_json(job->logprobs, 0) : json(nullptr);
      json out = {{"id", id},
                  {"object", "text_completion"},
                  {"created", created},
                  {"model", model.id},
                  {"system_fingerprint", "redlite-" REDLITE_VERSION},
                  {"choices", json::array({make_choice(r.text, finish_name(r), lp)})},
                  {"usage", usage_json(r)},
                  {"timings", timings_json(r)}};
      res.set_content(api::dump(out), "application/json");
      return;
    }
    const bool include_usage = cr.common.include_usage;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [this, job, id, created, make_choice, finish_name, include_usage](size_t, http::DataSink& sink) {
          auto frame = [&](json choices, json usage) {
            json c = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model.id},
                      {"choices", std::move(choices)}};
            if (!usage.is_null()) c["usage"] = std::move(usage);
            return c;
          };
          size_t offset = 0;
          auto on_output = [&](const std::string& text, const std::vector<TokenLogprob>& lps) {
            json lp = job->top_logprobs >= 0 ? completion_logprobs_json(lps, offset) : json(nullptr);
            offset += text.size();
            return send_event(sink, frame(json::array({make_choice(text, nullptr, lp)}), nullptr));
          };
          auto on_finish = [&](const GenerationResult& r) {
            send_event(sink, frame(json::array({make_choice("", finish_name(r), nullptr)}), nullptr));
            if (include_usage) send_event(sink, frame(json::array(), usage_json(r)));
          };
          return stream_job(job, sink, on_output, on_finish);
        });
  }

  void tokenize(const http::Request& req, http::Response& res) {
    json body = api::parse_body(req.body);
    require_ready();
    auto c = body.find("content");
    if (c == body.end() || !c->is_string())
      throw ApiError(400, "'content' must be a string", "invalid_request_error", "content");
    bool special = false;
    if (auto s = body.find("parse_special"); s != body.end()) {
      if (!s->is_boolean()) throw ApiError(400, "'parse_special' must be a boolean", "invalid_request_error", "parse_special");
      special = s->get<bool>();
    }
    bool with_pieces = false;
    if (auto s = body.find("with_pieces"); s != body.end()) {
      if (!s->is_boolean()) throw ApiError(400, "'with_pieces' must be a boolean", "invalid_request_error", "with_pieces");
      with_pieces = s->get<bool>();
    }
    std::vector<int32_t> ids = model.tokenizer->encode(c->get<std::string>(), special);
    json tokens = json::array();
    for (int32_t id : ids) {
      if (with_pieces) tokens.push_back({{"id", id}, {"piece", model.tokenizer->piece(id)}});
      else tokens.push_back(id);
    }
    res.set_content(api::dump(json{{"tokens", tokens}}), "application/json");
  }

  void detokenize(const http::Request& req, http::Response& res) {
    json body = api::parse_body(req.body);
    require_ready();
    auto t = body.find("tokens");
    if (t == body.end() || !t->is_array())
      throw ApiError(400, "'tokens' must be an array of token ids", "invalid_request_error", "tokens");
    std::vector<int32_t> ids;
    for (const json& v : *t) {
      if (!v.is_number_integer() && !v.is_number_unsigned())
        throw ApiError(400, "'tokens' must hold integers", "invalid_request_error", "tokens");
      const int64_t id = v.get<int64_t>();
      if (id < 0 || id >= model.tokenizer->n_vocab())
        throw ApiError(400, fmt::format("token id {} is out of range (vocabulary of {})", id, model.tokenizer->n_vocab()),
                       "invalid_request_error", "tokens");
      ids.push_back((int32_t)id);
    }
    res.set_content(api::dump(json{{"content", model.tokenizer->decode(ids)}}), "application/json");
  }

  void models(http::Response& res) {
    json data = json::array();
    if (is_ready)
      data.push_back({{"id", model.id}, {"object", "model"}, {"created", unix_now()}, {"owned_by", "redlite"},
                      {"meta",
                       {{"n_ctx", scheduler->n_ctx()},
                        {"n_vocab", model.tokenizer->n_vocab()},
                        {"backend", model.backend->name()},
                        {"numerics", model.numerics}}}});
    res.set_content(api::dump(json{{"object", "list"}, {"data", data}}), "application/json");
  }

  void health(http::Response& res) {
    if (load_failed) {
      res.status = 500;
      res.set_content(api::dump(json{{"status", "error"}, {"error", load_error}}), "application/json");
    } else if (!is_ready) {
      res.status = 503;
      res.set_content(api::dump(json{{"status", "loading"}, {"progress", load_progress.load()}}), "application/json");
    } else {
      res.set_content(api::dump(json{{"status", "ok"}}), "application/json");
    }
  }

  void metrics(http::Response& res) {
    std::string out;
    const SchedulerStats st = scheduler ? scheduler->stats() : SchedulerStats{};
    std::lock_guard<std::mutex> l(metrics_m);
    // A family's HELP and TYPE lines; metric() adds its one unlabelled sample: an integer as it
    // is, a real number with `digits` decimals.
    auto header = [&](const char* name, const char* type, const char* help) {
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    };
    auto metric = [&](const char* name, const char* type, const char* help, auto value, int digits = 0) {
      header(name, type, help);
      if constexpr (std::is_floating_point_v<decltype(value)>)
        out += fmt::format("{} {:.{}f}\n", name, value, digits);
      else
        out += fmt::format("{} {}\n", name, value);
    };
    const auto ratio = [](uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; };
    header("redlite_requests_total", "counter", "HTTP requests by endpoint and status");
    for (auto& [k, v] : requests)
      out += fmt::format("redlite_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", k.first, k.second, v);
    metric("redlite_requests_rejected_busy_total", "counter", "requests refused with 503 because the queue was full",
           st.rejected_busy);
    metric("redlite_requests_cancelled_total", "counter", "generations cancelled by a client that went away",
           st.cancelled);
    metric("redlite_requests_timed_out_total", "counter", "generations that ran past the request timeout", timed_out);
    metric("redlite_prompt_tokens_total", "counter", "prompt tokens of finished generations", st.prompt_tokens);
    metric("redlite_prompt_tokens_cached_total", "counter", "prompt tokens reused from a kept session state",
           st.cached_tokens);
    metric("redlite_prefill_tokens_total", "counter", "prompt tokens the model processed", st.prefill_tokens);
    metric("redlite_generated_tokens_total", "counter", "tokens generated", st.generated_tokens);
    metric("redlite_prefill_seconds_total", "counter", "time spent in prefill", st.prefill_seconds, 6);
    metric("redlite_decode_seconds_total", "counter", "time spent generating", st.decode_seconds, 6);
    metric("redlite_decode_tokens_per_second", "gauge", "decode speed of the last generation", st.last_decode_tok_s, 3);
    metric("redlite_prefill_tokens_per_second", "gauge", "prefill speed of the last prompt", st.last_prefill_tok_s, 3);
    metric("redlite_queue_depth", "gauge", "requests waiting for the model", st.queue_depth);
    metric("redlite_requests_running", "gauge", "generations running now", st.running);
    metric("redlite_decode_batch_size_mean", "gauge", "sequences advanced per batched decode pass, on average",
           ratio(st.batched_tokens, st.batched_steps), 3);
    metric("redlite_session_bytes", "gauge", "bytes held by the sequences' KV caches and states", st.session_bytes);
    metric("redlite_session_budget_bytes", "gauge", "budget for the sequences' KV caches and states (--kv-mib)",
           st.memory_bytes);
    metric("redlite_prompt_cache_hit_rate", "gauge", "share of lookups that found a reusable session state",
           ratio(st.cache_hits, st.cache_hits + st.cache_misses), 4);
    metric("redlite_prompt_cache_bytes", "gauge", "bytes held by kept session states", st.cache_bytes);
    res.set_content(out, "text/plain; version=0.0.4");
  }

  // Runs on the request line and header, before the body is read: the origin and content type
  // (origin_policy.h), then the API key, so a refused client uploads nothing.
  bool admit(const http::Request& req, http::Response& res) {
    try {
      if (auto refusal = origins.check(req, res)) {
        if (refusal->status == 204) return false;  // a preflight, answered in res
        throw ApiError(refusal->status, refusal->message,
                       refusal->status == 403 ? "permission_error" : "invalid_request_error");
      }
      if (req.path != "/health" && req.path != "/v1/health") check_auth(req);
      return true;
    } catch (const ApiError& e) {
      res.status = e.status;
      res.set_content(api::dump(api::error_body(e)), "application/json");
      count("other", e.status);
      if (cfg.verbose) fmt::print(stderr, "{} {} -> {} (before the body)\n", req.method, req.path, res.status);
      return false;
    }
  }

  http::Limits http_limits() const {
    http::Limits lim;
    lim.max_body_bytes = cfg.max_body_bytes;
    lim.header_timeout_s = cfg.read_timeout_s;
    lim.body_timeout_s = cfg.body_timeout_s;
    lim.idle_timeout_s = cfg.idle_timeout_s;
    lim.max_connections = cfg.max_connections;
    // Every running and every waiting request holds a handler thread.
    lim.handler_threads = cfg.http_threads > 0
                              ? cfg.http_threads
                              : std::min(kMaxHttpThreads, std::max(16, cfg.max_queue + cfg.parallel + 8));
    return lim;
  }

  // Wraps an endpoint: ApiError -> OpenAI error object; anything else -> 500; counts the result.
  template <class F>
  http::Handler wrap(const char* endpoint, F f) {
    return [this, endpoint, f](const http::Request& req, http::Response& res) {
      try {
        f(req, res);
      } catch (const ApiError& e) {
        res.status = e.status;
        if (e.status == 503) res.set_header("Retry-After", "1");
        res.set_content(api::dump(api::error_body(e)), "application/json");
      } catch (const std::exception& e) {
        res.status = 500;
        res.set_content(api::dump(api::error_body(ApiError(500, e.what(), "server_error"))), "application/json");
      }
      origins.add_cors_headers(req, res);
      count(endpoint, res.status);
      if (cfg.verbose) fmt::print(stderr, "{} {} -> {}\n", req.method, req.path, res.status);
    };
  }

  void routes() {
    http->route("GET", "/health", wrap("/health", [this](const http::Request&, http::Response& res) { health(res); }));
    http->route("GET", "/v1/health", wrap("/health", [this](const http::Request&, http::Response& res) { health(res); }));
    http->route("GET", "/metrics", wrap("/metrics", [this](const http::Request&, http::Response& res) { metrics(res); }));
    http->route("GET", "/v1/models", wrap("/v1/models", [this](const auto&, auto& s) { models(s); }));
    http->route("POST", "/v1/chat/completions", wrap("/v1/chat/completions", [this](const auto& q, auto& s) { chat_completions(q, s); }));
    http->route("POST", "/chat/completions", wrap("/v1/chat/completions", [this](const auto& q, auto& s) { chat_completions(q, s); }));
    http->route("POST", "/v1/completions", wrap("/v1/completions", [this](const auto& q, auto& s) { completions(q, s); }));
    http->route("POST", "/completions", wrap("/v1/completions", [this](const auto& q, auto& s) { completions(q, s); }));
    http->route("POST", "/tokenize", wrap("/tokenize", [this](const auto& q, auto& s) { tokenize(q, s); }));
    http->route("POST", "/detokenize", wrap("/detokenize", [this](const auto& q, auto& s) { detokenize(q, s); }));

    http->set_admission([this](const http::Request& req, http::Response& res) { return admit(req, res); });
    // The transport's own refusals still answer with an OpenAI-style error object.
    http->set_error_handler([this](const http::Request& req, http::Response& res) {
      std::string msg;
      switch (res.status) {
        case 404: msg = fmt::format("no endpoint {} {}", req.method, req.path); break;
        case 405: msg = fmt::format("method {} is not allowed on {}", req.method, req.path); break;
        case 408: msg = "the request did not arrive in time"; break;
        case 413: msg = fmt::format("the request body is larger than the limit of {} bytes", cfg.max_body_bytes); break;
        case 414: msg = fmt::format("the request line is longer than the limit of {} bytes", http_limits().max_request_line); break;
        case 431:
          msg = fmt::format("the request header is larger than the limit of {} bytes or {} fields",
                            http_limits().max_header_bytes, http_limits().max_header_count);
          break;
        default: msg = "the request is malformed"; break;
      }
      if (!res.error_detail.empty()) msg += fmt::format(" ({})", res.error_detail);
      res.set_content(api::dump(api::error_body(ApiError(res.status, msg))), "application/json");
      count("other", res.status);
    });
  }
};

Server::Server(ServerConfig config, ModelLoader loader) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = std::move(config);
  impl_->loader = std::move(loader);
  // OpenAI's defaults (temperature 1, top_p 1) with no top-k / min-p filter: a request that
  // names no sampling field samples from the model's own distribution.
  SamplingParams d;
  d.temperature = 1.0f;
  d.top_k = 0;
  d.top_p = 1.0f;
  d.min_p = 0.0f;
  impl_->default_sampling = d;
  if (impl_->cfg.max_queue < 0) fail("--max-queue: must be >= 0, got {}", impl_->cfg.max_queue);
  if (impl_->cfg.n_ctx < 2) fail("--ctx: must be at least 2, got {}", impl_->cfg.n_ctx);
  impl_->cfg.chat_template.validate();
  if (!(impl_->cfg.request_timeout_s > 0) || impl_->cfg.request_timeout_s > kMaxTimeoutSeconds)
    fail("--timeout: must be between 0 and {} seconds, got {}", kMaxTimeoutSeconds, impl_->cfg.request_timeout_s);
  SchedulerConfig limits;
  limits.parallel = impl_->cfg.parallel;
  limits.step_prefill_tokens = impl_->cfg.step_prefill_tokens;
  limits.check_limits();
  if (impl_->cfg.max_queue > kMaxQueue) fail("--max-queue: at most {}, got {}", kMaxQueue, impl_->cfg.max_queue);
  if (impl_->cfg.max_connections < 1 || impl_->cfg.max_connections > kMaxConnections)
    fail("--max-connections: must be between 1 and {}, got {}", kMaxConnections, impl_->cfg.max_connections);
  impl_->origins = OriginPolicy::parse(impl_->cfg.allowed_origins);
}

Server::~Server() {
  stop();
  if (impl_->load_thread.joinable()) impl_->load_thread.join();
  impl_->scheduler.reset();  // joins the worker
}

void Server::start() {
  Impl& s = *impl_;
  s.http = std::make_unique<http::HttpServer>(s.http_limits());
  s.routes();
  s.cfg.port = s.http->bind(s.cfg.host, s.cfg.port);
  s.http->start();
  s.load_thread = std::thread([&s] { s.load(); });
}

void Server::wait() {
  std::unique_lock<std::mutex> l(impl_->stop_m);
  impl_->stop_cv.wait(l, [&] { return impl_->stopped; });
}

void Server::stop() {
  Impl& s = *impl_;
  {
    // Queued requests end with 503; the running ones stop at their next token.
    std::lock_guard<std::mutex> l(s.stop_m);
    s.stopping = true;
    if (s.scheduler) s.scheduler->stop();
  }
  if (s.http) s.http->stop();
  std::lock_guard<std::mutex> l(s.stop_m);
  s.stopped = true;
  s.stop_cv.notify_all();
}

int Server::port() const { return impl_->cfg.port; }
bool Server::ready() const { return impl_->is_ready; }

}  // namespace rl
