// Tool calls in /v1/chat/completions, as OpenAI's API has them: the request's `tools` (function definitions
// with JSON-Schema parameters), `tool_choice` ("none" | "auto" | "required" | {"type": "function",
// "function": {"name"}}) and `parallel_tool_calls`; the model's own chat template renders the tools and the
// history's tool calls / tool results; the model's output is parsed into message.tool_calls in the syntax of
// its template's family; "required" and a named function are enforced by a grammar, "auto" by a lazy one
// once a call begins (lazy_tool_grammar).
//
// Families (detected from the template's text, as llama.cpp's common/chat.cpp does):
//   Hermes      <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>, one or more (Hermes 2 Pro / 3,
//               Qwen2.5, Qwen3, QwQ, and every template that does not render `tools` at all: those get the
//               fallback system prompt below and this syntax); the tag may hold Qwen3-Coder's XML instead
//               (Qwen3-Coder, Qwen3.5, Nemotron 3 Nano, StepFun 3.5): <function=N>\n<parameter=P>\nVALUE\n
//               </parameter>\n...</function>, a VALUE a string where the parameter's schema type says
//               string, else the JSON it holds (or the string when it holds none). Parsed only: a forced
//               call is written in the JSON form.
//   Llama3      {"name": N, "parameters": {...}}, optionally after <|python_tag|> (Llama 3.1 / 3.2 / 3.3);
//               one call per turn (the template refuses more)
//   Mistral     [TOOL_CALLS][{"name": N, "arguments": {...}, "id": ...}, ...] (Mistral Nemo / 7B v0.3)
//   MistralV11  [TOOL_CALLS]N[ARGS]{...} per call (Mistral Small 3.2, Devstral, Ministral 3)
//   Granite     <|tool_call|>[{"name": N, "arguments": {...}}, ...] (Granite 3.x; Granite 4 uses Hermes tags)
//   DeepSeek    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```
//               <｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (V3, R1), or N<｜tool▁sep｜>{...} after the call
//               begin (V3.1); its templates render the history's calls but not `tools` (the fallback prompt
//               describes them), so Hermes tags are taken too. Parsed only: a forced call is written as
//               Hermes tags.
//   Generic     a template that renders `tools` in a syntax not listed here: Hermes tags, or the whole
//               output a JSON object / array of {"name", "arguments"} naming declared functions
//
// Errors in the request throw FieldError (constraints.h) naming the field; the server answers 400.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "ultra/model.h"

namespace ultra::server {

enum class ToolSyntax { Hermes, Llama3, Mistral, MistralV11, Granite, DeepSeek, Generic };

struct ToolFamily {
  ToolSyntax syntax = ToolSyntax::Hermes;
  // The template renders the `tools` variable. When false the tools are described in a system message
  // (fallback_tool_prompt) and the history's tool calls / results are rewritten as Hermes text.
  bool template_takes_tools = false;
  bool xml_calls = false;  // Hermes tags around Qwen3-Coder's XML (<function=...><parameter=...>)
  // The template renders assistant messages' tool_calls and `tool` messages itself; when false they are
  // rewritten as Hermes text (prepare_tool_messages).
  bool template_takes_calls = false;
};

// The family of a template's source ("" = the server's built-in fallback format).
ToolFamily detect_tool_family(std::string_view template_source);
// "hermes", "llama3", "mistral", "mistral-v11", "granite", "deepseek", "generic".
const char* tool_syntax_name(ToolSyntax s);

enum class ToolChoice { None, Auto, Required, Named };

// A request's tools, checked.
struct ToolRequest {
  nlohmann::json tools = nlohmann::json::array();  // the request's definitions, as the template gets them
  std::vector<std::string> names;                  // [tools.size()] function names
  ToolChoice choice = ToolChoice::None;
  std::string named;     // ToolChoice::Named: the function
  bool parallel = true;  // parallel_tool_calls

  // Calls may be made: tools given and tool_choice not "none".
  bool active() const { return !names.empty() && choice != ToolChoice::None; }
  // The output must be calls (and is constrained by tool_call_grammar).
  bool forced() const { return choice == ToolChoice::Required || choice == ToolChoice::Named; }
};

// Reads `tools`, `tool_choice` and `parallel_tool_calls` from a chat request. Each tool must be {"type":
// "function", "function": {"name": [a-zA-Z0-9_-]{1,64}, "description"?: string, "parameters"?: object,
// "strict"?: bool}}, names distinct; "required" or a named function without tools ("auto" without them is
// "none") and a named function
// that is not among them are refused. FieldError names the field ("tools", "tool_choice",
// "parallel_tool_calls") and the message the element (tools[1].function.name).
ToolRequest parse_tool_request(const nlohmann::json& body);

// The template renders the tools into the prompt's text, where the text of a control token would become that
// token (the messages' strings are kept apart by encode_chat, the tools are not): a tool whose strings
// (object keys included) hold such text is refused, FieldError("tools") naming the element and the token.
void check_tools_special(const Tokenizer& tok, const ToolRequest& tools);

// The messages as the template gets them: assistant messages' tool_calls[].function.arguments given as a
// JSON string become the object (templates apply `tojson` to them, as vLLM does), and their null content ""
// (templates search it: Qwen3's `'</think>' in content`); when the template does not render tool calls, they
// become Hermes text (see below); when the template does not
// take tools, tool calls become Hermes text in the assistant's content and `tool` messages user messages
// holding <tool_response>...</tool_response>, and, with tools active, the fallback prompt is put in front
// of the first system message (or becomes one). A malformed tool_calls entry: FieldError("messages").
nlohmann::json prepare_tool_messages(const nlohmann::json& messages, const ToolFamily& family,
                                     const ToolRequest& tools);

// The fallback system prompt for templates that do not render tools (documented in README.md).
std::string fallback_tool_prompt(const ToolRequest& tools);

// GBNF whose sentences are calls in the family's syntax to the allowed functions (the named one, or any),
// one, or with parallel calls one or more (Llama3: always one), with arguments that validate against the
// function's parameters (the JSON Schema compiler's grammar, with at most one space or newline between JSON
// tokens: a sampler cannot spend the call's tokens on indentation). Control-token markers ([TOOL_CALLS] of
// Nemo,
// <|python_tag|>) are left out where the syntax does not need them: a grammar only produces text.
// FieldError("tools") naming the function when its parameters cannot be compiled.
std::string tool_call_grammar(const ToolRequest& tools, const ToolFamily& family);

// tool_choice "auto" with a lazy grammar (as llama.cpp's): the output is free until it writes `trigger` (the
// family's call marker, at a token boundary), then `grammar` (GBNF for the text after the trigger: the
// rest of the call, and further calls with parallel_tool_calls) constrains it, so a call once begun is
// well formed with arguments that validate. None (empty trigger) for Llama 3 (its calls start without a
// marker), Mistral v11 (its [ARGS] is a control token), XML calls, and when a parameters schema cannot be
// compiled (auto then stays free).
struct LazyToolGrammar {
  std::string trigger;
  std::string grammar;
};
LazyToolGrammar lazy_tool_grammar(const ToolRequest& tools, const ToolFamily& family);

struct ToolCall {
  std::string id;  // "call_" + 24 alphanumerics (Mistral: 9 alphanumerics, its templates' rule)
  std::string name;
  std::string arguments;  // a JSON object's text
};

struct ToolParse {
  std::string content;          // the text that is not a call ("" when the output was only calls)
  std::vector<ToolCall> calls;  // empty: the output holds no well-formed call (content = the whole text)
};

// Parses a whole output. A malformed call (bad JSON, an unclosed tag with more text after it, arguments
// that are not an object, a bare JSON call naming an undeclared function) makes the whole text content.
// With !tools.parallel only the first call is kept.
ToolParse parse_tool_calls(std::string_view text, const ToolFamily& family, const ToolRequest& tools);

// An output as it streams: push() returns the text that is certainly content (ready to send), holding back
// from where a call may begin (a tail that could start the family's marker, or, where a bare JSON call is
// possible, an output that starts with one); finish() parses the whole output and returns the content not
// yet returned (calls: the parsed calls). A forced request holds everything back.
class ToolCallStream {
 public:
  ToolCallStream(ToolFamily family, const ToolRequest& tools);
  std::string push(std::string_view text);
  ToolParse finish();

 private:
  ToolFamily family_;
  ToolRequest tools_;
  std::string buf_;       // the whole output so far
  size_t emitted_ = 0;    // bytes of buf_ returned as content
  bool holding_ = false;  // a call may have begun at emitted_: nothing more is content until finish()
};

}  // namespace ultra::server
