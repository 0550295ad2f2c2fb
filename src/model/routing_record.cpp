#include "model/routing_record.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"

namespace rl {

namespace {

constexpr char kMagic[8] = {'R', 'L', 'R', 'O', 'U', 'T', 'E', '\0'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 8 + 4 * 4 + 8 + 8;
constexpr uint32_t kMaxLayers = 4096, kMaxTokensPerPass = 1u << 20;

// Explicit little-endian bytes, so a recording reads the same on any host.
void put_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) out.push_back((uint8_t)(v >> (8 * i)));
}

class Reader {
 public:
  Reader(const std::string& path, std::vector<uint8_t> bytes) : path_(path), bytes_(std::move(bytes)) {}
  size_t left() const { return bytes_.size() - pos_; }
  uint64_t get(int bytes, const char* what) {
    if (left() < (size_t)bytes)
      fail("{}: routing recording truncated: {} bytes left at offset {}, {} needs {}", path_, left(), pos_, what,
           bytes);
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)bytes_[pos_ + i] << (8 * i);
    pos_ += bytes;
    return v;
  }
  const uint8_t* take(size_t n) {
    const uint8_t* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }
  size_t pos() const { return pos_; }

 private:
  const std::string& path_;
  std::vector<uint8_t> bytes_;
  size_t pos_ = 0;
};

}  // namespace

size_t RoutingRecording::n_tokens() const {
  size_t n = 0;
  for (const RoutingPass& p : passes) n += p.n_tokens;
  return n;
}

size_t expert_slot_bytes(const Model& m) {
  auto pad = [](size_t n) { return (n + kSlotAlign - 1) / kSlotAlign * kSlotAlign; };
  size_t bytes = 0;
  for (const LayerWeights& lw : m.layers) {
    const MoeWeights& w = lw.moe;
    bytes = std::max(bytes, pad(w.gate_exps.matrix(0).nbytes) + pad(w.up_exps.matrix(0).nbytes) +
                                pad(w.down_exps.matrix(0).nbytes));
  }
  return bytes;
}

RoutingRecorder::RoutingRecorder(int n_layer, int n_expert, int n_expert_used, uint64_t slot_bytes) {
  if (n_layer <= 0 || n_expert <= 0 || n_expert > 65535 || n_expert_used <= 0 || n_expert_used > n_expert)
    fail("routing recorder: unsupported shape ({} layers, {} experts, {} used)", n_layer, n_expert,
         n_expert_used);
  rec_.n_layer = n_layer;
  rec_.n_expert = n_expert;
  rec_.n_expert_used = n_expert_used;
  rec_.slot_bytes = slot_bytes;
  next_layer_ = n_layer;
}

void RoutingRecorder::ids(std::string_view name, int n_tokens, int width, const int32_t* data) {
  constexpr std::string_view prefix = "ffn_moe_topk-";
  if (name.substr(0, prefix.size()) != prefix) return;
  const int L = std::atoi(std::string(name.substr(prefix.size())).c_str());
  if (width != rec_.n_expert_used || n_tokens <= 0)
    fail("routing recorder: {} has {} tokens of {} ids, expected {} ids a token", name, n_tokens, width,
         rec_.n_expert_used);
  if (L == 0) {
    if (next_layer_ != rec_.n_layer)
      fail("routing recorder: a pass began before the previous one reached layer {}", next_layer_);
    rec_.passes.push_back(RoutingPass{n_tokens, {}});
    rec_.passes.back().ids.reserve((size_t)rec_.n_layer * n_tokens * width);
    next_layer_ = 0;
  }
  if (L != next_layer_ || rec_.passes.back().n_tokens != n_tokens)
    fail("routing recorder: {} ({} tokens) out of order: expected layer {} of a pass of {} tokens", name, n_tokens,
         next_layer_, rec_.passes.empty() ? 0 : rec_.passes.back().n_tokens);
  std::vector<uint16_t>& out = rec_.passes.back().ids;
  for (int i = 0; i < n_tokens * width; i++) {
    if (data[i] < 0 || data[i] >= rec_.n_expert) fail("routing recorder: {} selects expert {}", name, data[i]);
    out.push_back((uint16_t)data[i]);
  }
  next_layer_++;
}

const RoutingRecording& RoutingRecorder::recording() const {
  if (next_layer_ != rec_.n_layer)
    fail("routing recorder: the last pass stopped at layer {} of {}", next_layer_, rec_.n_layer);
  return rec_;
}

void write_routing_recording(const std::string& path, const RoutingRecording& rec) {
  std::vector<uint8_t> out(kMagic, kMagic + 8);
  put_le(out, kVersion, 4);
  put_le(out, (uint32_t)rec.n_layer, 4);
  put_le(out, (uint32_t)rec.n_expert, 4);
  put_le(out, (uint32_t)rec.n_expert_used, 4);
  put_le(out, rec.slot_bytes, 8);
  put_le(out, rec.passes.size(), 8);
  for (const RoutingPass& p : rec.passes) {
    put_le(out, (uint32_t)p.n_tokens, 4);
    for (uint16_t id : p.ids) put_le(out, id, 2);
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("{}: cannot create the routing recording", tmp);
    f.write(reinterpret_cast<const char*>(out.data()), (std::streamsize)out.size());
    f.close();
    if (!f) fail("{}: writing the routing recording failed", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("{}: cannot rename the routing recording into place: {}", path, ec.message());
}

RoutingRecording read_routing_recording(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open the routing recording", path);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 8) != 0)
    fail("{}: not a routing recording (no RLROUTE header; {} bytes)", path, bytes.size());
  Reader r(path, std::move(bytes));
  r.take(8);
  const uint32_t version = (uint32_t)r.get(4, "the version");
  if (version != kVersion) fail("{}: routing recording version {}, this build reads {}", path, version, kVersion);
  RoutingRecording rec;
  const uint64_t n_layer = r.get(4, "n_layer"), n_expert = r.get(4, "n_expert"), k = r.get(4, "n_expert_used");
  if (n_layer == 0 || n_layer > kMaxLayers || n_expert == 0 || n_expert > 65535 || k == 0 || k > n_expert)
    fail("{}: routing recording shape out of range ({} layers, {} experts, {} used)", path, n_layer, n_expert, k);
  rec.n_layer = (int)n_layer;
  rec.n_expert = (int)n_expert;
  rec.n_expert_used = (int)k;
  rec.slot_bytes = r.get(8, "slot_bytes");
  const uint64_t n_passes = r.get(8, "n_passes");
  // Every pass takes at least 4 + 2 * n_layer * k bytes: a count the file cannot hold is refused
  // before anything is allocated for it.
  if (n_passes > r.left() / (4 + 2 * n_layer * k))
    fail("{}: routing recording truncated: the header names {} passes, the {} bytes after it hold at most {}", path,
         n_passes, r.left(), r.left() / (4 + 2 * n_layer * k));
  rec.passes.resize(n_passes);
  std::vector<uint32_t> seen(n_expert, 0);
  uint32_t row = 0;
  for (uint64_t p = 0; p < n_passes; p++) {
    const uint64_t n_tokens = r.get(4, "a pass's n_tokens");
    if (n_tokens == 0 || n_tokens > kMaxTokensPerPass)
      fail("{}: pass {} has {} tokens (1 to {} allowed)", path, p, n_tokens, kMaxTokensPerPass);
    const size_t n_ids = (size_t)n_layer * n_tokens * k;
    if (r.left() < 2 * n_ids)
      fail("{}: routing recording truncated in pass {} of {}: {} ids need {} bytes, {} left", path, p, n_passes,
           n_ids, 2 * n_ids, r.left());
    const uint8_t* src = r.take(2 * n_ids);
    RoutingPass& pass = rec.passes[p];
    pass.n_tokens = (int)n_tokens;
    pass.ids.resize(n_ids);
    for (size_t i = 0; i < n_ids; i++) {
      const uint16_t id = (uint16_t)(src[2 * i] | (src[2 * i + 1] << 8));
      if (id >= n_expert) fail("{}: pass {} selects expert {} of {}", path, p, id, n_expert);
      if (i % k == 0) row++;  // each token's k ids in one layer are distinct, as the router picks them
      if (seen[id] == row) fail("{}: pass {} selects expert {} twice for one token", path, p, id);
      seen[id] = row;
      pass.ids[i] = id;
    }
  }
  if (r.left() != 0) fail("{}: {} trailing bytes after the last of {} passes", path, r.left(), n_passes);
  return rec;
}

}  // namespace rl
