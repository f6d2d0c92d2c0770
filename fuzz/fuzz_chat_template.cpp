// libFuzzer target: a chat template [NUL messages JSON]. Passes when the template parses and renders, or
// throws ultra::Error (parse error, unsupported construct, runtime error, a limit hit).
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "../fuzz/fuzz_harness.h"
#include "chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto [tmpl, msgs] = ultra::fuzz::split_at_nul(data, size);
  nlohmann::json messages = nlohmann::json::array({{{"role", "system"}, {"content", "sys"}},
                                                   {{"role", "user"}, {"content", "hi"}},
                                                   {{"role", "assistant"}, {"content", "yo"}}});
  if (!msgs.empty()) {
    messages = nlohmann::json::parse(msgs, nullptr, false);
    if (messages.is_discarded() || !messages.is_array()) return 0;
  }
  try {
    ultra::ChatTemplate t(std::string(tmpl), ultra::ChatTemplateOptions{"<s>", "</s>", 1'700'000'000});
    (void)t.apply(messages, true, nlohmann::json{{"tools", nlohmann::json::array()}});
  } catch (const ultra::Error&) {
  }
  return 0;
}
