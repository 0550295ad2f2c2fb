// Helpers shared by the GGUF tests: a scratch directory, whole-file reads, and RawGguf, a byte
// builder written independently of GgufWriter that records where each field lies, so tests can
// both cross-check the writer's bytes and forge any invalid value in any field.
#pragma once
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace rl::test {

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("rl-gguf-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// One recorded field of a RawGguf image: its label ("tensor[1].ne[0]"), offset and width.
struct RawField {
  std::string label;
  size_t offset;
  size_t width;  // 1, 4 or 8 bytes
};

// Appends GGUF fields exactly as the spec lays them out (little-endian), recording the count,
// length, type, dimension and offset fields under readable labels.
struct RawGguf {
  std::vector<uint8_t> bytes;
  std::vector<RawField> fields;

  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  }
  void u8(const std::string& label, uint8_t v) {
    if (!label.empty()) fields.push_back({label, bytes.size(), 1});
    raw(&v, 1);
  }
  void u32(const std::string& label, uint32_t v) {
    if (!label.empty()) fields.push_back({label, bytes.size(), 4});
    raw(&v, 4);
  }
  void u64(const std::string& label, uint64_t v) {
    if (!label.empty()) fields.push_back({label, bytes.size(), 8});
    raw(&v, 8);
  }
  void str(const std::string& label, std::string_view s) {
    u64(label + ".len", s.size());
    raw(s.data(), s.size());
  }
  void pad(uint64_t alignment) {
    while (bytes.size() % alignment != 0) bytes.push_back(0);
  }
  void header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    raw("GGUF", 4);
    u32("header.version", version);
    u64("header.n_tensors", n_tensors);
    u64("header.n_kv", n_kv);
  }
  void tensor_info(int index, std::string_view name, const std::vector<uint64_t>& ne, uint32_t type,
                   uint64_t offset) {
    const std::string p = "tensor[" + std::to_string(index) + "]";
    str(p + ".name", name);
    u32(p + ".n_dims", (uint32_t)ne.size());
    for (size_t d = 0; d < ne.size(); d++) u64(p + ".ne[" + std::to_string(d) + "]", ne[d]);
    u32(p + ".type", type);
    u64(p + ".offset", offset);
  }

  const RawField& field(const std::string& label) const {
    for (const auto& f : fields)
      if (f.label == label) return f;
    throw std::runtime_error("RawGguf: no field " + label);
  }
  // A copy with one field overwritten (value truncated to the field's width).
  std::vector<uint8_t> with(const std::string& label, uint64_t value) const { return with(field(label), value); }
  std::vector<uint8_t> with(const RawField& f, uint64_t value) const {
    std::vector<uint8_t> b = bytes;
    std::memcpy(b.data() + f.offset, &value, f.width);
    return b;
  }
};

}  // namespace rl::test
