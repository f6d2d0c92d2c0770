// libFuzzer target: a model's output as the tool-call parser sees it (src/server/tool_calls.h). Byte 0 picks
// the family (low 4 bits, modulo the 11 families), whether the request allows parallel calls (bit 4) and the
// streamed piece size (high 3 bits: 1-15 bytes); the rest is the output. Checks: without calls the content
// is the whole text (Functionary v3.2 and Command R: text may be left out, their recipient lines and direct
// answers); the calls' deltas (take_deltas) join to the calls' arguments, unless the stream diverged, which
// only an output that announced calls and turned out to hold fewer may do;
// every call has a name, an id and arguments that parse as a JSON object; the output streamed in pieces
// (ToolCallStream) gives the same content and calls as the whole parse.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

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

// One past the '}' that closes the '{' at text[at] (strings skipped), npos when none does.
size_t object_end(std::string_view text, size_t at) {
  int depth = 0;
  for (size_t i = at; i < text.size(); ++i) {
    if (text[i] == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\') ++i;
    } else if (text[i] == '{' || text[i] == '[') {
      ++depth;
    } else if ((text[i] == '}' || text[i] == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// Whether an object in the text (from any '{' to its closing '}', where JSON parses) holds a key twice.
bool repeats_a_key(std::string_view text) {
  using json = nlohmann::json;
  for (size_t at = text.find('{'); at != std::string_view::npos; at = text.find('{', at + 1)) {
    const size_t end = object_end(text, at);
    if (end == std::string_view::npos) continue;
    std::vector<std::set<std::string>> keys;
    bool repeated = false;
    const json::parser_callback_t cb = [&](int, json::parse_event_t e, json& k) {
      if (e == json::parse_event_t::object_start) {
        keys.emplace_back();
      } else if (e == json::parse_event_t::object_end && !keys.empty()) {
        keys.pop_back();
      } else if (e == json::parse_event_t::key && !keys.empty() &&
                 !keys.back().insert(k.get<std::string>()).second) {
        repeated = true;
      }
      return true;
    };
    json::parse(text.substr(at, end - at), cb, /*allow_exceptions=*/false);
    if (repeated) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ultra::server;
  if (size == 0) return 0;
  ToolFamily family;
  family.syntax = (ToolSyntax)((data[0] & 15) % ((int)ToolSyntax::Generic + 1));
  family.template_takes_tools = family.template_takes_calls = true;
  const ToolRequest& req = tools((data[0] & 16) != 0);
  const size_t piece = 1 + 2 * (data[0] >> 5);
  const std::string_view text((const char*)data + 1, size - 1);

  const ToolParse whole = parse_tool_calls(text, family, req);
  const bool drops_text =
      family.syntax == ToolSyntax::FunctionaryV32 || family.syntax == ToolSyntax::CommandR;
  if (whole.calls.empty() && !drops_text) require(whole.content == text);
  for (const ToolCall& c : whole.calls) {
    require(!c.name.empty() && !c.id.empty());
    require(nlohmann::json::parse(c.arguments, nullptr, false).is_object());
  }
  ToolCallStream stream(family, req);
  std::string sent;
  std::vector<std::string> args;  // per call, its arguments' pieces joined
  const auto take = [&] {
    for (const ToolCallDelta& d : stream.take_deltas()) {
      require(d.index <= args.size() && (d.index < args.size()) == d.id.empty());
      if (d.index == args.size()) args.emplace_back();
      args[d.index] += d.arguments;
    }
  };
  for (size_t i = 0; i < text.size(); i += piece) {
    sent += stream.push(text.substr(i, piece));
    take();
  }
  const ToolParse fin = stream.finish();
  take();
  if (!stream.diverged()) {  // the pieces join to the calls' arguments
    require(args.size() == fin.calls.size());
    for (size_t k = 0; k < args.size(); ++k) require(args[k] == fin.calls[k].arguments);
  } else {  // only announced calls that turned out none, or a key repeated in an object
    require(fin.calls.size() < args.size() || repeats_a_key(text));
  }
  require(sent + fin.content == whole.content);
  require(fin.calls.size() == whole.calls.size());
  for (size_t k = 0; k < fin.calls.size(); ++k)
    require(fin.calls[k].name == whole.calls[k].name && fin.calls[k].arguments == whole.calls[k].arguments);
  return 0;
}
