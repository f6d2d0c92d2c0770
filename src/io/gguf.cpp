#include "io/gguf.h"

#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "core/error.h"
#include "io/tmp_cleanup.h"

namespace ultra::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF is read and written in host byte order");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // the bytes "GGUF" read as a little-endian u32
constexpr uint32_t kWriteVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 16;  // arrays of arrays of ...; real files use at most one level
constexpr const char* kAlignmentKey = "general.alignment";
constexpr size_t kMaxWrittenNameBytes = 63;

// Smallest encoding of one value of type t, used to bound counts by the bytes left before trusting them.
uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::BOOL:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
      return 8;
    case ValueType::STRING:
      return 8;  // u64 length, then the bytes
    case ValueType::ARRAY:
      return 12;  // u32 element type, u64 count, then the elements
  }
  return 1;
}

bool is_known_value_type(uint32_t t) {
  return t <= (uint32_t)ValueType::F64;
}

bool is_unsigned_int(ValueType t) {
  return t == ValueType::U8 || t == ValueType::U16 || t == ValueType::U32 || t == ValueType::U64;
}
bool is_signed_int(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}
bool is_float(ValueType t) {
  return t == ValueType::F32 || t == ValueType::F64;
}

uint64_t align_up(uint64_t x, uint64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}
bool is_valid_alignment(uint64_t a) {
  return a != 0 && (a & (a - 1)) == 0 && a <= 0x80000000u;
}

// Bounds-checked little-endian reads over the whole buffer; every failure names the file and the offset.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& name) : data_(data), size_(size), name_(name) {}

  const std::string& name() const { return name_; }
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  void need(uint64_t n, std::string_view what) const {
    if (n > left()) {
      fail("{}: truncated: {} at offset {} needs {} bytes but only {} remain (file size {})", name_, what,
           pos_, n, left(), size_);
    }
  }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // u64 length, then that many bytes (not NUL-terminated, not checked for UTF-8), as a view of the buffer.
  std::string_view read_string_view(std::string_view what) {
    const uint64_t n = read<uint64_t>(what);
    if (n > left()) {
      fail("{}: {} at offset {} has length {} but only {} bytes remain (file size {})", name_, what, pos_ - 8,
           n, left(), size_);
    }
    const std::string_view s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  std::string read_string(std::string_view what) { return std::string(read_string_view(what)); }

  // The next n bytes (checked), skipped over.
  const uint8_t* take(uint64_t n, std::string_view what) {
    need(n, what);
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& name_;
};

// Header, 24 bytes: char magic[4] = "GGUF"; u32 version; u64 n_tensors; u64 n_kv.
// (GGUF v1 had u32 counts; v3 only added big-endian files, which announce themselves by a swapped version.)
struct Header {
  uint32_t version = 0;
  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
};

// Smallest key/value pair: u64 key length (empty key), u32 value type, 1-byte value.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
// Smallest tensor info: u64 name length (empty name), u32 n_dims, one u64 dim, u32 type, u64 offset.
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

Header read_header(Cursor& c) {
  if (c.left() < 4) fail("{}: not a GGUF file: {} bytes, too short for the magic", c.name(), c.left());
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic) fail("{}: not a GGUF file: bad magic 0x{:08x} (expected \"GGUF\")", c.name(), magic);
  Header h;
  h.version = c.read<uint32_t>("version");
  if (h.version == 1) {
    fail("{}: unsupported GGUF version 1 (only 2 and 3 are read; re-convert the model)", c.name());
  }
  if (__builtin_bswap32(h.version) == 2 || __builtin_bswap32(h.version) == 3) {
    fail("{}: unsupported GGUF version {}: big-endian GGUF files are not supported", c.name(), h.version);
  }
  if (h.version != 2 && h.version != 3) fail("{}: unsupported GGUF version {}", c.name(), h.version);
  h.n_tensors = c.read<uint64_t>("tensor count");
  h.n_kv = c.read<uint64_t>("key/value count");
  if (h.n_kv > c.left() / kMinKvBytes) {
    fail("{}: header claims {} key/value pairs but only {} bytes follow (each pair needs at least {})",
         c.name(), h.n_kv, c.left(), kMinKvBytes);
  }
  if (h.n_tensors > c.left() / kMinTensorInfoBytes) {
    fail("{}: header claims {} tensor infos but only {} bytes follow (each needs at least {})", c.name(),
         h.n_tensors, c.left(), kMinTensorInfoBytes);
  }
  if (h.n_kv > Reader::kMaxKeyValues) {
    fail("{}: header claims {} key/value pairs, more than the limit of {}", c.name(), h.n_kv,
         Reader::kMaxKeyValues);
  }
  if (h.n_tensors > Reader::kMaxTensors) {
    fail("{}: header claims {} tensors, more than the limit of {}", c.name(), h.n_tensors,
         Reader::kMaxTensors);
  }
  return h;
}

// Value encodings: integers and floats as their little-endian bytes; bool as one byte 0 or 1;
// string as u64 length + bytes; array as u32 element type, u64 count, then count values of that element type
// (no per-element type tag; an element type of ARRAY means each element is itself a typed, counted array).
// nested_left: how many more elements of arrays of arrays the file may hold (Reader::kMaxNestedArrays).
Value read_value(Cursor& c, ValueType type, std::string_view what, int depth, uint64_t& nested_left) {
  switch (type) {
    case ValueType::U8:
      return Value::of_uint(type, c.read<uint8_t>(what));
    case ValueType::U16:
      return Value::of_uint(type, c.read<uint16_t>(what));
    case ValueType::U32:
      return Value::of_uint(type, c.read<uint32_t>(what));
    case ValueType::U64:
      return Value::of_uint(type, c.read<uint64_t>(what));
    case ValueType::I8:
      return Value::of_int(type, c.read<int8_t>(what));
    case ValueType::I16:
      return Value::of_int(type, c.read<int16_t>(what));
    case ValueType::I32:
      return Value::of_int(type, c.read<int32_t>(what));
    case ValueType::I64:
      return Value::of_int(type, c.read<int64_t>(what));
    case ValueType::F32:
      return Value::of_float(type, c.read<float>(what));
    case ValueType::F64:
      return Value::of_float(type, c.read<double>(what));
    case ValueType::BOOL: {
      const uint8_t b = c.read<uint8_t>(what);
      if (b > 1) fail("{}: {} at offset {} is a bool with invalid value {}", c.name(), what, c.pos() - 1, b);
      return Value::of_bool(b != 0);
    }
    case ValueType::STRING:
      return Value::of_string(c.read_string(what));
    case ValueType::ARRAY:
      break;
  }
  if (depth >= kMaxArrayDepth) {
    fail("{}: {} at offset {}: arrays nested deeper than {} levels", c.name(), what, c.pos(), kMaxArrayDepth);
  }
  const uint32_t elem = c.read<uint32_t>(what);
  if (!is_known_value_type(elem)) {
    fail("{}: {} at offset {} is an array of unknown value type {}", c.name(), what, c.pos() - 4, elem);
  }
  const auto elem_type = static_cast<ValueType>(elem);
  const uint64_t n = c.read<uint64_t>(what);
  const uint64_t at = c.pos() - 8;
  if (n > c.left() / min_value_bytes(elem_type)) {
    fail("{}: {} at offset {} claims {} {} elements but only {} bytes remain", c.name(), what, at, n,
         value_type_name(elem_type), c.left());
  }
  if (const size_t sz = scalar_size(elem_type)) {  // numbers and bools: a view of the bytes
    const uint8_t* p = c.take(n * sz, what);       // no overflow: n * sz <= bytes left
    if (elem_type == ValueType::BOOL) {
      for (uint64_t k = 0; k < n; ++k) {
        if (p[k] > 1) {
          fail("{}: {} at offset {} is a bool with invalid value {}", c.name(), what, c.pos() - n + k, p[k]);
        }
      }
    }
    return Value::of_array(Array::view_scalars(elem_type, p, n));
  }
  if (elem_type == ValueType::STRING) {
    std::vector<std::string_view> strings;
    strings.reserve(n);  // 16 bytes each, for at least 8 bytes of file each (n <= bytes left / 8)
    for (uint64_t k = 0; k < n; ++k) strings.push_back(c.read_string_view(what));
    return Value::of_array(Array::view_strings(std::move(strings)));
  }
  if (n > nested_left) {
    fail("{}: {} at offset {}: arrays of arrays hold more than {} elements in this file", c.name(), what, at,
         Reader::kMaxNestedArrays);
  }
  nested_left -= n;
  std::vector<Value> items;
  items.reserve(n);  // bounded by kMaxNestedArrays
  for (uint64_t k = 0; k < n; ++k) items.push_back(read_value(c, elem_type, what, depth + 1, nested_left));
  return Value::of_array(Array::of_arrays(std::move(items)));
}

// Key/value pair: string key; u32 value type; value.
void read_kvs(Cursor& c, uint64_t n_kv, std::vector<std::pair<std::string, Value>>& kv,
              std::unordered_map<std::string, size_t>& index) {
  kv.reserve(n_kv);  // bounded by read_header
  uint64_t nested_left = Reader::kMaxNestedArrays;
  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t at = c.pos();
    std::string key = c.read_string(fmt::format("key #{}", k));
    const std::string what = fmt::format("value of key '{}'", key);
    const uint32_t type = c.read<uint32_t>(what);
    if (!is_known_value_type(type)) {
      fail("{}: key '{}' at offset {} has unknown value type {}", c.name(), key, at, type);
    }
    Value v = read_value(c, static_cast<ValueType>(type), what, 0, nested_left);
    if (!index.emplace(key, kv.size()).second) fail("{}: duplicate key '{}' at offset {}", c.name(), key, at);
    kv.emplace_back(std::move(key), std::move(v));
  }
}

// general.alignment: u32, a non-zero power of two; 32 when absent.
uint64_t read_alignment(const std::string& name, const Value* v) {
  if (!v) return kDefaultAlignment;
  if (v->type != ValueType::U32) {
    fail("{}: key '{}' has type {}, expected u32", name, kAlignmentKey, value_type_name(v->type));
  }
  if (!is_valid_alignment(v->u)) {
    fail("{}: key '{}' must be a non-zero power of two, got {}", name, kAlignmentKey, v->u);
  }
  return v->u;
}

struct TensorSize {
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
};

// Elements and bytes of a tensor; `where` prefixes the messages ("<file>: tensor '<name>'").
// Checks: 1..4 dims, every dim >= 1, element count below 2^63, known type, ne[0] a multiple of the block
// size, byte count without overflow.
TensorSize tensor_size(std::string_view where, const std::vector<uint64_t>& ne, uint32_t type_id) {
  if (ne.empty() || ne.size() > kMaxDims) {
    fail("{} has {} dims, expected 1 to {}", where, ne.size(), kMaxDims);
  }
  TensorSize ts{1, 0};
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] == 0) {
      fail("{} has ne[{}] = 0; every dim must be >= 1 (shape [{}])", where, d, fmt::join(ne, ", "));
    }
    if (__builtin_mul_overflow(ts.n_elements, ne[d], &ts.n_elements) ||
        ts.n_elements > (uint64_t)std::numeric_limits<int64_t>::max()) {
      fail("{}: element count of shape [{}] overflows", where, fmt::join(ne, ", "));
    }
  }
  const auto type = static_cast<GgmlType>(type_id);
  const auto tt = type_traits(type);
  if (!tt)
    fail(
        "{} has unknown tensor type id {} (0x{:x}): neither a ggml_type this reader knows nor one of ultra's "
        "own "
        "(F8_E4M3 = 0x55540001, TERNARY = 0x55540002; docs/QUANTIZATION.md)",
        where, type_id, type_id);
  if (ne[0] % tt->block_elems != 0) {
    fail("{}: row length ne[0] = {} is not a multiple of the {} block size {}", where, ne[0], tt->name,
         tt->block_elems);
  }
  const uint64_t n_blocks = ts.n_elements / tt->block_elems;
  if (__builtin_mul_overflow(n_blocks, (uint64_t)tt->block_bytes, &ts.n_bytes)) {
    fail("{}: byte size of shape [{}] of type {} overflows", where, fmt::join(ne, ", "), tt->name);
  }
  return ts;
}

// Tensor info: string name; u32 n_dims; u64 ne[n_dims]; u32 type (ggml_type); u64 offset (from the data
// section).
TensorInfo read_tensor_info(Cursor& c, uint64_t k) {
  const uint64_t at = c.pos();
  TensorInfo t;
  t.name = c.read_string(fmt::format("name of tensor #{}", k));
  const std::string what = fmt::format("tensor '{}'", t.name);
  const std::string where = fmt::format("{}: {}", c.name(), what);
  const uint32_t n_dims = c.read<uint32_t>(what);
  if (n_dims == 0 || n_dims > kMaxDims) {
    fail("{} (info at offset {}) has {} dims, expected 1 to {}", where, at, n_dims, kMaxDims);
  }
  t.ne.resize(n_dims);
  for (auto& d : t.ne) d = c.read<uint64_t>(what);
  const uint32_t type = c.read<uint32_t>(what);
  t.offset = c.read<uint64_t>(what);
  const TensorSize ts = tensor_size(where, t.ne, type);
  t.type = static_cast<GgmlType>(type);
  t.n_elements = ts.n_elements;
  t.n_bytes = ts.n_bytes;
  return t;
}

// Data section: starts at the end of the tensor infos rounded up to the alignment and runs to the end of the
// file. Each tensor's [offset, offset + n_bytes) must be aligned and lie inside it.
void place_tensors(const std::string& name, const uint8_t* data, uint64_t size, uint64_t data_start,
                   uint64_t alignment, std::vector<TensorInfo>& tensors) {
  const uint64_t data_size = data_start < size ? size - data_start : 0;
  for (auto& t : tensors) {
    if (t.offset % alignment != 0) {
      fail("{}: tensor '{}' offset {} is not a multiple of the alignment {}", name, t.name, t.offset,
           alignment);
    }
    if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
      fail("{}: tensor '{}' data [offset {}, {} bytes] lies outside the file (size {}, data section at {})",
           name, t.name, t.offset, t.n_bytes, size, data_start);
    }
    t.data = data + data_start + t.offset;
  }
  // No two tensors may share bytes (llama.cpp's writer packs them; a crafted file could alias weights).
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors.size());
  for (const auto& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->n_bytes < b->n_bytes;
  });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const TensorInfo& a = *by_offset[k - 1];
    const TensorInfo& b = *by_offset[k];
    if (b.offset < a.offset + a.n_bytes) {
      fail("{}: tensors '{}' [offset {}, {} bytes] and '{}' [offset {}, {} bytes] overlap", name, a.name,
           a.offset, a.n_bytes, b.name, b.offset, b.n_bytes);
    }
  }
}

// Names the writer accepts: unique, and shorter than llama.cpp's GGML_MAX_NAME (64 bytes with the NUL).
void check_new_tensor_name(const std::string& name, bool duplicate) {
  if (duplicate) fail("gguf writer: duplicate tensor '{}'", name);
  if (name.size() > kMaxWrittenNameBytes) {
    fail("gguf writer: tensor name '{}' is {} bytes, more than llama.cpp's limit of {}", name, name.size(),
         kMaxWrittenNameBytes);
  }
}

[[noreturn]] void wrong_type(const char* expected, ValueType got) {
  fail("GGUF value has type {}, expected {}", value_type_name(got), expected);
}

// Byte-level encoding shared by the header, key/values and tensor infos.
class Encoder {
 public:
  std::vector<uint8_t> bytes;

  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void put_string(std::string_view s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void put_value(const std::string& key, const Value& v) {
    switch (v.type) {
      case ValueType::U8:
        put<uint8_t>((uint8_t)v.u);
        break;
      case ValueType::U16:
        put<uint16_t>((uint16_t)v.u);
        break;
      case ValueType::U32:
        put<uint32_t>((uint32_t)v.u);
        break;
      case ValueType::U64:
        put<uint64_t>(v.u);
        break;
      case ValueType::I8:
        put<int8_t>((int8_t)v.i);
        break;
      case ValueType::I16:
        put<int16_t>((int16_t)v.i);
        break;
      case ValueType::I32:
        put<int32_t>((int32_t)v.i);
        break;
      case ValueType::I64:
        put<int64_t>(v.i);
        break;
      case ValueType::F32:
        put<float>((float)v.f);
        break;
      case ValueType::F64:
        put<double>(v.f);
        break;
      case ValueType::BOOL:
        put<uint8_t>(v.u != 0 ? 1 : 0);
        break;
      case ValueType::STRING:
        put_string(v.s);
        break;
      case ValueType::ARRAY: {
        static const Array kEmpty;
        const Array& a = v.arr ? *v.arr : kEmpty;
        put<uint32_t>((uint32_t)a.elem_type);
        put<uint64_t>(a.size());
        if (a.empty()) break;
        if (const size_t sz = scalar_size(a.elem_type)) {
          bytes.insert(bytes.end(), a.raw(), a.raw() + a.size() * sz);
        } else if (a.elem_type == ValueType::STRING) {
          for (size_t k = 0; k < a.size(); ++k) put_string(a.string_at(k));
        } else {
          for (size_t k = 0; k < a.size(); ++k) put_value(key, a.array_at(k));
        }
        break;
      }
      default:
        fail("gguf writer: key '{}' has unknown value type {}", key, (uint32_t)v.type);
    }
  }
  void pad_to(uint64_t alignment) { bytes.resize(align_up(bytes.size(), alignment), 0); }
};

// Output file written under a unique temporary name in the destination's directory (so that the final
// rename stays within one file system and two writers never share it) and renamed over the destination by
// commit(); removed on every other path (an exception from a producer, a failed write or rename), and
// registered with io/tmp_cleanup.h so that a program ended by SIGINT/SIGTERM/SIGHUP removes it too.
class TmpFile {
 public:
  explicit TmpFile(const std::string& path) : path_(path) {
    check_output_path(path);
    const std::filesystem::path p(path);
    const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
    tmp_ = (dir / ("." + p.filename().string() + ".tmp.XXXXXX")).string();
    int fd = -1;
    {
      const io::SignalBlock block;  // no signal between creating the file and registering it
      fd = ::mkstemp(tmp_.data());
      if (fd >= 0) slot_ = io::register_tmp(tmp_.c_str());
    }
    if (fd < 0) fail("{}: cannot create a temporary file {}: {}", path, tmp_, std::strerror(errno));
    created_ = true;
    // mkstemp creates the file 0600; give it the mode a plain create would (0666 minus the umask).
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::fchmod(fd, 0666 & ~mask);
    f_ = ::fdopen(fd, "wb");
    if (!f_) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp_.c_str());
      created_ = false;
      io::unregister_tmp(std::exchange(slot_, -1));
      fail("{}: cannot open {}: {}", path, tmp_, std::strerror(e));
    }
  }
  ~TmpFile() {
    if (f_) std::fclose(f_);
    if (created_ && !committed_) ::unlink(tmp_.c_str());
    io::unregister_tmp(slot_);  // after the unlink: a signal before it still removes the file
  }
  TmpFile(const TmpFile&) = delete;
  TmpFile& operator=(const TmpFile&) = delete;

  void write(const void* p, uint64_t n) {
    if (n > 0 && std::fwrite(p, 1, n, f_) != n) fail("{}: write failed: {}", tmp_, std::strerror(errno));
  }
  void write_zeros(uint64_t n) {
    static const uint8_t zeros[256] = {};
    while (n > 0) {
      const uint64_t k = std::min<uint64_t>(n, sizeof(zeros));
      write(zeros, k);
      n -= k;
    }
  }
  void commit() {
    FILE* f = std::exchange(f_, nullptr);
    if (std::fflush(f) != 0 || std::ferror(f)) {
      const int e = errno;
      std::fclose(f);
      fail("{}: write failed: {}", tmp_, std::strerror(e));
    }
    if (std::fclose(f) != 0) fail("{}: close failed: {}", tmp_, std::strerror(errno));
    // The destination may have changed since the constructor's check; rename() replaces a regular file
    // or a symlink itself (never what a link points to) and fails on a directory.
    check_output_path(path_);
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      fail("{}: cannot rename {} to it: {}", path_, tmp_, std::strerror(errno));
    }
    committed_ = true;
    io::unregister_tmp(std::exchange(slot_, -1));
  }

 private:
  std::string path_, tmp_;
  FILE* f_ = nullptr;
  bool created_ = false;
  bool committed_ = false;
  int slot_ = -1;  // io::register_tmp's
};

}  // namespace

void check_output_path(const std::string& path) {
  if (path.empty()) fail("the output path is empty");
  if (path.back() == '/') fail("{}: the output path names a directory (it ends with '/'), not a file", path);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) fail("{}: cannot use as output: {}", path, std::strerror(errno));
    // A new file: its directory must exist.
    const std::filesystem::path p(path);
    const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
    struct stat d {};
    if (::stat(dir.c_str(), &d) != 0 || !S_ISDIR(d.st_mode))
      fail("{}: cannot create the output: directory {} does not exist", path, dir);
    return;
  }
  if (S_ISREG(st.st_mode)) return;
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISLNK(st.st_mode)  ? "a symbolic link"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  fail("{}: output exists and is {}; refusing to replace it (give a new path or a regular file)", path, kind);
}

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8:
      return "u8";
    case ValueType::I8:
      return "i8";
    case ValueType::U16:
      return "u16";
    case ValueType::I16:
      return "i16";
    case ValueType::U32:
      return "u32";
    case ValueType::I32:
      return "i32";
    case ValueType::F32:
      return "f32";
    case ValueType::BOOL:
      return "bool";
    case ValueType::STRING:
      return "string";
    case ValueType::ARRAY:
      return "array";
    case ValueType::U64:
      return "u64";
    case ValueType::I64:
      return "i64";
    case ValueType::F64:
      return "f64";
  }
  return "unknown";
}

Value Value::of_uint(ValueType t, uint64_t v) {
  Value x;
  x.type = t;
  x.u = v;
  if (v <= (uint64_t)std::numeric_limits<int64_t>::max()) x.i = (int64_t)v;
  return x;
}

Value Value::of_int(ValueType t, int64_t v) {
  Value x;
  x.type = t;
  x.i = v;
  if (v >= 0) x.u = (uint64_t)v;
  return x;
}

Value Value::of_float(ValueType t, double v) {
  Value x;
  x.type = t;
  x.f = v;
  return x;
}

Value Value::of_bool(bool v) {
  return of_uint(ValueType::BOOL, v ? 1 : 0);
}

Value Value::of_string(std::string v) {
  Value x;
  x.type = ValueType::STRING;
  x.s = std::move(v);
  return x;
}

Value Value::of_array(ValueType elem_type, const std::vector<Value>& items) {
  return of_array(Array::of_values(elem_type, items));
}

Value Value::of_array(Array a) {
  Value x;
  x.type = ValueType::ARRAY;
  x.arr = std::make_shared<Array>(std::move(a));
  return x;
}

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::STRING:
    case ValueType::ARRAY:
      return 0;
    default:
      return (size_t)min_value_bytes(t);
  }
}

namespace {

// The number or bool of type t stored little-endian at p.
Value scalar_at(ValueType t, const uint8_t* p) {
  auto get = [p]<typename T>(T) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (t) {
    case ValueType::U8:
      return Value::of_uint(t, get(uint8_t{}));
    case ValueType::U16:
      return Value::of_uint(t, get(uint16_t{}));
    case ValueType::U32:
      return Value::of_uint(t, get(uint32_t{}));
    case ValueType::U64:
      return Value::of_uint(t, get(uint64_t{}));
    case ValueType::I8:
      return Value::of_int(t, get(int8_t{}));
    case ValueType::I16:
      return Value::of_int(t, get(int16_t{}));
    case ValueType::I32:
      return Value::of_int(t, get(int32_t{}));
    case ValueType::I64:
      return Value::of_int(t, get(int64_t{}));
    case ValueType::F32:
      return Value::of_float(t, get(float{}));
    case ValueType::F64:
      return Value::of_float(t, get(double{}));
    case ValueType::BOOL:
      return Value::of_bool(*p != 0);
    default:
      wrong_type("a number", t);
  }
}

// Appends the little-endian bytes of a number or bool value of type t.
void put_scalar(std::vector<uint8_t>& out, ValueType t, const Value& v) {
  auto put = [&out]<typename T>(T x) {
    const auto* p = reinterpret_cast<const uint8_t*>(&x);
    out.insert(out.end(), p, p + sizeof x);
  };
  switch (t) {
    case ValueType::U8:
      return put((uint8_t)v.u);
    case ValueType::U16:
      return put((uint16_t)v.u);
    case ValueType::U32:
      return put((uint32_t)v.u);
    case ValueType::U64:
      return put(v.u);
    case ValueType::I8:
      return put((int8_t)v.i);
    case ValueType::I16:
      return put((int16_t)v.i);
    case ValueType::I32:
      return put((int32_t)v.i);
    case ValueType::I64:
      return put(v.i);
    case ValueType::F32:
      return put((float)v.f);
    case ValueType::F64:
      return put(v.f);
    case ValueType::BOOL:
      return put((uint8_t)(v.u != 0 ? 1 : 0));
    default:
      wrong_type("a number", t);
  }
}

}  // namespace

Value Array::at(size_t i) const {
  if (i >= n_) fail("GGUF array index {} out of range (size {})", i, n_);
  if (const size_t sz = scalar_size(elem_type)) return scalar_at(elem_type, raw_ + i * sz);
  if (elem_type == ValueType::STRING) return Value::of_string(std::string(strings_[i]));
  return arrays_[i];
}

int64_t Array::int_at(size_t i) const {
  return at(i).as_int();
}
uint64_t Array::uint_at(size_t i) const {
  return at(i).as_uint();
}
double Array::float_at(size_t i) const {
  return at(i).as_float();
}

std::string_view Array::string_at(size_t i) const {
  if (elem_type != ValueType::STRING) wrong_type("string", elem_type);
  if (i >= n_) fail("GGUF array index {} out of range (size {})", i, n_);
  return strings_[i];
}

const Value& Array::array_at(size_t i) const {
  if (elem_type != ValueType::ARRAY) wrong_type("array", elem_type);
  if (i >= n_) fail("GGUF array index {} out of range (size {})", i, n_);
  return arrays_[i];
}

Array Array::of_values(ValueType elem_type, const std::vector<Value>& items) {
  for (const Value& item : items) {
    if (item.type != elem_type) {
      fail("GGUF array of {} holds a {} element", value_type_name(elem_type), value_type_name(item.type));
    }
  }
  if (scalar_size(elem_type)) {
    auto bytes = std::make_shared<std::vector<uint8_t>>();
    bytes->reserve(items.size() * scalar_size(elem_type));
    for (const Value& item : items) put_scalar(*bytes, elem_type, item);
    Array a = view_scalars(elem_type, bytes->data(), items.size());
    a.storage_ = std::move(bytes);
    return a;
  }
  if (elem_type == ValueType::STRING) {
    std::vector<std::string> v;
    v.reserve(items.size());
    for (const Value& item : items) v.push_back(item.s);
    return of_strings(v);
  }
  return of_arrays(items);
}

Array Array::of_strings(const std::vector<std::string>& v) {
  // One buffer holding every string back to back; the views point into it.
  size_t total = 0;
  for (const auto& x : v) total += x.size();
  auto blob = std::make_shared<std::string>();
  blob->reserve(total);
  for (const auto& x : v) blob->append(x);
  std::vector<std::string_view> views;
  views.reserve(v.size());
  size_t at = 0;
  for (const auto& x : v) {
    views.emplace_back(blob->data() + at, x.size());
    at += x.size();
  }
  Array a = view_strings(std::move(views));
  a.storage_ = std::move(blob);
  return a;
}

Array Array::of_f32(const std::vector<float>& v) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(v.size() * 4);
  if (!v.empty()) std::memcpy(bytes->data(), v.data(), bytes->size());
  Array a = view_scalars(ValueType::F32, bytes->data(), v.size());
  a.storage_ = std::move(bytes);
  return a;
}

Array Array::of_i32(const std::vector<int32_t>& v) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(v.size() * 4);
  if (!v.empty()) std::memcpy(bytes->data(), v.data(), bytes->size());
  Array a = view_scalars(ValueType::I32, bytes->data(), v.size());
  a.storage_ = std::move(bytes);
  return a;
}

Array Array::view_scalars(ValueType elem_type, const uint8_t* p, size_t n) {
  if (!scalar_size(elem_type))
    fail("GGUF array of {} is not an array of numbers", value_type_name(elem_type));
  Array a;
  a.elem_type = elem_type;
  a.n_ = n;
  a.raw_ = n > 0 ? p : nullptr;
  return a;
}

Array Array::view_strings(std::vector<std::string_view> v) {
  Array a;
  a.elem_type = ValueType::STRING;
  a.n_ = v.size();
  a.strings_ = std::move(v);
  return a;
}

Array Array::of_arrays(std::vector<Value> v) {
  for (const Value& item : v) {
    if (item.type != ValueType::ARRAY) {
      fail("GGUF array of {} holds a {} element", value_type_name(ValueType::ARRAY),
           value_type_name(item.type));
    }
  }
  Array a;
  a.elem_type = ValueType::ARRAY;
  a.n_ = v.size();
  a.arrays_ = std::move(v);
  return a;
}

Array Array::owned_copy() const {
  if (const size_t sz = scalar_size(elem_type)) {
    auto bytes = std::make_shared<std::vector<uint8_t>>(raw_, raw_ + n_ * sz);
    Array a = view_scalars(elem_type, bytes->data(), n_);
    a.storage_ = std::move(bytes);
    return a;
  }
  if (elem_type == ValueType::STRING) {
    std::vector<std::string> v(strings_.begin(), strings_.end());
    return of_strings(v);
  }
  std::vector<Value> items;
  items.reserve(n_);
  for (const Value& item : arrays_) items.push_back(Value::of_array(item.as_array().owned_copy()));
  return of_arrays(std::move(items));
}

int64_t Value::as_int() const {
  if (is_signed_int(type)) return i;
  if (is_unsigned_int(type) || type == ValueType::BOOL) {
    if (u > (uint64_t)std::numeric_limits<int64_t>::max()) fail("GGUF value {} does not fit in i64", u);
    return (int64_t)u;
  }
  if (is_float(type)) {
    if (!(f >= -0x1p63 && f < 0x1p63)) fail("GGUF value {} does not fit in i64", f);
    return (int64_t)f;
  }
  wrong_type("a number", type);
}

uint64_t Value::as_uint() const {
  if (is_unsigned_int(type) || type == ValueType::BOOL) return u;
  if (is_signed_int(type)) {
    if (i < 0) fail("GGUF value {} is negative, expected an unsigned integer", i);
    return (uint64_t)i;
  }
  if (is_float(type)) {
    if (!(f >= 0 && f < 0x1p64)) fail("GGUF value {} does not fit in u64", f);
    return (uint64_t)f;
  }
  wrong_type("a number", type);
}

double Value::as_float() const {
  if (is_float(type)) return f;
  if (is_signed_int(type)) return (double)i;
  if (is_unsigned_int(type) || type == ValueType::BOOL) return (double)u;
  wrong_type("a number", type);
}

bool Value::as_bool() const {
  if (type == ValueType::BOOL || is_unsigned_int(type)) return u != 0;
  if (is_signed_int(type)) return i != 0;
  if (is_float(type)) return f != 0;
  wrong_type("a bool", type);
}

const std::string& Value::as_string() const {
  if (type != ValueType::STRING) wrong_type("string", type);
  return s;
}

const Array& Value::as_array() const {
  static const Array kEmpty;  // an ARRAY value without storage: an empty u8 array
  if (type != ValueType::ARRAY) wrong_type("array", type);
  return arr ? *arr : kEmpty;
}

Reader Reader::open(const std::string& path) {
  MappedFile file(path, "GGUF file");
  Reader r = parse(file.data(), file.size(), path);
  r.file_ = std::move(file);  // the mapping (and so every TensorInfo::data) stays where it is
  return r;
}

Reader Reader::parse(const uint8_t* data, size_t size, const std::string& name) {
  Reader r;
  r.name_ = name;
  Cursor c(data, size, r.name_);
  const Header h = read_header(c);
  r.version_ = h.version;
  read_kvs(c, h.n_kv, r.kv_, r.kv_index_);
  r.alignment_ = read_alignment(r.name_, r.find(kAlignmentKey));

  if (h.n_tensors > c.left() / kMinTensorInfoBytes) {
    fail(
        "{}: header claims {} tensor infos but only {} bytes remain after the key/values (each needs at "
        "least {})",
        r.name_, h.n_tensors, c.left(), kMinTensorInfoBytes);
  }
  r.tensors_.reserve(h.n_tensors);
  for (uint64_t k = 0; k < h.n_tensors; ++k) {
    const uint64_t at = c.pos();
    TensorInfo t = read_tensor_info(c, k);
    if (!r.tensor_index_.emplace(t.name, r.tensors_.size()).second) {
      fail("{}: duplicate tensor '{}' (info at offset {})", r.name_, t.name, at);
    }
    r.tensors_.push_back(std::move(t));
  }
  place_tensors(r.name_, data, size, align_up(c.pos(), r.alignment_), r.alignment_, r.tensors_);
  return r;
}

const Value* Reader::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* Reader::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<std::string> Reader::get_string_opt(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::STRING) {
    fail("{}: key '{}' has type {}, expected string", name_, key, value_type_name(v->type));
  }
  return v->s;
}

std::optional<uint64_t> Reader::get_uint_opt(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (is_unsigned_int(v->type)) return v->u;
  if (is_signed_int(v->type)) {
    if (v->i < 0) fail("{}: key '{}' is {}, expected a non-negative integer", name_, key, v->i);
    return (uint64_t)v->i;
  }
  fail("{}: key '{}' has type {}, expected an unsigned integer", name_, key, value_type_name(v->type));
}

std::optional<double> Reader::get_float_opt(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (is_float(v->type)) return v->f;
  if (is_signed_int(v->type)) return (double)v->i;
  if (is_unsigned_int(v->type)) return (double)v->u;
  fail("{}: key '{}' has type {}, expected a float", name_, key, value_type_name(v->type));
}

std::optional<bool> Reader::get_bool_opt(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::BOOL) {
    fail("{}: key '{}' has type {}, expected bool", name_, key, value_type_name(v->type));
  }
  return v->u != 0;
}

std::string Reader::get_string(std::string_view key) const {
  if (auto v = get_string_opt(key)) return *v;
  fail("{}: key '{}' missing", name_, key);
}

uint64_t Reader::get_uint(std::string_view key) const {
  if (auto v = get_uint_opt(key)) return *v;
  fail("{}: key '{}' missing", name_, key);
}

double Reader::get_float(std::string_view key) const {
  if (auto v = get_float_opt(key)) return *v;
  fail("{}: key '{}' missing", name_, key);
}

void Writer::set_value(const std::string& key, const Value& v) {
  // Arrays read by a Reader view its buffer: keep a copy of our own.
  put_kv(key, v.type == ValueType::ARRAY && v.arr ? Value::of_array(v.arr->owned_copy()) : v);
}

void Writer::put_kv(const std::string& key, Value v) {
  for (auto& [k, old] : kv_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  kv_.emplace_back(key, std::move(v));
}

void Writer::set_u32(const std::string& key, uint32_t v) {
  set_value(key, Value::of_uint(ValueType::U32, v));
}
void Writer::set_i32(const std::string& key, int32_t v) {
  set_value(key, Value::of_int(ValueType::I32, v));
}
void Writer::set_u64(const std::string& key, uint64_t v) {
  set_value(key, Value::of_uint(ValueType::U64, v));
}
void Writer::set_f32(const std::string& key, float v) {
  set_value(key, Value::of_float(ValueType::F32, v));
}
void Writer::set_bool(const std::string& key, bool v) {
  set_value(key, Value::of_bool(v));
}
void Writer::set_string(const std::string& key, const std::string& v) {
  set_value(key, Value::of_string(v));
}

void Writer::set_array_string(const std::string& key, const std::vector<std::string>& v) {
  put_kv(key, Value::of_array(Array::of_strings(v)));
}

void Writer::set_array_f32(const std::string& key, const std::vector<float>& v) {
  put_kv(key, Value::of_array(Array::of_f32(v)));
}

void Writer::set_array_i32(const std::string& key, const std::vector<int32_t>& v) {
  put_kv(key, Value::of_array(Array::of_i32(v)));
}

void Writer::add_tensor(const std::string& name, GgmlType type, std::vector<uint64_t> ne, const void* data,
                        uint64_t n_bytes) {
  const std::string where = fmt::format("gguf writer: tensor '{}'", name);
  const TensorSize ts = tensor_size(where, ne, (uint32_t)type);
  if (ts.n_bytes != n_bytes) {
    fail("{}: {} bytes given but shape [{}] of type {} needs {}", where, n_bytes, fmt::join(ne, ", "),
         type_name(type), ts.n_bytes);
  }
  if (!data) fail("{}: data is null", where);
  check_new_tensor_name(
      name, std::any_of(tensors_.begin(), tensors_.end(), [&](auto& t) { return t.name == name; }));
  tensors_.push_back(PendingTensor{name, type, std::move(ne), data, n_bytes, {}});
}

void Writer::add_tensor(const std::string& name, GgmlType type, std::vector<uint64_t> ne, Producer produce) {
  const TensorSize ts = tensor_size(fmt::format("gguf writer: tensor '{}'", name), ne, (uint32_t)type);
  if (!produce) fail("gguf writer: tensor '{}': no producer", name);
  check_new_tensor_name(
      name, std::any_of(tensors_.begin(), tensors_.end(), [&](auto& t) { return t.name == name; }));
  tensors_.push_back(PendingTensor{name, type, std::move(ne), nullptr, ts.n_bytes, std::move(produce)});
}

// File layout written: header (version 3), key/values in insertion order (general.alignment set when the
// alignment is not the default), tensor infos with offsets packed in order and each rounded up to the
// alignment, zero padding to the alignment, then each tensor's bytes followed by zero padding.
void Writer::write(const std::string& path, uint64_t alignment) const {
  if (!is_valid_alignment(alignment)) fail("{}: alignment {} is not a power of two <= 2^31", path, alignment);
  // general.alignment: replaced in place when set, appended when absent and the alignment is not the default.
  const Value align_value = Value::of_uint(ValueType::U32, alignment);
  const bool has_key =
      std::any_of(kv_.begin(), kv_.end(), [](const auto& p) { return p.first == kAlignmentKey; });
  const bool append_key = !has_key && alignment != kDefaultAlignment;

  Encoder e;
  e.put<uint32_t>(kMagic);
  e.put<uint32_t>(kWriteVersion);
  e.put<uint64_t>(tensors_.size());
  e.put<uint64_t>(kv_.size() + (append_key ? 1 : 0));
  auto put_kv = [&](const std::string& key, const Value& v) {
    e.put_string(key);
    e.put<uint32_t>((uint32_t)v.type);
    e.put_value(key, v);
  };
  for (const auto& [key, v] : kv_) put_kv(key, key == kAlignmentKey ? align_value : v);
  if (append_key) put_kv(kAlignmentKey, align_value);
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    e.put_string(t.name);
    e.put<uint32_t>((uint32_t)t.ne.size());
    for (uint64_t d : t.ne) e.put<uint64_t>(d);
    e.put<uint32_t>((uint32_t)t.type);
    e.put<uint64_t>(offset);
    offset += align_up(t.n_bytes, alignment);
  }
  e.pad_to(alignment);

  TmpFile out(path);
  out.write(e.bytes.data(), e.bytes.size());
  std::vector<uint8_t> buf;
  for (const auto& t : tensors_) {
    if (t.produce) {
      buf.assign(t.n_bytes, 0);
      t.produce(buf.data());
      out.write(buf.data(), buf.size());
    } else {
      out.write(t.data, t.n_bytes);
    }
    out.write_zeros(align_up(t.n_bytes, alignment) - t.n_bytes);
  }
  out.commit();
}

}  // namespace ultra::gguf
