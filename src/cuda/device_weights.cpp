#include "cuda/device_weights.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "cuda/kernels.h"

namespace rl::cuda {

namespace {

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

}  // namespace

size_t DeviceWeights::slot_bytes() const {
  size_t bytes = 0;
  for (const LayerDev& d : layers) bytes = std::max(bytes, d.moe.expert_bytes);
  return bytes;
}

// Dense weights: every non-expert tensor, uploaded once into one allocation. Matrices keep their
// ggml type; small vectors are converted to fp32 (model::to_f32). The legacy fused ssm_in is
// stored with its rows permuted into the current layout [q all | k all | v all | z all], so both
// layouts run the same code: qkv and z are then two row ranges of one matrix.
DeviceWeights upload_weights(const Model& m) {
  const Config& c = m.config();
  DeviceWeights w;
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
      fail("{}: tensor {} has type {}, which the CUDA backend does not run", m.path(), t.name,
           type_name(t.type));
  };
  auto add_matrix = [&](const TensorView& t) -> DMat {
    check_type(t);
    if (t.row_length() % 32 != 0)
      fail("{}: tensor {} has rows of {} values; the CUDA backend needs a multiple of 32",
           m.path(), t.name, t.row_length());
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

  w.token_embd = add_matrix(m.token_embd);
  w.output = m.output_is_token_embd ? w.token_embd : add_matrix(m.output);
  w.output_norm = add_vector(m.output_norm);
  w.layers.resize(c.n_layer);
  for (int L = 0; L < c.n_layer; L++) {
    const LayerWeights& lw = m.layers[L];
    LayerDev& d = w.layers[L];
    d.recurrent = lw.recurrent;
    d.attn_norm = add_vector(lw.attn_norm);
    d.post_norm = add_vector(lw.post_attention_norm);
    if (lw.recurrent) {
      const DeltaNetWeights& dw = lw.ssm;
      if (dw.legacy_fused) {
        const TensorView& t = dw.in;
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
        d.ssm.qkv = add_matrix(dw.qkv);
        d.ssm.z = add_matrix(dw.gate);
      }
      d.ssm.ba = add_matrix(dw.ba);
      d.ssm.out = add_matrix(dw.out);
      d.ssm.conv = add_vector(dw.conv1d);
      d.ssm.dt_bias = add_vector(dw.dt_bias);
      d.ssm.a = add_vector(dw.a);
      d.ssm.norm = add_vector(dw.norm);
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
             m.path(), t->name, t->row_length());
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

  w.dense.allocate(arena.size());
  uint8_t* base = w.dense.get<uint8_t>();
  for (const Job& j : jobs) {
    const uint8_t* src = j.bytes.empty() ? j.src : j.bytes.data();
    const size_t n = j.bytes.empty() ? j.n : j.bytes.size();
    RL_CUDA_CHECK(cudaMemcpy(base + j.offset, src, n, cudaMemcpyHostToDevice));
  }
  auto rebase_m = [&](DMat& d) { d.data = base + (size_t)d.data; };
  auto rebase_v = [&](const float*& p) { p = reinterpret_cast<const float*>(base + (size_t)p); };
  const bool shared_head = m.output_is_token_embd;
  rebase_m(w.token_embd);
  if (shared_head) w.output = w.token_embd; else rebase_m(w.output);
  rebase_v(w.output_norm);
  for (LayerDev& d : w.layers) {
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
  w.dense_bytes = arena.size();

  // Bytes a decode token reads: every dense tensor, of the embedding only one row (unless it is
  // also the LM head), and n_expert_used experts per layer.
  size_t per_token = 0;
  for (const Job& j : jobs) per_token += j.bytes.empty() ? j.n : j.bytes.size();
  if (!shared_head) per_token = per_token - m.token_embd.nbytes + m.token_embd.row_bytes;
  for (const LayerDev& d : w.layers)
    per_token += (size_t)c.n_expert_used * (d.moe.gate_exps.matrix(0).nbytes + d.moe.up_exps.matrix(0).nbytes +
                                            d.moe.down_exps.matrix(0).nbytes);
  w.decode_bytes_per_token = per_token;
  return w;
}

}  // namespace rl::cuda
