// libFuzzer target: the JSON Schema -> GBNF compiler (see fuzz/fuzz_json_schema.h for the input format and
// the checks).
#include <cstddef>
#include <cstdint>

#include "fuzz_json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ultra::fuzz::json_schema_one_input(data, size);
  return 0;
}
