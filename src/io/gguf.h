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
// Arrays hold one element type; strings arrays (tokenizer.ggml.tokens) are the big ones.
struct Array {
  ValueType elem_type = ValueType::U8;
  std::vector<Value> items;
};

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
  static Value of_array(ValueType elem_type, std::vector<Value> items);

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
  // Maps and fully validates the file: magic, version (2 or 3), counts vs file size, every key and string
  // length inside the file, every value type, general.alignment (power of two, non-zero), every tensor
  // (n_dims <= 4, no zero/overflowing dims, known type, ne[0] multiple of the block size, n_bytes without
  // overflow, offset aligned, data inside the file, no duplicate names). Throws ultra::Error naming the file
  // and the problem.
  static Reader open(const std::string& path);
  // Same, over a caller-owned buffer (used by the fuzzer and tests); `name` is used in messages.
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
  void set_value(const std::string& key, const Value& v);  // any type, arrays included

  // ne in ggml order. `data` must stay valid until write(); n_bytes must match ne and type.
  void add_tensor(const std::string& name, GgmlType type, std::vector<uint64_t> ne, const void* data,
                  uint64_t n_bytes);
  // Streaming variant: at write() time `produce(dst)` fills the tensor's n_bytes (computed from ne and type)
  // into a zeroed buffer, so a converter needs only one tensor in memory at a time.
  using Producer = std::function<void(uint8_t* dst)>;
  void add_tensor(const std::string& name, GgmlType type, std::vector<uint64_t> ne, Producer produce);

  // Writes atomically (to path.tmp, then rename). Throws ultra::Error on I/O failure.
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
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace ultra::gguf
