// libFuzzer target: safetensors parsing of arbitrary bytes must either succeed or throw ultra::Error; any
// other exception, crash, sanitizer report, leak or out-of-memory is a finding.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = ultra::safetensors::File::parse(data, size, "fuzz.safetensors");
    volatile uint64_t sink = 0;
    // The first and last byte of every non-empty tensor must lie inside the input (ASan checks the access).
    for (const auto& t : f->tensors()) {
      if (t.n_bytes > 0) sink = sink + t.data[0] + t.data[t.n_bytes - 1];
      sink = sink + t.shape.size() + t.name.size();
    }
  } catch (const ultra::Error&) {
  }
  return 0;
}
