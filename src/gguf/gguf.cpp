#include "gguf/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/error.h"
#include "common/mapped_file.h"

namespace rl {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kMaxDims = 4;
// Counts read from the file only bound what can fit in it; reserving that much up front would let
// one corrupt count in a multi-GB model ask for tens of GB before any item is read.
constexpr uint64_t kMaxUpfrontReserve = 1 << 16;


bool known_value_type(uint32_t t) { return t <= (uint32_t)GgufValueType::FLOAT64; }

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

size_t gguf_value_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16: case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32: case GgufValueType::INT32: case GgufValueType::FLOAT32: return 4;
    case GgufValueType::UINT64: case GgufValueType::INT64: case GgufValueType::FLOAT64: return 8;
    default: return 0;
  }
}

const char* gguf_value_type_name(GgufValueType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                "string", "array", "u64", "i64", "f64"};
  uint32_t i = (uint32_t)t;
  return i < 13 ? names[i] : "unknown";
}

// Sequential, bounds-checked reader over the file image. Every failure names the offset.
class GgufParser {
 public:
  GgufParser(GgufFile& f) : f_(f), p_(f.bytes_.data()), size_(f.bytes_.size()) {}

  void parse() {
    if (size_ < 4) error("file too small for a GGUF header ({} bytes)", size_);
    uint32_t magic = u32();
    if (magic != kMagic) {
      pos_ = 0;
      error("not a GGUF file (magic {:02x} {:02x} {:02x} {:02x}, expected 'GGUF')", p_[0], p_[1],
            p_[2], p_[3]);
    }
    uint32_t version = u32();
    if (version == 1) error("GGUF version 1 is not supported (only 2 and 3)");
    if (version != 2 && version != 3) {
      if ((version & 0xffff) == 0 && version != 0)
        error("GGUF version {:#x} looks big-endian; only little-endian files are supported", version);
      error("unsupported GGUF version {} (supported: 2, 3)", version);
    }
    f_.version_ = version;
    const uint64_t n_tensors = u64();
    const uint64_t n_kv = u64();
    // Each kv needs at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at least 8+4+8+4+8.
    if (n_kv > remaining() / 13) error("metadata count {} cannot fit in the file", n_kv);
    if (n_tensors > remaining() / 32) error("tensor count {} cannot fit in the file", n_tensors);

    f_.kv_.reserve(std::min(n_kv, kMaxUpfrontReserve));
    for (uint64_t i = 0; i < n_kv; i++) {
      const size_t key_pos = pos_;
      std::string_view key = str("metadata key");
      if (key.empty()) error_at(key_pos, "metadata key #{} is empty", i);
      const uint32_t type = u32();
      if (!known_value_type(type)) error("key '{}': unknown value type {}", key, type);
      GgufKV kv{std::string(key), {}};
      value(kv.value, (GgufValueType)type, key, 0);
      f_.kv_.push_back(std::move(kv));
    }
    index_kv();

    if (const GgufValue* a = f_.find("general.alignment")) {
      if (a->type() != GgufValueType::UINT32 && a->type() != GgufValueType::UINT64 &&
          a->type() != GgufValueType::INT32)
        fail("{}: general.alignment has type {}, expected u32", f_.path_, gguf_value_type_name(a->type()));
      if (a->type() == GgufValueType::UINT64 && a->as_uint() > (1u << 30))
        fail("{}: general.alignment = {} is not a power of two up to 2^30", f_.path_, a->as_uint());
      int64_t al = a->as_int();
      if (al <= 0 || (al & (al - 1)) != 0 || al > (1 << 30))
        fail("{}: general.alignment = {} is not a power of two", f_.path_, al);
      f_.alignment_ = (uint64_t)al;
    }

    f_.tensors_.reserve(std::min(n_tensors, kMaxUpfrontReserve));
    for (uint64_t i = 0; i < n_tensors; i++) tensor_info(i);

    uint64_t data = pos_;
    data = (data + f_.alignment_ - 1) / f_.alignment_ * f_.alignment_;
    if (data > size_ && n_tensors > 0) error("data section at {} starts past the end of the file", data);
    f_.data_offset_ = data;
    const uint64_t data_size = size_ > data ? size_ - data : 0;
    for (auto& t : f_.tensors_) {
      if (t.offset % f_.alignment_ != 0)
        fail("{}: tensor '{}': data offset {} is not aligned to {}", f_.path_, t.name, t.offset,
             f_.alignment_);
      if (t.offset > data_size || t.nbytes > data_size - t.offset)
        fail("{}: tensor '{}': data [{}, +{}) lies outside the file's data section ({} bytes; file "
             "truncated?)",
             f_.path_, t.name, t.offset, t.nbytes, data_size);
      t.data = p_ + data + t.offset;
    }
    index_tensors();
  }

 private:
  template <class... Args>
  [[noreturn]] void error(fmt::format_string<Args...> f, Args&&... args) {
    error_at(pos_, f, std::forward<Args>(args)...);
  }
  template <class... Args>
  [[noreturn]] void error_at(size_t at, fmt::format_string<Args...> f, Args&&... args) {
    throw Error(fmt::format("{}: at offset {}: {}", f_.path_, at,
                            fmt::format(f, std::forward<Args>(args)...)));
  }

  size_t remaining() const { return size_ - pos_; }
  void need(uint64_t n, const char* what) {
    if (n > remaining()) error("truncated: {} needs {} bytes, {} left", what, n, remaining());
  }
  uint8_t u8() { need(1, "a u8"); return p_[pos_++]; }
  uint32_t u32() { need(4, "a u32"); uint32_t v = load<uint32_t>(p_ + pos_); pos_ += 4; return v; }
  uint64_t u64() { need(8, "a u64"); uint64_t v = load<uint64_t>(p_ + pos_); pos_ += 8; return v; }

  std::string_view str(const char* what) {
    const uint64_t n = u64();
    if (n > remaining()) error("truncated or corrupt {}: length {} but {} bytes left", what, n, remaining());
    std::string_view s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return s;
  }

  void scalar(GgufValue& v, GgufValueType t) {
    const size_t n = gguf_value_size(t);
    need(n, gguf_value_type_name(t));
    const uint8_t* q = p_ + pos_;
    switch (t) {
      case GgufValueType::UINT8: v.u_ = q[0]; v.i_ = q[0]; break;
      case GgufValueType::INT8: v.i_ = (int8_t)q[0]; break;
      case GgufValueType::BOOL:
        if (q[0] > 1) error("bool value {} is neither 0 nor 1", q[0]);
        v.u_ = v.i_ = q[0];
        break;
      case GgufValueType::UINT16: v.u_ = load<uint16_t>(q); v.i_ = (int64_t)v.u_; break;
      case GgufValueType::INT16: v.i_ = load<int16_t>(q); break;
      case GgufValueType::UINT32: v.u_ = load<uint32_t>(q); v.i_ = (int64_t)v.u_; break;
      case GgufValueType::INT32: v.i_ = load<int32_t>(q); break;
      case GgufValueType::UINT64: v.u_ = load<uint64_t>(q); v.i_ = (int64_t)v.u_; break;
      case GgufValueType::INT64: v.i_ = load<int64_t>(q); break;
      case GgufValueType::FLOAT32: v.f_ = load<float>(q); break;
      case GgufValueType::FLOAT64: v.f_ = load<double>(q); break;
      default: error("internal: not a scalar type");
    }
    if (t == GgufValueType::INT8 || t == GgufValueType::INT16 || t == GgufValueType::INT32 ||
        t == GgufValueType::INT64)
      v.u_ = (uint64_t)v.i_;
    pos_ += n;
  }

  void value(GgufValue& v, GgufValueType t, std::string_view key, int depth) {
    v.type_ = t;
    if (t == GgufValueType::STRING) {
      v.str_ = str("string value");
      return;
    }
    if (t != GgufValueType::ARRAY) {
      scalar(v, t);
      return;
    }
    if (depth >= kMaxArrayDepth) error("key '{}': arrays nested deeper than {}", key, kMaxArrayDepth);
    const uint32_t et = u32();
    if (!known_value_type(et)) error("key '{}': unknown array element type {}", key, et);
    v.elem_type_ = (GgufValueType)et;
    const uint64_t count = u64();
    if (v.elem_type_ == GgufValueType::STRING) {
      if (count > remaining() / 8) error("key '{}': string array of {} items cannot fit", key, count);
      v.strings_.reserve(std::min(count, kMaxUpfrontReserve));
      for (uint64_t i = 0; i < count; i++) v.strings_.push_back(str("string array item"));
    } else if (v.elem_type_ == GgufValueType::ARRAY) {
      if (count > remaining() / 12) error("key '{}': nested array of {} items cannot fit", key, count);
      v.items_.reserve(std::min(count, kMaxUpfrontReserve));
      for (uint64_t i = 0; i < count; i++) value(v.items_.emplace_back(), GgufValueType::ARRAY, key, depth + 1);
    } else {
      const size_t es = gguf_value_size(v.elem_type_);
      if (count > remaining() / es)
        error("key '{}': array of {} x {} cannot fit in the {} bytes left", key, count,
              gguf_value_type_name(v.elem_type_), remaining());
      v.raw_ = p_ + pos_;
      if (v.elem_type_ == GgufValueType::BOOL)
        for (uint64_t i = 0; i < count; i++)
          if (v.raw_[i] > 1) error("key '{}': bool item {} is {}", key, i, v.raw_[i]);
      pos_ += count * es;
    }
    v.count_ = count;
  }

  void tensor_info(uint64_t index) {
    const size_t at = pos_;
    GgufTensorInfo t;
    std::string_view name = str("tensor name");
    if (name.empty()) error_at(at, "tensor #{} has an empty name", index);
    t.name = std::string(name);
    t.n_dims = u32();
    if (t.n_dims == 0 || t.n_dims > kMaxDims)
      error("tensor '{}': {} dimensions (supported: 1 to {})", t.name, t.n_dims, kMaxDims);
    int64_t total = 1;
    for (uint32_t d = 0; d < t.n_dims; d++) {
      const uint64_t n = u64();
      if (n > (uint64_t)std::numeric_limits<int64_t>::max())
        error("tensor '{}': dimension {} = {} is negative", t.name, d, (int64_t)n);
      // An empty tensor has no rows: row_bytes() would divide by zero in every consumer.
      if (n == 0) error("tensor '{}': dimension {} is 0", t.name, d);
      t.ne[d] = (int64_t)n;
      if (__builtin_mul_overflow(total, t.ne[d], &total))
        error("tensor '{}': element count overflows", t.name);
    }
    const uint32_t type = u32();
    const QuantType* qt = find_quant_type(type);
    if (!qt) error("tensor '{}': unknown ggml type {}", t.name, type);
    t.type = qt->type;
    if (t.ne[0] % qt->block_size != 0)
      error("tensor '{}': row length {} is not a multiple of the {} block size {}", t.name, t.ne[0],
            qt->name, qt->block_size);
    uint64_t nbytes = 0;
    const uint64_t blocks = (uint64_t)total / (uint64_t)qt->block_size;
    if (__builtin_mul_overflow(blocks, (uint64_t)qt->type_size, &nbytes))
      error("tensor '{}': byte size overflows", t.name);
    t.nbytes = nbytes;
    t.offset = u64();
    f_.tensors_.push_back(std::move(t));
  }

  void index_kv() {
    auto& idx = f_.kv_index_;
    for (size_t i = 0; i < f_.kv_.size(); i++) idx.emplace_back(f_.kv_[i].key, i);
    std::sort(idx.begin(), idx.end());
    for (size_t i = 1; i < idx.size(); i++)
      if (idx[i].first == idx[i - 1].first) fail("{}: duplicate metadata key '{}'", f_.path_, idx[i].first);
  }
  void index_tensors() { f_.build_tensor_index(); }

  GgufFile& f_;
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
};

// ---- GgufValue ----------------------------------------------------------------------------

bool GgufValue::is_integer() const {
  switch (type_) {
    case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::UINT16:
    case GgufValueType::INT16: case GgufValueType::UINT32: case GgufValueType::INT32:
    case GgufValueType::UINT64: case GgufValueType::INT64: return true;
    default: return false;
  }
}

static bool is_unsigned(GgufValueType t) {
  return t == GgufValueType::UINT8 || t == GgufValueType::UINT16 || t == GgufValueType::UINT32 ||
         t == GgufValueType::UINT64;
}

uint64_t GgufValue::as_uint() const {
  if (!is_integer()) fail("expected an integer, found {}", gguf_value_type_name(type_));
  if (!is_unsigned(type_) && i_ < 0) fail("expected a non-negative integer, found {}", i_);
  return u_;
}

int64_t GgufValue::as_int() const {
  if (!is_integer()) fail("expected an integer, found {}", gguf_value_type_name(type_));
  if (type_ == GgufValueType::UINT64 && u_ > (uint64_t)std::numeric_limits<int64_t>::max())
    fail("integer {} does not fit in int64", u_);
  return i_;
}

double GgufValue::as_float() const {
  if (is_float()) return f_;
  if (is_integer()) return is_unsigned(type_) ? (double)u_ : (double)i_;
  fail("expected a number, found {}", gguf_value_type_name(type_));
}

bool GgufValue::as_bool() const {
  if (type_ != GgufValueType::BOOL) fail("expected a bool, found {}", gguf_value_type_name(type_));
  return u_ != 0;
}

std::string_view GgufValue::as_string() const {
  if (type_ != GgufValueType::STRING) fail("expected a string, found {}", gguf_value_type_name(type_));
  return str_;
}

int64_t GgufValue::int_at(size_t i) const {
  if (!is_array() || i >= count_) fail("array index {} out of range ({} items)", i, count_);
  const uint8_t* q = raw_;
  switch (elem_type_) {
    case GgufValueType::UINT8: case GgufValueType::BOOL: return q[i];
    case GgufValueType::INT8: return (int8_t)q[i];
    case GgufValueType::UINT16: return load<uint16_t>(q + 2 * i);
    case GgufValueType::INT16: return load<int16_t>(q + 2 * i);
    case GgufValueType::UINT32: return load<uint32_t>(q + 4 * i);
    case GgufValueType::INT32: return load<int32_t>(q + 4 * i);
    case GgufValueType::UINT64: return (int64_t)load<uint64_t>(q + 8 * i);
    case GgufValueType::INT64: return load<int64_t>(q + 8 * i);
    default: fail("expected an integer array, found an array of {}", gguf_value_type_name(elem_type_));
  }
}

double GgufValue::float_at(size_t i) const {
  if (!is_array() || i >= count_) fail("array index {} out of range ({} items)", i, count_);
  if (elem_type_ == GgufValueType::FLOAT32) return load<float>(raw_ + 4 * i);
  if (elem_type_ == GgufValueType::FLOAT64) return load<double>(raw_ + 8 * i);
  return (double)int_at(i);
}

std::string_view GgufValue::str_at(size_t i) const {
  if (!is_array() || elem_type_ != GgufValueType::STRING)
    fail("expected a string array, found {}", gguf_value_type_name(is_array() ? elem_type_ : type_));
  if (i >= count_) fail("array index {} out of range ({} items)", i, count_);
  return strings_[i];
}

const GgufValue& GgufValue::array_at(size_t i) const {
  if (!is_array() || elem_type_ != GgufValueType::ARRAY) fail("expected an array of arrays");
  if (i >= count_) fail("array index {} out of range ({} items)", i, count_);
  return items_[i];
}

std::string GgufValue::to_string(size_t max_items) const {
  switch (type_) {
    case GgufValueType::STRING: return fmt::format("\"{}\"", str_);
    case GgufValueType::BOOL: return u_ ? "true" : "false";
    case GgufValueType::FLOAT32: return fmt::format("{}", (float)f_);
    case GgufValueType::FLOAT64: return fmt::format("{}", f_);
    case GgufValueType::ARRAY: {
      std::string s = "[";
      const size_t n = std::min(count_, max_items);
      for (size_t i = 0; i < n; i++) {
        if (i) s += ", ";
        if (elem_type_ == GgufValueType::STRING) s += fmt::format("\"{}\"", strings_[i]);
        else if (elem_type_ == GgufValueType::ARRAY) s += items_[i].to_string(max_items);
        else if (elem_type_ == GgufValueType::FLOAT32 || elem_type_ == GgufValueType::FLOAT64)
          s += fmt::format("{}", float_at(i));
        else if (elem_type_ == GgufValueType::UINT64) s += fmt::format("{}", (uint64_t)int_at(i));
        else s += fmt::format("{}", int_at(i));
      }
      if (count_ > n) s += fmt::format(", ... {} items", count_);
      return s + "]";
    }
    default:
      return is_unsigned(type_) ? fmt::format("{}", u_) : fmt::format("{}", i_);
  }
}

// ---- GgufTensorInfo / GgufFile ----------------------------------------------------------------

std::string GgufTensorInfo::shape_string() const {
  std::string s = fmt::format("{}", ne[0]);
  for (uint32_t d = 1; d < n_dims; d++) s += fmt::format(" x {}", ne[d]);
  return s;
}

GgufFile::~GgufFile() = default;

void GgufFile::check_intact() const {
  if (map_) map_->check_intact();
  for (const auto& s : shards_) s->check_intact();
}

std::unique_ptr<GgufFile> GgufFile::open_one(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->map_ = std::make_unique<MappedFile>(path);
  f->bytes_ = f->map_->bytes();
  GgufParser(*f).parse();
  return f;
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f = open_one(path);
  f->open_split_shards();
  return f;
}

void GgufFile::build_tensor_index() {
  tensor_index_.clear();
  for (size_t i = 0; i < tensors_.size(); i++) tensor_index_.emplace_back(tensors_[i].name, i);
  std::sort(tensor_index_.begin(), tensor_index_.end());
  for (size_t i = 1; i < tensor_index_.size(); i++)
    if (tensor_index_[i].first == tensor_index_[i - 1].first)
      fail("{}: duplicate tensor name '{}'", path_, tensor_index_[i].first);
}

std::vector<GgufFile::Mapping> GgufFile::mappings() const {
  std::vector<Mapping> out{{path_, bytes_.data(), bytes_.size()}};
  for (const auto& s : shards_) out.push_back({s->path_, s->bytes_.data(), s->bytes_.size()});
  return out;
}

std::unique_ptr<GgufFile> GgufFile::from_bytes(std::span<const uint8_t> bytes, std::string name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(name);
  f->bytes_ = bytes;
  GgufParser(*f).parse();
  return f;
}

template <class Vec>
static const typename Vec::value_type* lookup(const Vec& idx, std::string_view key) {
  auto it = std::lower_bound(idx.begin(), idx.end(), key,
                             [](const auto& e, std::string_view k) { return e.first < k; });
  return (it != idx.end() && it->first == key) ? &*it : nullptr;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto* e = lookup(kv_index_, key);
  return e ? &kv_[e->second].value : nullptr;
}

const GgufValue& GgufFile::get(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) fail("{}: missing metadata key '{}'", path_, key);
  return *v;
}

uint64_t GgufFile::get_uint(std::string_view key, uint64_t def) const {
  const GgufValue* v = find(key);
  if (!v) return def;
  try {
    return v->as_uint();
  } catch (const Error& e) {
    fail("{}: metadata key '{}': {}", path_, key, e.what());
  }
}

double GgufFile::get_float(std::string_view key, double def) const {
  const GgufValue* v = find(key);
  if (!v) return def;
  try {
    return v->as_float();
  } catch (const Error& e) {
    fail("{}: metadata key '{}': {}", path_, key, e.what());
  }
}

std::string GgufFile::get_string(std::string_view key, std::string_view def) const {
  const GgufValue* v = find(key);
  if (!v) return std::string(def);
  try {
    return std::string(v->as_string());
  } catch (const Error& e) {
    fail("{}: metadata key '{}': {}", path_, key, e.what());
  }
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto* e = lookup(tensor_index_, name);
  return e ? &tensors_[e->second] : nullptr;
}

const GgufTensorInfo& GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t) fail("{}: missing tensor '{}'", path_, name);
  return *t;
}

}  // namespace rl
