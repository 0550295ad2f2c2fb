#include "cpu/forward.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cpu/attention_fast.h"
#include "cpu/delta_rule.h"
#include "cpu/fast_simd.h"
#include "cpu/ops.h"
#include "cpu/products.h"

namespace rl::cpu {

OracleWeights::OracleWeights(std::shared_ptr<const Model> m) : model(std::move(m)) {
  output_norm = to_f32(model->output_norm);
  for (const LayerWeights& lw : model->layers) {
    LayerVectors v;
    v.attn_norm = to_f32(lw.attn_norm);
    v.post_attention_norm = to_f32(lw.post_attention_norm);
    if (lw.recurrent) {
      v.conv1d = to_f32(lw.ssm.conv1d);
      v.dt_bias = to_f32(lw.ssm.dt_bias);
      v.ssm_a = to_f32(lw.ssm.a);
      v.ssm_norm = to_f32(lw.ssm.norm);
    } else {
      v.q_norm = to_f32(lw.attn.q_norm);
      v.k_norm = to_f32(lw.attn.k_norm);
    }
    layers.push_back(std::move(v));
  }
}

State initial_state(const Config& c, KvType kv) {
  State s;
  s.layers.resize(c.n_layer);
  for (int L = 0; L < c.n_layer; L++) {
    if (!c.is_recurrent[L]) {
      s.layers[L].k_cache = KvRows(kv, c.kv_dim());
      s.layers[L].v_cache = KvRows(kv, c.kv_dim());
      continue;
    }
    s.layers[L].conv.assign((size_t)(c.ssm_conv_kernel - 1) * c.ssm_conv_dim(), 0.0f);
    s.layers[L].ssm.assign((size_t)c.ssm_n_v_heads * c.ssm_head_dim * c.ssm_head_dim, 0.0f);
  }
  return s;
}

size_t state_bytes(const Config& c, int n_positions, KvType kv) {
  return sizeof(State) + c.recurrent_state_bytes() + c.kv_bytes_per_token(kv) * (size_t)n_positions;
}

void reserve_positions(const Config& c, State& state, int n_positions) {
  for (int L = 0; L < c.n_layer; L++) {
    if (c.is_recurrent[L]) continue;
    state.layers[L].k_cache.reserve((size_t)n_positions);
    state.layers[L].v_cache.reserve((size_t)n_positions);
  }
}

namespace {

// A pass's float buffer: n zeros, as std::vector<float>(n), its memory reused across layers and
// passes. A prefill's buffers are large enough that glibc maps each one fresh and unmaps it when
// freed, so new vectors a layer cost page faults: ~13 % of a 128-token prefill of fixture B on
// the CPU (perf, dev). The calling thread keeps up to kPooled freed vectors (a pass holds at most
// 14 at once), so it retains about its largest pass's buffers.
class Buf {
 public:
  Buf() = default;
  explicit Buf(size_t n) { resize(n); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() { give_back(); }
  // n zeros (a Buf is sized once).
  void resize(size_t n) {
    if (v_.capacity() < n) {
      give_back();
      v_ = take(n);
    }
    v_.assign(n, 0.0f);
  }
  float* data() { return v_.data(); }
  const float* data() const { return v_.data(); }
  size_t size() const { return v_.size(); }
  float& operator[](size_t i) { return v_[i]; }
  const float& operator[](size_t i) const { return v_[i]; }

 private:
  static constexpr size_t kPooled = 32;
  static std::vector<std::vector<float>>& pool() {
    // Reserved once, so that a destructor's push_back never allocates.
    thread_local std::vector<std::vector<float>> freed = [] {
      std::vector<std::vector<float>> v;
      v.reserve(kPooled);
      return v;
    }();
    return freed;
  }
  // The smallest freed vector that holds n values, else the largest (assign grows it).
  static std::vector<float> take(size_t n) {
    std::vector<std::vector<float>>& p = pool();
    if (p.empty()) return {};
    size_t best = 0;
    for (size_t i = 1; i < p.size(); i++) {
      const size_t c = p[i].capacity(), b = p[best].capacity();
      if (b >= n ? c >= n && c < b : c > b) best = i;
    }
    std::vector<float> v = std::move(p[best]);
    if (best + 1 != p.size()) p[best] = std::move(p.back());
    p.pop_back();
    return v;
  }
  void give_back() {
    if (v_.capacity() == 0) return;
    std::vector<std::vector<float>>& p = pool();
    if (p.size() < kPooled) p.push_back(std::move(v_));
    v_ = std::vector<float>();
  }

  std::vector<float> v_;
};

// The rows of a pass: the sequences' tokens one after another, sequence s owning rows
// [first[s], first[s + 1]). Positions are read before the pass advances any state.
struct PassRows {
  explicit PassRows(std::span<const SequenceTokens> sequences) : seqs(sequences), first(sequences.size() + 1, 0) {
    for (size_t s = 0; s < seqs.size(); s++) first[s + 1] = first[s] + (int)seqs[s].tokens.size();
  }
  int n_rows() const { return first.back(); }
  int n_seqs() const { return (int)seqs.size(); }
  int n_rows_of(int s) const { return first[s + 1] - first[s]; }
  int sequence_of(int row) const {
    return (int)(std::upper_bound(first.begin(), first.end(), row) - first.begin()) - 1;
  }
  int position(int row) const {
    const int s = sequence_of(row);
    return seqs[s].state->position + row - first[s];
  }
  LayerState& layer(int s, int L) const { return seqs[s].state->layers[L]; }

  std::span<const SequenceTokens> seqs;
  std::vector<int> first;  // [n_seqs + 1]
};

// x[t] = token_embd[token[t]]                                    x: [T][n_embd]
void embed(const Model& m, const PassRows& rows, float* x) {
  const int64_t n_embd = m.config().n_embd;
  for (int s = 0; s < rows.n_seqs(); s++)
    for (int i = 0; i < rows.n_rows_of(s); i++) {
      const int32_t token = rows.seqs[s].tokens[i];
      dequantize_row(m.token_embd.type, m.token_embd.row(token), x + (size_t)(rows.first[s] + i) * n_embd, n_embd);
    }
}

// y[t] = RMSNorm(x[t]) * weight                                  x, y: [T][n]
void rmsnorm_rows(const float* x, const std::vector<float>& weight, float eps, int T, int64_t n, float* y) {
  for (int t = 0; t < T; t++) rmsnorm(x + t * n, weight.data(), eps, n, y + t * n);
}

// NeoX rotary embedding of the first rope_dim values of one head: pairs (i, i + rope_dim/2) turn by
// pos * base^(-2i/rope_dim). The angle is formed as ggml forms it (fp32, multiplied up from the
// position one frequency at a time), because at positions in the thousands the angle's rounding
// is visible at the 1e-5 level and the reference is ggml's.
// The angles depend on the position only, so a token's cos/sin pairs are formed once for all its
// heads (RopeAngles) and applied to each (rope_neox).
struct RopeAngles {
  RopeAngles(int rope_dim, int pos, float base) : cos_sin((size_t)rope_dim) {
    const float theta_scale = std::pow(base, -2.0f / (float)rope_dim);
    float theta = (float)pos;
    for (int i = 0; i < rope_dim / 2; i++) {
      cos_sin[2 * i] = std::cos(theta);
      cos_sin[2 * i + 1] = std::sin(theta);
      theta *= theta_scale;
    }
  }
  std::vector<float> cos_sin;  // [rope_dim / 2][cos, sin]
};

void rope_neox(float* head, const RopeAngles& angles) {
  const int half = (int)angles.cos_sin.size() / 2;
  for (int i = 0; i < half; i++) {
    const float c = angles.cos_sin[2 * i], s = angles.cos_sin[2 * i + 1];
    const float x0 = head[i], x1 = head[i + half];
    head[i] = x0 * c - x1 * s;
    head[i + half] = x0 * s + x1 * c;
  }
}

// Gated full attention.                                         h, out: [T][n_embd]
//   [q | gate] = attn_q h  (per head: head_dim query, head_dim gate); k = attn_k h; v = attn_v h
//   q, k: per-head RMSNorm, then RoPE; softmax(q k^T / sqrt(head_dim)) v over positions <= own
//   out = attn_output (attention * sigmoid(gate))
// Each row attends to its own sequence's cache (layer L of its state). The exact tier's core is
// below (double sums, a task per token and query head); the fast tier's is gated_attention_fast
// (cpu/attention_fast.h: fp32, each key row read once per KV head).
void attention_layer(const Products& mm, const Config& c, const AttentionWeights& w,
                     const LayerVectors& vec, const PassRows& rows, int L, const float* h, int T,
                     float* out) {
  const int hd = c.head_dim, n_head = c.n_head, kv_dim = c.kv_dim(), q_dim = c.q_dim();
  const int group = n_head / c.n_head_kv;  // query heads per KV head
  Buf qg((size_t)T * 2 * q_dim), k((size_t)T * kv_dim), v((size_t)T * kv_dim);
  const ProductJob projections[] = {
      {w.q, h, T, qg.data()},  // [T][n_head][2][hd]
      {w.k, h, T, k.data()},   // [T][n_kv][hd]
      {w.v, h, T, v.data()},   // [T][n_kv][hd]
  };
  mm.matmul_batch(projections);

  Buf q((size_t)T * q_dim), gate((size_t)T * q_dim);  // [T][n_head][hd]
  for (int t = 0; t < T; t++) {
    const RopeAngles angles(c.rope_dim, rows.position(t), c.rope_base);
    for (int hh = 0; hh < n_head; hh++) {
      const float* src = qg.data() + ((size_t)t * n_head + hh) * 2 * hd;
      float* qh = q.data() + ((size_t)t * n_head + hh) * hd;
      std::copy(src + hd, src + 2 * hd, gate.data() + ((size_t)t * n_head + hh) * hd);
      rmsnorm(src, vec.q_norm.data(), c.rms_eps, hd, qh);
      rope_neox(qh, angles);
    }
    for (int kh = 0; kh < c.n_head_kv; kh++) {
      float* kk = k.data() + ((size_t)t * c.n_head_kv + kh) * hd;
      rmsnorm(kk, vec.k_norm.data(), c.rms_eps, hd, kk);
      rope_neox(kk, angles);
    }
  }

  // Append each sequence's keys and values: its cache then holds positions [0, pos0 + n).
  for (int s = 0; s < rows.n_seqs(); s++) {
    LayerState& st = rows.layer(s, L);
    const size_t pos0 = (size_t)rows.seqs[s].state->position, n = (size_t)rows.n_rows_of(s);
    const size_t row0 = (size_t)rows.first[s] * kv_dim;
    st.k_cache.write(pos0, k.data() + row0, n);
    st.v_cache.write(pos0, v.data() + row0, n);
  }

  Buf attn((size_t)T * q_dim);  // [T][n_head][hd]
  if (mm.numerics() == Numerics::kFast) {
    std::vector<AttentionRow> att((size_t)T);
    for (int t = 0; t < T; t++) {
      const LayerState& st = rows.layer(rows.sequence_of(t), L);
      att[t] = {&st.k_cache, &st.v_cache, rows.position(t) + 1};
    }
    gated_attention_fast(mm.pool(), att, q.data(), gate.data(), n_head, c.n_head_kv, hd, attn.data());
    mm.matmul(w.output, attn.data(), T, out);
    return;
  }
  const double scale = 1.0 / std::sqrt((double)hd);
  // One task per token and head, so a decode step's heads spread over the threads too.
  mm.pool().run((int64_t)T * n_head, [&](int64_t task) {
    const int t = (int)(task / n_head), hh = (int)(task % n_head);
    const LayerState& st = rows.layer(rows.sequence_of(t), L);
    const int n_keys = rows.position(t) + 1;  // causal: positions 0..pos
    thread_local std::vector<double> p, acc;
    thread_local std::vector<float> row;  // a key or value row decoded from a cache of another type than f32
    p.resize(n_keys);
    acc.assign(hd, 0.0);
    row.resize(hd);
    const int kh = hh / group;
    const float* qh = q.data() + ((size_t)t * n_head + hh) * hd;
    double max_score = -INFINITY;
    for (int s = 0; s < n_keys; s++) {
      p[s] = dot(qh, st.k_cache.read(s, kh * hd, hd, row.data()), hd) * scale;
      max_score = std::max(max_score, p[s]);
    }
    double sum = 0.0;
    for (int s = 0; s < n_keys; s++) sum += (p[s] = std::exp(p[s] - max_score));
    for (int s = 0; s < n_keys; s++) {
      const float* vs = st.v_cache.read(s, kh * hd, hd, row.data());
      for (int i = 0; i < hd; i++) acc[i] += p[s] * vs[i];
    }
    float* o = attn.data() + ((size_t)t * n_head + hh) * hd;
    const float* g = gate.data() + ((size_t)t * n_head + hh) * hd;
    for (int i = 0; i < hd; i++) o[i] = (float)(acc[i] / sum) * sigmoid(g[i]);
  });
  mm.matmul(w.output, attn.data(), T, out);
}

// The input projections of a DeltaNet layer, in the current layout whatever the file's:
//   qkv: [T][conv_dim] = [q of all key heads | k of all key heads | v of all value heads]
//   z:   [T][value_dim]
//   ba:  [T][nk][b (r), a (r)], from fp32 inputs (ProductJob::fp32_input)
void deltanet_projections(const Products& mm, const Config& c, const DeltaNetWeights& w,
                          const float* h, int T, Buf& qkv, Buf& z, Buf& ba) {
  const int conv_dim = c.ssm_conv_dim(), value_dim = c.ssm_value_dim(), key_dim = c.ssm_key_dim();
  qkv.resize((size_t)T * conv_dim);
  z.resize((size_t)T * value_dim);
  ba.resize((size_t)T * 2 * c.ssm_n_v_heads);
  const ProductJob gates{w.ba, h, T, ba.data(), true};
  if (!w.legacy_fused) {
    const ProductJob jobs[] = {{w.qkv, h, T, qkv.data()}, {w.gate, h, T, z.data()}, gates};
    mm.matmul_batch(jobs);
    return;
  }
  // Legacy ssm_in: per key head g, [q_g (dk), k_g (dk), v_g (r*dv), z_g (r*dv)].
  const int dk = c.ssm_head_dim, rdv = c.ssm_v_per_k() * c.ssm_head_dim;
  const int group_width = 2 * dk + 2 * rdv;
  Buf mixed((size_t)T * c.ssm_n_k_heads * group_width);
  const ProductJob jobs[] = {{w.in, h, T, mixed.data()}, gates};
  mm.matmul_batch(jobs);
  for (int t = 0; t < T; t++) {
    for (int g = 0; g < c.ssm_n_k_heads; g++) {
      const float* src = mixed.data() + ((size_t)t * c.ssm_n_k_heads + g) * group_width;
      float* dst = qkv.data() + (size_t)t * conv_dim;
      std::copy(src, src + dk, dst + g * dk);
      std::copy(src + dk, src + 2 * dk, dst + key_dim + g * dk);
      std::copy(src + 2 * dk, src + 2 * dk + rdv, dst + 2 * key_dim + g * rdv);
      std::copy(src + 2 * dk + rdv, src + group_width, z.data() + (size_t)t * value_dim + g * rdv);
    }
  }
}

// Causal depthwise conv1d over the channels, then SiLU; the state holds the previous K-1 inputs.
//   y[c] = SiLU(sum_j w[c][j] * x_{t-(K-1)+j}[c])                  qkv: [T][conv_dim], in place
// Channels are independent: the pool takes them in chunks, each chunk's tokens in order.
void causal_conv_silu(ThreadPool& pool, const Config& c, const std::vector<float>& taps,
                      std::vector<float>& conv_state, float* qkv, int T) {
  const int K = c.ssm_conv_kernel, conv_dim = c.ssm_conv_dim();
  constexpr int kChannelsPerTask = 512;
  pool.run((conv_dim + kChannelsPerTask - 1) / kChannelsPerTask, [&](int64_t task) {
    const int ch0 = (int)task * kChannelsPerTask, ch1 = std::min(conv_dim, ch0 + kChannelsPerTask);
    for (int t = 0; t < T; t++) {
      float* x = qkv + (size_t)t * conv_dim;
      for (int ch = ch0; ch < ch1; ch++) {
        const float* wc = taps.data() + (size_t)ch * K;
        double sum = (double)wc[K - 1] * x[ch];
        for (int j = 0; j < K - 1; j++) sum += (double)wc[j] * conv_state[(size_t)j * conv_dim + ch];
        // Shift the window: drop the oldest input, append this one.
        for (int j = 0; j + 1 < K - 1; j++)
          conv_state[(size_t)j * conv_dim + ch] = conv_state[(size_t)(j + 1) * conv_dim + ch];
        if (K > 1) conv_state[(size_t)(K - 2) * conv_dim + ch] = x[ch];
        x[ch] = silu((float)sum);
      }
    }
  });
}

// Gated DeltaNet.                                                h, out: [T][n_embd]
// The conv window and the recurrence run per sequence, on layer L of its state, in token order.
void deltanet_layer(const Products& mm, const Config& c, const DeltaNetWeights& w,
                    const LayerVectors& vec, const PassRows& rows, int L, const float* h, int T, float* out) {
  const int nk = c.ssm_n_k_heads, nv = c.ssm_n_v_heads, r = c.ssm_v_per_k();
  const int dk = c.ssm_head_dim, dv = c.ssm_head_dim;
  const int key_dim = c.ssm_key_dim(), value_dim = c.ssm_value_dim(), conv_dim = c.ssm_conv_dim();

  Buf qkv, z, ba;
  deltanet_projections(mm, c, w, h, T, qkv, z, ba);

  // beta = sigmoid(b); g = softplus(a + dt_bias) * ssm_a (log-decay, negative)   [T][nv]
  Buf beta((size_t)T * nv), decay_log((size_t)T * nv);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < nv; j++) {
      const int g = j / r, i = j % r;
      const float b = ba[(size_t)t * 2 * nv + g * 2 * r + i];
      const float a = ba[(size_t)t * 2 * nv + g * 2 * r + r + i];
      beta[(size_t)t * nv + j] = sigmoid(b);
      decay_log[(size_t)t * nv + j] = softplus(a + vec.dt_bias[j]) * vec.ssm_a[j];
    }

  for (int s = 0; s < rows.n_seqs(); s++)
    causal_conv_silu(mm.pool(), c, vec.conv1d, rows.layer(s, L).conv, qkv.data() + (size_t)rows.first[s] * conv_dim,
                     rows.n_rows_of(s));

  // q, k: L2-normalised per key head; q scaled by 1/sqrt(dk).
  const float q_scale = (float)(1.0 / std::sqrt((double)dk));
  for (int t = 0; t < T; t++)
    for (int g = 0; g < nk; g++) {
      float* q = qkv.data() + (size_t)t * conv_dim + g * dk;
      float* k = qkv.data() + (size_t)t * conv_dim + key_dim + g * dk;
      l2norm(q, dk, 1e-6f);
      l2norm(k, dk, 1e-6f);
      for (int i = 0; i < dk; i++) q[i] *= q_scale;
    }

  // The recurrence, one task per sequence and value head j (key head j / r), tokens in order:
  //   S = S * exp(g_t);  S += outer((v_t - S k_t) * beta_t, k_t);  o_t = S q_t     S: [dv][dk]
  // then o_t = RMSNorm(o_t) * ssm_norm * SiLU(z_t): cpu/delta_rule.h's step of the tier.
  Buf o((size_t)T * value_dim);  // [T][nv][dv]
  const bool fast = mm.numerics() == Numerics::kFast;
  mm.pool().run((int64_t)rows.n_seqs() * nv, [&](int64_t task) {
    const int s = (int)(task / nv), j = (int)(task % nv);
    float* S = rows.layer(s, L).ssm.data() + (size_t)j * dv * dk;
    const int g = j / r;
    for (int t = rows.first[s]; t < rows.first[s + 1]; t++) {
      const float* q = qkv.data() + (size_t)t * conv_dim + g * dk;
      const float* k = qkv.data() + (size_t)t * conv_dim + key_dim + g * dk;
      const float* v = qkv.data() + (size_t)t * conv_dim + 2 * key_dim + j * dv;
      const double decay = std::exp((double)decay_log[(size_t)t * nv + j]);
      const double b = beta[(size_t)t * nv + j];
      float* oj = o.data() + (size_t)t * value_dim + j * dv;
      if (fast)
        delta_rule_step_fast(S, q, k, v, (float)decay, (float)b, dk, dv, oj);
      else
        delta_rule_step_exact(S, q, k, v, decay, b, dk, dv, oj);
      rmsnorm(oj, vec.ssm_norm.data(), c.rms_eps, dv, oj);
      const float* zj = z.data() + (size_t)t * value_dim + j * dv;
      if (fast)
        simd::mul_silu_fast(oj, zj, dv);
      else
        for (int i = 0; i < dv; i++) oj[i] *= silu(zj[i]);
    }
  });
  mm.matmul(w.out, o.data(), T, out);
}

// Router: softmax over all experts, top-k (ties: lower expert index), probabilities renormalised.
//   logits: [T][n_expert] -> ids, weights: [T][k]
void route(const Config& c, const float* logits, int T, int32_t* ids, float* weights) {
  const int E = c.n_expert, K = c.n_expert_used;
  std::vector<float> prob(E);
  std::vector<double> unnormalised(E);
  std::vector<int> order(E);
  for (int t = 0; t < T; t++) {
    const float* l = logits + (size_t)t * E;
    const double max_l = *std::max_element(l, l + E);
    double sum = 0.0;
    for (int e = 0; e < E; e++) sum += (unnormalised[e] = std::exp((double)l[e] - max_l));
    for (int e = 0; e < E; e++) prob[e] = (float)(unnormalised[e] / sum);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int a, int b) {
      return prob[a] != prob[b] ? prob[a] > prob[b] : a < b;
    });
    double selected = 0.0;
    for (int k = 0; k < K; k++) selected += prob[order[k]];
    for (int k = 0; k < K; k++) {
      ids[(size_t)t * K + k] = order[k];
      double wk = prob[order[k]] / selected;
      if (c.expert_weights_scale != 0.0f) wk *= c.expert_weights_scale;
      weights[(size_t)t * K + k] = (float)wk;
    }
  }
}

// g = SiLU(g) * u, element-wise, over the pool in chunks (a decode step's ten experts are 5,120
// values at the 80B's widths); the fast tier's SiLU in fp32 on eight lanes (simd::swiglu_fast),
// the oracle's in double.
void swiglu_into(ThreadPool& pool, Buf& g, const Buf& u, bool fast) {
  constexpr int64_t kChunk = 2048;
  pool.run(((int64_t)g.size() + kChunk - 1) / kChunk, [&](int64_t task) {
    const size_t begin = (size_t)task * kChunk, end = std::min(g.size(), begin + kChunk);
    if (fast) return simd::swiglu_fast(g.data() + begin, u.data() + begin, end - begin);
    for (size_t i = begin; i < end; i++) g[i] = silu(g[i]) * u[i];
  });
}

// Mixture of experts with a shared expert.                      h2, out: [T][n_embd]
//   out = sum_k w_k Expert_{id_k}(h2) + sigmoid(ffn_gate_inp_shexp . h2) * SharedExpert(h2)
void moe_layer(const Products& mm, const Config& c, const MoeWeights& w, int layer, const float* h2,
               int T, float* out, TraceSink* trace) {
  const int E = c.n_expert, K = c.n_expert_used, n_embd = c.n_embd;
  Buf logits((size_t)T * E);
  mm.matmul(w.router, h2, T, logits.data());
  std::vector<int32_t> ids((size_t)T * K);
  Buf weights((size_t)T * K);
  route(c, logits.data(), T, ids.data(), weights.data());
  if (trace) {
    trace->tensor(fmt::format("ffn_moe_logits-{}", layer), T, E, logits.data());
    trace->ids(fmt::format("ffn_moe_topk-{}", layer), T, K, ids.data());
  }

  // Each selected expert runs once on all the tokens that chose it, so its weights are read once
  // per batch; the experts' products of a stage, the shared expert's with them, are one batch (the
  // fast tier spreads experts x rows over the threads). Rows of xs, gu and ys are slots grouped by
  // expert.
  const int64_t ff = w.gate_exps.ne[1];
  std::vector<std::vector<int>> slots(E);  // expert -> slots t*K + k that selected it
  for (int i = 0; i < T * K; i++) slots[ids[i]].push_back(i);
  Buf xs((size_t)T * K * n_embd), gate((size_t)T * K * ff), up((size_t)T * K * ff), ys((size_t)T * K * n_embd);
  std::vector<ProductJob> gate_up, down;
  for (int e = 0, row = 0; e < E; row += (int)slots[e].size(), e++) {
    if (slots[e].empty()) continue;
    const int n = (int)slots[e].size();
    // An expert of one token reads the token's row in place: in a decode step every expert then
    // has the same input, which the fast tier quantises once for all of them.
    const float* x = h2 + (size_t)(slots[e][0] / K) * n_embd;
    if (n > 1) {
      for (int i = 0; i < n; i++) {
        const float* src = h2 + (size_t)(slots[e][i] / K) * n_embd;
        std::copy(src, src + n_embd, xs.data() + (size_t)(row + i) * n_embd);
      }
      x = xs.data() + (size_t)row * n_embd;
    }
    gate_up.push_back({w.gate_exps.matrix(e), x, n, gate.data() + (size_t)row * ff});
    gate_up.push_back({w.up_exps.matrix(e), x, n, up.data() + (size_t)row * ff});
    down.push_back({w.down_exps.matrix(e), gate.data() + (size_t)row * ff, n, ys.data() + (size_t)row * n_embd});
  }
  // The shared expert: y = down (SiLU(gate h2) * (up h2)), and its scalar gate.
  const int64_t shared_ff = w.gate_shexp.n_rows();
  Buf shared_g((size_t)T * shared_ff), shared_u((size_t)T * shared_ff), shared((size_t)T * n_embd), shared_gate(T);
  gate_up.push_back({w.gate_shexp, h2, T, shared_g.data()});
  gate_up.push_back({w.up_shexp, h2, T, shared_u.data()});
  gate_up.push_back({w.shared_gate_inp, h2, T, shared_gate.data()});
  down.push_back({w.down_shexp, shared_g.data(), T, shared.data()});
  mm.matmul_batch(gate_up);
  const bool fast = mm.numerics() == Numerics::kFast;
  swiglu_into(mm.pool(), gate, up, fast);
  swiglu_into(mm.pool(), shared_g, shared_u, fast);
  mm.matmul_batch(down);
  Buf expert_out((size_t)T * K * n_embd);  // [T][K][n_embd]
  for (int e = 0, row = 0; e < E; row += (int)slots[e].size(), e++)
    for (size_t i = 0; i < slots[e].size(); i++)
      std::copy(ys.data() + (size_t)(row + i) * n_embd, ys.data() + (size_t)(row + i + 1) * n_embd,
                expert_out.data() + (size_t)slots[e][i] * n_embd);

  // The weighted sum, per token in chunks of the hidden width over the pool.
  constexpr int kChunk = 512;
  const int chunks = (n_embd + kChunk - 1) / kChunk;
  mm.pool().run((int64_t)T * chunks, [&](int64_t task) {
    const int t = (int)(task / chunks), i0 = (int)(task % chunks) * kChunk, i1 = std::min(n_embd, i0 + kChunk);
    const float sg = sigmoid(shared_gate[t]);
    for (int i = i0; i < i1; i++) {
      double routed = 0.0;
      for (int k = 0; k < K; k++)
        routed += (double)weights[(size_t)t * K + k] * expert_out[((size_t)t * K + k) * n_embd + i];
      out[(size_t)t * n_embd + i] = (float)routed + shared[(size_t)t * n_embd + i] * sg;
    }
  });
}

void add_into(float* x, const float* y, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] += y[i];
}

}  // namespace

void forward(const OracleWeights& w, const Products& mm, std::span<const SequenceTokens> sequences,
             bool all_logits, float* logits, TraceSink* trace) {
  const Model& m = *w.model;
  const Config& c = m.config();
  const PassRows rows(sequences);
  const int T = rows.n_rows(), n_embd = c.n_embd;
  const size_t act = (size_t)T * n_embd;

  Buf x(act), h(act), mix(act);  // residual stream, normed input, block output: [T][n_embd]
  embed(m, rows, x.data());

  for (int L = 0; L < c.n_layer; L++) {
    const LayerWeights& lw = m.layers[L];
    const LayerVectors& vec = w.layers[L];
    // x += Mixer(RMSNorm(x) * attn_norm)
    rmsnorm_rows(x.data(), vec.attn_norm, c.rms_eps, T, n_embd, h.data());
    if (lw.recurrent)
      deltanet_layer(mm, c, lw.ssm, vec, rows, L, h.data(), T, mix.data());
    else
      attention_layer(mm, c, lw.attn, vec, rows, L, h.data(), T, mix.data());
    add_into(x.data(), mix.data(), act);
    if (trace) trace->tensor(fmt::format("attn_residual-{}", L), T, n_embd, x.data());

    // x += MoE(RMSNorm(x) * post_attention_norm)
    rmsnorm_rows(x.data(), vec.post_attention_norm, c.rms_eps, T, n_embd, h.data());
    moe_layer(mm, c, lw.moe, L, h.data(), T, mix.data(), trace);
    add_into(x.data(), mix.data(), act);
    if (trace) trace->tensor(fmt::format("l_out-{}", L), T, n_embd, x.data());
  }

  // logits = output (RMSNorm(x) * output_norm), for every token or the last one of each sequence.
  rmsnorm_rows(x.data(), w.output_norm, c.rms_eps, T, n_embd, h.data());
  if (trace) trace->tensor("result_norm", T, n_embd, h.data());
  if (all_logits) {
    mm.matmul(m.output, h.data(), T, logits);
  } else {
    Buf last((size_t)rows.n_seqs() * n_embd);  // [n_seqs][n_embd]
    for (int s = 0; s < rows.n_seqs(); s++)
      std::copy(h.data() + (size_t)(rows.first[s + 1] - 1) * n_embd, h.data() + (size_t)rows.first[s + 1] * n_embd,
                last.data() + (size_t)s * n_embd);
    mm.matmul(m.output, last.data(), rows.n_seqs(), logits);
  }
  for (int s = 0; s < rows.n_seqs(); s++) sequences[s].state->position += rows.n_rows_of(s);
}

void forward(const OracleWeights& w, const Products& mm, State& state, std::span<const int32_t> tokens,
             bool all_logits, float* logits, TraceSink* trace) {
  const SequenceTokens one{&state, tokens};
  forward(w, mm, std::span(&one, 1), all_logits, logits, trace);
}

}  // namespace rl::cpu
