// libFuzzer target: a GGUF file holding a vocabulary (tokenizer.ggml.* keys). See fuzz_harness.h for what
// is checked and docs/FUZZING.md for how to build and run it.
#include "fuzz_harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ultra::fuzz::gguf_vocab_one(data, size);
  return 0;
}
