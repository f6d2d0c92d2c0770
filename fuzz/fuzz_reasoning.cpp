// libFuzzer target: a model's output as the reasoning splitter sees it (src/server/reasoning.h). Byte 0 picks
// the syntax (Think, Think with the prompt inside a block, Harmony: low 2 bits) and the streamed piece size
// (high 4 bits, 1-16 bytes); the rest is the output. Checks: the output streamed in pieces gives the same
// reasoning, content and calls as the whole at once; every call has a name and arguments that parse as a JSON
// object; nothing is made up (reasoning and content together are no longer than the output).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "server/reasoning.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ultra::server;
  if (size == 0) return 0;
  const int pick = data[0] & 3;
  const ReasoningSyntax syntax = pick == 2 ? ReasoningSyntax::Harmony : ReasoningSyntax::Think;
  const bool in_thinking = pick == 1;
  const size_t piece = 1 + (data[0] >> 4);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  const ReasoningSplit whole = split_reasoning(text, syntax, in_thinking);
  require(whole.reasoning.size() + whole.content.size() <= text.size());
  for (const ToolCall& c : whole.calls) {
    require(!c.name.empty() && !c.id.empty());
    require(nlohmann::json::parse(c.arguments, nullptr, false).is_object());
  }
  ReasoningStream s(syntax, in_thinking);
  std::string reasoning, content;
  for (size_t i = 0; i < text.size(); i += piece) {
    const ReasoningSplit p = s.push(text.substr(i, piece));
    require(p.calls.empty());
    reasoning += p.reasoning;
    content += p.content;
  }
  const ReasoningSplit f = s.finish();
  require(reasoning + f.reasoning == whole.reasoning);
  require(content + f.content == whole.content);
  require(f.calls.size() == whole.calls.size());
  for (size_t i = 0; i < f.calls.size(); ++i)
    require(f.calls[i].name == whole.calls[i].name && f.calls[i].arguments == whole.calls[i].arguments);
  return 0;
}
