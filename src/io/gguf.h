// GGUF v2/v3 reader over mmap (zero-copy tensor data) and writer.
// Spec: magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv key/values, n_tensors tensor infos
// (name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset), padding to general.alignment (default 32),
// then the data section; tensor offsets are relative to the data section start and aligned.
// All integers little-endian.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/mmap.h"

namespace ultra::gguf {

enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
std::string_view value_type_name(ValueType t);

struct Value;

// An array value (one element type). Its memory is proportional to its size in the file, whatever the
// content:
//  - numbers and bools stay as their little-endian bytes: a view into the parsed buffer, no copy;
//  - strings are one std::string_view (16 bytes) per element into the parsed buffer, for at least 8 bytes
//    of file per element (the u64 length): at most 2 bytes of memory per byte of file;
//  - arrays of arrays hold one Value per element; a file may hold at most Reader::kMaxNestedArrays of them
//    (llama.cpp rejects arrays of arrays altogether).
// Views into a parsed buffer are valid while the Reader (Reader::open) or the caller's buffer
// (Reader::parse) is. Arrays built in memory (the of_* builders) own the same representation; copies
// share it.
class Array {
 public:
  ValueType elem_type = ValueType::U8;

  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  // Element i < size() as a Value (numbers and strings copied out, nested arrays shared).
  Value at(size_t i) const;
  // Element i without building a Value; the conversions and errors of Value::as_int etc.
  int64_t int_at(size_t i) const;
  uint64_t uint_at(size_t i) const;
  double float_at(size_t i) const;
  std::string_view string_at(size_t i) const;  // elem_type STRING, else ultra::Error
  const Value& array_at(size_t i) const;       // elem_type ARRAY, else ultra::Error
  // Numbers and bools: the size() * element-size little-endian bytes (nullptr when empty, and for strings
  // and arrays).
  const uint8_t* raw() const { return raw_; }
  // Builders, owning their storage. of_values throws ultra::Error for an element of another type.
  static Array of_values(ValueType elem_type, const std::vector<Value>& items);
  static Array of_strings(const std::vector<std::string>& v);
  static Array of_f32(const std::vector<float>& v);
  static Array of_i32(const std::vector<int32_t>& v);
  // Views over a parsed buffer (the Reader): n numbers or bools at p (bools must be 0 or 1), or strings.
  static Array view_scalars(ValueType elem_type, const uint8_t* p, size_t n);
  static Array view_strings(std::vector<std::string_view> v);
  static Array of_arrays(std::vector<Value> v);  // elements of type ARRAY
  // A deep copy that owns all its storage (so that it outlives the buffer a Reader parsed).
  Array owned_copy() const;

 private:
  size_t n_ = 0;
  const uint8_t* raw_ = nullptr;           // numbers and bools
  std::vector<std::string_view> strings_;  // strings
  std::vector<Value> arrays_;              // arrays of arrays
  std::shared_ptr<const void> storage_;    // owned bytes behind raw_ / strings_ (null for views)
};

// Bytes of one element of a number or bool type; 0 for STRING and ARRAY.
size_t scalar_size(ValueType t);

struct Value {
  ValueType type = ValueType::U8;
  // U8..U64/BOOL stored in u (I* sign-extended into i), floats in f, strings in s, arrays in arr.
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<Array> arr;

  // Constructors filling the fields above; integers are mirrored into the other integer field (u <-> i) when
  // representable there. `t` must be of the matching kind (U*, I*, F*).
  static Value of_uint(ValueType t, uint64_t v);
  static Value of_int(ValueType t, int64_t v);
  static Value of_float(ValueType t, double v);
  static Value of_bool(bool v);
  static Value of_string(std::string v);
  // Throws ultra::Error when an item's type is not elem_type.
  static Value of_array(ValueType elem_type, const std::vector<Value>& items);
  static Value of_array(Array a);

  // Numeric view of any integer/bool/float value (throws ultra::Error for strings/arrays).
  int64_t as_int() const;
  uint64_t as_uint() const;
  double as_float() const;
  bool as_bool() const;
  const std::string& as_string() const;
  const Array& as_array() const;
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the fastest-varying (row length)
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;  // relative to the data section
  uint64_t n_bytes = 0;
  uint64_t n_elements = 0;
  const uint8_t* data = nullptr;  // points into the mapped file
};

class Reader {
 public:
  // Limits on counts whose memory cost per entry is a few hundred bytes (far above any real file: ~50
  // key/values, a few thousand tensors, no nested arrays), so that metadata memory stays bounded.
  static constexpr uint64_t kMaxKeyValues = 1 << 16;
  static constexpr uint64_t kMaxTensors = 1 << 18;
  static constexpr uint64_t kMaxNestedArrays = 1 << 16;  // elements of arrays of arrays, whole file

  // Maps and fully validates the file: magic, version (2 or 3), counts vs file size and the limits above,
  // every key and string length inside the file, every value type, general.alignment (power of two,
  // non-zero), every tensor (n_dims <= 4, no zero/overflowing dims, known type, ne[0] multiple of the block
  // size, n_bytes without overflow, offset aligned, data inside the file, no duplicate names, no two
  // tensors' data overlapping). Throws ultra::Error naming the file and the problem.
  // Memory: proportional to the metadata bytes (see Array), never to element counts.
  static Reader open(const std::string& path);
  // Same, over a caller-owned buffer (used by the fuzzer and tests); `name` is used in messages. Arrays and
  // tensor data point into the buffer, which must outlive the Reader.
  static Reader parse(const uint8_t* data, size_t size, const std::string& name);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& path() const { return name_; }

  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  // Typed getters: throw ultra::Error "<file>: key '<key>' missing" / "has type X, expected Y".
  std::string get_string(std::string_view key) const;
  uint64_t get_uint(std::string_view key) const;
  double get_float(std::string_view key) const;
  // Optional variants return fallback when the key is absent (still throw on a wrong type).
  std::optional<std::string> get_string_opt(std::string_view key) const;
  std::optional<uint64_t> get_uint_opt(std::string_view key) const;
  std::optional<double> get_float_opt(std::string_view key) const;
  std::optional<bool> get_bool_opt(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

 private:
  MappedFile file_;
  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// Throws ultra::Error unless path is absent or a regular file: an output never replaces a directory, a
// symlink, a device node or a FIFO. An empty path, or one ending in '/', is refused. (A new path's directory
// must exist; the writer then fails to create.)
void check_output_path(const std::string& path);

// Writes GGUF v3. Tensor data is copied from caller memory at write() time (or produced by a callback so
// a converter can stream tensor by tensor without holding them all). Tensor offsets are packed in order, as
// llama.cpp requires; tensor names are limited to 63 bytes (llama.cpp's limit). Arrays of arrays are valid
// GGUF and read back by Reader, but llama.cpp's reader rejects them.
class Writer {
 public:
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_array_string(const std::string& key, const std::vector<std::string>& v);
  void set_array_f32(const std::string& key, const std::vector<float>& v);
  void set_array_i32(const std::string& key, const std::vector<int32_t>& v);
  // Any type, arrays included. Arrays are copied into storage the Writer owns, so a Value taken from a
  // Reader may be set and the Reader closed before write().
  void set_value(const std::string& key, const Value& v);

  // ne in ggml order. `data` must stay valid until write(); n_bytes must match ne and type.
  void add_tensor(const std::string& name, GgmlType type, std::vector<uint64_t> ne, const void* data,
                  uint64_t n_bytes);
  // Streaming variant: at write() time `produce(dst)` fills the tensor's n_bytes (computed from ne and type)
  // into a zeroed buffer, so a converter needs only one tensor in memory at a time.
  using Producer = std::function<void(uint8_t* dst)>;
  void add_tensor(const std::string& name, GgmlType type, std::vector<uint64_t> ne, Producer produce);

  // Writes atomically: to a uniquely named temporary file in path's directory, renamed over path at the
  // end and removed on any failure. path must be new or a regular file (check_output_path). Throws
  // ultra::Error on I/O failure.
  // `alignment` (a power of two) wins over any general.alignment set before; it is written as
  // general.alignment (u32) when it is not the default 32.
  void write(const std::string& path, uint64_t alignment = 32) const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> ne;
    const void* data;
    uint64_t n_bytes;
    Producer produce;  // set instead of data by the streaming add_tensor
  };
  void put_kv(const std::string& key, Value v);  // replaces in place, or appends

  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace ultra::gguf
