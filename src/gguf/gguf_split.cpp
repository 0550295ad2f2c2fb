// Split GGUF models as llama.cpp's gguf-split writes them: NAME-00001-of-0000N.gguf ...
// NAME-0000N-of-0000N.gguf, each shard a complete GGUF file holding some of the tensors, with
// split.no (0-based), split.count and, in the first, split.tensors.count; the first shard also
// carries the model's metadata.
#include <fmt/format.h>

#include "common/error.h"
#include "gguf/gguf.h"

namespace rl {

namespace {

constexpr const char* kSplitNo = "split.no";
constexpr const char* kSplitCount = "split.count";
constexpr const char* kSplitTensors = "split.tensors.count";
constexpr uint64_t kMaxShards = 9999;  // the five-digit naming's practical bound

// "DIR/NAME-00001-of-00003.gguf" -> "DIR/NAME"; empty when the path is not named that way.
std::string split_prefix(const std::string& path, uint64_t count) {
  const std::string tail = fmt::format("-{:05d}-of-{:05d}.gguf", 1, count);
  if (path.size() <= tail.size() || path.compare(path.size() - tail.size(), tail.size(), tail) != 0) return {};
  return path.substr(0, path.size() - tail.size());
}

}  // namespace

void GgufFile::open_split_shards() {
  const GgufValue* count_v = find(kSplitCount);
  if (!count_v) return;
  const uint64_t count = count_v->as_uint();
  const uint64_t no = get_uint(kSplitNo, 0);
  if (count == 0 || count > kMaxShards) fail("{}: {} = {} is not a valid shard count", path_, kSplitCount, count);
  if (no != 0)
    fail("{}: this is shard {} of {} of a split model; open the first shard (...-00001-of-{:05d}.gguf)", path_,
         no + 1, count, count);
  if (count == 1) return;
  const std::string prefix = split_prefix(path_, count);
  if (prefix.empty())
    fail("{}: split model of {} shards, but the file is not named NAME-00001-of-{:05d}.gguf, so the other "
         "shards cannot be found",
         path_, count, count);
  const uint64_t expected_tensors = get_uint(kSplitTensors, 0);
  for (uint64_t i = 1; i < count; ++i) {
    const std::string shard_path = fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, i + 1, count);
    std::unique_ptr<GgufFile> shard;
    try {
      shard = open_one(shard_path);
    } catch (const Error& e) {
      fail("{}: shard {} of {} of this split model cannot be read: {}", path_, i + 1, count, e.what());
    }
    const GgufValue* sc = shard->find(kSplitCount);
    const GgufValue* sn = shard->find(kSplitNo);
    if (!sc || !sn || sc->as_uint() != count || sn->as_uint() != i)
      fail("{}: shard {} of {} does not belong to this split model ({} = {}, {} = {}; expected {} and {})", shard_path,
           i + 1, count, kSplitNo, sn ? sn->to_string() : "missing", kSplitCount, sc ? sc->to_string() : "missing", i,
           count);
    for (GgufTensorInfo& t : shard->tensors_) tensors_.push_back(std::move(t));
    shard->tensors_.clear();
    shard->tensor_index_.clear();
    shards_.push_back(std::move(shard));
  }
  if (expected_tensors != 0 && tensors_.size() != expected_tensors)
    fail("{}: the {} shards hold {} tensors, but {} says {}", path_, count, tensors_.size(), kSplitTensors,
         expected_tensors);
  build_tensor_index();  // names now come from every shard (and a name twice is refused)
}

}  // namespace rl
