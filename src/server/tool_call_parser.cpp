// The model's output -> tool calls, per family (tool_calls.h): the whole-output parser and the streaming
// hold-back. Any input gives a result: a call that is not well formed leaves the whole text as content.
// Work is linear in the text (JSON values are delimited by one scan, nesting at most kMaxDepth levels).
#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "server/chat.h"
#include "server/json_text.h"
#include "server/tool_calls.h"

namespace ultra::server {

namespace {

using ojson = nlohmann::ordered_json;  // arguments keep the model's order

constexpr int kMaxDepth = 128;  // deeper JSON in a call is not a call
constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>", kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]", kMistralCallId = "[CALL_ID]";
constexpr std::string_view kGraniteCall = "<|tool_call|>";
constexpr std::string_view kDsCalls = "<｜tool▁calls▁begin｜>", kDsCall = "<｜tool▁call▁begin｜>",
                           kDsSep = "<｜tool▁sep｜>", kDsCallEnd = "<｜tool▁call▁end｜>",
                           kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kFnOpen = "<function=", kFnClose = "</function>";          // Functionary v3.1
constexpr std::string_view kRecipient = ">>>", kAll = "all";                          // Functionary v3.2
constexpr std::string_view kFunctools = "functools";                                  // FireFunction v2
constexpr std::string_view kAction = "Action:", kDirectlyAnswer = "directly-answer";  // Command R

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

bool is_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// The end (one past) of the JSON object or array that starts at s[i], npos when it is not one, is cut
// short or nests deeper than kMaxDepth. Only the brackets and strings are checked; the JSON parser checks
// the rest.
size_t json_value_end(std::string_view s, size_t i) {
  if (i >= s.size() || (s[i] != '{' && s[i] != '[')) return std::string_view::npos;
  char stack[kMaxDepth];
  int depth = 0;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '"') {
      for (++i; i < s.size() && s[i] != '"'; ++i)
        if (s[i] == '\\') ++i;
      if (i >= s.size()) return std::string_view::npos;
    } else if (c == '{' || c == '[') {
      if (depth == kMaxDepth) return std::string_view::npos;
      stack[depth++] = c == '{' ? '}' : ']';
    } else if (c == '}' || c == ']') {
      if (depth == 0 || stack[depth - 1] != c) return std::string_view::npos;
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// The JSON value at s[i] (advancing i past it), or a discarded value.
ojson take_json(std::string_view s, size_t& i) {
  const size_t e = json_value_end(s, i);
  if (e == std::string_view::npos) return ojson(ojson::value_t::discarded);
  ojson v = parse_ordered_json_text(s.substr(i, e - i), /*allow_exceptions=*/false);
  i = e;
  return v;
}

std::string random_alnum(size_t n) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s(n, 'a');
  for (char& c : s) c = kChars[rng() % 62];
  return s;
}

std::string new_id(ToolSyntax syntax) {
  return syntax == ToolSyntax::Mistral || syntax == ToolSyntax::MistralV11 ? random_alnum(9)
                                                                           : "call_" + random_alnum(24);
}

bool declared(const ToolRequest& tools, const std::string& name) {
  return std::find(tools.names.begin(), tools.names.end(), name) != tools.names.end();
}

// Arguments as the call's JSON text: an object, or a string holding one. False otherwise.
bool arguments_text(const ojson& a, std::string& out) {
  if (a.is_object()) {
    out = dump_replacing(a);
    return true;
  }
  if (a.is_string()) {
    const ojson p = parse_ordered_json_text(a.get<std::string>(), /*allow_exceptions=*/false);
    if (!p.is_object()) return false;
    out = dump_replacing(p);
    return true;
  }
  return false;
}

// {"name" | "tool_name": N, "arguments" | "parameters": {...}} (also wrapped as {"type": "function",
// "function": {...}}).
// must_declare: the name must be one of the request's functions (bare JSON, which any answer could be).
bool call_from(const ojson& v, ToolSyntax syntax, const ToolRequest& tools, bool must_declare, ToolCall& c) {
  if (!v.is_object()) return false;
  const ojson& o = v.contains("function") && v["function"].is_object() ? v["function"] : v;
  const char* name_key = o.contains("name") ? "name" : "tool_name";
  if (!o.contains(name_key) || !o[name_key].is_string()) return false;
  c.name = o[name_key].get<std::string>();
  if (c.name.empty() || (must_declare && !declared(tools, c.name))) return false;
  const char* key = o.contains("arguments") ? "arguments" : o.contains("parameters") ? "parameters" : nullptr;
  if (!key) {
    c.arguments = "{}";
  } else if (!arguments_text(o[key], c.arguments)) {
    return false;
  }
  c.id = v.contains("id") && v["id"].is_string() ? v["id"].get<std::string>() : "";
  if (c.id.empty() || c.id.size() > 64 ||
      !std::all_of(c.id.begin(), c.id.end(),
                   [](char ch) { return is_alnum(ch) || ch == '_' || ch == '-'; }) ||
      ((syntax == ToolSyntax::Mistral || syntax == ToolSyntax::MistralV11) && c.id.size() != 9))
    c.id = new_id(syntax);
  return true;
}

// Bare JSON at s[i]: one call object, or an array of them. All names declared.
bool bare_json_calls(std::string_view s, size_t i, ToolSyntax syntax, const ToolRequest& tools,
                     std::vector<ToolCall>& calls, size_t& end, bool must_declare = true) {
  const ojson v = take_json(s, i);
  if (v.is_discarded()) return false;
  const auto one = [&](const ojson& x) {
    ToolCall c;
    if (!call_from(x, syntax, tools, must_declare, c)) return false;
    calls.push_back(std::move(c));
    return true;
  };
  if (v.is_array()) {
    if (v.empty()) return false;
    for (const ojson& x : v)
      if (!one(x)) return false;
  } else if (!one(v)) {
    return false;
  }
  end = i;
  return true;
}

// The type a function's parameters schema gives a parameter ("" when it gives none).
std::string parameter_type(const ToolRequest& tools, const std::string& fn, const std::string& param) {
  for (size_t k = 0; k < tools.names.size(); ++k) {
    if (tools.names[k] != fn) continue;
    const nlohmann::json& f = tools.tools[k]["function"];
    if (!f.contains("parameters") || !f["parameters"].is_object()) return "";
    const nlohmann::json& props = f["parameters"].value("properties", nlohmann::json::object());
    if (!props.is_object() || !props.contains(param) || !props[param].is_object()) return "";
    const nlohmann::json& t = props[param].value("type", nlohmann::json());
    return t.is_string() ? t.get<std::string>() : "";
  }
  return "";
}

// A parameter's text as its JSON value: a string where the schema says so (or the text is no JSON), else
// the JSON it holds (Python's True / False for booleans, as templates print them).
ojson parameter_value(std::string_view text, const std::string& type) {
  if (type == "string") return ojson(std::string(text));
  if (type == "boolean" && (text == "True" || text == "False")) return ojson(text == "True");
  const size_t b = skip_ws(text, 0);  // an object or array: at most kMaxDepth levels
  if (b < text.size() && (text[b] == '{' || text[b] == '[') &&
      skip_ws(text, json_value_end(text, b)) != text.size())
    return ojson(std::string(text));
  ojson v = parse_ordered_json_text(text, /*allow_exceptions=*/false);
  return v.is_discarded() ? ojson(std::string(text)) : v;
}

// Qwen3-Coder's XML call (Qwen3.5, Nemotron 3 Nano, StepFun 3.5 too) at s[i] = "<function=":
//   <function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>
bool xml_call(std::string_view s, size_t& i, const ToolRequest& tools, ToolCall& c) {
  constexpr std::string_view kFn = "<function=", kFnEnd = "</function>",
                             kParam = "<parameter=", kParamEnd = "</parameter>";
  const auto tag_name = [&](std::string_view open, std::string& name) {
    if (s.compare(i, open.size(), open) != 0) return false;
    const size_t gt = s.find('>', i + open.size());
    if (gt == std::string_view::npos || gt - i - open.size() > 64) return false;
    name.assign(s.substr(i + open.size(), gt - i - open.size()));
    i = gt + 1;
    return !name.empty() && std::all_of(name.begin(), name.end(),
                                        [](char ch) { return is_alnum(ch) || ch == '_' || ch == '-'; });
  };
  if (!tag_name(kFn, c.name)) return false;
  ojson args = ojson::object();
  for (;;) {
    i = skip_ws(s, i);
    if (s.compare(i, kFnEnd.size(), kFnEnd) == 0) {
      i += kFnEnd.size();
      break;
    }
    std::string param;
    if (!tag_name(kParam, param)) return false;
    if (i < s.size() && s[i] == '\n') ++i;
    const size_t end = s.find(kParamEnd, i);
    if (end == std::string_view::npos) return false;
    std::string_view value = s.substr(i, end - i);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    args[param] = parameter_value(value, parameter_type(tools, c.name, param));
    i = end + kParamEnd.size();
  }
  c.arguments = dump_replacing(args);
  c.id = new_id(ToolSyntax::Hermes);
  return true;
}

// <tool_call> JSON or XML </tool_call> ... from `at` (where the first tag is). Text between and after the
// calls is content. A missing last close tag is allowed at the very end (a stop string may have eaten it).
bool hermes(std::string_view s, size_t at, ToolSyntax syntax, const ToolRequest& tools, ToolParse& r) {
  r.content.assign(s.substr(0, at));
  size_t i = at;
  while (i < s.size()) {
    if (s.compare(i, kHermesOpen.size(), kHermesOpen) != 0) {
      const size_t next = s.find(kHermesOpen, i);
      r.content.append(s.substr(i, next - i));
      if (next == std::string_view::npos) break;
      i = next;
      continue;
    }
    i = skip_ws(s, i + kHermesOpen.size());
    ToolCall c;
    if (s.compare(i, 10, "<function=") == 0) {
      if (!xml_call(s, i, tools, c)) return false;
    } else if (!call_from(take_json(s, i), syntax, tools, false, c)) {
      return false;
    }
    r.calls.push_back(std::move(c));
    i = skip_ws(s, i);
    if (s.compare(i, kHermesClose.size(), kHermesClose) == 0) {
      i += kHermesClose.size();
    } else if (i != s.size()) {
      return false;
    }
    if (i < s.size() && s.find(kHermesOpen, i) != std::string_view::npos) i = skip_ws(s, i);
  }
  return true;
}

// Llama 3.x: [<|python_tag|>] {call} [; {call}]... (the whole output); text before <|python_tag|> is content.
bool llama3(std::string_view s, const ToolRequest& tools, ToolParse& r) {
  size_t i = s.find(kPythonTag);
  if (i != std::string_view::npos) {
    r.content.assign(s.substr(0, i));
    i += kPythonTag.size();
  } else {
    i = 0;
  }
  i = skip_ws(s, i);
  if (i >= s.size() || s[i] != '{') return false;
  while (i < s.size()) {
    ToolCall c;
    if (!call_from(take_json(s, i), ToolSyntax::Llama3, tools, true, c)) return false;
    r.calls.push_back(std::move(c));
    i = skip_ws(s, i);
    if (i < s.size() && s[i] == ';') i = skip_ws(s, i + 1);
  }
  return true;
}

// Mistral: [TOOL_CALLS][{...}, ...] (Nemo) or [TOOL_CALLS]name[CALL_ID]id[ARGS]{...} per call (v11); a
// bare [{...}] array at the start (what the grammar writes for Nemo). Text before the first marker is
// content.
bool mistral(std::string_view s, const ToolRequest& tools, ToolParse& r) {
  size_t i = s.find(kMistralCalls);
  if (i == std::string_view::npos) {
    i = skip_ws(s, 0);
    size_t end = 0;
    if (!bare_json_calls(s, i, ToolSyntax::Mistral, tools, r.calls, end) || skip_ws(s, end) != s.size())
      return false;
    return true;
  }
  r.content.assign(s.substr(0, i));
  while (i < s.size()) {
    if (s.compare(i, kMistralCalls.size(), kMistralCalls) != 0) return false;
    i = skip_ws(s, i + kMistralCalls.size());
    if (i < s.size() && s[i] == '[') {  // Nemo: a JSON array of calls
      const ojson v = take_json(s, i);
      if (!v.is_array() || v.empty()) return false;
      for (const ojson& x : v) {
        ToolCall c;
        if (!call_from(x, ToolSyntax::Mistral, tools, false, c)) return false;
        r.calls.push_back(std::move(c));
      }
    } else {  // v11: name [CALL_ID]id [ARGS]{...}
      const size_t args = s.find(kMistralArgs, i);
      if (args == std::string_view::npos) return false;
      std::string_view head = s.substr(i, args - i);
      std::string id;
      if (const size_t ci = head.find(kMistralCallId); ci != std::string_view::npos) {
        id.assign(head.substr(ci + kMistralCallId.size()));
        head = head.substr(0, ci);
      }
      ToolCall c;
      c.name.assign(head);
      if (c.name.empty() || c.name.size() > 64 || !std::all_of(c.name.begin(), c.name.end(), [](char ch) {
            return is_alnum(ch) || ch == '_' || ch == '-';
          }))
        return false;
      i = skip_ws(s, args + kMistralArgs.size());
      if (!arguments_text(take_json(s, i), c.arguments)) return false;
      c.id =
          id.size() == 9 && std::all_of(id.begin(), id.end(), is_alnum) ? id : new_id(ToolSyntax::MistralV11);
      r.calls.push_back(std::move(c));
    }
    i = skip_ws(s, i);
  }
  return true;
}

// Granite 3: <|tool_call|> and a JSON array of calls (or one call); the bare array at the start (what the
// grammar writes). Text before the marker is content.
bool granite(std::string_view s, const ToolRequest& tools, ToolParse& r) {
  size_t i = s.find(kGraniteCall);
  const bool marked = i != std::string_view::npos;
  if (marked) {
    r.content.assign(s.substr(0, i));
    i += kGraniteCall.size();
  } else {
    i = 0;
  }
  size_t end = 0;
  return bare_json_calls(s, skip_ws(s, i), ToolSyntax::Granite, tools, r.calls, end,
                         /*must_declare=*/!marked) &&
         skip_ws(s, end) == s.size();
}

// DeepSeek: <｜tool▁calls▁begin｜> then per call <｜tool▁call▁begin｜> [function<｜tool▁sep｜>NAME\n```json\n
// {...}\n```] or [NAME<｜tool▁sep｜>{...}] <｜tool▁call▁end｜>, then <｜tool▁calls▁end｜>. Text before is
// content.
bool deepseek(std::string_view s, size_t at, const ToolRequest& tools, ToolParse& r) {
  r.content.assign(s.substr(0, at));
  size_t i = at;
  if (s.compare(i, kDsCalls.size(), kDsCalls) == 0) i += kDsCalls.size();
  for (;;) {
    i = skip_ws(s, i);
    if (s.compare(i, kDsCall.size(), kDsCall) != 0) break;
    i += kDsCall.size();
    ToolCall c;
    const size_t sep = s.find(kDsSep, i);
    if (sep == std::string_view::npos) return false;
    const std::string_view head = s.substr(i, sep - i);
    i = sep + kDsSep.size();
    size_t name_end = i;
    if (head == "function") {  // V3 / R1: the name on its line, the arguments in a ```json fence
      name_end = s.find('\n', i);
      if (name_end == std::string_view::npos) return false;
      c.name.assign(s.substr(i, name_end - i));
      i = skip_ws(s, name_end);
      if (s.compare(i, 7, "```json") == 0)
        i += 7;
      else if (s.compare(i, 3, "```") == 0)
        i += 3;
    } else {  // V3.1: NAME<｜tool▁sep｜>{...}
      c.name.assign(head);
    }
    if (c.name.empty() || c.name.size() > 64 || !std::all_of(c.name.begin(), c.name.end(), [](char ch) {
          return is_alnum(ch) || ch == '_' || ch == '-';
        }))
      return false;
    i = skip_ws(s, i);
    if (!arguments_text(take_json(s, i), c.arguments)) return false;
    i = skip_ws(s, i);
    if (s.compare(i, 3, "```") == 0) i = skip_ws(s, i + 3);
    if (s.compare(i, kDsCallEnd.size(), kDsCallEnd) != 0) return false;
    i += kDsCallEnd.size();
    c.id = new_id(ToolSyntax::DeepSeek);
    r.calls.push_back(std::move(c));
  }
  if (s.compare(i, kDsCallsEnd.size(), kDsCallsEnd) == 0) i = skip_ws(s, i + kDsCallsEnd.size());
  return !r.calls.empty() && i == s.size();
}

bool valid_call_name(std::string_view n) {
  return !n.empty() && n.size() <= 64 &&
         std::all_of(n.begin(), n.end(), [](char ch) { return is_alnum(ch) || ch == '_' || ch == '-'; });
}

// Functionary v3.1: <function=NAME>{...}</function> per call, or <|python_tag|> and raw code to the end (a
// "python" call with {"code": ...}). Text before and between the calls is content; a missing last close tag
// is allowed at the very end.
bool functionary_v31(std::string_view s, const ToolRequest& tools, ToolParse& r) {
  (void)tools;
  size_t i = 0;
  while (i < s.size()) {
    const size_t fn = s.find(kFnOpen, i), py = s.find(kPythonTag, i);
    const size_t at = std::min(fn, py);
    r.content.append(s.substr(i, at - i));
    if (at == std::string_view::npos) break;
    ToolCall c;
    c.id = new_id(ToolSyntax::FunctionaryV31);
    if (at == py) {
      c.name = "python";
      c.arguments = dump_replacing(ojson{{"code", std::string(s.substr(py + kPythonTag.size()))}});
      r.calls.push_back(std::move(c));
      break;
    }
    i = at + kFnOpen.size();
    const size_t gt = s.find('>', i);
    if (gt == std::string_view::npos || !valid_call_name(s.substr(i, gt - i))) return false;
    c.name.assign(s.substr(i, gt - i));
    i = skip_ws(s, gt + 1);
    if (!arguments_text(take_json(s, i), c.arguments)) return false;
    i = skip_ws(s, i);
    if (s.compare(i, kFnClose.size(), kFnClose) == 0) {
      i += kFnClose.size();
    } else if (i != s.size()) {
      return false;
    }
    r.calls.push_back(std::move(c));
  }
  return true;
}

// Functionary v3.2: parts "RECIPIENT\n..." separated by >>> (the first follows the prompt's): "all" parts
// are content (their text without the recipient line), others calls with a JSON object ("python": raw
// code too).
bool functionary_v32(std::string_view s, const ToolRequest& tools, ToolParse& r) {
  (void)tools;
  size_t i = 0;
  for (;;) {
    const size_t nl = s.find('\n', i);
    if (nl == std::string_view::npos || !valid_call_name(s.substr(i, nl - i))) return false;
    const std::string_view name = s.substr(i, nl - i);
    i = nl + 1;
    if (name == kAll) {
      const size_t next = s.find(kRecipient, i);
      r.content.append(s.substr(i, next - i));
      if (next == std::string_view::npos) return true;
      i = next + kRecipient.size();
      continue;
    }
    ToolCall c;
    c.name.assign(name);
    c.id = new_id(ToolSyntax::FunctionaryV32);
    const size_t b = skip_ws(s, i);
    size_t e = b;
    if (!arguments_text(take_json(s, e), c.arguments)) {
      if (name != "python") return false;
      e = std::min(s.find(kRecipient, i), s.size());
      c.arguments = dump_replacing(ojson{{"code", std::string(s.substr(i, e - i))}});
    }
    r.calls.push_back(std::move(c));
    i = skip_ws(s, e);
    if (i == s.size()) return true;
    if (s.compare(i, kRecipient.size(), kRecipient) != 0) return false;
    i += kRecipient.size();
  }
}

// FireFunction v2: [text] functools[{"name": N, "arguments": {...}}, ...] to the end.
bool firefunction(std::string_view s, const ToolRequest& tools, ToolParse& r) {
  const size_t at = s.find(kFunctools);
  if (at == std::string_view::npos) return false;
  r.content.assign(s.substr(0, at));
  size_t end = 0;
  return bare_json_calls(s, skip_ws(s, at + kFunctools.size()), ToolSyntax::FireFunction, tools, r.calls, end,
                         /*must_declare=*/false) &&
         skip_ws(s, end) == s.size();
}

// Command R / R+: [text] Action: [```json] [{"tool_name": N, "parameters": {...}}, ...] [```] to the end.
// "directly-answer" (its built-in non-call) is dropped unless the request declares it.
bool command_r(std::string_view s, const ToolRequest& tools, ToolParse& r) {
  const size_t at = s.find(kAction);
  if (at == std::string_view::npos) return false;
  r.content.assign(s.substr(0, at));
  size_t i = skip_ws(s, at + kAction.size());
  if (s.compare(i, 7, "```json") == 0)
    i += 7;
  else if (s.compare(i, 3, "```") == 0)
    i += 3;
  i = skip_ws(s, i);
  size_t end = 0;
  if (!bare_json_calls(s, i, ToolSyntax::CommandR, tools, r.calls, end, /*must_declare=*/false)) return false;
  i = skip_ws(s, end);
  if (s.compare(i, 3, "```") == 0) i = skip_ws(s, i + 3);
  if (i != s.size()) return false;
  std::erase_if(r.calls,
                [&](const ToolCall& c) { return c.name == kDirectlyAnswer && !declared(tools, c.name); });
  return true;
}

// The cut mark: a private-use character (U+E000) that ends an open string of a held output
// (close_json_prefix), so that the part of a dump before it is text the model wrote.
constexpr std::string_view kCut = "\xEE\x80\x80";

// Drops a UTF-8 sequence cut short at the end of s.
void drop_partial_utf8(std::string& s) {
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const unsigned char c = (unsigned char)s[s.size() - back];
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need > back) s.resize(s.size() - back);
    return;
  }
}

// s closed as JSON into out: s (without an escape or a UTF-8 sequence cut short at its end), then `pad`,
// then, in an open string, kCut and a quote, then the open brackets' closers. False when s ends in a number
// or a word (it may go on, and a number dumps otherwise once it does: "5" may become "5e-1", 0.5) or nests
// deeper than kMaxDepth.
bool close_json_prefix(std::string_view s, std::string_view pad, std::string& out) {
  char stack[kMaxDepth];
  int depth = 0;
  bool in_str = false;
  size_t esc_at = std::string_view::npos;  // the backslash of an escape not yet complete
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_str) {
      if (esc_at != std::string_view::npos) {
        if (s[esc_at + 1] != 'u' || i == esc_at + 5) esc_at = std::string_view::npos;
      } else if (c == '\\') {
        esc_at = i;
      } else if (c == '"') {
        in_str = false;
      }
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      if (depth == kMaxDepth) return false;
      stack[depth++] = c == '{' ? '}' : ']';
    } else if ((c == '}' || c == ']') && depth > 0 && stack[depth - 1] == c) {
      --depth;
    }
  }
  out.assign(s);
  if (in_str && esc_at != std::string_view::npos) out.resize(esc_at);
  drop_partial_utf8(out);
  if (!in_str) {
    size_t k = out.size();
    while (k > 0 && is_space(out[k - 1])) --k;
    if (k > 0 && (is_alnum(out[k - 1]) || out[k - 1] == '.' || out[k - 1] == '+' || out[k - 1] == '-'))
      return false;
  }
  out += pad;
  if (in_str) {
    out += kCut;
    out += '"';
  }
  while (depth > 0) out += stack[--depth];
  return true;
}

// The marker a call of this family begins with ("" for none).
std::string_view marker(ToolSyntax s) {
  switch (s) {
    case ToolSyntax::Hermes:
    case ToolSyntax::Generic:
    case ToolSyntax::DeepSeek:  // and kDsCalls (ToolCallStream::push)
      return kHermesOpen;
    case ToolSyntax::Granite:
      return kGraniteCall;
    case ToolSyntax::Llama3:
      return kPythonTag;
    case ToolSyntax::Mistral:
    case ToolSyntax::MistralV11:
      return kMistralCalls;
    case ToolSyntax::FunctionaryV31:
      return kFnOpen;  // and kPythonTag (ToolCallStream::push)
    case ToolSyntax::FunctionaryV32:
      return kRecipient;
    case ToolSyntax::FireFunction:
      return kFunctools;
    case ToolSyntax::CommandR:
      return kAction;
  }
  return {};
}

}  // namespace

std::string new_call_id() {
  return new_id(ToolSyntax::Hermes);
}

ToolParse parse_tool_calls(std::string_view text, const ToolFamily& family, const ToolRequest& tools) {
  ToolParse r;
  bool ok = false;
  switch (family.syntax) {
    case ToolSyntax::Hermes:
    case ToolSyntax::Generic: {
      const size_t at = text.find(kHermesOpen);
      if (at != std::string_view::npos) {
        ok = hermes(text, at, family.syntax, tools, r);
      } else if (family.syntax == ToolSyntax::Generic) {
        size_t end = 0;
        ok = bare_json_calls(text, skip_ws(text, 0), family.syntax, tools, r.calls, end) &&
             skip_ws(text, end) == text.size();
      }
      break;
    }
    case ToolSyntax::Llama3:
      ok = llama3(text, tools, r);
      break;
    case ToolSyntax::Granite:
      ok = granite(text, tools, r);
      break;
    case ToolSyntax::DeepSeek: {
      const size_t ds = std::min(text.find(kDsCalls), text.find(kDsCall));
      const size_t at = text.find(kHermesOpen);
      if (ds != std::string_view::npos && (at == std::string_view::npos || ds < at))
        ok = deepseek(text, ds, tools, r);
      else if (at != std::string_view::npos)
        ok = hermes(text, at, family.syntax, tools, r);
      break;
    }
    case ToolSyntax::Mistral:
    case ToolSyntax::MistralV11:
      ok = mistral(text, tools, r);
      break;
    case ToolSyntax::FunctionaryV31:
      ok = functionary_v31(text, tools, r);
      break;
    case ToolSyntax::FunctionaryV32:
      ok = functionary_v32(text, tools, r);
      break;
    case ToolSyntax::FireFunction:
      ok = firefunction(text, tools, r);
      break;
    case ToolSyntax::CommandR:
      ok = command_r(text, tools, r);
      break;
  }
  // Without calls the text is content; Functionary v3.2's without its recipient lines, Command R's without
  // an action that only answered directly.
  const bool content_only =
      ok && (family.syntax == ToolSyntax::FunctionaryV32 || family.syntax == ToolSyntax::CommandR);
  if (r.calls.empty() && content_only) return ToolParse{std::move(r.content), {}};
  if (!ok || r.calls.empty()) {  // the text (Functionary v3.2: without a first "all" recipient line)
    const bool all = family.syntax == ToolSyntax::FunctionaryV32 && text.starts_with("all\n");
    return ToolParse{std::string(text.substr(all ? 4 : 0)), {}};
  }
  if (!tools.parallel) r.calls.resize(1);
  return r;
}

ToolCallStream::ToolCallStream(ToolFamily family, const ToolRequest& tools)
    : family_(family), tools_(tools), holding_(tools.forced()) {}

std::string ToolCallStream::push(std::string_view text) {
  buf_.append(text);
  if (holding_) {
    progress();
    return {};
  }
  // The markers a call may begin with: the family's, and DeepSeek's own beside the Hermes tag (Functionary
  // v3.1's <|python_tag|> beside its <function=).
  const std::string_view m = marker(family_.syntax);
  const std::string_view m2 = family_.syntax == ToolSyntax::DeepSeek ? kDsCall.substr(0, kDsCall.size() - 12)
                              : family_.syntax == ToolSyntax::FunctionaryV31 ? kPythonTag
                                                                             : std::string_view{};
  const std::string_view b = buf_;
  // Functionary v3.2: the first line names the recipient; "all" is content (from after the line), else a
  // call. A first line that is no name is content as it is.
  if (family_.syntax == ToolSyntax::FunctionaryV32 && !started_) {
    const size_t nl = b.find('\n');
    const std::string_view line = b.substr(0, std::min(nl, b.size()));
    const bool name = valid_call_name(line) || line.empty();
    if (nl == std::string_view::npos && name) return {};  // the line goes on
    started_ = true;
    if (name && line == kAll) {
      skip_ = emitted_ = nl + 1;
    } else if (name) {
      holding_ = true;
      return {};
    }
  }
  // A call at the start without a marker: bare JSON (Llama 3, the grammar's Mistral / Granite array,
  // Generic); hold on while the output is only whitespace or a beginning of the marker.
  const bool bare_json = family_.syntax == ToolSyntax::Llama3 || family_.syntax == ToolSyntax::Mistral ||
                         family_.syntax == ToolSyntax::MistralV11 || family_.syntax == ToolSyntax::Granite ||
                         family_.syntax == ToolSyntax::Generic;
  if (emitted_ == 0 && bare_json) {
    const size_t i = skip_ws(b, 0);
    const std::string_view rest = b.substr(i);
    const bool json_start = !rest.empty() && (rest[0] == '{' || rest[0] == '[') &&
                            (family_.syntax != ToolSyntax::Llama3 || rest[0] == '{');
    if (json_start) {
      holding_ = true;
      progress();
      return {};
    }
    if (rest.empty() || (rest.size() < m.size() && m.substr(0, rest.size()) == rest)) return {};
  }
  size_t end = b.size();
  for (const std::string_view mk : {m, m2}) {
    if (mk.empty()) continue;
    const size_t at = b.find(mk, emitted_);
    if (at != std::string_view::npos) {
      holding_ = true;
      end = std::min(end, at);
      continue;
    }
    end =
        std::min(end, b.size() - partial_marker_tail(b.substr(emitted_), mk));  // a tail that could begin it
  }
  std::string out(b.substr(emitted_, end - emitted_));
  emitted_ = end;
  if (holding_) progress();
  return out;
}

// The held text closed as JSON twice, without and with a space before the closing, and parsed (when it grew
// by an eighth since the last parse: the work stays linear in the output). Each call whose name is complete
// is announced, and its arguments advance to the part of their dumps that can no longer change: where the
// two agree (a difference is the closing's doing: it went into an open string, or into raw code, a Python
// call's), and for the last call without the closing brackets; the calls before it are whole.
void ToolCallStream::progress() {
  if (diverged_) return;
  const size_t held = buf_.size() - emitted_;
  if (buf_.size() - parsed_at_ < std::max<size_t>(8, held / 8)) return;
  parsed_at_ = buf_.size();
  std::string closed[2];
  for (int v = 0; v < 2; ++v) {
    if (!close_json_prefix(std::string_view(buf_).substr(emitted_), v == 0 ? "" : " ", closed[v])) return;
    closed[v].insert(0, buf_, 0, emitted_);
  }
  const ToolParse r = parse_tool_calls(closed[0], family_, tools_);
  const ToolParse r2 = parse_tool_calls(closed[1], family_, tools_);
  const size_t n = std::min(r.calls.size(), r2.calls.size());
  for (size_t k = 0; k < n && k <= sent_.size(); ++k) {
    const ToolCall& c = r.calls[k];
    if (c.name.find(kCut) != std::string::npos || c.name != r2.calls[k].name) break;  // the name goes on
    if (k < sent_.size() && c.name != sent_[k].name) {
      diverged_ = true;
      return;
    }
    const std::string& a2 = r2.calls[k].arguments;
    std::string_view a = c.arguments;
    a = a.substr(0, (size_t)(std::mismatch(a.begin(), a.end(), a2.begin(), a2.end()).first - a.begin()));
    if (k + 1 == r.calls.size())
      while (!a.empty() && (a.back() == '}' || a.back() == ']')) a.remove_suffix(1);
    advance(k, c, a);
  }
}

void ToolCallStream::advance(size_t k, const ToolCall& c, std::string_view stable) {
  if (k == sent_.size()) {
    sent_.push_back({c.id, c.name, ""});
    deltas_.push_back({k, c.id, c.name, ""});
  }
  Sent& s = sent_[k];
  if (stable.size() <= s.arguments.size()) return;
  if (stable.substr(0, s.arguments.size()) != s.arguments) {
    diverged_ = true;
    return;
  }
  const std::string_view piece = stable.substr(s.arguments.size());
  s.arguments.append(piece);
  if (!deltas_.empty() && deltas_.back().index == k)
    deltas_.back().arguments.append(piece);
  else
    deltas_.push_back({k, "", "", std::string(piece)});
}

std::vector<ToolCallDelta> ToolCallStream::take_deltas() {
  std::vector<ToolCallDelta> d = std::move(deltas_);
  deltas_.clear();
  return d;
}

ToolParse ToolCallStream::finish() {
  ToolParse r = parse_tool_calls(buf_, family_, tools_);
  // The content already returned is a prefix of what the parse calls content (the text before the first
  // call); the rest is returned now.
  const size_t n = emitted_ - skip_;
  if (r.content.compare(0, n, buf_, skip_, n) != 0) {
    r.calls.clear();
    r.content = buf_.substr(emitted_);
  } else {
    r.content.erase(0, n);
  }
  // The rest of each call's arguments; the ids announced stay.
  if (r.calls.size() < sent_.size()) diverged_ = true;
  for (size_t k = 0; k < r.calls.size() && !diverged_; ++k) {
    ToolCall& c = r.calls[k];
    if (k < sent_.size()) {
      if (c.name != sent_[k].name || !c.arguments.starts_with(sent_[k].arguments)) {
        diverged_ = true;
        break;
      }
      c.id = sent_[k].id;
    }
    advance(k, c, c.arguments);
  }
  return r;
}

}  // namespace ultra::server
