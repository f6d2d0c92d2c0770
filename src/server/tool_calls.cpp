// Tool calls: the family of a template, the request's tools and the messages the template gets
// (tool_calls.h). The output parser is tool_call_parser.cpp, the grammar tool_call_grammar.cpp.
#include "server/tool_calls.h"
#include "server/json_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <functional>
#include <set>

#include "server/chat.h"
#include "server/constraints.h"

namespace ultra::server {

using json = nlohmann::json;

namespace {

bool has(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

bool given(const json& j, const char* k) {
  return j.contains(k) && !j[k].is_null();
}

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  return true;
}

// One {"name": N, "arguments": {...}} call as Hermes text (the fallback's history).
std::string hermes_call_text(const std::string& name, const json& arguments) {
  // name first, as the model is asked to write it
  return fmt::format("<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>",
                     dump_replacing(json(name)), dump_replacing(arguments));
}

}  // namespace

ToolFamily detect_tool_family(std::string_view src) {
  ToolFamily f;
  f.template_takes_tools = has(src, "tools");
  f.template_takes_calls = has(src, "tool_calls");
  if (has(src, "tool▁calls▁begin")) {  // DeepSeek: with or without tools in the template
    f.syntax = ToolSyntax::DeepSeek;
    return f;
  }
  if (!f.template_takes_tools) {  // the fallback prompt teaches Hermes tags
    f.template_takes_calls = false;
    return f;
  }
  if (has(src, "<|tool_call|>")) {
    f.syntax = ToolSyntax::Granite;
  } else if (has(src, " functools[")) {  // renders `functions` (tool_template_variables)
    f.syntax = ToolSyntax::FireFunction;
    f.string_arguments = true;
  } else if (has(src, "Action:") && has(src, "```json") && has(src, "tool_name") &&
             !has(src, "<|START_ACTION|>")) {  // not Command R7B's syntax
    f.syntax = ToolSyntax::CommandR;
  } else if (has(src, "<tool_call>")) {
    f.syntax = ToolSyntax::Hermes;
    f.xml_calls = has(src, "<function=") && has(src, "<parameter=");
  } else if (has(src, "[TOOL_CALLS]")) {
    f.syntax = has(src, "[ARGS]") ? ToolSyntax::MistralV11 : ToolSyntax::Mistral;
  } else if (has(src, "<|start_header_id|>") && has(src, ">>>") && has(src, "recipient")) {
    f.syntax = ToolSyntax::FunctionaryV32;
    f.string_arguments = true;
  } else if (has(src, "<|start_header_id|>") && has(src, "<function=") && has(src, "</function>")) {
    f.syntax = ToolSyntax::FunctionaryV31;
  } else if (has(src, "<|start_header_id|>") && (has(src, "ipython") || has(src, "<|python_tag|>"))) {
    f.syntax = ToolSyntax::Llama3;
  } else {
    f.syntax = ToolSyntax::Generic;
  }
  return f;
}

const char* tool_syntax_name(ToolSyntax s) {
  switch (s) {
    case ToolSyntax::Hermes:
      return "hermes";
    case ToolSyntax::Llama3:
      return "llama3";
    case ToolSyntax::Mistral:
      return "mistral";
    case ToolSyntax::MistralV11:
      return "mistral-v11";
    case ToolSyntax::Granite:
      return "granite";
    case ToolSyntax::DeepSeek:
      return "deepseek";
    case ToolSyntax::FunctionaryV31:
      return "functionary-v3.1";
    case ToolSyntax::FunctionaryV32:
      return "functionary-v3.2";
    case ToolSyntax::FireFunction:
      return "firefunction-v2";
    case ToolSyntax::CommandR:
      return "command-r";
    case ToolSyntax::Generic:
      return "generic";
  }
  return "?";
}

ToolRequest parse_tool_request(const json& body) {
  ToolRequest r;
  if (given(body, "tools")) {
    const json& tools = body["tools"];
    if (!tools.is_array())
      throw FieldError("tools", "'tools' must be a list of {type: function, function} objects");
    std::set<std::string> seen;
    for (size_t i = 0; i < tools.size(); ++i) {
      const json& t = tools[i];
      const auto at = [&](const char* what) { return fmt::format("'tools[{}]{}'", i, what); };
      if (!t.is_object()) throw FieldError("tools", fmt::format("{} must be an object", at("")));
      if (!t.contains("type") || t["type"] != "function")
        throw FieldError("tools", fmt::format("{} must be \"function\"", at(".type")));
      if (!t.contains("function") || !t["function"].is_object())
        throw FieldError("tools", fmt::format("{} must be an object", at(".function")));
      const json& f = t["function"];
      if (!f.contains("name") || !f["name"].is_string() || !valid_name(f["name"].get<std::string>()))
        throw FieldError("tools", fmt::format("{} must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -",
                                              at(".function.name")));
      const std::string name = f["name"].get<std::string>();
      if (!seen.insert(name).second)
        throw FieldError("tools", fmt::format("{} '{}' is defined twice", at(".function.name"), name));
      if (given(f, "description") && !f["description"].is_string())
        throw FieldError("tools", fmt::format("{} must be a string", at(".function.description")));
      if (given(f, "parameters") && !f["parameters"].is_object())
        throw FieldError("tools", fmt::format("{} must be a JSON Schema object", at(".function.parameters")));
      if (given(f, "strict") && !f["strict"].is_boolean())
        throw FieldError("tools", fmt::format("{} must be a boolean", at(".function.strict")));
      r.names.push_back(name);
    }
    r.tools = tools;
  }
  r.choice = r.names.empty() ? ToolChoice::None : ToolChoice::Auto;
  if (given(body, "tool_choice")) {
    const json& c = body["tool_choice"];
    if (c.is_string()) {
      const std::string s = c.get<std::string>();
      if (s == "none") {
        r.choice = ToolChoice::None;
      } else if (s == "auto") {
        r.choice = ToolChoice::Auto;
      } else if (s == "required") {
        r.choice = ToolChoice::Required;
      } else {
        throw FieldError("tool_choice",
                         fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or {{\"type\": "
                                     "\"function\", \"function\": {{\"name\": ...}}}}, got \"{}\"",
                                     s.substr(0, 64)));
      }
    } else if (c.is_object()) {
      if (!c.contains("type") || c["type"] != "function" || !c.contains("function") ||
          !c["function"].is_object() || !c["function"].contains("name") || !c["function"]["name"].is_string())
        throw FieldError(
            "tool_choice",
            "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": "
            "...}}");
      r.choice = ToolChoice::Named;
      r.named = c["function"]["name"].get<std::string>();
      if (std::find(r.names.begin(), r.names.end(), r.named) == r.names.end())
        throw FieldError("tool_choice",
                         fmt::format("'tool_choice' names the function '{}', which 'tools' does "
                                     "not define",
                                     r.named.substr(0, 64)));
    } else {
      throw FieldError("tool_choice", "'tool_choice' must be a string or an object");
    }
    if (r.forced() && r.names.empty())
      throw FieldError("tool_choice", "'tool_choice' asks for tool calls but no 'tools' are given");
    if (r.names.empty()) r.choice = ToolChoice::None;  // "auto" without tools
  }
  if (given(body, "parallel_tool_calls")) {
    if (!body["parallel_tool_calls"].is_boolean())
      throw FieldError("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    r.parallel = body["parallel_tool_calls"].get<bool>();
  }
  return r;
}

void check_tools_special(const Tokenizer& tok, const ToolRequest& tools) {
  const std::function<void(const json&, const std::string&)> walk = [&](const json& v,
                                                                        const std::string& where) {
    const auto check = [&](const std::string& s) {
      size_t at = 0;
      const int32_t id = tok.find_special(s, &at);
      if (id >= 0)
        throw FieldError("tools",
                         fmt::format("'{}' contains the text of the special token '{}' (at byte {}), "
                                     "which the chat template would pass as that token; remove it",
                                     where, tok.token_to_piece(id), at));
    };
    if (v.is_string()) {
      check(v.get<std::string>());
    } else if (v.is_object()) {
      for (const auto& [k, x] : v.items()) {
        check(k);
        walk(x, where + "." + k.substr(0, 64));
      }
    } else if (v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i) walk(v[i], fmt::format("{}[{}]", where, i));
    }
  };
  walk(tools.tools, "tools");
}

json tool_template_variables(const ToolFamily& family, const ToolRequest& tools) {
  json vars = {{"tools", tools.tools}};
  if (family.syntax == ToolSyntax::FireFunction) {
    vars["functions"] = dump_replacing(tools.tools, 2);
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char buf[64];
    vars["datetime"] = std::string(buf, std::strftime(buf, sizeof buf, "%b %d %Y %H:%M:%S GMT", &tm));
  }
  return vars;
}

std::string fallback_tool_prompt(const ToolRequest& tools) {
  std::string s = "You can call these functions (their parameters as JSON Schema):\n";
  for (const json& t : tools.tools) {
    const json& f = t["function"];
    json d = {{"name", f["name"]}};
    if (given(f, "description")) d["description"] = f["description"];
    d["parameters"] = given(f, "parameters") ? f["parameters"] : json::object();
    s += dump_replacing(d) + "\n";
  }
  s += "To call one, reply with <tool_call>\n{\"name\": NAME, \"arguments\": {...}}\n</tool_call>";
  return s;
}

json prepare_tool_messages(const json& messages, const ToolFamily& family, const ToolRequest& tools) {
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    json m = messages[i];
    const std::string role = m["role"].get<std::string>();
    if (role == "assistant" && given(m, "tool_calls")) {
      const auto bad = [&](const std::string& what) {
        throw FieldError("messages", fmt::format("messages[{}].tool_calls{}", i, what));
      };
      json& calls = m["tool_calls"];
      if (!calls.is_array()) bad(" must be a list of {id, type, function: {name, arguments}} objects");
      std::string text;
      for (size_t k = 0; k < calls.size(); ++k) {
        json& c = calls[k];
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
          bad(fmt::format("[{}] must be an object with a 'function' object", k));
        json& f = c["function"];
        if (!f.contains("name") || !f["name"].is_string())
          bad(fmt::format("[{}].function.name must be a string", k));
        if (f.contains("arguments") && f["arguments"].is_string()) {
          json a = parse_json_text(f["arguments"].get<std::string>(), nullptr, /*allow_exceptions=*/false);
          if (a.is_object()) f["arguments"] = std::move(a);  // else left a string
        } else if (!given(f, "arguments")) {
          f["arguments"] = json::object();
        } else if (!f["arguments"].is_object()) {
          bad(fmt::format("[{}].function.arguments must be a JSON string or an object", k));
        }
        if (family.string_arguments && family.template_takes_calls && f["arguments"].is_object())
          f["arguments"] = dump_replacing(f["arguments"]);
        if (!family.template_takes_calls) text += "\n" + hermes_call_text(f["name"], f["arguments"]);
      }
      if (!given(m, "content")) m["content"] = "";  // templates test or search it (Qwen3: '</think>' in it)
      if (!family.template_takes_calls) {
        std::string content = given(m, "content") ? message_text(m["content"]) : "";
        m["content"] = content + (content.empty() ? text.substr(1) : text);
        m.erase("tool_calls");
      }
    } else if (role == "tool" && !family.template_takes_calls) {
      const std::string content = given(m, "content") ? message_text(m["content"]) : "";
      m = {{"role", "user"}, {"content", "<tool_response>\n" + content + "\n</tool_response>"}};
    }
    out.push_back(std::move(m));
  }
  if (tools.active() && !family.template_takes_tools) {
    const std::string prompt = fallback_tool_prompt(tools);
    if (!out.empty() && out[0]["role"] == "system") {
      const std::string sys = given(out[0], "content") ? message_text(out[0]["content"]) : "";
      out[0]["content"] = sys.empty() ? prompt : sys + "\n\n" + prompt;
    } else {
      out.insert(out.begin(), json{{"role", "system"}, {"content", prompt}});
    }
  }
  return out;
}

}  // namespace ultra::server
