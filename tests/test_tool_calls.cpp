// Tool calls (src/server/tool_calls.h): the family of real templates, tool conversations rendered as Python's
// jinja2 renders them (tests/fixtures/templates/tool_renderings.json, tools/make_tool_fixtures.py), the
// output parser per family (well-formed, malformed, hostile and huge inputs), the streaming hold-back, and
// the grammar of forced calls (its sentences parse into calls whose arguments validate).
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "chat/chat_template.h"
#include "grammar/gbnf_parser.h"
#include "grammar/grammar_matcher.h"
#include "sanitized.h"
#include "server/constraints.h"
#include "server/tool_calls.h"

using json = nlohmann::json;
using namespace ultra;
using namespace ultra::server;

namespace {

const std::string kTemplates = std::string(ULTRA_SOURCE_DIR) + "/tests/fixtures/templates/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string template_source(const std::string& name) {
  return read_file(kTemplates + name + ".jinja");
}

const json kWeather = json::parse(R"({"type": "function", "function": {"name": "get_weather",
  "description": "The weather in a city", "parameters": {"type": "object", "properties": {
  "city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["c", "f"]}},
  "required": ["city"], "additionalProperties": false}}})");
const json kTime = json::parse(R"({"type": "function", "function": {"name": "get_time",
  "parameters": {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12,
  "maximum": 14}}, "required": ["zone"], "additionalProperties": false}}})");

ToolRequest request(json extra = json::object()) {
  json body = {{"tools", json::array({kWeather, kTime})}};
  body.update(extra);
  return parse_tool_request(body);
}

ToolFamily family(ToolSyntax s, bool takes = true) {
  ToolFamily f;
  f.syntax = s;
  f.template_takes_tools = f.template_takes_calls = takes;
  return f;
}

// The parameters of get_weather / get_time, checked by hand (what the schemas say).
bool valid_arguments(const std::string& name, const std::string& arguments) {
  const json a = json::parse(arguments, nullptr, false);
  if (!a.is_object()) return false;
  if (name == "get_weather") {
    if (!a.contains("city") || !a["city"].is_string() || a["city"].get<std::string>().size() > 12)
      return false;
    if (a.contains("unit") && a["unit"] != "c" && a["unit"] != "f") return false;
    return a.size() <= 2 && (a.size() == 1 || a.contains("unit"));
  }
  if (name == "get_time")
    return a.size() == 1 && a.contains("zone") && a["zone"].is_number_integer() &&
           a["zone"].get<int>() >= -12 && a["zone"].get<int>() <= 14;
  return false;
}

std::string field_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const FieldError& e) {
    return e.param + ": " + e.what();
  }
  return "no error";
}

}  // namespace

TEST(ToolFamily, DetectedFromRealTemplates) {
  const std::pair<const char*, ToolSyntax> cases[] = {
      {"Qwen-Qwen2.5-7B-Instruct", ToolSyntax::Hermes},
      {"Qwen-Qwen3-0.6B", ToolSyntax::Hermes},
      {"Qwen3-Coder", ToolSyntax::Hermes},
      {"Qwen3.5-4B", ToolSyntax::Hermes},
      {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", ToolSyntax::Hermes},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", ToolSyntax::Hermes},
      {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", ToolSyntax::Hermes},
      {"meta-llama-Llama-3.1-8B-Instruct", ToolSyntax::Llama3},
      {"meta-llama-Llama-3.2-3B-Instruct", ToolSyntax::Llama3},
      {"meta-llama-Llama-3.3-70B-Instruct", ToolSyntax::Llama3},
      {"mistralai-Mistral-Nemo-Instruct-2407", ToolSyntax::Mistral},
      {"Mistral-Small-3.2-24B-Instruct-2506", ToolSyntax::MistralV11},
      {"unsloth-mistral-Devstral-Small-2507", ToolSyntax::MistralV11},
      {"meetkai-functionary-medium-v3.1", ToolSyntax::Generic},
      {"meetkai-functionary-medium-v3.2", ToolSyntax::Generic},
      {"CohereForAI-c4ai-command-r-plus-tool_use", ToolSyntax::Generic},
      {"ibm-granite-granite-3.3-2B-Instruct", ToolSyntax::Granite},
      {"ibm-granite-granite-4.0", ToolSyntax::Hermes},
  };
  for (const auto& [name, syntax] : cases) {
    const ToolFamily f = detect_tool_family(template_source(name));
    EXPECT_TRUE(f.template_takes_tools) << name;
    EXPECT_EQ(tool_syntax_name(f.syntax), std::string(tool_syntax_name(syntax))) << name;
  }
  // Templates that never render tools: the fallback prompt and Hermes tags.
  for (const char* name : {"google-gemma-2-2b-it", "microsoft-Phi-3.5-mini-instruct"}) {
    const ToolFamily f = detect_tool_family(template_source(name));
    EXPECT_FALSE(f.template_takes_tools) << name;
    EXPECT_EQ(f.syntax, ToolSyntax::Hermes) << name;
  }
  // DeepSeek's templates render the history's calls in its own tokens, not the tools.
  for (const char* name : {"deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"}) {
    const ToolFamily f = detect_tool_family(template_source(name));
    EXPECT_EQ(f.syntax, ToolSyntax::DeepSeek) << name;
    EXPECT_FALSE(f.template_takes_tools) << name;
    EXPECT_TRUE(f.template_takes_calls) << name;
  }
  EXPECT_FALSE(detect_tool_family("").template_takes_tools);
  EXPECT_FALSE(detect_tool_family(read_file(std::string(ULTRA_SOURCE_DIR) + "/models/chat_template.jinja"))
                   .template_takes_tools);
}

// OpenAI-shaped history (arguments as a JSON string, null content) prepared and rendered with the tools
// equals jinja2's rendering of the same conversation.
TEST(ToolRender, ConversationsWithCallsAndResultsMatchJinja2) {
  const json fx = json::parse(read_file(kTemplates + "tool_renderings.json"));
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 10;
  tm.tm_mday = 30;
  tm.tm_hour = 12;
  tm.tm_isdst = -1;
  const ChatTemplateOptions opts{"<BOS>", "<EOS>", std::mktime(&tm)};
  int n = 0;
  for (const auto& [name, cases] : fx["templates"].items()) {
    const std::string src = template_source(name);
    const ChatTemplate tmpl(src, opts);
    const ToolFamily fam = detect_tool_family(src);
    const ToolRequest tools = parse_tool_request({{"tools", fx["tools"]}});
    for (const json& c : cases) {
      ASSERT_TRUE(c.contains("output")) << name << ": " << c;
      json conv = fx["conversations"][c["conversation"].get<int>()];
      for (json& m : conv)  // as a client sends them
        if (m.contains("tool_calls"))
          for (json& tc : m["tool_calls"]) tc["function"]["arguments"] = tc["function"]["arguments"].dump();
      const json prepared = prepare_tool_messages(conv, fam, tools);
      const std::string out = tmpl.apply(prepared, true, {{"tools", tools.tools}});
      EXPECT_EQ(out, c["output"].get<std::string>()) << name << " conversation " << c["conversation"];
      ++n;
    }
  }
  EXPECT_EQ(n, 24);
}

TEST(ToolRender, FallbackRewritesHistoryAndAddsThePrompt) {
  const ToolRequest tools = request();
  const json conv = json::parse(R"([{"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "cold"}])");
  const json p = prepare_tool_messages(conv, family(ToolSyntax::Hermes, false), tools);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0]["role"], "system");
  EXPECT_NE(p[0]["content"].get<std::string>().find("\"name\":\"get_weather\""), std::string::npos) << p[0];
  EXPECT_NE(p[0]["content"].get<std::string>().find("<tool_call>"), std::string::npos);
  EXPECT_EQ(p[2]["content"],
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>");
  EXPECT_FALSE(p[2].contains("tool_calls"));
  EXPECT_EQ(p[3]["role"], "user");
  EXPECT_EQ(p[3]["content"], "<tool_response>\ncold\n</tool_response>");
  // tool_choice none: no prompt; a system message is extended, not replaced.
  EXPECT_EQ(prepare_tool_messages(conv, family(ToolSyntax::Hermes, false), request({{"tool_choice", "none"}}))
                .size(),
            3u);
  const json with_sys = json::array({{{"role", "system"}, {"content", "Be brief."}}, conv[0]});
  const json q = prepare_tool_messages(with_sys, family(ToolSyntax::Hermes, false), tools);
  ASSERT_EQ(q.size(), 2u);
  EXPECT_EQ(q[0]["content"].get<std::string>().rfind("Be brief.\n\nYou can call", 0), 0u) << q[0];
  // A malformed history call names the message.
  const json bad = json::parse(R"([{"role": "assistant", "tool_calls": [{"function": 3}]}])");
  EXPECT_EQ(field_of([&] { prepare_tool_messages(bad, family(ToolSyntax::Hermes), tools); }),
            "messages: messages[0].tool_calls[0] must be an object with a 'function' object");
}

TEST(ToolRequest, BadDefinitionsNameTheField) {
  const auto err = [](const json& body) { return field_of([&] { parse_tool_request(body); }); };
  EXPECT_EQ(err({{"tools", 3}}), "tools: 'tools' must be a list of {type: function, function} objects");
  EXPECT_EQ(err({{"tools", {1}}}), "tools: 'tools[0]' must be an object");
  EXPECT_EQ(err({{"tools", {{{"type", "code"}}}}}), "tools: 'tools[0].type' must be \"function\"");
  EXPECT_EQ(err({{"tools", {{{"type", "function"}}}}}), "tools: 'tools[0].function' must be an object");
  EXPECT_EQ(err({{"tools", {kWeather, {{"type", "function"}, {"function", {{"name", "a b"}}}}}}}),
            "tools: 'tools[1].function.name' must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -");
  EXPECT_EQ(err({{"tools", {kWeather, kWeather}}}),
            "tools: 'tools[1].function.name' 'get_weather' is defined twice");
  json p = kWeather;
  p["function"]["parameters"] = "x";
  EXPECT_EQ(err({{"tools", {p}}}), "tools: 'tools[0].function.parameters' must be a JSON Schema object");
  EXPECT_EQ(err({{"tools", {kWeather}}, {"tool_choice", "always"}}).substr(0, 28),
            "tool_choice: 'tool_choice' m");
  EXPECT_EQ(err({{"tool_choice", "required"}}),
            "tool_choice: 'tool_choice' asks for tool calls but no 'tools' are given");
  EXPECT_EQ(err({{"tools", {kWeather}},
                 {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}}),
            "tool_choice: 'tool_choice' names the function 'get_time', which 'tools' does not define");
  EXPECT_EQ(err({{"tools", {kWeather}}, {"parallel_tool_calls", "yes"}}),
            "parallel_tool_calls: 'parallel_tool_calls' must be a boolean");
  // A parameters schema the compiler refuses: at grammar time, naming the tool and the keyword.
  p = kWeather;
  p["function"]["parameters"]["properties"]["n"] = {{"type", "integer"}, {"multipleOf", 3}};
  const ToolRequest r = parse_tool_request({{"tools", {p}}, {"tool_choice", "required"}});
  const std::string e = field_of([&] { tool_call_grammar(r, family(ToolSyntax::Hermes)); });
  EXPECT_EQ(e.rfind("tools: 'tools[0].function.parameters' ('get_weather'): ", 0), 0u) << e;
  EXPECT_NE(e.find("multipleOf"), std::string::npos) << e;
  // Defaults: tools -> auto, parallel; none without tools.
  EXPECT_EQ(request().choice, ToolChoice::Auto);
  EXPECT_TRUE(request().parallel);
  EXPECT_FALSE(parse_tool_request(json::object()).active());
  EXPECT_FALSE(request({{"tool_choice", "none"}}).active());
  EXPECT_EQ(parse_tool_request({{"tools", json::array()}, {"tool_choice", "auto"}}).choice, ToolChoice::None);
}

TEST(ToolParse, HermesCalls) {
  const ToolRequest tools = request();
  const ToolFamily f = family(ToolSyntax::Hermes);
  ToolParse r = parse_tool_calls(
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\", \"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": "
      "1}\"}\n"
      "</tool_call>",
      f, tools);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.content, "Let me look.\n");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"unit\":\"c\",\"city\":\"Paris\"}");  // the model's order
  EXPECT_EQ(r.calls[1].arguments, "{\"zone\":1}");
  EXPECT_EQ(r.calls[0].id.rfind("call_", 0), 0u);
  EXPECT_EQ(r.calls[0].id.size(), 29u);
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
  // parallel_tool_calls false: the first only.
  EXPECT_EQ(
      parse_tool_calls("<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"b\"}"
                       "</tool_call>",
                       f, request({{"parallel_tool_calls", false}}))
          .calls.size(),
      1u);
  // A missing close tag at the very end is taken (a stop string may have eaten it); not before more text.
  EXPECT_EQ(parse_tool_calls("<tool_call>{\"name\": \"get_time\", \"arguments\": {\"zone\": 2}}\n", f, tools)
                .calls.size(),
            1u);
  EXPECT_TRUE(parse_tool_calls("<tool_call>{\"name\": \"x\"} and more", f, tools).calls.empty());
  // Plain text.
  r = parse_tool_calls("Just text.", f, tools);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "Just text.");
}

// Qwen3-Coder's XML inside the tag: values typed by the parameter's schema.
TEST(ToolParse, QwenXmlCalls) {
  json num = kTime;
  num["function"]["name"] = "mix";
  num["function"]["parameters"]["properties"] = {{"zone", {{"type", "integer"}}},
                                                 {"label", {{"type", "string"}}},
                                                 {"flag", {{"type", "boolean"}}},
                                                 {"list", {{"type", "array"}}}};
  const ToolRequest tools = parse_tool_request({{"tools", {kWeather, num}}});
  const ToolFamily f = family(ToolSyntax::Hermes);
  ToolParse r = parse_tool_calls(
      "I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=mix>\n"
      "<parameter=zone>\n7\n</parameter>\n<parameter=label>\n42\n</parameter>\n<parameter=flag>\nTrue\n"
      "</parameter>\n<parameter=list>\n[1, \"a\"]\n</parameter>\n"
      "<parameter=other>\ntwo\nlines\n</parameter>\n"
      "</function>\n</tool_call>",
      f, tools);
  ASSERT_EQ(r.calls.size(), 2u) << r.content;
  EXPECT_EQ(r.content, "I will check.\n");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Paris\",\"unit\":\"c\"}");
  EXPECT_EQ(r.calls[1].arguments,
            "{\"zone\":7,\"label\":\"42\",\"flag\":true,\"list\":[1,\"a\"],\"other\":\"two\\nlines\"}");
  for (const char* bad :
       {"<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>",
        "<tool_call>\n<function=f\n</tool_call>", "<tool_call>\n<function=>\n</function></tool_call>",
        "<tool_call>\n<function=f>\n<param=a>\n1\n</param>\n</function>\n</tool_call>"})
    EXPECT_TRUE(parse_tool_calls(bad, f, tools).calls.empty()) << bad;
  // Deep nesting in a value stays a string.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  r = parse_tool_calls(
      "<tool_call><function=mix><parameter=list>" + deep + "</parameter></function></tool_call>", f, tools);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(json::parse(r.calls[0].arguments)["list"], deep);
}

TEST(ToolParse, Llama3Calls) {
  const ToolRequest tools = request();
  const ToolFamily f = family(ToolSyntax::Llama3);
  ToolParse r =
      parse_tool_calls("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", f, tools);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Rome\"}");
  r = parse_tool_calls(
      "<|python_tag|>{\"type\": \"function\", \"name\": \"get_time\", \"parameters\": "
      "{\"zone\": 3}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"X\"}}",
      f, tools);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_time");
  // Bare JSON naming no declared function is an answer, not a call.
  r = parse_tool_calls("{\"name\": \"Alice\", \"age\": 3}", f, tools);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "{\"name\": \"Alice\", \"age\": 3}");
}

TEST(ToolParse, MistralCalls) {
  const ToolRequest tools = request();
  ToolParse r = parse_tool_calls(
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}, \"id\": \"abcDEF123\"}, "
      "{\"name\": \"get_time\", \"arguments\": {\"zone\": 0}}]",
      family(ToolSyntax::Mistral), tools);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].id, "abcDEF123");
  EXPECT_EQ(r.calls[1].id.size(), 9u);  // Mistral's templates want 9 alphanumerics
  // The grammar's form: the array without the control token.
  EXPECT_EQ(parse_tool_calls(" [{\"name\": \"get_time\", \"arguments\": {\"zone\": 0}}]",
                             family(ToolSyntax::Mistral), tools)
                .calls.size(),
            1u);
  r = parse_tool_calls(
      "[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{\"city\": \"Nice\"}[TOOL_CALLS]get_time"
      "[ARGS]{\"zone\": 1}",
      family(ToolSyntax::MistralV11), tools);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].id, "abc123XYZ");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Nice\"}");
  EXPECT_EQ(r.calls[1].name, "get_time");
}

TEST(ToolParse, GraniteAndDeepSeekCalls) {
  const ToolRequest tools = request();
  ToolParse r = parse_tool_calls(
      "<|tool_call|>[{\"name\": \"get_time\", \"arguments\": {\"zone\": 1}}, "
      "{\"name\": \"other\", \"arguments\": {}}]",
      family(ToolSyntax::Granite), tools);
  ASSERT_EQ(r.calls.size(), 2u);  // after the marker any name; a bare array names declared functions
  EXPECT_EQ(r.calls[1].name, "other");
  EXPECT_EQ(parse_tool_calls("[{\"name\": \"get_time\", \"arguments\": {\"zone\": 1}}]",
                             family(ToolSyntax::Granite), tools)
                .calls.size(),
            1u);
  EXPECT_TRUE(
      parse_tool_calls("[{\"name\": \"other\", \"arguments\": {}}]", family(ToolSyntax::Granite), tools)
          .calls.empty());
  const ToolFamily ds = family(ToolSyntax::DeepSeek, false);
  r = parse_tool_calls(
      "Checking.<｜tool▁calls▁begin｜>"
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
      "\"Oslo\"}\n```<｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"zone\": 2}\n```<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>",
      ds, tools);
  ASSERT_EQ(r.calls.size(), 2u) << r.content;
  EXPECT_EQ(r.content, "Checking.");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Oslo\"}");
  EXPECT_EQ(r.calls[1].name, "get_time");
  r = parse_tool_calls(
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": 3}<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>",
      ds, tools);  // V3.1
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"zone\":3}");
  EXPECT_EQ(parse_tool_calls("<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>", ds, tools)
                .calls.size(),
            1u);  // the fallback prompt's syntax
  for (const char* bad :
       {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time{}<｜tool▁call▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get time<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
        "<｜tool▁calls▁begin｜>"})
    EXPECT_TRUE(parse_tool_calls(bad, ds, tools).calls.empty()) << bad;
  // Streamed: content up to DeepSeek's marker.
  ToolCallStream st(ds, tools);
  EXPECT_EQ(st.push("Checking.<｜tool"), "Checking.");
  EXPECT_EQ(st.push("▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>"), "");
  EXPECT_EQ(st.finish().calls.size(), 1u);
}

TEST(ToolParse, GenericTakesTagsOrBareJson) {
  const ToolRequest tools = request();
  const ToolFamily f = family(ToolSyntax::Generic);
  EXPECT_EQ(parse_tool_calls("{\"name\": \"get_time\", \"arguments\": {\"zone\": 5}}", f, tools).calls.size(),
            1u);
  EXPECT_EQ(
      parse_tool_calls("[{\"name\": \"get_time\", \"arguments\": {\"zone\": 5}}]", f, tools).calls.size(),
      1u);
  EXPECT_EQ(parse_tool_calls("<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>", f, tools)
                .calls.size(),
            1u);
}

// Malformed and hostile outputs: never a crash, and without a call the content is the whole text.
TEST(ToolParse, MalformedAndHostileInputs) {
  const ToolRequest tools = request();
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string cases[] = {
      "<tool_call>",
      "<tool_call>{",
      "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"zone\": 1}",
      "<tool_call>{\"name\": 5}</tool_call>",
      "<tool_call>{\"name\": \"\"}</tool_call>",
      "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>",
      "<tool_call>{\"name\": \"a\", \"arguments\": \"not json\"}</tool_call>",
      "<tool_call>[1, 2]</tool_call>",
      "<tool_call>{\"name\": \"a\"]</tool_call>",
      "<tool_call>{\"name\": \"a\\\"}</tool_call>",
      "<tool_call>{\"name\": \"\xff\xfe\"}</tool_call>",
      "<tool_call>" + deep + "</tool_call>",
      "<tool_call>{\"a\":" + deep + "}</tool_call>",
      "[TOOL_CALLS]",
      "[TOOL_CALLS][",
      "[TOOL_CALLS][]",
      "[TOOL_CALLS]name",
      "[TOOL_CALLS]bad name[ARGS]{}",
      "[TOOL_CALLS]f[ARGS]",
      "[TOOL_CALLS]f[ARGS][1]",
      "<|python_tag|>",
      "<|python_tag|>print(1)",
      "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}} trailing",
      "{\"name\": \"get_time\"",
      deep,
      std::string(1 << 20, '{'),
      std::string(1 << 20, '"'),
      std::string("\0<tool_call>\0", 13),
      "<|tool_call|>",
      "<|tool_call|>[{\"name\": 1}]",
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>",
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
      "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}",
  };
  for (const ToolSyntax s :
       {ToolSyntax::Hermes, ToolSyntax::Llama3, ToolSyntax::Mistral, ToolSyntax::MistralV11,
        ToolSyntax::Granite, ToolSyntax::DeepSeek, ToolSyntax::Generic})
    for (const std::string& c : cases) {
      const ToolParse r = parse_tool_calls(c, family(s), tools);
      EXPECT_TRUE(r.calls.empty()) << tool_syntax_name(s) << ": " << c.substr(0, 80);
      EXPECT_EQ(r.content, c) << tool_syntax_name(s);
    }
  // Huge well-formed input: linear work.
  std::string big = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"" +
                    std::string(8 << 20, 'x') + "\"}}</tool_call>";
  const ToolParse r = parse_tool_calls(big, family(ToolSyntax::Hermes), tools);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments.size(), (8u << 20) + 11);
}

// Random mutations of well-formed calls and random bytes through every family, whole and streamed in random
// pieces: either calls (each with a name and an object's text) or the whole text as content.
TEST(ToolParse, FuzzedOutputs) {
  const ToolRequest tools = request();
  const std::string seeds[] = {
      "Hi <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
      "{\"name\": \"get_time\", \"parameters\": {\"zone\": 2}}",
      "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"zone\": 2}, \"id\": \"abcdefghi\"}]",
      "[TOOL_CALLS]get_time[ARGS]{\"zone\": 2}",
      "<tool_call>\n<function=get_time>\n<parameter=zone>\n2\n</parameter>\n</function>\n</tool_call>",
      "<|tool_call|>[{\"name\": \"get_time\", \"arguments\": {\"zone\": 2}}]",
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"zone\": 2}\n```"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
  };
  const char alphabet[] = "<>{}[]\":,\\ \nabc_/|TOOL_CALS";
  std::mt19937 rng(7);
  const int n = ultra::test::kSanitized ? 2000 : 20000;
  int n_calls = 0;
  for (int it = 0; it < n; ++it) {
    std::string s = seeds[rng() % std::size(seeds)];
    const int edits = 1 + (int)(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s.erase(at, 1 + rng() % 4);
          break;
        case 1:
          s.insert(at, 1, alphabet[rng() % (sizeof alphabet - 1)]);
          break;
        case 2:
          s[at] = (char)(rng() % 256);
          break;
        default:
          s.insert(at, s.substr(rng() % s.size(), rng() % 16));
          break;
      }
    }
    const ToolSyntax syn = (ToolSyntax)(rng() % 7);
    const ToolParse r = parse_tool_calls(s, family(syn), tools);
    if (r.calls.empty()) {
      EXPECT_EQ(r.content, s);
    } else {
      ++n_calls;
      for (const ToolCall& c : r.calls) {
        EXPECT_FALSE(c.name.empty());
        EXPECT_TRUE(json::parse(c.arguments, nullptr, false).is_object()) << c.arguments;
        EXPECT_FALSE(c.id.empty());
      }
    }
    // Streamed in random pieces: the content sent plus the rest equals the whole parse's content.
    ToolCallStream st(family(syn), tools);
    std::string sent;
    for (size_t i = 0; i < s.size();) {
      const size_t k = 1 + rng() % 8;
      sent += st.push(std::string_view(s).substr(i, k));
      i += k;
    }
    const ToolParse fin = st.finish();
    EXPECT_EQ(sent + fin.content, r.content) << s;
    EXPECT_EQ(fin.calls.size(), r.calls.size()) << s;
  }
  // Both outcomes are exercised.
  EXPECT_GT(n_calls, n / 50);
  EXPECT_LT(n_calls, n - n / 10);
}

TEST(ToolStream, ContentFlowsAndCallsAreHeldBack) {
  const ToolRequest tools = request();
  {
    ToolCallStream st(family(ToolSyntax::Hermes), tools);
    EXPECT_EQ(st.push("Let me "), "Let me ");
    EXPECT_EQ(st.push("check. <tool"), "check. ");  // "<tool" could begin the tag
    EXPECT_EQ(st.push("_call>\n{\"name\": \"get_time\", "), "");
    EXPECT_EQ(st.push("\"arguments\": {\"zone\": 1}}\n</tool_call>"), "");
    const ToolParse r = st.finish();
    EXPECT_EQ(r.content, "");
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].name, "get_time");
  }
  {
    ToolCallStream st(family(ToolSyntax::Hermes), tools);
    EXPECT_EQ(st.push("a <to"), "a ");
    EXPECT_EQ(st.push("y>"), "<toy>");  // not the tag after all
    EXPECT_EQ(st.finish().content, "");
  }
  {  // Llama 3: an output that starts with '{' is held; plain text flows.
    ToolCallStream st(family(ToolSyntax::Llama3), tools);
    EXPECT_EQ(st.push("  "), "");
    EXPECT_EQ(st.push("{\"name\": \"get_time\", \"parameters\": {\"zone\": 1}}"), "");
    EXPECT_EQ(st.finish().calls.size(), 1u);
    ToolCallStream t(family(ToolSyntax::Llama3), tools);
    EXPECT_EQ(t.push("<|py"), "");
    EXPECT_EQ(t.push("thon is nice"), "<|python is nice");
    const ToolParse r = t.finish();
    EXPECT_TRUE(r.calls.empty());
    EXPECT_EQ(r.content, "");
  }
  {  // A failed call comes back as content at the end.
    ToolCallStream st(family(ToolSyntax::Mistral), tools);
    EXPECT_EQ(st.push("ok [TOOL_CALLS][{oops"), "ok ");
    const ToolParse r = st.finish();
    EXPECT_TRUE(r.calls.empty());
    EXPECT_EQ(r.content, "[TOOL_CALLS][{oops");
  }
  {  // Forced: nothing is content until the end.
    ToolCallStream st(family(ToolSyntax::Hermes), request({{"tool_choice", "required"}}));
    EXPECT_EQ(st.push("plain"), "");
    EXPECT_EQ(st.finish().content, "plain");
  }
}

// The forced-call grammar of each family: real calls (and several with parallel calls) are sentences,
// wrong names / arguments are not, and a random walk through the grammar gives calls that parse and validate.
TEST(ToolGrammar, ForcedCallsParseAndValidate) {
  struct Case {
    ToolSyntax syntax;
    std::string good, two, bad_name, bad_args;
  };
  const Case cases[] = {
      {ToolSyntax::Hermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": "
       "-3}}\n</tool_call>\n<tool_call>\n{\"name\": "
       "\"get_time\", \"arguments\": {\"zone\": 4}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_date\", \"arguments\": {}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": 99}}\n</tool_call>"},
      {ToolSyntax::Llama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", "",
       "{\"name\": \"get_date\", \"parameters\": {}}",
       "{\"name\": \"get_weather\", \"parameters\": {\"town\": \"x\"}}"},
      {ToolSyntax::Mistral,
       "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"f\"}}]",
       "[{\"name\": \"get_time\", \"arguments\": {\"zone\": 1}}, {\"name\": \"get_time\", \"arguments\": "
       "{\"zone\": "
       "2}}]",
       "[{\"name\": \"x\", \"arguments\": {}}]",
       "[{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"k\"}}]"},
      {ToolSyntax::MistralV11, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}",
       "[TOOL_CALLS]get_time[ARGS]{\"zone\": 1}[TOOL_CALLS]get_time[ARGS]{\"zone\": 2}",
       "[TOOL_CALLS]x[ARGS]{}", "[TOOL_CALLS]get_time[ARGS]{\"zone\": \"1\"}"},
  };
  for (const Case& c : cases) {
    const ToolFamily f = family(c.syntax);
    const std::string name = tool_syntax_name(c.syntax);
    const ToolRequest req = request({{"tool_choice", "required"}});
    const auto g = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(tool_call_grammar(req, f)));
    EXPECT_TRUE(grammar::grammar_accepts(g, c.good)) << name;
    if (!c.two.empty()) EXPECT_TRUE(grammar::grammar_accepts(g, c.two)) << name;
    EXPECT_FALSE(grammar::grammar_accepts(g, c.bad_name)) << name;
    EXPECT_FALSE(grammar::grammar_accepts(g, c.bad_args)) << name;
    const ToolParse p = parse_tool_calls(c.good, f, req);
    ASSERT_EQ(p.calls.size(), 1u) << name;
    EXPECT_TRUE(valid_arguments(p.calls[0].name, p.calls[0].arguments)) << name << p.calls[0].arguments;
    // One call only without parallel calls; the named function only.
    const ToolRequest one = request({{"tool_choice", "required"}, {"parallel_tool_calls", false}});
    const auto g1 = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(tool_call_grammar(one, f)));
    EXPECT_TRUE(grammar::grammar_accepts(g1, c.good)) << name;
    if (!c.two.empty()) EXPECT_FALSE(grammar::grammar_accepts(g1, c.two)) << name;
    const ToolRequest named =
        request({{"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}});
    const auto gn =
        std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(tool_call_grammar(named, f)));
    EXPECT_FALSE(grammar::grammar_accepts(gn, c.good)) << name;  // get_weather
    if (!c.two.empty()) EXPECT_TRUE(grammar::grammar_accepts(gn, c.two)) << name;
  }
  // A function without parameters takes any object.
  const ToolRequest bare = parse_tool_request(
      {{"tools", {{{"type", "function"}, {"function", {{"name", "ping"}}}}}}, {"tool_choice", "required"}});
  const auto gb = std::make_shared<const grammar::Grammar>(
      grammar::parse_gbnf(tool_call_grammar(bare, family(ToolSyntax::Hermes))));
  EXPECT_TRUE(grammar::grammar_accepts(
      gb, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {\"a\": [1]}}\n</tool_call>"));
}

// The lazy grammar of "auto": after the marker, the rest of a call to a declared function with valid
// arguments (and, with parallel calls, more of them); none where the family has no usable marker.
TEST(ToolGrammar, LazyGrammarAfterTheMarker) {
  const ToolRequest tools = request();
  const LazyToolGrammar h = lazy_tool_grammar(tools, family(ToolSyntax::Hermes));
  EXPECT_EQ(h.trigger, "<tool_call>");
  const auto g = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(h.grammar));
  EXPECT_TRUE(
      grammar::grammar_accepts(g, "\n{\"name\": \"get_time\", \"arguments\": {\"zone\": 1}}\n</tool_call>"));
  EXPECT_TRUE(
      grammar::grammar_accepts(g,
                               "{\"name\": \"get_time\", \"arguments\": {\"zone\": 1}}</tool_call>\n"
                               "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n"
                               "</tool_call>"));
  EXPECT_FALSE(
      grammar::grammar_accepts(g, "\n{\"name\": \"get_time\", \"arguments\": {\"zone\": 77}}\n</tool_call>"));
  EXPECT_FALSE(grammar::grammar_accepts(g, "\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>"));
  const LazyToolGrammar one =
      lazy_tool_grammar(request({{"parallel_tool_calls", false}}), family(ToolSyntax::Hermes));
  const auto g1 = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(one.grammar));
  EXPECT_FALSE(grammar::grammar_accepts(g1,
                                        "{\"name\": \"get_time\", \"arguments\": {\"zone\": 1}}</tool_call>\n"
                                        "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"zone\": 1}}"
                                        "</tool_call>"));
  const LazyToolGrammar m = lazy_tool_grammar(tools, family(ToolSyntax::Mistral));
  EXPECT_EQ(m.trigger, "[TOOL_CALLS]");
  const auto gm = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(m.grammar));
  EXPECT_TRUE(grammar::grammar_accepts(gm, "[{\"name\": \"get_time\", \"arguments\": {\"zone\": 3}}]"));
  EXPECT_TRUE(lazy_tool_grammar(tools, family(ToolSyntax::Llama3)).trigger.empty());
  EXPECT_TRUE(lazy_tool_grammar(tools, family(ToolSyntax::MistralV11)).trigger.empty());
  EXPECT_TRUE(lazy_tool_grammar(tools, detect_tool_family(template_source("Qwen3-Coder"))).trigger.empty());
  json p = kWeather;
  p["function"]["parameters"]["properties"]["n"] = {{"type", "integer"}, {"multipleOf", 3}};
  EXPECT_TRUE(
      lazy_tool_grammar(parse_tool_request({{"tools", {p}}}), family(ToolSyntax::Hermes)).trigger.empty());
}
