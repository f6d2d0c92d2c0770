// libFuzzer target: config.json, optionally followed by NUL and a generation_config.json. See fuzz_harness.h
// for what is checked and docs/FUZZING.md for how to build and run it.
#include "fuzz_harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ultra::fuzz::hf_config_one(data, size);
  return 0;
}
