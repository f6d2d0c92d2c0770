// libFuzzer target: a chat template [NUL messages JSON array], parsed and rendered with a small render
// budget (fuzz/fuzz_chat_template.h). Passes when the template renders or throws ultra::Error.
#include <cstddef>
#include <cstdint>

#include "../fuzz/fuzz_chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)ultra::fuzz::chat_template_one(data, size);
  return 0;
}
