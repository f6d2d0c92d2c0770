// The grammar of a forced tool call (tool_choice "required" or a named function; tool_calls.h): each
// allowed function's parameters compiled by the JSON Schema compiler (include/ultra/grammar.h), its rules
// renamed apart (t<i>-...), inside the family's call syntax.
#include <fmt/format.h>

#include "server/constraints.h"
#include "server/tool_calls.h"
#include "ultra/error.h"
#include "ultra/grammar.h"

namespace ultra::server {

using json = nlohmann::json;

namespace {

bool word_char(char c) {  // a GBNF rule name's characters (gbnf_parser.h)
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

// The GBNF text with every rule name (definitions and references) prefixed. Literals "...", classes
// [...], repetition counts {m,n} and comments are copied as they are.
std::string prefix_rules(std::string_view g, const std::string& prefix) {
  std::string out;
  out.reserve(g.size() * 5 / 4);
  for (size_t i = 0; i < g.size();) {
    const char c = g[i];
    if (c == '"' || c == '[') {
      const char close = c == '"' ? '"' : ']';
      size_t j = i + 1;
      while (j < g.size() && g[j] != close) j += g[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, g.size());
      out.append(g.substr(i, j - i));
      i = j;
    } else if (c == '{' || c == '#') {
      const size_t j = std::min(g.find(c == '{' ? '}' : '\n', i), g.size());
      out.append(g.substr(i, j - i));
      i = j;
    } else if (word_char(c)) {
      size_t j = i;
      while (j < g.size() && word_char(g[j])) ++j;
      out += prefix;
      out.append(g.substr(i, j - i));
      i = j;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

const json& parameters_of(const json& tool) {
  static const json kAny = {{"type", "object"}};
  const json& f = tool["function"];
  return f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"] : kAny;
}

}  // namespace

std::string tool_call_grammar(const ToolRequest& tools, const ToolFamily& family) {
  const ToolSyntax syntax = family.syntax;
  const bool llama3 = syntax == ToolSyntax::Llama3, v11 = syntax == ToolSyntax::MistralV11;
  std::string rules, alts;
  for (size_t i = 0; i < tools.names.size(); ++i) {
    const std::string& name = tools.names[i];  // [a-zA-Z0-9_-]: no escaping in a literal or in JSON
    if (tools.choice == ToolChoice::Named && name != tools.named) continue;
    std::string args;
    try {
      // At most one space or newline between tokens: a call spends its tokens on the arguments.
      args = ultra::json_schema_to_gbnf(parameters_of(tools.tools[i]).dump(), /*max_indent=*/0);
    } catch (const Error& e) {
      throw FieldError("tools", fmt::format("'tools[{}].function.parameters' ('{}'): {}", i, name, e.what()));
    }
    const std::string p = fmt::format("t{}-", i);
    rules += prefix_rules(args, p);
    if (v11) {
      alts += fmt::format("{}\"{}[ARGS]\" {}root", alts.empty() ? "" : " | ", name, p);
    } else {
      alts += fmt::format("{}\"{{\\\"name\\\": \\\"{}\\\", \\\"{}\\\": \" {}root \"}}\"",
                          alts.empty() ? "" : " | ", name, llama3 ? "parameters" : "arguments", p);
    }
  }
  std::string root;
  const bool many = tools.parallel && !llama3;
  switch (syntax) {
    case ToolSyntax::Hermes:
    case ToolSyntax::Generic:
      root = many
                 ? "root ::= call (\"\\n\" call)*\ncall ::= \"<tool_call>\\n\" call-obj \"\\n</tool_call>\"\n"
                 : "root ::= \"<tool_call>\\n\" call-obj \"\\n</tool_call>\"\n";
      break;
    case ToolSyntax::Llama3:
      root = "root ::= call-obj\n";
      break;
    case ToolSyntax::Mistral:
      root = many ? "root ::= \"[\" call-obj (\", \" call-obj)* \"]\"\n" : "root ::= \"[\" call-obj \"]\"\n";
      break;
    case ToolSyntax::MistralV11:
      root = many ? "root ::= (\"[TOOL_CALLS]\" call-obj)+\n" : "root ::= \"[TOOL_CALLS]\" call-obj\n";
      break;
  }
  std::string g = root + "call-obj ::= " + alts + "\n" + rules;
  check_grammar(g);  // a composition error is ours, not the request's: ultra::Error
  return g;
}

}  // namespace ultra::server
