// libFuzzer target: GGUF parsing of arbitrary bytes must either succeed or throw ultra::Error; any other
// exception, crash, sanitizer report, leak or out-of-memory is a finding.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "io/gguf.h"

namespace {

// Walks a value the way a model loader would, so that every parsed field is actually read.
uint64_t touch(const ultra::gguf::Value& v) {
  uint64_t h = v.u ^ (uint64_t)v.i ^ v.s.size();
  if (v.type == ultra::gguf::ValueType::ARRAY) {
    const ultra::gguf::Array& a = v.as_array();
    for (size_t k = 0; k < a.size(); ++k) h += touch(a.at(k));
  }
  return h;
}

uint64_t bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

template <typename F>
void getter_or_error(F f) {
  try {
    volatile uint64_t sink = f();
    (void)sink;
  } catch (const ultra::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto r = ultra::gguf::Reader::parse(data, size, "fuzz.gguf");
    volatile uint64_t sink = r.alignment();
    for (const auto& [key, value] : r.metadata()) sink = sink + touch(value) + key.size();
    // The first and last byte of every tensor must lie inside the input (ASan checks the access).
    for (const auto& t : r.tensors()) sink = sink + t.data[0] + t.data[t.n_bytes - 1];
    // Typed getters on every key: each either returns or throws ultra::Error for a wrong type.
    for (const auto& kv : r.metadata()) {
      const std::string& key = kv.first;  // (clang 14 cannot capture structured bindings in lambdas)
      const ultra::gguf::Value& value = kv.second;
      getter_or_error([&] { return (uint64_t)r.get_uint(key); });
      getter_or_error([&] { return bits(r.get_float(key)); });
      getter_or_error([&] { return (uint64_t)r.get_string(key).size(); });
      getter_or_error([&] { return (uint64_t)r.get_bool_opt(key).value_or(false); });
      getter_or_error([&] { return (uint64_t)value.as_int() + value.as_uint() + (uint64_t)value.as_bool(); });
      getter_or_error([&] { return bits(value.as_float()); });
    }
  } catch (const ultra::Error&) {
  }
  return 0;
}
