// libFuzzer target: GBNF grammar parsing and matching (see fuzz/fuzz_grammar.h for the input format and
// the checks).
#include <cstddef>
#include <cstdint>

#include "fuzz_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ultra::fuzz::grammar_one_input(data, size);
  return 0;
}
