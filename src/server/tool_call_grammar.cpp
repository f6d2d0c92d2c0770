// The grammar of a forced tool call (tool_choice "required" or a named function; tool_calls.h): each
// allowed function's parameters compiled by the JSON Schema compiler (include/ultra/grammar.h), its rules
// renamed apart (t<i>-...), inside the family's call syntax.
#include <fmt/format.h>

#include "server/constraints.h"
#include "server/json_text.h"
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

// One call to `name` whose arguments are the rule `args`, in the family's syntax (GBNF).
std::string call_text(ToolSyntax syntax, const std::string& name, const std::string& args) {
  switch (syntax) {
    case ToolSyntax::MistralV11:
      return fmt::format("\"{}[ARGS]\" {}", name, args);
    case ToolSyntax::FunctionaryV31:  // after "<function" (the lazy grammar's trigger)
      return fmt::format("\"={}>\" {} \"</function>\"", name, args);
    case ToolSyntax::FunctionaryV32:
      return fmt::format("\"{}\\n\" {}", name, args);
    case ToolSyntax::CommandR:
      return fmt::format("\"{{\\\"tool_name\\\": \\\"{}\\\", \\\"parameters\\\": \" {} \"}}\"", name, args);
    default:
      return fmt::format("\"{{\\\"name\\\": \\\"{}\\\", \\\"{}\\\": \" {} \"}}\"", name,
                         syntax == ToolSyntax::Llama3 ? "parameters" : "arguments", args);
  }
}

// "call-obj ::= ..." over the allowed functions (the named one, or all) and their renamed parameter rules.
std::string call_rules(const ToolRequest& tools, ToolSyntax syntax) {
  std::string rules, alts;
  for (size_t i = 0; i < tools.names.size(); ++i) {
    const std::string& name = tools.names[i];  // [a-zA-Z0-9_-]: no escaping in a literal or in JSON
    if (tools.choice == ToolChoice::Named && name != tools.named) continue;
    std::string args;
    try {
      // At most one space or newline between tokens: a call spends its tokens on the arguments.
      args = ultra::json_schema_to_gbnf(dump_json(parameters_of(tools.tools[i])), /*max_indent=*/0);
    } catch (const Error& e) {
      throw FieldError("tools", fmt::format("'tools[{}].function.parameters' ('{}'): {}", i, name, e.what()));
    }
    const std::string p = fmt::format("t{}-", i);
    rules += prefix_rules(args, p);
    alts += (alts.empty() ? "" : " | ") + call_text(syntax, name, p + "root");
  }
  return "call-obj ::= " + alts + "\n" + rules;
}

}  // namespace

std::string tool_call_grammar(const ToolRequest& tools, const ToolFamily& family) {
  const ToolSyntax syntax = family.syntax;
  std::string root;
  const bool many = tools.parallel && syntax != ToolSyntax::Llama3;
  switch (syntax) {
    case ToolSyntax::Hermes:
    case ToolSyntax::Generic:
    case ToolSyntax::DeepSeek:  // its markers are control tokens: Hermes tags, which its parser takes
      root = many
                 ? "root ::= call (\"\\n\" call)*\ncall ::= \"<tool_call>\\n\" call-obj \"\\n</tool_call>\"\n"
                 : "root ::= \"<tool_call>\\n\" call-obj \"\\n</tool_call>\"\n";
      break;
    case ToolSyntax::Llama3:
      root = "root ::= call-obj\n";
      break;
    case ToolSyntax::Mistral:
    case ToolSyntax::Granite:  // the array without its marker
      root = many ? "root ::= \"[\" call-obj (\", \" call-obj)* \"]\"\n" : "root ::= \"[\" call-obj \"]\"\n";
      break;
    case ToolSyntax::MistralV11:
      root = many ? "root ::= (\"[TOOL_CALLS]\" call-obj)+\n" : "root ::= \"[TOOL_CALLS]\" call-obj\n";
      break;
    case ToolSyntax::FunctionaryV31:
      root = many ? "root ::= (\"<function\" call-obj)+\n" : "root ::= \"<function\" call-obj\n";
      break;
    case ToolSyntax::FunctionaryV32:  // after the prompt's >>>
      root = many ? "root ::= call-obj (\">>>\" call-obj)*\n" : "root ::= call-obj\n";
      break;
    case ToolSyntax::FireFunction:
      root = many ? "root ::= \"functools[\" call-obj (\", \" call-obj)* \"]\"\n"
                  : "root ::= \"functools[\" call-obj \"]\"\n";
      break;
    case ToolSyntax::CommandR:
      root = many ? "root ::= \"Action:\\n```json\\n[\\n\" call-obj (\",\\n\" call-obj)* \"\\n]\\n```\"\n"
                  : "root ::= \"Action:\\n```json\\n[\\n\" call-obj \"\\n]\\n```\"\n";
      break;
  }
  std::string g = root + call_rules(tools, syntax);
  check_grammar(g);  // a composition error is ours, not the request's: ultra::Error
  return g;
}

LazyToolGrammar lazy_tool_grammar(const ToolRequest& tools, const ToolFamily& family) {
  LazyToolGrammar lazy;
  if (family.xml_calls) return lazy;  // the calls are XML, the grammar would write JSON
  std::string root;
  // Whitespace around the JSON inside the tag: nothing, a space or a newline (Qwen writes newlines).
  const char* ws = "tws ::= [ \\n]?\n";
  switch (family.syntax) {
    case ToolSyntax::Hermes:
    case ToolSyntax::Generic:
    case ToolSyntax::DeepSeek:
      lazy.trigger = "<tool_call>";
      root = tools.parallel
                 ? "root ::= tws call-obj tws \"</tool_call>\" (tws \"<tool_call>\" tws call-obj tws "
                   "\"</tool_call>\")*\n"
                 : "root ::= tws call-obj tws \"</tool_call>\"\n";
      break;
    case ToolSyntax::Mistral:
    case ToolSyntax::Granite:
      lazy.trigger = family.syntax == ToolSyntax::Granite ? "<|tool_call|>" : "[TOOL_CALLS]";
      root = tools.parallel ? "root ::= tws \"[\" call-obj (\", \" call-obj)* \"]\"\n"
                            : "root ::= tws \"[\" call-obj \"]\"\n";
      break;
    // Triggers end where a token may (a word, or a run of punctuation, ends).
    case ToolSyntax::FunctionaryV31:
      lazy.trigger = "<function";
      root = tools.parallel ? "root ::= call-obj (tws \"<function\" call-obj)*\n" : "root ::= call-obj\n";
      break;
    case ToolSyntax::FunctionaryV32:  // calls after content: >>>NAME\n{...}
      lazy.trigger = ">>>";
      root = tools.parallel ? "root ::= call-obj (tws \">>>\" call-obj)*\n" : "root ::= call-obj\n";
      break;
    case ToolSyntax::FireFunction:
      lazy.trigger = "functools";
      root = tools.parallel ? "root ::= \"[\" call-obj (\", \" call-obj)* \"]\"\n"
                            : "root ::= \"[\" call-obj \"]\"\n";
      break;
    case ToolSyntax::Llama3:      // the call is bare JSON from the first token: no marker to wait for
    case ToolSyntax::MistralV11:  // [ARGS] inside the call is a control token, which a grammar cannot write
    case ToolSyntax::CommandR:  // an action every turn ("directly-answer" for none): the trigger is no choice
      return lazy;
  }
  try {
    lazy.grammar = root + ws + call_rules(tools, family.syntax);
    check_grammar(lazy.grammar);
  } catch (const std::exception&) {  // a parameters schema the compiler refuses: "auto" stays free
    return LazyToolGrammar{};
  }
  return lazy;
}

}  // namespace ultra::server
