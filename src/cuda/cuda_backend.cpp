#include "cuda/cuda_backend.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "common/error.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "gguf/gguf.h"

namespace rl::cuda {

namespace {

// A switch that is on unless set to 0 (`value` when unset).
bool env_on(const char* name, bool value) {
  const char* e = std::getenv(name);
  return e ? std::string(e) != "0" : value;
}

// A switch whose digit 0 .. n - 1 is the enumerator of that number (`value` when unset); any other
// value is refused, `expected` naming the choices.
template <class E>
E env_choice(const char* name, E value, int n, const char* expected) {
  const char* e = std::getenv(name);
  if (!e) return value;
  const std::string v = e;
  if (v.size() != 1 || v[0] < '0' || v[0] >= '0' + n) fail("{}={}: expected {}", name, v, expected);
  return static_cast<E>(v[0] - '0');
}

}  // namespace

CudaOptions CudaOptions::from_env(int64_t cache_mib) {
  CudaOptions o;
  o.cache_mib = cache_mib;
  o.preload = env_on("RL_ENGINE_PRELOAD", o.preload);
  if (const char* e = std::getenv("RL_ENGINE_PROFILE")) o.profile = std::string(e) == "1";
  o.overlap_copies = env_on("RL_ENGINE_OVERLAP", o.overlap_copies);
  o.x24 = env_on("RL_ENGINE_X24", o.x24);
  o.x32 = env_choice("RL_ENGINE_X32", o.x32, 3, "0 (off), 1 (when the grid fills the GPU) or 2 (always)");
  o.gpu_grouping = env_on("RL_ENGINE_GPU_GROUPING", o.gpu_grouping);
  o.speculation = env_choice("RL_ENGINE_SPECULATIVE", o.speculation, 4,
                             "0 (off), 1 (fully resident), 2 (warm cache) or 3 (always)");
  return o;
}

namespace {

constexpr int kMaxChunk = 512;          // tokens per forward pass (DESIGN.md §5)
constexpr size_t kAlign = 256;
constexpr size_t kStagingBytes = 64u << 20;  // pinned ring for per-layer host<->device tables
constexpr size_t kFreeMemoryReserve = 1ull << 30;  // left free for the driver and other sessions

size_t align_up(size_t n, size_t a = kAlign) { return (n + a - 1) / a * a; }

// ---- weights on the device ------------------------------------------------------------------

// A quantised matrix [rows x cols] in device memory.
struct DMat {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  int rows = 0, cols = 0;
};

struct AttnDev {
  DMat q, k, v, o;      // q: [n_head*2*hd x n_embd] (query, gate per head)
  const float* q_norm;  // [hd]
  const float* k_norm;  // [hd]
};

struct SsmDev {
  DMat qkv, z, ba, out;  // qkv [conv_dim x n_embd], z [value_dim x n_embd] (legacy rows permuted)
  const float* conv;     // [conv_dim][K]
  const float* dt_bias;  // [nv]
  const float* a;        // [nv]
  const float* norm;     // [dv]
};

struct MoeDev {
  DMat router, shared_gate_inp, gate_sh, up_sh, down_sh;
  // Routed experts: the host views (copied into slots) and where each matrix sits in a slot.
  TensorView gate_exps, up_exps, down_exps;
  size_t up_offset = 0, down_offset = 0, expert_bytes = 0;
};

struct LayerDev {
  bool recurrent = false;
  const float* attn_norm = nullptr;
  const float* post_norm = nullptr;
  AttnDev attn{};
  SsmDev ssm{};
  MoeDev moe;
};

// Bump allocator over one device allocation, sized by a first pass that only counts.
class Arena {
 public:
  size_t reserve(size_t bytes) {
    const size_t off = size_;
    size_ += align_up(bytes);
    return off;
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

// ---- per-stage GPU timing (RL_ENGINE_PROFILE=1) ------------------------------------------------

// kBackups: the GPU-routed token's state backups (compute stream). kCopyWait: the compute stream
// idle until a layer's expert copies land (after its resident experts ran). kCopies: expert copies,
// timed on the copy stream and not part of the total; copies minus copy_wait is the copy time that
// overlapped compute.
enum Stage { kNorms, kProjections, kDeltaNet, kAttention, kRouter, kSharedExpert, kExperts, kLmHead, kBackups,
             kCopyWait, kOther, kCopies, kStageCount };
const char* const kStageNames[kStageCount] = {"norms",   "projections", "deltanet",  "attention",
                                              "router",  "shared_exp",  "experts",   "lm_head",
                                              "backups", "copy_wait",   "other",     "copies"};

class Profiler {
 public:
  bool on = false;
  // Marks the start of `stage` on the stream; the previous stage ends there.
  void mark(Stage stage, cudaStream_t s) {
    if (!on) return;
    cudaEvent_t e = next_event();
    cudaEventRecord(e, s);
    marks_.push_back({stage, e});
  }
  // After a synchronisation: folds the recorded marks into the totals.
  void collect() {
    if (!on) return;
    for (size_t i = 0; i + 1 < marks_.size(); i++) {
      float ms = 0;
      cudaEventElapsedTime(&ms, marks_[i].second, marks_[i + 1].second);
      total_ms[marks_[i].first] += ms;
    }
    marks_.clear();
    used_ = 0;
  }
  void reset() { std::fill(std::begin(total_ms), std::end(total_ms), 0.0); }
  ~Profiler() {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }
  double total_ms[kStageCount] = {};

 private:
  cudaEvent_t next_event() {
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      RL_CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    return pool_[used_++];
  }
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::vector<std::pair<Stage, cudaEvent_t>> marks_;
};

class CudaSessionImpl;

// ---- the backend: weights, expert cache, shared buffers -----------------------------------------

class CudaBackendImpl final : public CudaBackend {
 public:
  CudaBackendImpl(std::shared_ptr<const Model> model, const CudaOptions& opts);
  ~CudaBackendImpl() override;

  std::string name() const override { return "cuda"; }
  std::unique_ptr<Session> new_session(int n_ctx) override;
  EngineStats stats() const override {
    EngineStats s = stats_;
    s.cache = cache_->stats();
    return s;
  }
  void reset_stats() override {
    cache_->reset_stats();
    stats_.tokens_decoded = 0;
    stats_.gpu_routed_tokens = 0;
    stats_.gpu_routed_fallbacks = 0;
    stats_.gpu_grouped_layers = 0;
    stats_.x32_products = 0;
    profiler_.reset();
  }
  std::string profile_report() const override;

  // One forward pass of T <= kMaxChunk tokens for a session (the state buffers it owns), on the
  // synchronous path.
  struct SessionState;
  void forward(SessionState& st, std::span<const int32_t> tokens, bool all_logits, float* logits_out,
               TraceSink* trace);
  // One decode token on the GPU-routed path. False (state unchanged) when the token must be
  // recomputed by forward(): the path is off, or a layer selected a non-resident expert.
  bool decode_gpu_routed(SessionState& st, int32_t token, float* logits_out, TraceSink* trace);

  const Config& config() const { return model_->config(); }
  std::shared_ptr<const Model> model_;
  CudaOptions opts_;

 private:
  friend class CudaSessionImpl;
  void upload_weights();
  void init_cache();
  void register_mapping();
  void preload_all();
  void allocate_working_set();
  // Routed experts of layer L for the T tokens whose h2 rows are in `h2`; adds into x.
  // The MoE block of layer L: x += experts(h2); then h_out = RMSNorm(x) * next_norm (the next
  // layer's input norm or the output norm, fused into the combine).
  void moe_layer(int L, const float* h2, int T, float* x, TraceSink* trace, const float* next_norm, float* h_out);
  void run_expert_batch(int L, std::span<const int> experts, std::span<const int> group_rows,
                        std::span<const int> group_offset, int T, int row0 = 0);
  void expert_products(int L, const uint8_t* const* ptr_d, const int* off_d, int n, int max_cnt, size_t row0,
                       size_t rows);
  void gather_expert_inputs(const MoeDev& moe, const float* h2, const int32_t* gather_d, int n);
  // Prefill routing on the GPU (moe_experts_grouped): a chunk, every expert resident, not switched off.
  bool gpu_grouping(int T) const;
  void moe_experts_grouped(int L, const float* h2, int T, float* x, const float* next_norm, float* h_out);
  // Enqueues the misses' copies; with wait, the compute stream waits for them.
  void copy_misses(int L, const ExpertCache::Reservation& r, bool wait = true);
  // Reserves experts of layer L, copies the misses (copy_misses), commits and brings the device
  // residency rows up to date; aborts the reservation when a copy fails. `resident`, when given,
  // receives whether each expert was already resident (request order).
  void reserve_and_copy(int L, std::span<const int> experts, bool wait, std::vector<char>* resident = nullptr);
  void sync_residency_rows();
  // What the X32 buffers hold: the conversion of input x of `cols` columns (x null: nothing).
  struct KqHeld {
    const float* x = nullptr;
    int cols = 0;
  };
  void project(const DMat& w, const float* x, int T, float* y, KqHeld* held = nullptr);
  struct Projection {
    const DMat* w;
    const float* x;
    float* y;
  };
  void project_group(std::initializer_list<Projection> list, int T);
  void project_gate_up(const DMat& gate, const DMat& up, const float* x, int T, float* act, float* up_out,
                       bool x_in_dq = false);
  // Enqueues a forward pass of T tokens whose ids and positions are already in device memory, up
  // to the LM head's logits in `logits` ([T or 1][n_vocab]). gpu_routed (T == 1): the routing runs
  // on the GPU and the pass never waits for the host, so it can be captured into a graph.
  void encode_pass(SessionState& st, const int32_t* ids_d, const int32_t* pos_d, int T, bool all_logits,
                   float* logits, TraceSink* trace, bool gpu_routed);
  // Routed and shared experts of layer L for one token, routed on the GPU (route_topk); adds into x.
  void moe_layer_gpu_routed(int L, const float* h2, float* x, const float* next_norm, float* h_out);
  void capture_token_graph(SessionState& st);
  void allocate_state_backups(SessionState& st);
  void copy_recurrent_states(SessionState& st, bool to_backup);
  void upload_token_position(int32_t token, int position);
  void allocate_gpu_routed_buffers();

  // Pinned staging area (host) mirrored by a device area at the same offsets, for the small
  // per-layer tables (slot pointers, assignments, weights). Reset once per layer, when the host
  // has waited for the router logits: by stream order everything staged before was consumed.
  template <class T>
  std::pair<T*, T*> stage(size_t count);
  void stage_reset() { staging_used_ = 0; }

  cudaStream_t stream_ = nullptr, copy_stream_ = nullptr;
  cudaEvent_t slots_free_ = nullptr, copies_done_ = nullptr, router_ready_ = nullptr;
  DeviceBuffer dense_;
  std::vector<LayerDev> layers_;
  DMat token_embd_, output_;
  const float* output_norm_ = nullptr;

  std::unique_ptr<ExpertCache> cache_;
  DeviceBuffer slots_;
  DeviceBuffer residency_table_;              // [n_layer][n_expert] slot address or 0
  std::vector<uint64_t> residency_host_;
  std::vector<bool> residency_dirty_;
  bool registered_ = false;                     // every mapping page-locked
  std::vector<const uint8_t*> registered_bases_;  // one per registered mapping (split models have several)
  std::vector<GgufFile::Mapping> mappings_;       // the files the experts are copied from

  uint8_t* staging_host_ = nullptr;
  DeviceBuffer staging_dev_;
  size_t staging_used_ = 0;

  // Activations for one chunk of up to kMaxChunk tokens.
  DeviceBuffer x_, h_, mix_, proj_a_, proj_b_, proj_c_, small_a_, small_b_, logits_;
  DeviceBuffer router_logits_, g_buf_, u_buf_, y_buf_, xg_buf_, sh_gate_, sh_up_, sh_out_, sh_scalar_;
  // X24 prefill products (CudaOptions::x24) allowed: the option, compute capability 8.0, widths of
  // whole 256-column blocks. Buffers in the X24 form: the gathered expert inputs and the SwiGLU
  // outputs (when some routed expert has an X24 type), the MoE input h2 (T × n_embd; converted
  // once a layer for the shared expert's pair and, gathered, the routed experts' gate and up).
  bool x24_ = false;
  DeviceBuffer xq_buf_, xq_scale_, aq_buf_, aq_scale_;
  DeviceBuffer dq_buf_, dq_scale_;
  bool use_x24(GgmlType t) const { return x24_ && x24_supported(t); }
  // Dense prefill products on X32 (CudaOptions::x32): inputs of up to kq_cols_ columns in the X32
  // form with their 32-column sums, converted once for the products that share them.
  bool x32_ = false;
  int kq_cols_ = 0;
  DeviceBuffer kq_buf_, kq_scale_, kq_sum_;
  bool use_x32(const DMat& w, int T) const {
    return x32_ && x32_supported(w.type) && w.cols % 256 == 0 && w.cols <= kq_cols_ &&
           reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % 16 == 0 &&
           (opts_.x32 == CudaOptions::X32Mode::kAlways || x32_blocks(w.rows, T) >= device_info().sm_count);
  }
  // Whether a layer's prefill converts its MoE input to X24 (shared pair or routed gate/up).
  bool moe_input_x24(const MoeDev& m) const {
    return use_x24(m.gate_sh.type) || (m.gate_exps.present() && (use_x24(m.gate_exps.type) || use_x24(m.up_exps.type)));
  }
  DeviceBuffer ids_, pos_;
  size_t logits_rows_ = 0;
  float* pinned_logits_ = nullptr;
  size_t pinned_logits_floats_ = 0;
  float* pinned_router_ = nullptr;  // [kMaxChunk][n_expert]
  DeviceBuffer route_ids_, route_weights_;  // [kMaxChunk][k] from route_tokens
  // moe_experts_grouped: the gathered order and the groups (group_by_expert), each layer's number
  // of experts used (statistics, read after the pass) and the layers grouped in this pass.
  DeviceBuffer gg_gather_, gg_assign_, gg_ptrs_, gg_groups_, gg_distinct_;
  int32_t* gg_distinct_host_ = nullptr;
  std::vector<int> grouped_layers_;
  int32_t* pinned_route_ids_ = nullptr;     // their host copy

  // GPU-routed decode: [0] token id, [1] position, read by the captured graph.
  DeviceBuffer tokpos_;
  int32_t* tokpos_host_ = nullptr;
  // Per layer, written by route_topk: selections [n_layer][K] then miss counts [n_layer] (one
  // buffer, so one copy brings both back); weights [n_layer][K]; slot addresses [n_layer][K];
  // router logits [n_layer][E] (kept per layer for the trace).
  // The graph's logits have a buffer of their own: logits_ is reallocated when a prefill asks
  // for all positions, and a captured graph must never see an address change.
  DeviceBuffer gr_io_, gr_weights_, gr_slot_ptrs_, gr_router_, assign_identity_, gr_logits_;
  int32_t* gr_io_host_ = nullptr;
  float* gr_router_host_ = nullptr;
  // Expert loads of the pass in progress / of the last pass: the GPU-routed path is tried only
  // after a pass that loaded nothing (with a bounded cache a token almost always misses somewhere).
  bool loads_this_pass_ = false;
  bool last_pass_loaded_ = false;
  bool gpu_routed_broken_ = false;  // capture failed once: stay on the synchronous path

  Profiler profiler_;
  EngineStats stats_;
  std::vector<cudaEvent_t> pending_copy_events_;  // (start, stop) pairs awaiting collection
  std::vector<size_t> pending_copy_bytes_;
};

struct CudaBackendImpl::SessionState {
  int position = 0;
  int n_ctx = 0;
  std::vector<DeviceBuffer> k_cache, v_cache;  // [n_layer]: [n_ctx][kv_dim] (attention layers)
  std::vector<DeviceBuffer> conv, ssm;         // [n_layer]: [K-1][conv_dim], [nv][dv][dk]
  // GPU-routed decode: the state backups the graph writes first, and the graph (captured on the
  // first GPU-routed token; it holds this session's buffer addresses).
  std::vector<DeviceBuffer> conv_backup, ssm_backup;
  cudaGraphExec_t token_graph = nullptr;
  SessionState() = default;
  SessionState(const SessionState&) = delete;
  SessionState& operator=(const SessionState&) = delete;
  ~SessionState() {
    if (token_graph) cudaGraphExecDestroy(token_graph);
  }
};

template <class T>
std::pair<T*, T*> CudaBackendImpl::stage(size_t count) {
  const size_t bytes = align_up(count * sizeof(T));
  // A layer stages a few hundred KiB at most (T·k ids, weights, assignments; slot pointers).
  if (staging_used_ + bytes > kStagingBytes)
    fail("CUDA backend: {} bytes of per-layer tables exceed the {} MiB staging area",
         staging_used_ + bytes, kStagingBytes >> 20);
  T* h = reinterpret_cast<T*>(staging_host_ + staging_used_);
  T* d = reinterpret_cast<T*>(staging_dev_.get<uint8_t>() + staging_used_);
  staging_used_ += bytes;
  return {h, d};
}

CudaBackendImpl::CudaBackendImpl(std::shared_ptr<const Model> model, const CudaOptions& opts)
    : model_(std::move(model)), opts_(opts) {
  if (!device_available()) fail("--backend cuda: no CUDA device is available");
  cudaDeviceProp prop{};
  RL_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  stats_.gpu_name = prop.name;
  upload_quant_tables();
  RL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  RL_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  RL_CUDA_CHECK(cudaEventCreateWithFlags(&slots_free_, cudaEventDisableTiming));
  RL_CUDA_CHECK(cudaEventCreateWithFlags(&copies_done_, cudaEventDisableTiming));
  RL_CUDA_CHECK(cudaEventCreateWithFlags(&router_ready_, cudaEventDisableTiming));
  RL_CUDA_CHECK(cudaEventRecord(slots_free_, stream_));
  profiler_.on = opts_.profile;
  upload_weights();
  allocate_working_set();
  allocate_gpu_routed_buffers();
  init_cache();
  register_mapping();
  if (cache_->holds_all() && opts_.preload) preload_all();
}

CudaBackendImpl::~CudaBackendImpl() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (copy_stream_) cudaStreamSynchronize(copy_stream_);
  for (cudaEvent_t e : pending_copy_events_) cudaEventDestroy(e);
  for (const uint8_t* base : registered_bases_) cudaHostUnregister(const_cast<uint8_t*>(base));
  if (staging_host_) cudaFreeHost(staging_host_);
  if (pinned_logits_) cudaFreeHost(pinned_logits_);
  if (pinned_router_) cudaFreeHost(pinned_router_);
  if (pinned_route_ids_) cudaFreeHost(pinned_route_ids_);
  if (gg_distinct_host_) cudaFreeHost(gg_distinct_host_);
  for (void* p : {(void*)tokpos_host_, (void*)gr_io_host_, (void*)gr_router_host_})
    if (p) cudaFreeHost(p);
  for (cudaEvent_t e : {slots_free_, copies_done_, router_ready_})
    if (e) cudaEventDestroy(e);
  if (stream_) cudaStreamDestroy(stream_);
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
}

// Dense weights: every non-expert tensor, uploaded once into one allocation. Matrices keep their
// ggml type; small vectors are converted to fp32 (model::to_f32). The legacy fused ssm_in is
// stored with its rows permuted into the current layout [q all | k all | v all | z all], so both
// layouts run the same code: qkv and z are then two row ranges of one matrix.
void CudaBackendImpl::upload_weights() {
  const Model& m = *model_;
  const Config& c = m.config();
  struct Job {
    size_t offset;
    std::vector<uint8_t> bytes;  // host copy (converted or permuted); empty: use src
    const uint8_t* src = nullptr;
    size_t n = 0;
  };
  std::vector<Job> jobs;
  Arena arena;
  auto check_type = [&](const TensorView& t) {
    if (!weight_type_supported(t.type))
      fail("{}: tensor {} has type {}, which the CUDA backend does not run", model_->path(), t.name,
           type_name(t.type));
  };
  auto add_matrix = [&](const TensorView& t) -> DMat {
    check_type(t);
    if (t.row_length() % 32 != 0)
      fail("{}: tensor {} has rows of {} values; the CUDA backend needs a multiple of 32",
           model_->path(), t.name, t.row_length());
    Job j;
    j.offset = arena.reserve(t.nbytes);
    j.src = t.data;
    j.n = t.nbytes;
    jobs.push_back(std::move(j));
    DMat d;
    d.type = t.type;
    d.data = reinterpret_cast<const uint8_t*>(jobs.back().offset);  // rebased after allocation
    d.row_bytes = t.row_bytes;
    d.rows = (int)t.n_rows();
    d.cols = (int)t.row_length();
    return d;
  };
  auto add_vector = [&](const TensorView& t) -> const float* {
    std::vector<float> v = to_f32(t);
    Job j;
    j.offset = arena.reserve(v.size() * 4);
    j.bytes.resize(v.size() * 4);
    std::memcpy(j.bytes.data(), v.data(), j.bytes.size());
    jobs.push_back(std::move(j));
    return reinterpret_cast<const float*>(jobs.back().offset);
  };

  token_embd_ = add_matrix(m.token_embd);
  output_ = m.output_is_token_embd ? token_embd_ : add_matrix(m.output);
  output_norm_ = add_vector(m.output_norm);
  layers_.resize(c.n_layer);
  for (int L = 0; L < c.n_layer; L++) {
    const LayerWeights& lw = m.layers[L];
    LayerDev& d = layers_[L];
    d.recurrent = lw.recurrent;
    d.attn_norm = add_vector(lw.attn_norm);
    d.post_norm = add_vector(lw.post_attention_norm);
    if (lw.recurrent) {
      const DeltaNetWeights& w = lw.ssm;
      if (w.legacy_fused) {
        const TensorView& t = w.in;
        check_type(t);
        const int dk = c.ssm_head_dim, rdv = c.ssm_v_per_k() * c.ssm_head_dim;
        const int group = 2 * dk + 2 * rdv, key_dim = c.ssm_key_dim(), conv_dim = c.ssm_conv_dim();
        Job j;
        j.offset = arena.reserve(t.nbytes);
        j.bytes.resize(t.nbytes);
        auto put = [&](int dst_row, int src_row, int n) {
          std::memcpy(j.bytes.data() + (size_t)dst_row * t.row_bytes, t.row(src_row), (size_t)n * t.row_bytes);
        };
        for (int g = 0; g < c.ssm_n_k_heads; g++) {
          put(g * dk, g * group, dk);                                        // q
          put(key_dim + g * dk, g * group + dk, dk);                         // k
          put(2 * key_dim + g * rdv, g * group + 2 * dk, rdv);               // v
          put(conv_dim + g * rdv, g * group + 2 * dk + rdv, rdv);            // z
        }
        jobs.push_back(std::move(j));
        const auto base = (const uint8_t*)jobs.back().offset;
        d.ssm.qkv = {t.type, base, t.row_bytes, conv_dim, (int)t.row_length()};
        d.ssm.z = {t.type, (const uint8_t*)(jobs.back().offset + (size_t)conv_dim * t.row_bytes),
                   t.row_bytes, c.ssm_value_dim(), (int)t.row_length()};
      } else {
        d.ssm.qkv = add_matrix(w.qkv);
        d.ssm.z = add_matrix(w.gate);
      }
      d.ssm.ba = add_matrix(w.ba);
      d.ssm.out = add_matrix(w.out);
      d.ssm.conv = add_vector(w.conv1d);
      d.ssm.dt_bias = add_vector(w.dt_bias);
      d.ssm.a = add_vector(w.a);
      d.ssm.norm = add_vector(w.norm);
    } else {
      d.attn.q = add_matrix(lw.attn.q);
      d.attn.k = add_matrix(lw.attn.k);
      d.attn.v = add_matrix(lw.attn.v);
      d.attn.o = add_matrix(lw.attn.output);
      d.attn.q_norm = add_vector(lw.attn.q_norm);
      d.attn.k_norm = add_vector(lw.attn.k_norm);
    }
    const MoeWeights& mw = lw.moe;
    d.moe.router = add_matrix(mw.router);
    d.moe.shared_gate_inp = add_matrix(mw.shared_gate_inp);
    d.moe.gate_sh = add_matrix(mw.gate_shexp);
    d.moe.up_sh = add_matrix(mw.up_shexp);
    d.moe.down_sh = add_matrix(mw.down_shexp);
    for (const TensorView* t : {&mw.gate_exps, &mw.up_exps, &mw.down_exps}) {
      check_type(*t);
      if (t->row_length() % 32 != 0)
        fail("{}: tensor {} has rows of {} values; the CUDA backend needs a multiple of 32",
             model_->path(), t->name, t->row_length());
    }
    d.moe.gate_exps = mw.gate_exps;
    d.moe.up_exps = mw.up_exps;
    d.moe.down_exps = mw.down_exps;
    const size_t g = mw.gate_exps.matrix(0).nbytes, u = mw.up_exps.matrix(0).nbytes,
                 dn = mw.down_exps.matrix(0).nbytes;
    d.moe.up_offset = align_up(g);
    d.moe.down_offset = d.moe.up_offset + align_up(u);
    d.moe.expert_bytes = d.moe.down_offset + align_up(dn);
  }

  dense_.allocate(arena.size());
  uint8_t* base = dense_.get<uint8_t>();
  for (const Job& j : jobs) {
    const uint8_t* src = j.bytes.empty() ? j.src : j.bytes.data();
    const size_t n = j.bytes.empty() ? j.n : j.bytes.size();
    RL_CUDA_CHECK(cudaMemcpy(base + j.offset, src, n, cudaMemcpyHostToDevice));
  }
  auto rebase_m = [&](DMat& d) { d.data = base + (size_t)d.data; };
  auto rebase_v = [&](const float*& p) { p = reinterpret_cast<const float*>(base + (size_t)p); };
  const bool shared_head = m.output_is_token_embd;
  rebase_m(token_embd_);
  if (shared_head) output_ = token_embd_; else rebase_m(output_);
  rebase_v(output_norm_);
  for (LayerDev& d : layers_) {
    rebase_v(d.attn_norm);
    rebase_v(d.post_norm);
    if (d.recurrent) {
      for (DMat* x : {&d.ssm.qkv, &d.ssm.z, &d.ssm.ba, &d.ssm.out}) rebase_m(*x);
      for (const float** p : {&d.ssm.conv, &d.ssm.dt_bias, &d.ssm.a, &d.ssm.norm}) rebase_v(*p);
    } else {
      for (DMat* x : {&d.attn.q, &d.attn.k, &d.attn.v, &d.attn.o}) rebase_m(*x);
      rebase_v(d.attn.q_norm);
      rebase_v(d.attn.k_norm);
    }
    for (DMat* x : {&d.moe.router, &d.moe.shared_gate_inp, &d.moe.gate_sh, &d.moe.up_sh, &d.moe.down_sh})
      rebase_m(*x);
  }
  stats_.dense_bytes = arena.size();

  // Bytes a decode token reads: every dense tensor, of the embedding only one row (unless it is
  // also the LM head), and n_expert_used experts per layer.
  size_t per_token = 0;
  for (const Job& j : jobs) per_token += j.bytes.empty() ? j.n : j.bytes.size();
  if (!shared_head) per_token = per_token - m.token_embd.nbytes + m.token_embd.row_bytes;
  for (const LayerDev& d : layers_)
    per_token += (size_t)c.n_expert_used * (d.moe.gate_exps.matrix(0).nbytes + d.moe.up_exps.matrix(0).nbytes +
                                            d.moe.down_exps.matrix(0).nbytes);
  stats_.decode_bytes_per_token = per_token;
}

void CudaBackendImpl::allocate_working_set() {
  const Config& c = config();
  const size_t T = kMaxChunk;
  const size_t n_embd = c.n_embd;
  const size_t proj = std::max<size_t>({(size_t)c.ssm_conv_dim(), 2 * (size_t)c.q_dim(), 1});
  const size_t small = std::max<size_t>({(size_t)c.ssm_value_dim(), (size_t)c.q_dim(), 2 * (size_t)c.ssm_n_v_heads, 1});
  const size_t n_assign = T * c.n_expert_used;
  const size_t ff = std::max(c.n_ff_exp, 1), ff_sh = std::max(c.n_ff_shexp, 1);
  size_t total = 0;
  auto alloc = [&](DeviceBuffer& b, size_t floats) {
    b.allocate(floats * sizeof(float));
    total += floats * sizeof(float);
  };
  alloc(x_, T * n_embd);
  alloc(h_, T * n_embd);
  // mix_ also holds the DeltaNet gates [2][T][nv] and the attention values [T][kv_dim].
  alloc(mix_, T * std::max<size_t>({n_embd, (size_t)c.kv_dim(), 2 * (size_t)c.ssm_n_v_heads}));
  alloc(proj_a_, T * proj);
  alloc(proj_b_, T * proj);
  alloc(proj_c_, T * small);
  alloc(small_a_, T * small);
  alloc(small_b_, T * small);
  alloc(router_logits_, T * c.n_expert);
  alloc(g_buf_, n_assign * ff);
  alloc(u_buf_, n_assign * ff);
  alloc(y_buf_, n_assign * n_embd);
  alloc(xg_buf_, n_assign * n_embd);
  x24_ = opts_.x24 && device_info().cc_major >= 8 && c.n_embd % 256 == 0 && c.n_ff_exp % 256 == 0;
  bool routed_x24 = false, h2_x24 = false;
  for (const LayerDev& d : layers_) {
    for (const TensorView* v : {&d.moe.gate_exps, &d.moe.up_exps, &d.moe.down_exps})
      routed_x24 = routed_x24 || (v->present() && use_x24(v->type));
    h2_x24 = h2_x24 || moe_input_x24(d.moe);
  }
  auto alloc_bytes = [&](DeviceBuffer& b, size_t bytes) {
    b.allocate(bytes);
    total += bytes;
  };
  if (routed_x24) {
    alloc_bytes(xq_buf_, x24_bytes(n_assign, n_embd));
    alloc_bytes(xq_scale_, n_assign * (n_embd / 256) * sizeof(double));
    alloc_bytes(aq_buf_, x24_bytes(n_assign, ff));
    alloc_bytes(aq_scale_, n_assign * (ff / 256) * sizeof(double));
  }
  if (h2_x24) {
    alloc_bytes(dq_buf_, x24_bytes(T, n_embd));
    alloc_bytes(dq_scale_, T * (n_embd / 256) * sizeof(double));
  }
  x32_ = x24_ && opts_.x32 != CudaOptions::X32Mode::kOff && device_info().cc_major >= 9;
  kq_cols_ = 0;
  if (x32_) {
    // Every matrix a prefill projects through project() (the LM head when all logits are asked for).
    auto widen = [&](const DMat& m) {
      if (x32_supported(m.type) && m.cols % 256 == 0) kq_cols_ = std::max(kq_cols_, m.cols);
    };
    widen(output_);
    for (const LayerDev& d : layers_)
      for (const DMat* m : {&d.attn.q, &d.attn.k, &d.attn.v, &d.attn.o, &d.ssm.qkv, &d.ssm.z, &d.ssm.ba, &d.ssm.out,
                            &d.moe.router, &d.moe.shared_gate_inp, &d.moe.gate_sh, &d.moe.up_sh, &d.moe.down_sh})
        widen(*m);
    if (kq_cols_ > 0) {
      alloc_bytes(kq_buf_, x32_bytes(T, kq_cols_));
      alloc_bytes(kq_scale_, T * (kq_cols_ / 256) * sizeof(double));
      alloc_bytes(kq_sum_, T * (kq_cols_ / 32) * sizeof(double));
    }
  }
  alloc(sh_gate_, T * ff_sh);
  alloc(sh_up_, T * ff_sh);
  alloc(sh_out_, T * n_embd);
  alloc(sh_scalar_, T);
  ids_.allocate(T * sizeof(int32_t));
  pos_.allocate(T * sizeof(int32_t));
  alloc(logits_, c.n_vocab);  // grows when all positions' logits are asked for
  logits_rows_ = 1;
  RL_CUDA_CHECK(cudaMallocHost(&staging_host_, kStagingBytes));
  RL_CUDA_CHECK(cudaMallocHost(&pinned_router_, T * c.n_expert * sizeof(float)));
  route_ids_.allocate(n_assign * sizeof(int32_t));
  route_weights_.allocate(n_assign * sizeof(float));
  RL_CUDA_CHECK(cudaMallocHost(&pinned_route_ids_, n_assign * sizeof(int32_t)));
  staging_dev_.allocate(kStagingBytes);
  total += kStagingBytes + 2 * T * sizeof(int32_t) + 2 * n_assign * sizeof(int32_t);
  const size_t n_groups = (size_t)expert_group_bound((int)n_assign, c.n_expert);
  alloc_bytes(gg_gather_, n_assign * sizeof(int32_t));
  alloc_bytes(gg_assign_, n_assign * sizeof(int32_t));
  alloc_bytes(gg_ptrs_, n_groups * sizeof(void*));
  alloc_bytes(gg_groups_, 2 * n_groups * sizeof(int32_t));
  alloc_bytes(gg_distinct_, (size_t)c.n_layer * sizeof(int32_t));
  RL_CUDA_CHECK(cudaMallocHost(&gg_distinct_host_, (size_t)c.n_layer * sizeof(int32_t)));
  stats_.working_bytes = total;
}

void CudaBackendImpl::init_cache() {
  const Config& c = config();
  size_t slot_bytes = 0;
  for (const LayerDev& d : layers_) slot_bytes = std::max(slot_bytes, d.moe.expert_bytes);
  const size_t n_total = (size_t)c.n_layer * c.n_expert;
  size_t free_b = 0, total_b = 0;
  RL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t usable = free_b > kFreeMemoryReserve ? free_b - kFreeMemoryReserve : 0;
  size_t budget;
  if (opts_.cache_mib > 0) {
    // A budget the card cannot hold is refused even when the model's experts would need less:
    // the user asked for memory that is not there, and silently capping would hide it.
    budget = (size_t)opts_.cache_mib << 20;
    if (budget > usable)
      fail("--cache-mib {}: only {} MiB of device memory are free after the dense weights ({} MiB) "
           "and the working set ({} MiB), keeping {} MiB spare",
           opts_.cache_mib, usable >> 20, stats_.dense_bytes >> 20, stats_.working_bytes >> 20,
           kFreeMemoryReserve >> 20);
  } else {
    budget = std::min(usable, n_total * slot_bytes);
  }
  cache_ = std::make_unique<ExpertCache>(c.n_layer, c.n_expert, slot_bytes, budget, c.n_expert_used);
  slots_.allocate((size_t)cache_->n_slots() * slot_bytes);
  residency_table_.allocate(n_total * sizeof(uint64_t));
  RL_CUDA_CHECK(cudaMemset(residency_table_.get(), 0, n_total * sizeof(uint64_t)));
  residency_host_.assign(n_total, 0);
  residency_dirty_.assign(c.n_layer, false);
  cache_->set_listener([this](ExpertCache::Key k, int slot) {
    residency_host_[k] = slot < 0 ? 0 : (uint64_t)(slots_.get<uint8_t>() + (size_t)slot * cache_->slot_bytes());
    residency_dirty_[cache_->layer_of(k)] = true;
  });
  stats_.n_slots = cache_->n_slots();
  stats_.n_experts_total = (int)n_total;
  stats_.slot_bytes = slot_bytes;
  stats_.cache_bytes = (size_t)cache_->n_slots() * slot_bytes;
  stats_.fully_resident = cache_->holds_all();
}

// Misses are copied straight from the mapping (each tensor view points into the mapping of the
// shard that holds it). Registering the mappings (read-only, page-locked) lets the copy engine
// read them at PCIe speed; a pageable copy measured ~9x slower on the H200 host (DEVICE.md). When
// registration is refused the backend still works, with pageable copies.
void CudaBackendImpl::register_mapping() {
  mappings_ = model_->gguf().mappings();
  registered_ = true;
  const size_t page = 4096;
  for (const GgufFile::Mapping& m : mappings_) {
    const uint8_t* start = reinterpret_cast<const uint8_t*>((uintptr_t)m.base & ~(uintptr_t)(page - 1));
    const size_t len = align_up((size_t)(m.base + m.size - start), page);
    cudaError_t e = cudaHostRegister(const_cast<uint8_t*>(start), len,
                                     cudaHostRegisterReadOnly | cudaHostRegisterPortable);
    if (e == cudaSuccess) {
      registered_bases_.push_back(start);
    } else {
      cudaGetLastError();
      registered_ = false;
      std::fprintf(stderr, "cuda: could not page-lock the model mapping of %s (%s); its experts are copied "
                   "from pageable memory, which is slower\n", m.path.c_str(), cudaGetErrorString(e));
    }
  }
  stats_.pinned_copies = registered_;
}

void CudaBackendImpl::sync_residency_rows() {
  const int E = config().n_expert;
  for (size_t L = 0; L < residency_dirty_.size(); L++) {
    if (!residency_dirty_[L]) continue;
    RL_CUDA_CHECK(cudaMemcpyAsync(residency_table_.get<uint64_t>() + L * E, residency_host_.data() + L * E,
                                  E * sizeof(uint64_t), cudaMemcpyHostToDevice, stream_));
    residency_dirty_[L] = false;
  }
}

// Enqueues the copies of a reservation's misses on the copy stream, after the expert kernels that
// last read those slots, and makes the compute stream wait for them.
void CudaBackendImpl::copy_misses(int L, const ExpertCache::Reservation& r, bool wait) {
  if (r.n_misses() == 0) return;
  loads_this_pass_ = true;
  // A file truncated after open would make the mapping's tail unreadable: refuse before copying.
  for (const GgufFile::Mapping& m : mappings_) {
    struct stat sb{};
    if (::stat(m.path.c_str(), &sb) != 0 || (uint64_t)sb.st_size < m.size)
      fail("{}: the model file changed size after it was opened (now {} bytes, expected {}); cannot "
           "copy the experts of layer {}", m.path, (long long)sb.st_size, m.size, L);
  }
  const MoeDev& moe = layers_[L].moe;
  uint8_t* slots = slots_.get<uint8_t>();
  RL_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, slots_free_, 0));
  cudaEvent_t start = nullptr, stop = nullptr;
  RL_CUDA_CHECK(cudaEventCreate(&start));
  RL_CUDA_CHECK(cudaEventCreate(&stop));
  pending_copy_events_.push_back(start);
  pending_copy_events_.push_back(stop);
  RL_CUDA_CHECK(cudaEventRecord(start, copy_stream_));
  size_t bytes = 0;
  for (const ExpertCache::Entry& e : r.entries) {
    if (e.hit) continue;
    uint8_t* dst = slots + (size_t)e.slot * cache_->slot_bytes();
    const TensorView g = moe.gate_exps.matrix(e.expert), u = moe.up_exps.matrix(e.expert),
                     d = moe.down_exps.matrix(e.expert);
    RL_CUDA_CHECK(cudaMemcpyAsync(dst, g.data, g.nbytes, cudaMemcpyHostToDevice, copy_stream_));
    RL_CUDA_CHECK(cudaMemcpyAsync(dst + moe.up_offset, u.data, u.nbytes, cudaMemcpyHostToDevice, copy_stream_));
    RL_CUDA_CHECK(cudaMemcpyAsync(dst + moe.down_offset, d.data, d.nbytes, cudaMemcpyHostToDevice, copy_stream_));
    bytes += g.nbytes + u.nbytes + d.nbytes;
  }
  RL_CUDA_CHECK(cudaEventRecord(stop, copy_stream_));
  pending_copy_bytes_.push_back(bytes);
  RL_CUDA_CHECK(cudaEventRecord(copies_done_, copy_stream_));
  if (wait) RL_CUDA_CHECK(cudaStreamWaitEvent(stream_, copies_done_, 0));
}

void CudaBackendImpl::reserve_and_copy(int L, std::span<const int> experts, bool wait, std::vector<char>* resident) {
  const ExpertCache::Reservation& r = cache_->reserve(L, experts);
  try {
    copy_misses(L, r, wait);
  } catch (...) {
    cache_->abort();
    sync_residency_rows();
    throw;
  }
  if (resident) {
    resident->clear();
    for (const ExpertCache::Entry& e : r.entries) resident->push_back(e.hit);
  }
  cache_->commit();
  sync_residency_rows();
}

void CudaBackendImpl::preload_all() {
  const Config& c = config();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> all(c.n_expert);
  std::iota(all.begin(), all.end(), 0);
  const bool tty = isatty(2);
  for (int L = 0; L < c.n_layer; L++) {
    reserve_and_copy(L, all, true);
    RL_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
    if (tty || L + 1 == c.n_layer) {
      const int width = 30, done = (L + 1) * width / c.n_layer;
      std::fprintf(stderr, "\rloading experts [%.*s%*s] %d/%d layers", done,
                   "##############################", width - done, "", L + 1, c.n_layer);
      if (L + 1 == c.n_layer) std::fprintf(stderr, "\n");
    }
  }
  RL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  stats_.preload_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The preload is not part of any request's statistics.
  for (cudaEvent_t e : pending_copy_events_) cudaEventDestroy(e);
  pending_copy_events_.clear();
  pending_copy_bytes_.clear();
  cache_->reset_stats();
}

// held (optional): what the X32 buffers hold, kept up to date, so that products of one input in a
// row convert it once (the caller starts from an empty KqHeld).
void CudaBackendImpl::project(const DMat& w, const float* x, int T, float* y, KqHeld* held) {
  if (T == 1) {
    matvec(w.type, w.data, w.row_bytes, w.rows, w.cols, x, y, stream_);
  } else if (use_x32(w, T)) {
    if (!held || held->x != x || held->cols != w.cols) {
      quantize_x32(x, T, w.cols, kq_buf_.get<uint8_t>(), kq_scale_.get<double>(), kq_sum_.get<double>(), stream_);
      if (held) *held = {x, w.cols};
    }
    matmul_x32(w.type, w.data, w.row_bytes, w.rows, w.cols, kq_buf_.get<uint8_t>(), kq_scale_.get<double>(),
               kq_sum_.get<double>(), T, y, stream_);
    stats_.x32_products++;
  } else {
    matmul(w.type, w.data, w.row_bytes, w.rows, w.cols, x, T, y, stream_);
  }
  // An output written over the converted input makes the conversion stale.
  if (held && held->x && y < held->x + (size_t)T * held->cols && held->x < y + (size_t)T * w.rows) *held = {};
}

// Several products of T tokens (an input shared by X32 products converted once); for one token,
// consecutive products of one type and width are one launch (matvec_jobs).
void CudaBackendImpl::project_group(std::initializer_list<Projection> list, int T) {
  if (T != 1) {
    KqHeld held;
    for (const Projection& p : list) project(*p.w, p.x, T, p.y, &held);
    return;
  }
  std::vector<MatvecJob> jobs;
  const DMat* first = nullptr;
  auto flush = [&] {
    if (!jobs.empty()) matvec_jobs(first->type, first->cols, jobs.data(), (int)jobs.size(), stream_);
    jobs.clear();
  };
  for (const Projection& p : list) {
    if (first && (p.w->type != first->type || p.w->cols != first->cols)) flush();
    if (jobs.empty()) first = p.w;
    MatvecJob j;
    j.w = p.w->data;
    j.row_bytes = p.w->row_bytes;
    j.rows = p.w->rows;
    j.x = p.x;
    j.y = p.y;
    jobs.push_back(j);
  }
  flush();
}

// act = SiLU(gate · x) * (up · x) for T tokens (act [T][rows]; `up_out` holds up · x where the
// two products are separate launches).
// x_in_dq: dq_buf_ already holds x in the X24 form (moe_layer converts its input once).
void CudaBackendImpl::project_gate_up(const DMat& gate, const DMat& up, const float* x, int T, float* act,
                                      float* up_out, bool x_in_dq) {
  if (T == 1 && gate.type == up.type && gate.cols == up.cols) {
    GateUpJob j;
    j.gate = gate.data;
    j.up = up.data;
    j.row_bytes_gate = gate.row_bytes;
    j.row_bytes_up = up.row_bytes;
    j.rows = gate.rows;
    j.x = x;
    j.act = act;
    matvec_gate_up(gate.type, gate.cols, &j, 1, stream_);
    return;
  }
  if (gate.type == up.type && gate.cols == up.cols && gate.rows == up.rows) {
    if (use_x24(gate.type) && gate.cols == config().n_embd) {
      if (!x_in_dq) quantize_x24(x, T, gate.cols, dq_buf_.get<uint8_t>(), dq_scale_.get<double>(), stream_);
      matmul_x24_gate_up(gate.type, gate.data, up.data, gate.row_bytes, gate.rows, gate.cols, dq_buf_.get<uint8_t>(),
                         dq_scale_.get<double>(), T, act, stream_);
      return;
    }
    matmul_gate_up(gate.type, gate.data, up.data, gate.row_bytes, gate.rows, gate.cols, x, T, act, stream_);
    return;
  }
  KqHeld held;
  project(gate, x, T, act, &held);
  project(up, x, T, up_out, &held);
  swiglu(act, up_out, act, (size_t)T * gate.rows, stream_);
}

// The prefill products of layer L's routed experts: group g (slot ptr_d[g]) over the gathered rows
// [off_d[g], + off_d[n + g]) (at most max_cnt), the groups' rows being [row0, row0 + rows).
void CudaBackendImpl::expert_products(int L, const uint8_t* const* ptr_d, const int* off_d, int n, int max_cnt,
                                      size_t row0, size_t rows) {
  const Config& c = config();
  const MoeDev& moe = layers_[L].moe;
  const TensorView gv = moe.gate_exps.matrix(0), uv = moe.up_exps.matrix(0), dv = moe.down_exps.matrix(0);
  const int ff = c.n_ff_exp, n_embd = c.n_embd;
  // One product: the X24 form of its input (the gathered rows of moe_layer's conversion; `aq` the
  // SwiGLU outputs) for the IQ types, else the fp64 products on the fp32 input.
  const uint8_t* xq = xq_buf_.get<uint8_t>();
  const double* xs = xq_scale_.get<double>();
  auto product = [&](const TensorView& v, size_t offset, int out_rows, int cols, const float* x, const uint8_t* q,
                     const double* qs, float* y) {
    if (use_x24(v.type))
      matmul_x24_experts(v.type, ptr_d, offset, v.row_bytes, out_rows, cols, q, qs, off_d, off_d + n, n, max_cnt, y,
                         stream_);
    else
      matmul_experts(v.type, ptr_d, offset, v.row_bytes, out_rows, cols, x, off_d, off_d + n, n, max_cnt, y, stream_);
  };
  if (gv.type == uv.type && gv.row_bytes == uv.row_bytes) {
    if (use_x24(gv.type))
      matmul_x24_experts_gate_up(gv.type, ptr_d, 0, moe.up_offset, gv.row_bytes, ff, n_embd, xq, xs, off_d,
                                 off_d + n, n, max_cnt, g_buf_.f(), stream_);
    else
      matmul_experts_gate_up(gv.type, ptr_d, 0, moe.up_offset, gv.row_bytes, ff, n_embd, xg_buf_.f(), off_d,
                             off_d + n, n, max_cnt, g_buf_.f(), stream_);
  } else {
    product(gv, 0, ff, n_embd, xg_buf_.f(), xq, xs, g_buf_.f());
    product(uv, moe.up_offset, ff, n_embd, xg_buf_.f(), xq, xs, u_buf_.f());
    swiglu(g_buf_.f() + row0 * ff, u_buf_.f() + row0 * ff, g_buf_.f() + row0 * ff, rows * ff, stream_);
  }
  if (use_x24(dv.type))
    quantize_x24(g_buf_.f() + row0 * ff, (int)rows, ff, aq_buf_.get<uint8_t>() + x24_bytes(row0, ff),
                 aq_scale_.get<double>() + row0 * (ff / 256), stream_);
  product(dv, moe.down_offset, n_embd, ff, g_buf_.f(), aq_buf_.get<uint8_t>(), aq_scale_.get<double>(), y_buf_.f());
}

// Expert kernels for one batch of experts (all reserved and resident): group g = experts[g] over
// rows [group_offset[g], +group_rows[g]) of the gathered activations (prefill) or, for one token,
// the shared input h (decode).
void CudaBackendImpl::run_expert_batch(int L, std::span<const int> experts, std::span<const int> group_rows,
                                       std::span<const int> group_offset, int T, int row0) {
  const Config& c = config();
  const MoeDev& moe = layers_[L].moe;
  const int n = (int)experts.size();
  auto [ptr_h, ptr_d] = stage<const uint8_t*>(n);
  for (int g = 0; g < n; g++)
    ptr_h[g] = slots_.get<uint8_t>() + (size_t)cache_->lookup(L, experts[g]) * cache_->slot_bytes();
  RL_CUDA_CHECK(cudaMemcpyAsync(ptr_d, ptr_h, n * sizeof(void*), cudaMemcpyHostToDevice, stream_));
  const TensorView gv = moe.gate_exps.matrix(0), uv = moe.up_exps.matrix(0), dv = moe.down_exps.matrix(0);
  const int ff = c.n_ff_exp, n_embd = c.n_embd;
  if (T == 1) {
    // Decode: group g's output row is row0 + g.
    const size_t r0 = (size_t)row0;
    matvec_experts_gate_up(gv.type, uv.type, ptr_d, moe.up_offset, gv.row_bytes, uv.row_bytes, ff, n_embd, h_.f(),
                           g_buf_.f() + r0 * ff, u_buf_.f() + r0 * ff, n, stream_);
    matvec_experts(dv.type, ptr_d, moe.down_offset, dv.row_bytes, n_embd, ff, g_buf_.f() + r0 * ff, ff,
                   y_buf_.f() + r0 * n_embd, n, stream_);
  } else {
    auto [off_h, off_d] = stage<int>(2 * n);
    int max_cnt = 0;
    for (int g = 0; g < n; g++) {
      off_h[g] = group_offset[g];
      off_h[n + g] = group_rows[g];
      max_cnt = std::max(max_cnt, group_rows[g]);
    }
    RL_CUDA_CHECK(cudaMemcpyAsync(off_d, off_h, 2 * n * sizeof(int), cudaMemcpyHostToDevice, stream_));
    // This batch's rows of the gathered order (contiguous: groups are in gathered order).
    size_t rows = 0;
    for (int g = 0; g < n; g++) rows += group_rows[g];
    expert_products(L, ptr_d, off_d, n, max_cnt, (size_t)group_offset[0], rows);
  }
  // These slots may be overwritten once the kernels above have read them.
  RL_CUDA_CHECK(cudaEventRecord(slots_free_, stream_));
}

void CudaBackendImpl::moe_layer(int L, const float* h2, int T, float* x, TraceSink* trace, const float* next_norm,
                                float* h_out) {
  const Config& c = config();
  const LayerDev& d = layers_[L];
  const int E = c.n_expert, K = c.n_expert_used, n_embd = c.n_embd;

  // Routing on the GPU, the selections to the host (which reserves the experts); the shared expert
  // runs on the GPU meanwhile. With every expert resident a chunk's selections are grouped on the
  // GPU instead (moe_experts_grouped) and the layer does not wait for the host.
  profiler_.mark(kRouter, stream_);
  project_group({{&d.moe.router, h2, router_logits_.f()}, {&d.moe.shared_gate_inp, h2, sh_scalar_.f()}}, T);
  route_tokens(router_logits_.f(), T, E, K, c.expert_weights_scale, route_ids_.get<int32_t>(), route_weights_.f(),
               stream_);
  // The selections to the host: to reserve the experts, or (grouped on the GPU) for the trace only.
  const bool grouped = gpu_grouping(T);
  if (!grouped || trace) {
    RL_CUDA_CHECK(cudaMemcpyAsync(pinned_route_ids_, route_ids_.get(), (size_t)T * K * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream_));
    if (trace)
      RL_CUDA_CHECK(cudaMemcpyAsync(pinned_router_, router_logits_.f(), (size_t)T * E * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
    RL_CUDA_CHECK(cudaEventRecord(router_ready_, stream_));
  }
  profiler_.mark(kSharedExpert, stream_);
  // Prefill: h2 in the X24 form once, for the shared pair and (gathered) the routed gate and up.
  const bool h2_x24 = T > 1 && moe_input_x24(d.moe);
  if (h2_x24) quantize_x24(h2, T, n_embd, dq_buf_.get<uint8_t>(), dq_scale_.get<double>(), stream_);
  project_gate_up(d.moe.gate_sh, d.moe.up_sh, h2, T, sh_gate_.f(), sh_up_.f(), h2_x24);
  project(d.moe.down_sh, sh_gate_.f(), T, sh_out_.f());
  const int32_t* ids_h = pinned_route_ids_;
  const float* w_d = route_weights_.f();
  if (trace) {
    RL_CUDA_CHECK(cudaEventSynchronize(router_ready_));
    trace->tensor(fmt::format("ffn_moe_logits-{}", L), T, E, pinned_router_);
    trace->ids(fmt::format("ffn_moe_topk-{}", L), T, K, ids_h);
  }
  if (grouped) {
    moe_experts_grouped(L, h2, T, x, next_norm, h_out);
    return;
  }
  if (!trace) RL_CUDA_CHECK(cudaEventSynchronize(router_ready_));
  stage_reset();
  profiler_.mark(kExperts, stream_);

  // The distinct experts: the selections in order (decode), or ascending with the (token,
  // selection) pairs i = t*K + k of each, tokens in order (prefill: each expert's weights are read
  // once per chunk). Prefill groups by a counting sort: group g's pairs are
  // pair_list[group_start[g] .. group_start[g + 1]).
  std::vector<int> experts, group_start, pair_list;
  if (T == 1) {
    experts.assign(ids_h, ids_h + K);
  } else {
    std::vector<int> count(E, 0);
    for (int i = 0; i < T * K; i++) count[ids_h[i]]++;
    for (int e = 0; e < E; e++)
      if (count[e] > 0) experts.push_back(e);
    std::vector<int> next(E, 0);  // the next free position of each expert's pairs
    group_start.reserve(experts.size() + 1);
    int a = 0;
    for (int e : experts) group_start.push_back(a), next[e] = a, a += count[e];
    group_start.push_back(a);
    pair_list.resize((size_t)T * K);
    for (int i = 0; i < T * K; i++) pair_list[next[ids_h[i]]++] = i;
  }
  // The groups in the order they run (resident experts first under copy overlap).
  std::vector<size_t> order(experts.size());
  std::iota(order.begin(), order.end(), size_t{0});

  // With copy overlap (and all the layer's experts in one reservation): reserve first, start the
  // copies, and order the experts resident ones first, so their kernels run while the misses are
  // copied; the missed experts' kernels wait for the copies.
  const bool overlap = opts_.overlap_copies && (int)experts.size() <= cache_->n_slots();
  size_t n_resident = 0;
  bool any_miss = false;
  if (overlap) {
    std::vector<char> resident;
    reserve_and_copy(L, experts, false, &resident);
    n_resident = (size_t)(std::stable_partition(order.begin(), order.end(),
                                                [&](size_t g) { return resident[g] != 0; }) -
                          order.begin());
    any_miss = n_resident < experts.size();
    if (any_miss) {  // (with every expert resident the order stays as it is)
      std::vector<int> ex2;
      ex2.reserve(experts.size());
      for (size_t g : order) ex2.push_back(experts[g]);
      experts = std::move(ex2);
    }
  }

  // Assignments: row a of the expert outputs holds (token, selection) assign[t][k] == a.
  auto [assign_h, assign_d] = stage<int32_t>((size_t)T * K);
  std::vector<int> rows, offsets;
  if (T == 1) {
    for (int k = 0; k < K; k++)
      assign_h[k] = (int32_t)(std::find(experts.begin(), experts.end(), ids_h[k]) - experts.begin());
  } else {
    auto [gather_h, gather_d] = stage<int32_t>((size_t)T * K);
    rows.reserve(order.size());
    offsets.reserve(order.size());
    int a = 0;
    for (size_t g : order) {
      offsets.push_back(a);
      rows.push_back(group_start[g + 1] - group_start[g]);
      for (int j = group_start[g]; j < group_start[g + 1]; j++) {
        const int i = pair_list[j];
        gather_h[a] = i / K;
        assign_h[i] = a++;
      }
    }
    RL_CUDA_CHECK(cudaMemcpyAsync(gather_d, gather_h, (size_t)T * K * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  stream_));
    gather_expert_inputs(d.moe, h2, gather_d, T * K);
  }
  RL_CUDA_CHECK(cudaMemcpyAsync(assign_d, assign_h, (size_t)T * K * sizeof(int32_t), cudaMemcpyHostToDevice,
                                stream_));
  // Experts b0 .. b0+n-1 of the list (their rows are contiguous in the gathered order).
  auto run = [&](size_t b0, size_t n) {
    if (n == 0) return;
    std::span<const int> ex(experts.data() + b0, n);
    if (T == 1)
      run_expert_batch(L, ex, {}, {}, 1, (int)b0);
    else
      run_expert_batch(L, ex, std::span<const int>(rows.data() + b0, n), std::span<const int>(offsets.data() + b0, n),
                       T);
  };

  if (overlap) {
    // The cache already lists the missed experts as resident: if anything throws before the compute
    // stream waits for their copies, finish the copies before the error leaves, so no later kernel
    // reads a slot that is still being written.
    struct CopyGuard {
      cudaStream_t stream;
      bool armed;
      ~CopyGuard() {
        if (armed) cudaStreamSynchronize(stream);
      }
    } guard{copy_stream_, any_miss};
    run(0, n_resident);
    if (any_miss) {
      profiler_.mark(kCopyWait, stream_);
      RL_CUDA_CHECK(cudaStreamWaitEvent(stream_, copies_done_, 0));
      guard.armed = false;
      profiler_.mark(kExperts, stream_);
    }
    run(n_resident, experts.size() - n_resident);
  } else {
    // Reserve, copy the misses, run: in batches of at most n_slots distinct experts.
    const size_t batch = std::min(experts.size(), (size_t)cache_->n_slots());
    for (size_t b0 = 0; b0 < experts.size(); b0 += batch) {
      const size_t n = std::min(experts.size() - b0, batch);
      reserve_and_copy(L, std::span<const int>(experts.data() + b0, n), true);
      run(b0, n);
    }
  }
  moe_combine_norm(x, y_buf_.f(), assign_d, w_d, K, sh_out_.f(), sh_scalar_.f(), T, n_embd, next_norm, c.rms_eps, h_out,
                   stream_);
}

// The gathered rows of the routed experts' input (row a = token gather_d[a] of h2): of h2's X24
// form for X24 gate/up products (bit copies: the same as converting the gathered rows), of h2
// itself for the others.
void CudaBackendImpl::gather_expert_inputs(const MoeDev& moe, const float* h2, const int32_t* gather_d, int n) {
  const int n_embd = config().n_embd;
  const bool gate_x24 = use_x24(moe.gate_exps.type), up_x24 = use_x24(moe.up_exps.type);
  if (!gate_x24 || !up_x24) gather_rows(h2, gather_d, xg_buf_.f(), n, n_embd, stream_);
  if (gate_x24 || up_x24) {
    gather_words(dq_buf_.get(), gather_d, xq_buf_.get(), n, (int)(x24_bytes(1, n_embd) / 4), stream_);
    gather_words(dq_scale_.get(), gather_d, xq_scale_.get(), n, n_embd / 256 * 2, stream_);
  }
}

bool CudaBackendImpl::gpu_grouping(int T) const {
  const Config& c = config();
  return T > 1 && opts_.gpu_grouping && c.n_expert <= kMaxGroupExperts &&
         cache_->n_resident() == c.n_layer * c.n_expert;
}

// moe_layer's routed experts when every expert is resident: the selections (route_ids_) are
// grouped by expert on the GPU, with the slots from the residency table, so the layer never waits
// for the host. The same products on the same rows as the host's grouping (groups of at most
// kExpertGroupRows rows instead of one group per expert; each row's products do not depend on
// the others), so the same results bit for bit (test).
void CudaBackendImpl::moe_experts_grouped(int L, const float* h2, int T, float* x, const float* next_norm,
                                          float* h_out) {
  const Config& c = config();
  const int E = c.n_expert, K = c.n_expert_used, n = T * K, n_groups = expert_group_bound(n, E);
  profiler_.mark(kExperts, stream_);
  int32_t* gather = gg_gather_.get<int32_t>();
  int32_t* assign = gg_assign_.get<int32_t>();
  const uint8_t** ptrs = gg_ptrs_.get<const uint8_t*>();
  int32_t* groups = gg_groups_.get<int32_t>();  // [n_groups] first rows, then [n_groups] row counts
  group_by_expert(route_ids_.get<int32_t>(), n, K, E, residency_table_.get<uint64_t>() + (size_t)L * E, gather, assign,
                  ptrs, groups, groups + n_groups, n_groups, gg_distinct_.get<int32_t>() + L, stream_);
  gather_expert_inputs(layers_[L].moe, h2, gather, n);
  expert_products(L, ptrs, groups, n_groups, kExpertGroupRows, 0, (size_t)n);
  moe_combine_norm(x, y_buf_.f(), assign, route_weights_.f(), K, sh_out_.f(), sh_scalar_.f(), T, c.n_embd, next_norm,
                   c.rms_eps, h_out, stream_);
  grouped_layers_.push_back(L);
  stats_.gpu_grouped_layers++;
}

void CudaBackendImpl::allocate_gpu_routed_buffers() {
  const Config& c = config();
  const size_t LK = (size_t)c.n_layer * c.n_expert_used;
  tokpos_.allocate(2 * sizeof(int32_t));
  gr_io_.allocate((LK + c.n_layer) * sizeof(int32_t));
  gr_weights_.allocate(LK * sizeof(float));
  gr_slot_ptrs_.allocate(LK * sizeof(void*));
  gr_router_.allocate((size_t)c.n_layer * c.n_expert * sizeof(float));
  assign_identity_.allocate((size_t)c.n_expert_used * sizeof(int32_t));
  gr_logits_.allocate((size_t)c.n_vocab * sizeof(float));
  std::vector<int32_t> identity(c.n_expert_used);
  std::iota(identity.begin(), identity.end(), 0);
  RL_CUDA_CHECK(cudaMemcpy(assign_identity_.get(), identity.data(), identity.size() * sizeof(int32_t),
                           cudaMemcpyHostToDevice));
  RL_CUDA_CHECK(cudaMallocHost(&tokpos_host_, 2 * sizeof(int32_t)));
  RL_CUDA_CHECK(cudaMallocHost(&gr_io_host_, (LK + c.n_layer) * sizeof(int32_t)));
  RL_CUDA_CHECK(cudaMallocHost(&gr_router_host_, (size_t)c.n_layer * c.n_expert * sizeof(float)));
  // The GPU-routed path copies the logits here without a prefill having sized it.
  RL_CUDA_CHECK(cudaMallocHost(&pinned_logits_, (size_t)c.n_vocab * sizeof(float)));
  pinned_logits_floats_ = c.n_vocab;
  stats_.working_bytes += tokpos_.bytes() + gr_io_.bytes() + gr_weights_.bytes() + gr_slot_ptrs_.bytes() +
                          gr_router_.bytes() + assign_identity_.bytes() + gr_logits_.bytes();
}

// The decode MoE of the synchronous path with the host taken out: route_topk selects on the GPU
// and reads the slots from the residency table; the expert kernels read the slot addresses it
// wrote. Same kernels and the same arithmetic as moe_layer + run_expert_batch for T == 1.
void CudaBackendImpl::moe_layer_gpu_routed(int L, const float* h2, float* x, const float* next_norm, float* h_out) {
  const Config& c = config();
  const MoeDev& moe = layers_[L].moe;
  const int E = c.n_expert, K = c.n_expert_used, n_embd = c.n_embd, ff = c.n_ff_exp;
  float* router = gr_router_.f() + (size_t)L * E;
  int32_t* ids = gr_io_.get<int32_t>() + (size_t)L * K;
  int32_t* misses = gr_io_.get<int32_t>() + (size_t)c.n_layer * K + L;
  float* weights = gr_weights_.f() + (size_t)L * K;
  const uint8_t** ptrs = gr_slot_ptrs_.get<const uint8_t*>() + (size_t)L * K;
  profiler_.mark(kRouter, stream_);
  project_group({{&moe.router, h2, router}, {&moe.shared_gate_inp, h2, sh_scalar_.f()}}, 1);
  route_topk(router, E, K, c.expert_weights_scale, residency_table_.get<uint64_t>() + (size_t)L * E,
             slots_.get<uint8_t>(), ids, weights, ptrs, misses, stream_);
  profiler_.mark(kSharedExpert, stream_);
  project_gate_up(moe.gate_sh, moe.up_sh, h2, 1, sh_gate_.f(), sh_up_.f());
  project(moe.down_sh, sh_gate_.f(), 1, sh_out_.f());
  const TensorView gv = moe.gate_exps.matrix(0), uv = moe.up_exps.matrix(0), dv = moe.down_exps.matrix(0);
  profiler_.mark(kExperts, stream_);
  matvec_experts_gate_up(gv.type, uv.type, ptrs, moe.up_offset, gv.row_bytes, uv.row_bytes, ff, n_embd, h2,
                         g_buf_.f(), u_buf_.f(), K, stream_);
  matvec_experts(dv.type, ptrs, moe.down_offset, dv.row_bytes, n_embd, ff, g_buf_.f(), ff, y_buf_.f(), K,
                 stream_);
  moe_combine_norm(x, y_buf_.f(), assign_identity_.get<int32_t>(), weights, K, sh_out_.f(), sh_scalar_.f(), 1,
                   n_embd, next_norm, c.rms_eps, h_out, stream_);
}

void CudaBackendImpl::encode_pass(SessionState& st, const int32_t* ids_d, const int32_t* pos_d, int T,
                                  bool all_logits, float* logits, TraceSink* trace, bool gpu_routed) {
  const Config& c = config();
  const int n_embd = c.n_embd;
  auto trace_tensor = [&](const std::string& name, const float* d, int width) {
    if (!trace || gpu_routed) return;
    std::vector<float> h((size_t)T * width);
    RL_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, h.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    RL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    trace->tensor(name, T, width, h.data());
  };
  float* x = x_.f();
  float* h = h_.f();
  float* mix = mix_.f();
  get_rows(token_embd_.type, token_embd_.data, token_embd_.row_bytes, n_embd, ids_d, T, x, stream_);

  const float theta_scale = std::pow(c.rope_base, -2.0f / (float)c.rope_dim);
  for (int L = 0; L < c.n_layer; L++) {
    const LayerDev& d = layers_[L];
    // This layer's input norm; from layer 1 on, the previous layer's MoE combine wrote it to h.
    profiler_.mark(kNorms, stream_);
    if (L == 0) rms_norm(x, d.attn_norm, h, T, n_embd, c.rms_eps, stream_);
    if (d.recurrent) {
      // Gated DeltaNet.
      const SsmDev& w = d.ssm;
      const int nk = c.ssm_n_k_heads, nv = c.ssm_n_v_heads, dk = c.ssm_head_dim, dv = c.ssm_head_dim;
      const int key_dim = c.ssm_key_dim(), conv_dim = c.ssm_conv_dim();
      float* qkv = proj_a_.f();   // [T][conv_dim]
      float* conv = proj_b_.f();  // [T][conv_dim]
      float* z = small_a_.f();    // [T][value_dim]
      float* o = small_b_.f();    // [T][value_dim]
      float* ba = proj_c_.f();    // [T][2 nv]
      profiler_.mark(kProjections, stream_);
      project_group({{&w.qkv, h, qkv}, {&w.z, h, z}, {&w.ba, h, ba}}, T);
      profiler_.mark(kDeltaNet, stream_);
      float* beta = mix;                  // [T][nv], mix is free until ssm_out
      float* g = mix + (size_t)T * nv;    // [T][nv]
      deltanet_conv_gates(qkv, conv_dim, conv, st.conv[L].f(), w.conv, T, conv_dim, c.ssm_conv_kernel, ba, w.dt_bias,
                          w.a, beta, g, nk, nv, stream_);
      // q heads (scaled by 1/sqrt(dk)) and then k heads, adjacent in each token's row: one launch;
      // a decode step normalises inside the recurrence instead (the same values).
      const L2Norm qk_norm{1e-6f, (float)(1.0 / std::sqrt((double)dk))};
      const bool fuse_norm = T == 1 && dk == 128;
      if (!fuse_norm) l2_norm(conv, T, 2 * nk, dk, conv_dim, qk_norm.eps, qk_norm.q_scale, stream_, nk);
      deltanet_recurrence(conv, conv + key_dim, conv + 2 * key_dim, conv_dim, beta, g, st.ssm[L].f(), o, T,
                          nk, nv, dk, dv, stream_, fuse_norm ? &qk_norm : nullptr);
      gated_rms_norm(o, z, w.norm, o, T * nv, dv, c.rms_eps, stream_);
      profiler_.mark(kProjections, stream_);
      project(w.out, o, T, mix);
    } else {
      // Gated attention. Positions come from pos_d, so a captured graph replays at any position.
      const AttnDev& w = d.attn;
      const int hd = c.head_dim, nh = c.n_head, nkv = c.n_head_kv;
      float* qg = proj_a_.f();        // [T][nh][2][hd]
      float* q = proj_b_.f();         // [T][nh][hd]
      float* gate = small_a_.f();     // [T][nh][hd]
      float* att = small_b_.f();      // [T][nh][hd]
      float* k = proj_c_.f();         // [T][nkv][hd]
      float* v = mix;                 // [T][nkv][hd], mix is free until attn_output
      profiler_.mark(kProjections, stream_);
      project_group({{&w.q, h, qg}, {&w.k, h, k}, {&w.v, h, v}}, T);
      profiler_.mark(kAttention, stream_);
      attention_prep(qg, k, v, q, gate, w.q_norm, w.k_norm, st.k_cache[L].f(), st.v_cache[L].f(), T, nh, nkv, hd,
                     c.rms_eps, c.rope_dim, theta_scale, pos_d, stream_);
      gated_attention(q, gate, st.k_cache[L].f(), st.v_cache[L].f(), att, T, nh, nkv, hd, 0,
                      (float)(1.0 / std::sqrt((double)hd)), stream_, pos_d);
      profiler_.mark(kProjections, stream_);
      project(w.o, att, T, mix);
    }
    // Residual add and the post-attention norm in one kernel (x += mix; h = RMSNorm(x)).
    profiler_.mark(kNorms, stream_);
    if (trace && !gpu_routed) {
      add_inplace(x, mix, (size_t)T * n_embd, stream_);
      trace_tensor(fmt::format("attn_residual-{}", L), x, n_embd);
      rms_norm(x, d.post_norm, h, T, n_embd, c.rms_eps, stream_);
    } else {
      add_rms_norm(x, mix, d.post_norm, h, T, n_embd, c.rms_eps, stream_);
    }
    const float* next_norm = L + 1 < c.n_layer ? layers_[L + 1].attn_norm : output_norm_;
    if (gpu_routed) {
      moe_layer_gpu_routed(L, h, x, next_norm, h);
    } else {
      moe_layer(L, h, T, x, trace, next_norm, h);
    }
    trace_tensor(fmt::format("l_out-{}", L), x, n_embd);
  }

  // The output norm is in h (the last layer's combine).
  trace_tensor("result_norm", h, n_embd);
  profiler_.mark(kLmHead, stream_);
  const int rows = all_logits ? T : 1;
  project(output_, all_logits ? h : h + (size_t)(T - 1) * n_embd, rows, logits);
}

void CudaBackendImpl::forward(SessionState& st, std::span<const int32_t> tokens, bool all_logits,
                              float* logits_out, TraceSink* trace) {
  const Config& c = config();
  const int T = (int)tokens.size(), pos0 = st.position;
  stage_reset();
  loads_this_pass_ = false;

  profiler_.mark(kOther, stream_);
  auto [ids_h, ids_staged] = stage<int32_t>(T);
  auto [pos_h, pos_staged] = stage<int32_t>(T);
  (void)ids_staged;
  (void)pos_staged;
  for (int t = 0; t < T; t++) {
    ids_h[t] = tokens[t];
    pos_h[t] = pos0 + t;
  }
  // Into buffers of their own: the staging area is reused from the first layer on.
  int32_t* ids_d = ids_.get<int32_t>();
  int32_t* pos_d = pos_.get<int32_t>();
  RL_CUDA_CHECK(cudaMemcpyAsync(ids_d, ids_h, T * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  RL_CUDA_CHECK(cudaMemcpyAsync(pos_d, pos_h, T * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  const int rows = all_logits ? T : 1;
  if ((size_t)rows > logits_rows_) {
    logits_.allocate((size_t)rows * c.n_vocab * sizeof(float));
    logits_rows_ = rows;
  }
  grouped_layers_.clear();
  encode_pass(st, ids_d, pos_d, T, all_logits, logits_.f(), trace, false);
  if (!grouped_layers_.empty())
    RL_CUDA_CHECK(cudaMemcpyAsync(gg_distinct_host_, gg_distinct_.get(), (size_t)c.n_layer * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream_));
  const size_t n_out = (size_t)rows * c.n_vocab;
  if (n_out > pinned_logits_floats_) {
    if (pinned_logits_) cudaFreeHost(pinned_logits_);
    pinned_logits_ = nullptr;
    RL_CUDA_CHECK(cudaMallocHost(&pinned_logits_, n_out * sizeof(float)));
    pinned_logits_floats_ = n_out;
  }
  RL_CUDA_CHECK(cudaMemcpyAsync(pinned_logits_, logits_.f(), n_out * sizeof(float), cudaMemcpyDeviceToHost,
                                stream_));
  profiler_.mark(kOther, stream_);
  RL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::memcpy(logits_out, pinned_logits_, n_out * sizeof(float));
  st.position = pos0 + T;
  last_pass_loaded_ = loads_this_pass_;
  // The GPU-grouped layers' experts, each a hit (as a reservation would have counted them).
  uint64_t grouped_hits = 0;
  for (int L : grouped_layers_) grouped_hits += (uint64_t)gg_distinct_host_[L];
  if (!grouped_layers_.empty()) cache_->count_hits(grouped_hits);

  // Statistics that need the GPU's clock.
  RL_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  for (size_t i = 0; i < pending_copy_bytes_.size(); i++) {
    float ms = 0;
    cudaEventElapsedTime(&ms, pending_copy_events_[2 * i], pending_copy_events_[2 * i + 1]);
    cache_->record_copy(pending_copy_bytes_[i], ms / 1000.0);
    if (profiler_.on) profiler_.total_ms[kCopies] += ms;
  }
  for (cudaEvent_t e : pending_copy_events_) cudaEventDestroy(e);
  pending_copy_events_.clear();
  pending_copy_bytes_.clear();
  profiler_.collect();
}

// Backups of the DeltaNet conv and SSM states, allocated on first use (never while a graph is
// being captured: capture_token_graph allocates them first).
void CudaBackendImpl::allocate_state_backups(SessionState& st) {
  const int n_layer = config().n_layer;
  if (st.conv_backup.empty()) {
    st.conv_backup.resize(n_layer);
    st.ssm_backup.resize(n_layer);
    for (int L = 0; L < n_layer; L++) {
      if (st.conv[L].bytes()) st.conv_backup[L].allocate(st.conv[L].bytes());
      if (st.ssm[L].bytes()) st.ssm_backup[L].allocate(st.ssm[L].bytes());
    }
  }
}

// The recurrent states to their backups (to_backup) or back from them, every layer, on the compute
// stream.
void CudaBackendImpl::copy_recurrent_states(SessionState& st, bool to_backup) {
  const int n_layer = config().n_layer;
  allocate_state_backups(st);
  auto copy = [&](DeviceBuffer& live, DeviceBuffer& backup) {
    if (!live.bytes()) return;
    void* dst = to_backup ? backup.get() : live.get();
    const void* src = to_backup ? live.get() : backup.get();
    RL_CUDA_CHECK(cudaMemcpyAsync(dst, src, live.bytes(), cudaMemcpyDeviceToDevice, stream_));
  };
  for (int L = 0; L < n_layer; L++) {
    copy(st.conv[L], st.conv_backup[L]);
    copy(st.ssm[L], st.ssm_backup[L]);
  }
}

// The GPU-routed token's inputs (token, position), read by the graph from device memory.
void CudaBackendImpl::upload_token_position(int32_t token, int position) {
  tokpos_host_[0] = token;
  tokpos_host_[1] = position;
  RL_CUDA_CHECK(cudaMemcpyAsync(tokpos_.get(), tokpos_host_, 2 * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
}

// Captures the GPU-routed token once per session: the state backups, then the pass. Nothing in it
// depends on the host between replays except tokpos_ (token, position) and the residency table,
// both read from device memory at replay time.
void CudaBackendImpl::capture_token_graph(SessionState& st) {
  allocate_state_backups(st);
  RL_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    copy_recurrent_states(st, true);
    const int32_t* tp = tokpos_.get<int32_t>();
    encode_pass(st, tp, tp + 1, 1, false, gr_logits_.f(), nullptr, true);
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream_, &partial);
    if (partial) cudaGraphDestroy(partial);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  RL_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  const cudaError_t e = cudaGraphInstantiate(&st.token_graph, graph, 0);
  cudaGraphDestroy(graph);
  RL_CUDA_CHECK(e);
}

bool CudaBackendImpl::decode_gpu_routed(SessionState& st, int32_t token, float* logits_out, TraceSink* trace) {
  using S = CudaOptions::Speculation;
  switch (opts_.speculation) {
    case S::kOff: return false;
    case S::kFullyResident: if (!cache_->holds_all()) return false; break;
    case S::kWarmCache: if (last_pass_loaded_) return false; break;
    case S::kAlways: break;
  }
  if (gpu_routed_broken_) return false;
  const Config& c = config();
  const int K = c.n_expert_used, E = c.n_expert, n_layer = c.n_layer;
  if (profiler_.on) {
    // RL_ENGINE_PROFILE=1: the same work launched one by one with stage marks, no graph. A spin
    // kernel holds the GPU while the host enqueues the whole token, so the GPU then runs it back
    // to back and the stage times are kernel times, not launch gaps (the token itself is slower).
    upload_token_position(token, st.position);
    allocate_state_backups(st);  // before the spin: an allocation would stall the queued work
    gpu_spin(20'000'000, stream_);
    profiler_.mark(kBackups, stream_);
    copy_recurrent_states(st, true);
    profiler_.mark(kOther, stream_);
    const int32_t* tp = tokpos_.get<int32_t>();
    encode_pass(st, tp, tp + 1, 1, false, gr_logits_.f(), nullptr, true);
    profiler_.mark(kOther, stream_);
  } else if (!st.token_graph) {
    try {
      capture_token_graph(st);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "cuda: the GPU-routed decode graph could not be captured (%s); decoding on the "
                   "synchronous path\n", ex.what());
      gpu_routed_broken_ = true;
      return false;
    }
  }
  if (!profiler_.on) {
    upload_token_position(token, st.position);
    RL_CUDA_CHECK(cudaGraphLaunch(st.token_graph, stream_));
  }
  const size_t io_count = (size_t)n_layer * K + n_layer;
  RL_CUDA_CHECK(cudaMemcpyAsync(pinned_logits_, gr_logits_.f(), (size_t)c.n_vocab * sizeof(float),
                                cudaMemcpyDeviceToHost, stream_));
  RL_CUDA_CHECK(cudaMemcpyAsync(gr_io_host_, gr_io_.get(), io_count * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                stream_));
  if (trace)
    RL_CUDA_CHECK(cudaMemcpyAsync(gr_router_host_, gr_router_.get(), (size_t)n_layer * E * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_));
  RL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  profiler_.collect();

  int misses = 0;
  for (int L = 0; L < n_layer; L++) misses += gr_io_host_[(size_t)n_layer * K + L];
  if (misses > 0) {
    // Undo the token: the recurrent states come back from the backups; the KV rows written at this
    // position are overwritten by the recomputation.
    copy_recurrent_states(st, false);
    stats_.gpu_routed_fallbacks++;
    return false;
  }
  std::memcpy(logits_out, pinned_logits_, (size_t)c.n_vocab * sizeof(float));
  st.position += 1;
  for (int L = 0; L < n_layer; L++) {
    const int32_t* ids = gr_io_host_ + (size_t)L * K;
    const std::vector<int> used(ids, ids + K);
    cache_->touch(L, used);
    if (trace) {
      trace->tensor(fmt::format("ffn_moe_logits-{}", L), 1, E, gr_router_host_ + (size_t)L * E);
      trace->ids(fmt::format("ffn_moe_topk-{}", L), 1, K, ids);
    }
  }
  stats_.gpu_routed_tokens++;
  return true;
}

std::string CudaBackendImpl::profile_report() const {
  if (!profiler_.on) return "";
  double total = 0;
  for (int s = 0; s < kStageCount; s++) total += s == kCopies ? 0 : profiler_.total_ms[s];
  std::string out = fmt::format("{:<12} {:>10} {:>7}\n", "stage", "GPU ms", "share");
  for (int s = 0; s < kStageCount; s++)
    out += fmt::format("{:<12} {:>10.3f} {:>6.1f}%{}\n", kStageNames[s], profiler_.total_ms[s],
                       total > 0 ? 100.0 * profiler_.total_ms[s] / total : 0.0,
                       s == kCopies ? " (copy stream, not in the total; expert kernels wait for it)" : "");
  out += fmt::format("{:<12} {:>10.3f}\n", "total", total);
  return out;
}

// ---- sessions ------------------------------------------------------------------------------------

class CudaSnapshot final : public SessionSnapshot {
 public:
  const CudaBackendImpl* owner = nullptr;
  int pos = 0;
  std::vector<DeviceBuffer> k_cache, v_cache, conv, ssm;
  size_t total = 0;
  size_t bytes() const override { return total; }
  int position() const override { return pos; }
};

class CudaSessionImpl final : public Session {
 public:
  CudaSessionImpl(CudaBackendImpl* backend, int n_ctx) : b_(backend) {
    const Config& c = b_->config();
    st_.n_ctx = n_ctx;
    st_.k_cache.resize(c.n_layer);
    st_.v_cache.resize(c.n_layer);
    st_.conv.resize(c.n_layer);
    st_.ssm.resize(c.n_layer);
    for (int L = 0; L < c.n_layer; L++) {
      if (c.is_recurrent[L]) {
        st_.conv[L].allocate((size_t)(c.ssm_conv_kernel - 1) * c.ssm_conv_dim() * sizeof(float));
        st_.ssm[L].allocate((size_t)c.ssm_n_v_heads * c.ssm_head_dim * c.ssm_head_dim * sizeof(float));
      } else {
        st_.k_cache[L].allocate((size_t)n_ctx * c.kv_dim() * sizeof(float));
        st_.v_cache[L].allocate((size_t)n_ctx * c.kv_dim() * sizeof(float));
      }
    }
    reset();
  }

  std::vector<float> prefill(std::span<const int32_t> tokens, std::vector<float>* all_logits) override {
    check_tokens(tokens);
    const size_t n_vocab = (size_t)b_->config().n_vocab;
    if (all_logits) all_logits->assign(tokens.size() * n_vocab, 0.0f);
    std::vector<float> last(n_vocab);
    for (size_t begin = 0; begin < tokens.size(); begin += kMaxChunk) {
      const size_t n = std::min(tokens.size() - begin, (size_t)kMaxChunk);
      float* dst = all_logits ? all_logits->data() + begin * n_vocab : last.data();
      b_->forward(st_, tokens.subspan(begin, n), all_logits != nullptr, dst, trace_);
      if (all_logits && begin + n == tokens.size())
        std::copy(dst + (n - 1) * n_vocab, dst + n * n_vocab, last.begin());
    }
    return last;
  }

  std::vector<float> decode(int32_t token) override {
    check_tokens(std::span(&token, 1));
    b_->stats_.tokens_decoded++;
    std::vector<float> logits((size_t)b_->config().n_vocab);
    if (b_->decode_gpu_routed(st_, token, logits.data(), trace_)) return logits;
    return prefill(std::span(&token, 1), nullptr);
  }

  int position() const override { return st_.position; }
  int n_ctx() const override { return st_.n_ctx; }
  int n_vocab() const override { return b_->config().n_vocab; }

  std::unique_ptr<SessionSnapshot> snapshot() const override {
    auto s = std::make_unique<CudaSnapshot>();
    s->owner = b_;
    s->pos = st_.position;
    const Config& c = b_->config();
    auto copy = [&](const DeviceBuffer& src, size_t bytes, std::vector<DeviceBuffer>& dst) {
      dst.emplace_back(bytes);
      if (bytes) RL_CUDA_CHECK(cudaMemcpy(dst.back().get(), src.get(), bytes, cudaMemcpyDeviceToDevice));
      s->total += bytes;
    };
    for (int L = 0; L < c.n_layer; L++) {
      const size_t kv = (size_t)st_.position * c.kv_dim() * sizeof(float);
      copy(st_.k_cache[L], st_.k_cache[L].bytes() ? kv : 0, s->k_cache);
      copy(st_.v_cache[L], st_.v_cache[L].bytes() ? kv : 0, s->v_cache);
      copy(st_.conv[L], st_.conv[L].bytes(), s->conv);
      copy(st_.ssm[L], st_.ssm[L].bytes(), s->ssm);
    }
    return s;
  }

  void restore(const SessionSnapshot& snap) override {
    const auto* s = dynamic_cast<const CudaSnapshot*>(&snap);
    if (!s) fail("restore: the snapshot was not taken from a cuda session");
    if (s->owner != b_) fail("restore: the snapshot was taken from a session of another loaded model");
    if (s->pos > st_.n_ctx)
      fail("restore: the snapshot is at position {}, past this session's context of {} tokens", s->pos,
           st_.n_ctx);
    for (size_t L = 0; L < st_.conv.size(); L++) {
      for (auto [src, dst] : {std::pair{&s->k_cache[L], &st_.k_cache[L]}, {&s->v_cache[L], &st_.v_cache[L]},
                              {&s->conv[L], &st_.conv[L]}, {&s->ssm[L], &st_.ssm[L]}})
        if (src->bytes())
          RL_CUDA_CHECK(cudaMemcpy(dst->get(), src->get(), src->bytes(), cudaMemcpyDeviceToDevice));
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

 private:
  void check_tokens(std::span<const int32_t> tokens) const {
    if (tokens.empty()) fail("prefill: no tokens given");
    if ((int64_t)st_.position + (int64_t)tokens.size() > st_.n_ctx)
      fail("context full: {} tokens at position {} would run past the context of {} tokens (--ctx)",
           tokens.size(), st_.position, st_.n_ctx);
    for (size_t i = 0; i < tokens.size(); i++)
      if (tokens[i] < 0 || tokens[i] >= b_->config().n_vocab)
        fail("token id {} (input index {}) is out of range: the vocabulary has {} tokens", tokens[i], i,
             b_->config().n_vocab);
  }

  CudaBackendImpl* b_;
  CudaBackendImpl::SessionState st_;
  TraceSink* trace_ = nullptr;
};

std::unique_ptr<Session> CudaBackendImpl::new_session(int n_ctx) {
  if (n_ctx <= 0) fail("context size {} must be positive (--ctx)", n_ctx);
  return std::make_unique<CudaSessionImpl>(this, n_ctx);
}

}  // namespace

std::unique_ptr<CudaBackend> make_cuda_backend(std::shared_ptr<const Model> model, const CudaOptions& options) {
  if (!model) fail("make_cuda_backend: no model");
  return std::make_unique<CudaBackendImpl>(std::move(model), options);
}

}  // namespace rl::cuda
