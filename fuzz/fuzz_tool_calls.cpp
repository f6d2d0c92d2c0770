// libFuzzer target: a model's output as the tool-call parser sees it (src/server/tool_calls.h). Byte 0 picks
// the family (low 3 bits), whether the request allows parallel calls (bit 3) and the streamed piece size
// (high 4 bits, 1-16 bytes); the rest is the output. Checks: without calls the content is the whole text;
// every call has a name, an id and arguments that parse as a JSON object; the output streamed in pieces
// (ToolCallStream) gives the same content and calls as the whole parse.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "server/tool_calls.h"

namespace {

const ultra::server::ToolRequest& tools(bool parallel) {
  static const auto make = [](bool p) {
    const nlohmann::json body = nlohmann::json::parse(R"({"tools": [
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
        "properties": {"zone": {"type": "integer"}}, "required": ["zone"]}}},
      {"type": "function", "function": {"name": "mix", "parameters": {"type": "object", "properties": {
        "s": {"type": "string"}, "b": {"type": "boolean"}, "a": {"type": "array"}}}}}]})");
    nlohmann::json b = body;
    b["parallel_tool_calls"] = p;
    return ultra::server::parse_tool_request(b);
  };
  static const ultra::server::ToolRequest one = make(false), many = make(true);
  return parallel ? many : one;
}

void require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ultra::server;
  if (size == 0) return 0;
  ToolFamily family;
  family.syntax = (ToolSyntax)(data[0] % 7);
  family.template_takes_tools = family.template_takes_calls = true;
  const ToolRequest& req = tools((data[0] & 8) != 0);
  const size_t piece = 1 + (data[0] >> 4);
  const std::string_view text((const char*)data + 1, size - 1);

  const ToolParse whole = parse_tool_calls(text, family, req);
  if (whole.calls.empty()) require(whole.content == text);
  for (const ToolCall& c : whole.calls) {
    require(!c.name.empty() && !c.id.empty());
    require(nlohmann::json::parse(c.arguments, nullptr, false).is_object());
  }
  ToolCallStream stream(family, req);
  std::string sent;
  for (size_t i = 0; i < text.size(); i += piece) sent += stream.push(text.substr(i, piece));
  const ToolParse fin = stream.finish();
  require(sent + fin.content == whole.content);
  require(fin.calls.size() == whole.calls.size());
  for (size_t k = 0; k < fin.calls.size(); ++k)
    require(fin.calls[k].name == whole.calls[k].name && fin.calls[k].arguments == whole.calls[k].arguments);
  return 0;
}
