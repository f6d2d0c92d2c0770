// The body of the chat-template libFuzzer target (fuzz/fuzz_chat_template.cpp), shared with the test that
// replays its regression inputs (tests/fixtures/fuzz/chat_template/, FuzzRegression.ChatTemplate), so both
// run exactly the same code.
//
// Input: a chat template [NUL messages JSON array]. The template is parsed and rendered with a small
// budget; true when it rendered, false when it threw ultra::Error (a parse error, an unsupported construct,
// a runtime error, a limit or the budget). Anything else is a finding: another exception, a crash, a
// sanitizer report, a leak, a timeout or running out of memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "chat/chat_template.h"
#include "core/error.h"

namespace ultra::fuzz {

inline bool chat_template_one(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string_view tmpl = all.substr(0, nul);
  nlohmann::json messages = nlohmann::json::array({{{"role", "system"}, {"content", "sys"}},
                                                   {{"role", "user"}, {"content", "hi"}},
                                                   {{"role", "assistant"}, {"content", "yo"}}});
  if (nul != std::string_view::npos) {
    messages = nlohmann::json::parse(all.substr(nul + 1), nullptr, false);
    if (messages.is_discarded() || !messages.is_array()) return false;
  }
  // A small budget: a fuzz input renders in well under a second (under ASan) or is stopped.
  RenderBudget budget;
  budget.max_bytes = 8u << 20;
  budget.max_work = uint64_t(1) << 20;
  budget.max_seconds = 2;
  try {
    const ChatTemplate t(std::string(tmpl), ChatTemplateOptions{"<s>", "</s>", 1'700'000'000});
    (void)t.apply(messages, true, nlohmann::json{{"tools", nlohmann::json::array()}}, budget);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace ultra::fuzz
