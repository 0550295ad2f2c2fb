// GGUF v3 writer. Layout (ggml docs/gguf.md), all little-endian:
//   "GGUF" u32 version u64 n_tensors u64 n_kv
//   n_kv x   { string key, u32 value type, value }
//   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset }
//   zero padding to `alignment`, then the data section: each tensor at its offset (a multiple of
//   the alignment, counted from the start of the data section), each followed by zero padding.
// A string is u64 length + bytes (no terminator); an array is u32 element type, u64 count,
// elements. llama.cpp requires tensor offsets to be exactly the running sum of the padded sizes,
// so they are assigned here in file order and never chosen by the caller.
#include "gguf/gguf_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>

#include "common/error.h"

namespace rl {

namespace {

constexpr uint32_t kGgufVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
// ggml's GGML_MAX_NAME is 64 including the terminator; longer names do not load in llama.cpp.
constexpr size_t kMaxTensorName = 63;
constexpr size_t kMaxDims = 4;

uint64_t pad_to(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  if (n == 0) return;
  const size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, p, n);
}
void put_u32(std::vector<uint8_t>& out, uint32_t v) { put_bytes(out, &v, 4); }
void put_u64(std::vector<uint8_t>& out, uint64_t v) { put_bytes(out, &v, 8); }
void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put_u64(out, s.size());
  put_bytes(out, s.data(), s.size());
}

template <class T>
std::vector<uint8_t> encode_scalar(GgufValueType type, T v) {
  std::vector<uint8_t> out;
  put_u32(out, (uint32_t)type);
  put_bytes(out, &v, sizeof(T));
  return out;
}

// The payload of an array value (element type, count, elements) read from another file.
void encode_array_payload(std::vector<uint8_t>& out, const GgufValue& v);

// Type tag + payload of any value read from another file.
void encode_value(std::vector<uint8_t>& out, const GgufValue& v) {
  put_u32(out, (uint32_t)v.type());
  switch (v.type()) {
    case GgufValueType::UINT8: { uint8_t x = (uint8_t)v.as_uint(); put_bytes(out, &x, 1); break; }
    case GgufValueType::INT8: { int8_t x = (int8_t)v.as_int(); put_bytes(out, &x, 1); break; }
    case GgufValueType::UINT16: { uint16_t x = (uint16_t)v.as_uint(); put_bytes(out, &x, 2); break; }
    case GgufValueType::INT16: { int16_t x = (int16_t)v.as_int(); put_bytes(out, &x, 2); break; }
    case GgufValueType::UINT32: put_u32(out, (uint32_t)v.as_uint()); break;
    case GgufValueType::INT32: { int32_t x = (int32_t)v.as_int(); put_bytes(out, &x, 4); break; }
    case GgufValueType::UINT64: put_u64(out, v.as_uint()); break;
    case GgufValueType::INT64: { int64_t x = v.as_int(); put_bytes(out, &x, 8); break; }
    case GgufValueType::FLOAT32: { float x = (float)v.as_float(); put_bytes(out, &x, 4); break; }
    case GgufValueType::FLOAT64: { double x = v.as_float(); put_bytes(out, &x, 8); break; }
    case GgufValueType::BOOL: { uint8_t x = v.as_bool() ? 1 : 0; put_bytes(out, &x, 1); break; }
    case GgufValueType::STRING: put_string(out, v.as_string()); break;
    case GgufValueType::ARRAY: encode_array_payload(out, v); break;
  }
}

void encode_array_payload(std::vector<uint8_t>& out, const GgufValue& v) {
  const GgufValueType elem = v.elem_type();
  put_u32(out, (uint32_t)elem);
  put_u64(out, v.size());
  if (elem == GgufValueType::STRING) {
    for (size_t i = 0; i < v.size(); i++) put_string(out, v.str_at(i));
  } else if (elem == GgufValueType::ARRAY) {
    for (size_t i = 0; i < v.size(); i++) encode_array_payload(out, v.array_at(i));
  } else if (v.raw_data() != nullptr || v.size() == 0) {
    // Scalar elements are copied as stored: no conversion can change a value.
    put_bytes(out, v.raw_data(), v.size() * gguf_value_size(elem));
  } else {
    fail("array of {} has no element bytes", gguf_value_type_name(elem));
  }
}

// Size of a tensor of this type and shape; throws when ggml could not represent it.
struct TensorLayout {
  uint64_t rows;       // ne[1] * ne[2] * ne[3]
  uint64_t row_bytes;  // bytes of ne[0] values
  uint64_t nbytes;
};
TensorLayout tensor_layout(const std::string& name, GgmlType type, const std::vector<int64_t>& ne) {
  const QuantType* qt = find_quant_type((uint32_t)type);
  if (!qt) fail("tensor {}: unknown ggml type id {}", name, (uint32_t)type);
  if (ne.empty() || ne.size() > kMaxDims) fail("tensor {}: {} dimensions (1 to {} allowed)", name, ne.size(), kMaxDims);
  uint64_t rows = 1;
  for (size_t d = 0; d < ne.size(); d++) {
    if (ne[d] < 1) fail("tensor {}: dimension {} is {} (must be at least 1)", name, d, ne[d]);
    if (d > 0) {
      if (rows > (uint64_t)std::numeric_limits<int64_t>::max() / (uint64_t)ne[d]) fail("tensor {}: too many rows", name);
      rows *= (uint64_t)ne[d];
    }
  }
  if (ne[0] % qt->block_size != 0)
    fail("tensor {}: row length {} is not a multiple of the {} block size {}", name, ne[0], qt->name, qt->block_size);
  if ((uint64_t)(ne[0] / qt->block_size) > (uint64_t)std::numeric_limits<int64_t>::max() / qt->type_size)
    fail("tensor {}: row size overflows", name);
  const uint64_t row_bytes = (uint64_t)(ne[0] / qt->block_size) * qt->type_size;
  if (rows > (uint64_t)std::numeric_limits<int64_t>::max() / row_bytes) fail("tensor {}: size overflows", name);
  return {rows, row_bytes, rows * row_bytes};
}

// Writes every byte or fails with errno set; retries short writes and interrupted calls.
bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (w == 0) {
      errno = EIO;
      return false;
    }
    p += w;
    n -= (size_t)w;
  }
  return true;
}

// PATH.tmp while it is being written: closed and removed unless the write completed.
class PartialFile {
 public:
  explicit PartialFile(std::string final_path) : final_path_(std::move(final_path)), tmp_path_(final_path_ + ".tmp") {
    fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("{}: cannot create {}: {}", final_path_, tmp_path_, std::strerror(errno));
  }
  ~PartialFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_path_.c_str());
  }
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;

  // Reserves the whole size up front so that a full disk is reported before hours of writing.
  void reserve(uint64_t size) {
    if (size == 0) return;
    int r = ::posix_fallocate(fd_, 0, (off_t)size);
    // Filesystems without preallocation are written normally; the writes report ENOSPC then.
    if (r != 0 && r != EOPNOTSUPP && r != ENOSYS && r != EINVAL)
      fail("{}: cannot reserve {} bytes: {}", final_path_, size, std::strerror(r));
  }

  void write(const uint8_t* p, size_t n) {
    if (!write_all(fd_, p, n))
      fail("{}: write failed at byte {}: {}", final_path_, written_, std::strerror(errno));
    written_ += n;
  }

  void write_zeros(size_t n) {
    static const uint8_t zeros[256] = {};
    while (n > 0) {
      size_t k = std::min(n, sizeof(zeros));
      write(zeros, k);
      n -= k;
    }
  }

  uint64_t written() const { return written_; }

  // Flushes, closes and renames PATH.tmp to PATH. Errors that the kernel reports late (a full
  // disk on delayed allocation, network filesystems) surface in fsync/close and fail here.
  void commit() {
    if (::fsync(fd_) != 0) fail("{}: fsync failed: {}", final_path_, std::strerror(errno));
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("{}: close failed: {}", final_path_, std::strerror(errno));
    if (::rename(tmp_path_.c_str(), final_path_.c_str()) != 0)
      fail("{}: cannot rename {} to it: {}", final_path_, tmp_path_, std::strerror(errno));
    committed_ = true;
  }

 private:
  std::string final_path_;
  std::string tmp_path_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

}  // namespace

GgufWriter::GgufWriter(uint64_t alignment) : alignment_(alignment) {
  // llama.cpp accepts only a non-zero power of two, stored as u32.
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > std::numeric_limits<uint32_t>::max())
    fail("GGUF alignment {} is not a power of two that fits in 32 bits", alignment);
  if (alignment != kDefaultAlignment) add_u32("general.alignment", (uint32_t)alignment);
}

void GgufWriter::add_kv(const std::string& key, std::vector<uint8_t> encoded) {
  if (key.empty()) fail("GGUF metadata key must not be empty");
  if (key == "general.alignment") {
    // The alignment governs the layout this writer produces, so it can only restate it.
    uint32_t type = 0, value = 0;
    std::memcpy(&type, encoded.data(), 4);
    if (type != (uint32_t)GgufValueType::UINT32 || encoded.size() != 8)
      fail("metadata key general.alignment must be a u32");
    std::memcpy(&value, encoded.data() + 4, 4);
    if (value != alignment_)
      fail("metadata key general.alignment = {} conflicts with the writer's alignment {}", value, alignment_);
    for (const auto& kv : kv_)
      if (kv.first == key) return;  // already written by the constructor
  }
  for (const auto& kv : kv_)
    if (kv.first == key) fail("duplicate GGUF metadata key {}", key);
  kv_.emplace_back(key, std::move(encoded));
}

void GgufWriter::add_u8(const std::string& key, uint8_t v) { add_kv(key, encode_scalar(GgufValueType::UINT8, v)); }
void GgufWriter::add_i8(const std::string& key, int8_t v) { add_kv(key, encode_scalar(GgufValueType::INT8, v)); }
void GgufWriter::add_u16(const std::string& key, uint16_t v) { add_kv(key, encode_scalar(GgufValueType::UINT16, v)); }
void GgufWriter::add_i16(const std::string& key, int16_t v) { add_kv(key, encode_scalar(GgufValueType::INT16, v)); }
void GgufWriter::add_u32(const std::string& key, uint32_t v) { add_kv(key, encode_scalar(GgufValueType::UINT32, v)); }
void GgufWriter::add_i32(const std::string& key, int32_t v) { add_kv(key, encode_scalar(GgufValueType::INT32, v)); }
void GgufWriter::add_u64(const std::string& key, uint64_t v) { add_kv(key, encode_scalar(GgufValueType::UINT64, v)); }
void GgufWriter::add_i64(const std::string& key, int64_t v) { add_kv(key, encode_scalar(GgufValueType::INT64, v)); }
void GgufWriter::add_f32(const std::string& key, float v) { add_kv(key, encode_scalar(GgufValueType::FLOAT32, v)); }
void GgufWriter::add_f64(const std::string& key, double v) { add_kv(key, encode_scalar(GgufValueType::FLOAT64, v)); }
void GgufWriter::add_bool(const std::string& key, bool v) {
  add_kv(key, encode_scalar(GgufValueType::BOOL, uint8_t(v ? 1 : 0)));
}
void GgufWriter::add_string(const std::string& key, const std::string& v) {
  std::vector<uint8_t> out;
  put_u32(out, (uint32_t)GgufValueType::STRING);
  put_string(out, v);
  add_kv(key, std::move(out));
}

void GgufWriter::add_array_i32(const std::string& key, const std::vector<int32_t>& v) { add_array(key, array(v)); }
void GgufWriter::add_array_u32(const std::string& key, const std::vector<uint32_t>& v) { add_array(key, array(v)); }
void GgufWriter::add_array_f32(const std::string& key, const std::vector<float>& v) { add_array(key, array(v)); }
void GgufWriter::add_array_bool(const std::string& key, const std::vector<bool>& v) { add_array(key, array(v)); }
void GgufWriter::add_array_string(const std::string& key, const std::vector<std::string>& v) {
  add_array(key, array(v));
}

void GgufWriter::add_array(const std::string& key, const Array& a) {
  std::vector<uint8_t> out;
  out.reserve(16 + a.payload.size());
  put_u32(out, (uint32_t)GgufValueType::ARRAY);
  put_u32(out, (uint32_t)a.elem_type);
  put_u64(out, a.count);
  put_bytes(out, a.payload.data(), a.payload.size());
  add_kv(key, std::move(out));
}

void GgufWriter::add_value(const std::string& key, const GgufValue& v) {
  std::vector<uint8_t> out;
  encode_value(out, v);
  add_kv(key, std::move(out));
}

GgufWriter::Array GgufWriter::scalar_array(GgufValueType elem_type, size_t count, const void* le_bytes,
                                           size_t elem_size) {
  Array a;
  a.elem_type = elem_type;
  a.count = count;
  put_bytes(a.payload, le_bytes, count * elem_size);
  return a;
}

GgufWriter::Array GgufWriter::string_array(const std::vector<std::string>& v) {
  Array a;
  a.elem_type = GgufValueType::STRING;
  a.count = v.size();
  size_t total = 0;
  for (const auto& s : v) total += 8 + s.size();
  a.payload.reserve(total);
  for (const auto& s : v) put_string(a.payload, s);
  return a;
}

GgufWriter::Array GgufWriter::nested_array(const std::vector<Array>& v) {
  Array a;
  a.elem_type = GgufValueType::ARRAY;
  a.count = v.size();
  for (const auto& inner : v) {
    put_u32(a.payload, (uint32_t)inner.elem_type);
    put_u64(a.payload, inner.count);
    put_bytes(a.payload, inner.payload.data(), inner.payload.size());
  }
  return a;
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne, FillFn fill) {
  if (name.empty()) fail("GGUF tensor name must not be empty");
  if (name.size() > kMaxTensorName)
    fail("tensor {}: name is {} bytes, longer than ggml's limit of {}", name, name.size(), kMaxTensorName);
  for (const auto& t : tensors_)
    if (t.name == name) fail("duplicate tensor {}", name);
  if (!fill) fail("tensor {}: no fill function", name);
  const TensorLayout layout = tensor_layout(name, type, ne);
  Tensor t{name, type, std::move(ne), std::move(fill), layout.nbytes, pad_to(data_size_, alignment_)};
  data_size_ = pad_to(t.offset + t.nbytes, alignment_);
  tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor_bytes(const std::string& name, GgmlType type, std::vector<int64_t> ne,
                                  std::vector<uint8_t> bytes) {
  const TensorLayout layout = tensor_layout(name, type, ne);
  if (bytes.size() != layout.nbytes)
    fail("tensor {}: {} bytes given, its type and shape need {}", name, bytes.size(), layout.nbytes);
  auto data = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  const size_t row_bytes = layout.row_bytes;
  add_tensor(name, type, std::move(ne), [data, row_bytes](uint8_t* dst, int64_t first_row, int64_t n_rows) {
    std::memcpy(dst, data->data() + (size_t)first_row * row_bytes, (size_t)n_rows * row_bytes);
  });
}

uint64_t GgufWriter::file_size() const {
  uint64_t header = 4 + 4 + 8 + 8;
  for (const auto& [key, encoded] : kv_) header += 8 + key.size() + encoded.size();
  for (const auto& t : tensors_) header += 8 + t.name.size() + 4 + 8 * t.ne.size() + 4 + 8;
  return pad_to(header, alignment_) + data_size_;
}

void GgufWriter::write(const std::string& path, size_t chunk_bytes) const {
  std::vector<uint8_t> header;
  put_bytes(header, "GGUF", 4);
  put_u32(header, kGgufVersion);
  put_u64(header, tensors_.size());
  put_u64(header, kv_.size());
  for (const auto& [key, encoded] : kv_) {
    put_string(header, key);
    put_bytes(header, encoded.data(), encoded.size());
  }
  for (const auto& t : tensors_) {
    put_string(header, t.name);
    put_u32(header, (uint32_t)t.ne.size());
    for (int64_t n : t.ne) put_u64(header, (uint64_t)n);
    put_u32(header, (uint32_t)t.type);
    put_u64(header, t.offset);
  }
  header.resize(pad_to(header.size(), alignment_), 0);
  const uint64_t data_start = header.size();
  const uint64_t total = data_start + data_size_;

  PartialFile file(path);
  file.reserve(total);
  file.write(header.data(), header.size());

  std::vector<uint8_t> buffer;  // one chunk of whole rows, reused across tensors
  for (const auto& t : tensors_) {
    if (file.written() < data_start + t.offset) file.write_zeros(data_start + t.offset - file.written());
    const TensorLayout layout = tensor_layout(t.name, t.type, t.ne);
    const int64_t rows = (int64_t)layout.rows;
    const size_t row_bytes = (size_t)layout.row_bytes;
    const int64_t rows_per_chunk = std::clamp<int64_t>((int64_t)(chunk_bytes / row_bytes), 1, rows);
    if (buffer.size() < (size_t)rows_per_chunk * row_bytes) buffer.resize((size_t)rows_per_chunk * row_bytes);
    for (int64_t first = 0; first < rows; first += rows_per_chunk) {
      const int64_t n = std::min(rows_per_chunk, rows - first);
      try {
        t.fill(buffer.data(), first, n);
      } catch (const std::exception& e) {
        fail("{}: producing tensor {} (rows {}..{}) failed: {}", path, t.name, first, first + n - 1, e.what());
      }
      file.write(buffer.data(), (size_t)n * row_bytes);
    }
  }
  if (file.written() < total) file.write_zeros(total - file.written());
  if (file.written() != total)
    fail("{}: wrote {} bytes, the layout needs {} (writer bug)", path, file.written(), total);
  file.commit();
}

}  // namespace rl
