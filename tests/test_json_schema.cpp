// The JSON Schema -> GBNF compiler (src/grammar/json_schema.h, regex_to_gbnf.h, numeric_range_gbnf.h):
// for schemas of each supported kind, JSON texts that the compiled grammar must accept and reject;
// keywords refused with their JSON pointer; recursive $refs; integer ranges checked exhaustively over
// [-1000, 1000]; a property check (random schemas, random sentences of their grammars validated by
// python3-jsonschema); and the JSONSchemaBench sample's coverage per category against a committed floor.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../fuzz/fuzz_json_schema.h"
#include "core/error.h"
#include "grammar/gbnf_parser.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"
#include "grammar/numeric_range_gbnf.h"
#include "jsonschema_check.h"
#include "tmp_dir.h"
#include "tokenizer/utf8.h"

using namespace ultra;
using namespace ultra::grammar;
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

std::shared_ptr<const Grammar> compile(const std::string& schema_text, const JsonSchemaOptions& o = {}) {
  return std::make_shared<const Grammar>(json_schema_to_grammar(ojson::parse(schema_text), o));
}

void check(const std::string& schema, const std::vector<std::string>& good,
           const std::vector<std::string>& bad) {
  std::shared_ptr<const Grammar> g;
  try {
    g = compile(schema);
  } catch (const Error& e) {
    ADD_FAILURE() << "schema refused: " << schema << ": " << e.what();
    return;
  }
  for (const std::string& s : good) EXPECT_TRUE(grammar_accepts(g, s)) << schema << "\nshould accept: " << s;
  for (const std::string& s : bad) EXPECT_FALSE(grammar_accepts(g, s)) << schema << "\nshould reject: " << s;
}

std::string refusal(const std::string& schema) {
  try {
    json_schema_to_grammar(ojson::parse(schema));
  } catch (const Error& e) {
    return e.what();
  }
  return "(compiled)";
}

}  // namespace

TEST(JsonSchema, Primitives) {
  check(R"({"type":"string"})", {R"("")", R"("abc")", R"("a\"b\\c\n\u00e9\/")", "\"\xc3\xa9\""},
        {"abc", R"("a)", "\"a\nb\"", R"("\x")", R"("\ud800")", "1"});
  check(R"({"type":"integer"})", {"0", "-1", "123", "-9999999999999999"},
        {"01", "1.0", "+1", "1e3", "\"1\"", "-"});
  check(R"({"type":"number"})", {"0", "-1.5", "3.14", "1e10", "2.5E-3", "-0.0"},
        {"01", ".5", "1.", "+1", "NaN"});
  check(R"({"type":"boolean"})", {"true", "false"}, {"True", "1", "null"});
  check(R"({"type":"null"})", {"null"}, {"nil", "0", "\"null\""});
  check(R"({"type":["string","null"]})", {"null", R"("x")"}, {"1", "true"});
  check(R"({"type":["integer","number"]})", {"1", "1.5"}, {"\"1\""});
}

TEST(JsonSchema, AnyValue) {
  for (const char* any : {"{}", "true", R"({"type":"object"})", R"({"title":"t","description":"d"})"}) {
    const bool object_only = std::string(any).find("object") != std::string::npos;
    std::vector<std::string> good = {R"({"a":[1,2,{"b":null}],"c":"d"})", "{}"};
    std::vector<std::string> bad = {"{", R"({"a"})", R"({a:1})"};
    if (!object_only) {
      good.insert(good.end(), {"1", "[]", "\"s\"", "null", "[1, [2, [3]]]"});
    } else {
      bad.insert(bad.end(), {"1", "[]"});
    }
    check(any, good, bad);
  }
}

TEST(JsonSchema, ObjectPropertiesRequiredFirstThenOptionalInOrder) {
  // ordered_json keeps the document's order: required b, then optional a, c in properties' order.
  const std::string s =
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},
          "required":["b"]})";
  check(s,
        {R"({"b":"x"})", R"({"b":"x","a":1})", R"({"b":"x","c":true})", R"({"b":"x","a":1,"c":false})",
         R"({ "b": "x", "a": 1 })", "{\n  \"b\": \"x\"\n}"},
        {R"({})", R"({"a":1})", R"({"a":1,"b":"x"})", R"({"b":"x","c":true,"a":1})", R"({"b":1})",
         R"({"b":"x","d":1})", R"({"b":"x",})", R"({"b":"x","a":1,"a":2})"});
  // nlohmann::json sorts keys: the same schema's order is then alphabetical.
  const auto sorted = std::make_shared<const Grammar>(json_schema_to_grammar(nlohmann::json::parse(
      R"({"properties":{"z":{"type":"integer"},"y":{"type":"integer"}},"required":["z","y"]})")));
  EXPECT_TRUE(grammar_accepts(sorted, R"({"y":1,"z":2})"));
  EXPECT_FALSE(grammar_accepts(sorted, R"({"z":2,"y":1})"));
  check(R"({"properties":{"z":{"type":"integer"},"y":{"type":"integer"}},"required":["z","y"]})",
        {R"({"z":2,"y":1})"}, {R"({"y":1,"z":2})"});
}

// Properties that the compiler adds to an object (allOf merging, patternProperties, oneOf exclusions) come in
// the schema's own key order too: sorted for nlohmann::json, insertion order for ordered_json.
TEST(JsonSchema, AddedPropertiesFollowTheJsonTypesKeyOrder) {
  const std::string merged =
      R"({"allOf":[{"properties":{"z":{"type":"integer"}},"required":["z"]},
                   {"properties":{"a":{"type":"integer"}},"required":["a"]}]})";
  const std::string patterned = R"({"patternProperties":{"^b":{"type":"integer"}},"required":["a","bb"]})";
  for (const std::string& s : {merged, patterned}) {
    const auto sorted = std::make_shared<const Grammar>(json_schema_to_grammar(nlohmann::json::parse(s)));
    const auto ordered = compile(s);
    const std::string first = s == merged ? "z" : "bb";
    const std::string in_order = R"({")" + first + R"(":1,"a":2})";
    const std::string alphabetical = R"({"a":2,")" + first + R"(":1})";
    EXPECT_TRUE(grammar_accepts(sorted, alphabetical)) << s;
    EXPECT_FALSE(grammar_accepts(sorted, in_order)) << s;
    EXPECT_TRUE(grammar_accepts(ordered, in_order)) << s;
    EXPECT_FALSE(grammar_accepts(ordered, alphabetical)) << s;
  }
}

TEST(JsonSchema, NoRequiredPropertiesAnySubsetInOrder) {
  check(R"({"properties":{"a":{"const":1},"b":{"const":2},"c":{"const":3}}})",
        {"{}", R"({"a":1})", R"({"b":2})", R"({"c":3})", R"({"a":1,"c":3})", R"({"b":2,"c":3})",
         R"({"a":1,"b":2,"c":3})"},
        {R"({"c":3,"a":1})", R"({"a":1,})", R"({,"a":1})", R"({"d":4})", R"({"a":2})"});
}

TEST(JsonSchema, AdditionalProperties) {
  check(R"({"properties":{"a":{"type":"integer"}},"additionalProperties":false})", {"{}", R"({"a":1})"},
        {R"({"b":1})", R"({"a":1,"b":1})"});
  check(
      R"({"properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":{"type":"string"}})",
      {R"({"a":1})", R"({"a":1,"b":"x"})", R"({"a":1,"b":"x","ab":"y","":"z"})"},
      {R"({"a":1,"b":2})", R"({"a":1,"a":"x"})", R"({"b":"x"})"});
  check(R"({"properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":true})",
        {R"({"a":1,"b":[1,{"c":null}]})"}, {R"({"a":1,"a":2})"});
  check(R"({"type":"object","additionalProperties":{"type":"integer"}})", {"{}", R"({"x":1,"y":2})"},
        {R"({"x":"1"})"});
  check(R"({"type":"object","additionalProperties":false})", {"{}"}, {R"({"x":1})"});
  // A required name that properties does not list: any value.
  check(R"({"type":"object","required":["id"]})", {R"({"id":[1]})", R"({"id":"x"})"}, {"{}"});
  // ... or the additionalProperties schema when there is one.
  check(R"({"type":"object","properties":{},"additionalProperties":{"type":"integer"},"required":["id"]})",
        {R"({"id":1})", R"({"id":1,"x":2})"}, {R"({"id":[]})", R"({"id":1,"x":[]})"});
}

TEST(JsonSchema, PatternPropertiesApplyToListedProperties) {
  // Listed properties whose names match take the pattern's schema too; nothing else is generated.
  check(R"({"type":"object","properties":{"x_a":{"type":"integer"},"b":{"type":"integer"}},
            "patternProperties":{"^x_":{"minimum":10}},"required":["x_a","b"]})",
        {R"({"x_a":10,"b":1})"}, {R"({"x_a":9,"b":1})", R"({"x_a":10,"b":1,"x_c":11})"});
  check(R"({"type":"object","patternProperties":{"^x":{"type":"string"}}})", {"{}"}, {R"({"x":"s"})"});
  check(R"({"type":"object","patternProperties":{"^x":{"type":"string"}},"required":["xy","z"]})",
        {R"({"xy":"s","z":1})"}, {R"({"xy":1,"z":1})"});
  EXPECT_NE(refusal(R"j({"patternProperties":{"(?=x)":{}}})j").find("/patternProperties/(?=x)"),
            std::string::npos);
}

TEST(JsonSchema, DependenciesAndMinProperties) {
  // A required property's dependencies become required; an optional one with unmet dependencies is left out.
  check(R"({"properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},
            "required":["a"],"dependencies":{"a":["b"]},"dependentRequired":{"c":["zzz"]}})",
        {R"({"a":1,"b":2})"}, {R"({"a":1})", R"({"a":1,"b":2,"c":3})"});
  check(
      R"({"properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"dependencies":{"a":{"required":["b"]}}})",
      {"{}", R"({"b":1})"}, {R"({"a":1})", R"({"a":1,"b":1})"});
  // Additional keys never take a dependency's trigger name.
  check(R"({"type":"object","additionalProperties":{"type":"integer"},"properties":{"x":{}},
            "dependentRequired":{"t":["u"]}})",
        {R"({"s":1})"}, {R"({"t":1})"});
  check(R"({"type":"object","properties":{"a":{},"b":{}},"minProperties":1})", {R"({"a":1})", R"({"b":1})"},
        {"{}"});
}

TEST(JsonSchema, EnumAndConst) {
  check(R"({"enum":["red","green",1,null,{"a":[1]}]})", {R"("red")", "1", "null", R"({"a":[1]})"},
        {R"("blue")", "2", R"({"a":[2]})"});
  check(R"({"const":"x"})", {R"("x")"}, {R"("y")"});
  check(R"({"type":"string","enum":["a",1,"b"]})", {R"("a")", R"("b")"}, {"1"});
  check(R"({"type":"string","enum":["a","bbbb"],"maxLength":2})", {R"("a")"}, {R"("bbbb")"});
  check(R"({"enum":["tab\there","quote\"","\u00e9"]})", {R"("tab\there")", R"("quote\"")", "\"\xc3\xa9\""},
        {"\"tab\there\""});
}

TEST(JsonSchema, AnyOfOneOfAllOf) {
  check(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]})", {"1", R"("a")"},
        {R"("ab")", "true"});
  check(R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})", {"true", "null"}, {"1"});
  // oneOf alternatives told apart by `required`: an object of one must not also satisfy another.
  check(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},
            "oneOf":[{"required":["a"]},{"required":["b"]}]})",
        {R"({"a":1})", R"({"b":1})"}, {R"({"a":1,"b":2})", "{}"});
  // A tagged union: the tag (disjoint const / enum values) becomes required in each alternative.
  check(R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}}},
                     {"type":"object","properties":{"kind":{"enum":["b","c"]},"x":{"type":"integer"}}}]})",
        {R"({"kind":"a"})", R"({"kind":"c","x":1})"}, {"{}", R"({"x":1})"});
  // An alternative whose objects always satisfy another only-`required` one is left out.
  check(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},
            "oneOf":[{"required":["a","b"]},{"required":["a"]}]})",
        {R"({"a":1})"}, {R"({"a":1,"b":2})"});
  // allOf merges properties and required.
  check(R"({"allOf":[{"properties":{"a":{"type":"integer"}},"required":["a"]},
                     {"properties":{"b":{"type":"string"}},"required":["b"]}]})",
        {R"({"a":1,"b":"x"})"}, {R"({"a":1})", R"({"b":"x"})"});
  // allOf with a $ref and extra constraints; siblings of anyOf are distributed into each alternative.
  check(R"({"$defs":{"base":{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]}},
            "allOf":[{"$ref":"#/$defs/base"},{"properties":{"name":{"type":"string"}},"required":["name"]}]})",
        {R"({"id":1,"name":"n"})"}, {R"({"id":1})"});
  check(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},
            "anyOf":[{"required":["a"]},{"required":["b"]}]})",
        {R"({"a":1})", R"({"b":1})", R"({"a":1,"b":2})"}, {"{}"});
  // Numeric bounds merge to the tightest.
  check(R"({"allOf":[{"type":"integer","minimum":0},{"maximum":5},{"minimum":2}]})", {"2", "5"}, {"1", "6"});
  // A part with additionalProperties false admits only its own properties.
  check(R"({"allOf":[{"properties":{"a":{"type":"integer"}},"additionalProperties":false},
                     {"properties":{"b":{"type":"integer"}}}]})",
        {"{}", R"({"a":1})"}, {R"({"b":1})"});
  EXPECT_NE(refusal(R"({"allOf":[{"type":"string"},{"type":"integer"}]})").find("no 'type' in common"),
            std::string::npos);
}

TEST(JsonSchema, RefsAndRecursion) {
  const std::string tree = R"({"$defs":{"node":{"type":"object","properties":{
      "value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["value","children"]}},"$ref":"#/$defs/node"})";
  check(tree,
        {R"({"value":1,"children":[]})",
         R"({"value":1,"children":[{"value":2,"children":[{"value":3,"children":[]}]}]})"},
        {R"({"value":1})", R"({"value":1,"children":[{"value":2}]})"});
  // Linked list through the root, and draft-7 definitions with a pointer that needs escaping.
  check(
      R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["next"]})",
      {R"({"next":null})", R"({"next":{"next":{"next":null}}})"}, {R"({"next":1})"});
  check(R"({"definitions":{"a/b":{"type":"integer"},"c%d":{"type":"string"}},
            "properties":{"x":{"$ref":"#/definitions/a~1b"},"y":{"$ref":"#/definitions/c%25d"}},"required":["x","y"]})",
        {R"({"x":1,"y":"s"})"}, {R"({"x":"1","y":"s"})"});
  check(R"({"properties":{"a":{"type":"boolean"},"b":{"$ref":"#/properties/a"}},"required":["a","b"]})",
        {R"({"a":true,"b":false})"}, {R"({"a":true,"b":1})"});
  // A reference that only refers to itself is left recursion: refused, not a hang.
  EXPECT_NE(refusal(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})").find("left recursion"),
            std::string::npos)
      << refusal(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})");
  // Recursion without a way out: no finite value matches, so a sampler could follow it forever.
  EXPECT_NE(refusal(R"({"type":"object","properties":{"next":{"$ref":"#"}},"required":["next"]})")
                .find("no finite JSON value"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"$ref":"#/$defs/missing"})").find("not found"), std::string::npos);
  EXPECT_NE(refusal(R"({"$ref":"https://example.com/s.json"})").find("remote $ref"), std::string::npos);
  EXPECT_NE(refusal(R"({"allOf":[{"$ref":"#"}]})").find("nested deeper"), std::string::npos);
}

TEST(JsonSchema, Arrays) {
  check(R"({"type":"array","items":{"type":"integer"}})", {"[]", "[1]", "[1, 2, 3]"},
        {"[1,]", "[\"a\"]", "[,1]"});
  check(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})", {"[1,2]", "[1,2,3]"},
        {"[]", "[1]", "[1,2,3,4]"});
  check(R"({"type":"array","minItems":1})", {"[1]", "[\"a\",null]"}, {"[]"});
  check(R"({"type":"array","maxItems":0})", {"[]"}, {"[1]"});
  check(R"({"type":"array","uniqueItems":true,"items":{"type":"integer"}})", {"[]", "[1]"},
        {"[1,2]", "[1,1]"});
  check(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}]})",
        {"[]", R"(["a"])", R"(["a",1])"}, {R"([1])", R"(["a",1,2])"});
  check(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":{"type":"boolean"},
            "minItems":2})",
        {R"(["a",1])", R"(["a",1,true,false])"}, {R"(["a"])", R"(["a",1,2])"});
  check(R"({"type":"array","prefixItems":[{"type":"string"}],"items":false})", {"[]", R"(["a"])"},
        {R"(["a","b"])"});
  // Draft 4-2019: items as a list, additionalItems for the rest.
  check(
      R"({"type":"array","items":[{"type":"integer"},{"type":"integer"}],"additionalItems":{"type":"string"}})",
      {"[1,2]", R"([1,2,"x"])"}, {R"([1,"x"])", "[1,2,3]"});
}

TEST(JsonSchema, StringLengths) {
  check(R"({"type":"string","minLength":2,"maxLength":3})",
        {R"("ab")", R"("abc")", "\"\xc3\xa9\xc3\xa9\"", R"("\n\t")", R"("\u00e9a")"},
        {R"("a")", R"("abcd")", "\"\xc3\xa9\""});
  check(R"({"type":"string","maxLength":0})", {R"("")"}, {R"("a")"});
  check(R"({"type":"string","maxLength":100000})", {R"("abc")"}, {});
  EXPECT_NE(refusal(R"({"type":"string","minLength":5000})").find("minLength"), std::string::npos);
}

TEST(JsonSchema, Patterns) {
  check(R"({"type":"string","pattern":"^[a-z]+\\d{2}$"})", {R"("ab12")"},
        {R"("ab1")", R"("A12")", R"("ab123")"});
  check(R"({"type":"string","pattern":"^\\d{3}-\\d{4}$"})", {R"("555-1234")"}, {R"("5551234")"});
  check(R"({"type":"string","pattern":"^(foo|bar)+$"})", {R"("foo")", R"("barfoo")"}, {R"("")", R"("baz")"});
  check(R"({"type":"string","pattern":"ab"})", {R"("ab")", R"("xxaby")", R"("\"ab\n")"},
        {R"("a")", R"("ba")"});
  check(R"({"type":"string","pattern":"^a"})", {R"("a")", R"("abc")"}, {R"("ba")"});
  check(R"({"type":"string","pattern":"c$"})", {R"("c")", R"("abc")"}, {R"("ca")"});
  check(R"({"type":"string","pattern":"^[^\"\\\\]{1,3}$"})", {R"("abc")"},
        {R"("\"")", R"("\\")", R"("abcd")"});
  check(R"({"type":"string","pattern":"^\"\\\\$"})", {R"("\"\\")"}, {R"("x")"});
  check(R"({"type":"string","pattern":"^(?:[A-Z]{2})?\\s\\w*\\.?$"})", {R"(" x")", R"("AB _z.")"},
        {R"("A x")"});
  // A negated class with a shorthand excludes what Python counts too (\x1c-\x1f are whitespace there).
  check(R"({"type":"string","pattern":"^[^:\\s]+$"})", {R"("ab")"}, {R"("a:b")", R"("a b")", R"("\u001c")"});
  check(R"({"type":"string","pattern":"^a|b$"})", {R"("a")", R"("ax")", R"("xb")"}, {R"("xa")"});
  check(R"({"type":"string","pattern":"^[a-z]{2,3}$","minLength":2,"maxLength":3})", {R"("ab")"}, {R"("a")"});
  for (const char* p : {"(?=a)", "(?!a)", "(?<=a)b", "(a)\\1", "\\bword", "\\p{L}", "a^b", "(^a)"}) {
    const std::string why = refusal(std::string(R"({"type":"string","pattern":)") + ojson(p).dump() + "}");
    EXPECT_NE(why.find("/pattern"), std::string::npos) << p << ": " << why;
  }
  // maxLength lowers the pattern's repetitions (unanchored ends included); minLength must be implied.
  check(R"({"type":"string","pattern":"^a*$","maxLength":3})", {R"("")", R"("aaa")"}, {R"("aaaa")"});
  check(R"({"type":"string","pattern":"^[a-z][a-z0-9-]*$","maxLength":4})", {R"("a")", R"("ab-1")"},
        {R"("ab-12")"});
  check(R"({"type":"string","pattern":"x","maxLength":2})", {R"("x")", R"("xa")"}, {R"("axa")", R"("aax")"});
  check(R"({"type":"string","pattern":"^(abc|d+)$","maxLength":2})", {R"("d")", R"("dd")"},
        {R"("abc")", R"("ddd")"});
  EXPECT_NE(refusal(R"({"type":"string","pattern":"^abc$","maxLength":2})").find("at most 2"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","pattern":"^a*$","minLength":3})").find("minLength"),
            std::string::npos);
}

TEST(JsonSchema, Formats) {
  check(R"({"type":"string","format":"date"})", {R"("2024-02-29")", R"("2000-02-29")", R"("2023-12-31")"},
        {R"("2023-02-29")", R"("1900-02-29")", R"("2023-04-31")", R"("2023-13-01")", R"("0000-01-01")",
         R"("23-1-1")"});
  check(R"({"type":"string","format":"time"})", {R"("12:34:56Z")", R"("23:59:59.123+05:30")"},
        {R"("24:00:00Z")", R"("12:34:56")", R"("12:60:00Z")"});
  check(R"({"type":"string","format":"date-time"})", {R"("2024-01-02T03:04:05Z")"},
        {R"("2024-01-02 03:04:05Z")"});
  check(R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"},
        {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"});
  check(R"({"type":"string","format":"email"})", {R"("a.b+c@example.com")"},
        {R"("a@b")", R"("@example.com")"});
  check(R"({"type":"string","format":"uri"})", {R"("https://example.com/a?b=c#d")", R"("urn:isbn:123")"},
        {R"("example")", R"("http://a b")"});
  // Formats JSON Schema leaves as annotations (and we do not implement) are ignored.
  check(R"({"type":"string","format":"ipv4"})", {R"("192.168.0.1")", R"("0.0.0.0")"},
        {R"("256.1.1.1")", R"("01.1.1.1")", R"("1.1.1")"});
  check(R"({"type":"string","format":"ipv6"})", {R"("2001:db8:0:0:0:0:0:1")"}, {R"("2001:db8::1")"});
  check(R"({"type":"string","format":"hostname"})", {R"("example.com")", R"("a")"},
        {R"("-a.com")", R"("a b")"});
  check(R"({"type":"string","format":"regex"})", {R"("abc 1_2")"}, {R"("(")", R"("a*")"});
  check(R"({"type":"string","format":"json-pointer"})", {R"("")", R"("/a/b~1c/0")"}, {R"("a")", R"("/~2")"});
  check(R"({"type":"string","format":"relative-json-pointer"})", {R"("0#")", R"("1/a")"},
        {R"("/a")", R"("01")"});
  check(R"({"type":"string","format":"color"})", {R"("anything")"}, {"1"});
  // Definitions named like built-in rules (a rule is named after its $ref) do not clash with them.
  check(R"({"$defs":{"octet":{"type":"boolean"},"date-string":{"type":"integer"},"h16":{"format":"ipv6"}},
            "properties":{"a":{"$ref":"#/$defs/octet"},"b":{"$ref":"#/$defs/date-string"},"c":{"$ref":"#/$defs/h16"},
                          "d":{"format":"date"},"e":{"format":"ipv4"}},"required":["a","b","c","d","e"]})",
        {R"({"a":true,"b":1,"c":"1:2:3:4:5:6:7:8","d":"2024-01-01","e":"1.2.3.4"})"},
        {R"({"a":1,"b":1,"c":"1:2:3:4:5:6:7:8","d":"2024-01-01","e":"1.2.3.4"})"});
  // Lengths beside a format: supported when every string of the format meets them.
  check(R"({"type":"string","format":"date","maxLength":10})", {R"("2024-01-01")"}, {});
  EXPECT_NE(refusal(R"({"type":"string","format":"email","maxLength":20})").find("maxLength"),
            std::string::npos);
}

namespace {

// Every integer in [-1000, 1000] is accepted iff it is in [lo, hi].
void exhaustive_int_range(const std::string& bounds, int64_t lo, int64_t hi) {
  const auto g = compile(R"({"type":"integer",)" + bounds + "}");
  int n_wrong = 0;
  for (int64_t v = -1000; v <= 1000 && n_wrong < 5; ++v) {
    const bool want = v >= lo && v <= hi;
    if (grammar_accepts(g, std::to_string(v)) != want) {
      ADD_FAILURE() << bounds << ": " << v << " should be " << (want ? "accepted" : "rejected");
      ++n_wrong;
    }
  }
  EXPECT_FALSE(grammar_accepts(g, "-0"));
  EXPECT_FALSE(grammar_accepts(g, "007"));
}

}  // namespace

TEST(JsonSchema, IntegerRangesExhaustive) {
  const int64_t inf = INT64_MAX;
  exhaustive_int_range(R"("minimum":0,"maximum":100)", 0, 100);
  exhaustive_int_range(R"("minimum":-50,"maximum":50)", -50, 50);
  exhaustive_int_range(R"("minimum":-999,"maximum":-10)", -999, -10);
  exhaustive_int_range(R"("minimum":7,"maximum":7)", 7, 7);
  exhaustive_int_range(R"("minimum":1)", 1, inf);
  exhaustive_int_range(R"("maximum":-3)", -inf, -3);
  exhaustive_int_range(R"("exclusiveMinimum":0,"exclusiveMaximum":10)", 1, 9);
  exhaustive_int_range(R"("minimum":123,"maximum":987)", 123, 987);
  exhaustive_int_range(R"("minimum":-1000,"maximum":1000)", -1000, 1000);
  exhaustive_int_range(R"("minimum":-101,"maximum":99)", -101, 99);
  exhaustive_int_range(R"("minimum":0.5,"maximum":9.5)", 1, 9);
  exhaustive_int_range(R"("minimum":10,"exclusiveMinimum":true,"maximum":20,"exclusiveMaximum":true)", 11,
                       19);
  exhaustive_int_range(R"("minimum":-1e30,"maximum":1e30)", -inf, inf);
  // Beyond the 16 digits: an upper bound is lowered, a lower bound cannot be met.
  EXPECT_TRUE(
      grammar_accepts(compile(R"({"type":"integer","minimum":9999999999999990})"), "9999999999999999"));
  EXPECT_NE(refusal(R"({"type":"integer","minimum":1e20})").find("beyond"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"integer","minimum":5,"maximum":4})").find("no integer"), std::string::npos);
}

TEST(JsonSchema, NumberRanges) {
  struct Case {
    std::string bounds;
    double lo, hi;
    bool lo_strict, hi_strict;
  };
  const double inf = 1e300;
  const std::vector<Case> cases = {
      {R"("minimum":0,"maximum":1)", 0, 1, false, false},
      {R"("exclusiveMinimum":0,"exclusiveMaximum":1)", 0, 1, true, true},
      {R"("minimum":-2,"maximum":3)", -2, 3, false, false},
      {R"("minimum":-5,"exclusiveMaximum":-2)", -5, -2, false, true},
      {R"("exclusiveMinimum":-3)", -3, inf, true, false},
      {R"("maximum":0)", -inf, 0, false, false},
      {R"("minimum":0.5,"maximum":2.5)", 1, 2, false, false},  // rounded inwards
  };
  const std::vector<std::string> samples = {
      "-6",  "-5",   "-5.0", "-4.99", "-3",  "-3.0",     "-2.999", "-2.5",  "-2", "-2.0",
      "-1",  "-0.5", "-0",   "0",     "0.0", "0.000001", "0.5",    "0.999", "1",  "1.0",
      "1.5", "2",    "2.01", "2.5",   "3",   "3.0",      "3.5",    "10",    "-10"};
  for (const Case& c : cases) {
    const auto g = compile(R"({"type":"number",)" + c.bounds + "}");
    for (const std::string& s : samples) {
      const double v = std::stod(s);
      if (s.rfind("-0", 0) == 0 && v == 0) continue;  // "-0" is 0, and may be left out (a narrower grammar)
      const bool in = (c.lo_strict ? v > c.lo : v >= c.lo) && (c.hi_strict ? v < c.hi : v <= c.hi);
      EXPECT_EQ(grammar_accepts(g, s), in) << c.bounds << ": " << s;
    }
    EXPECT_FALSE(grammar_accepts(g, "1e0"));
  }
}

TEST(JsonSchema, BoundedWhitespace) {
  const auto g = compile(R"({"type":"array","items":{"type":"integer"}})");
  EXPECT_TRUE(grammar_accepts(g, "[ 1, 2 ]"));
  EXPECT_TRUE(grammar_accepts(g, "[\n" + std::string(20, ' ') + "1\n]"));
  EXPECT_FALSE(grammar_accepts(g, "[\n" + std::string(21, ' ') + "1\n]"));
  EXPECT_FALSE(grammar_accepts(g, "[  1]"));
  EXPECT_FALSE(grammar_accepts(g, "[\n\n1]"));
  // The prefix of endless spaces dies: a sampler cannot loop on whitespace.
  EXPECT_FALSE(grammar_accepts_prefix(g, "[" + std::string(3, ' ')));
  JsonSchemaOptions compact;
  compact.whitespace = false;
  const auto c = compile(R"({"type":"array","items":{"type":"integer"}})", compact);
  EXPECT_TRUE(grammar_accepts(c, "[1,2]"));
  EXPECT_FALSE(grammar_accepts(c, "[1, 2]"));
}

TEST(JsonSchema, RefusedKeywordsNameKeywordAndPointer) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"properties":{"price":{"type":"number","multipleOf":0.01}}})",
       "'multipleOf' at /properties/price/multipleOf"},
      {R"({"type":"array","uniqueItems":true,"minItems":2})", "'uniqueItems' at /uniqueItems"},
      {R"({"type":"number","multipleOf":2})", "'multipleOf' at /multipleOf"},
      {R"({"not":{"type":"null"}})", "'not' at /not"},
      {R"({"if":{"required":["a"]},"then":{"required":["b"]}})", "'if' at /if"},
      {R"({"items":{"properties":{"a":{}},"required":["a"],"dependentSchemas":{"a":{"required":["b"]}}}})",
       "'dependentSchemas' at /items/dependentSchemas"},
      {R"({"anyOf":[{"type":"array","contains":{"type":"integer"}}]})", "'contains' at /anyOf/0/contains"},
      {R"({"$defs":{"x":{"propertyNames":{"maxLength":3}}},"$ref":"#/$defs/x"})",
       "'propertyNames' at /$defs/x/propertyNames"},
      {R"({"type":"object","minProperties":2})", "'minProperties' at /minProperties"},
      {R"({"type":"object","properties":{"a/b":{"type":"array","unevaluatedItems":false}}})",
       "'unevaluatedItems' at /properties/a~1b/unevaluatedItems"},
  };
  for (const auto& [schema, want] : cases) {
    const std::string why = refusal(schema);
    EXPECT_NE(why.find(want), std::string::npos) << schema << "\n -> " << why;
    EXPECT_NE(why.find("unsupported keyword"), std::string::npos) << why;
  }
  // Annotations are ignored; uniqueItems false and unevaluatedItems true constrain nothing.
  check(R"({"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"https://x/y","title":"t",
            "description":"d","examples":[1],"default":1,"$comment":"c","readOnly":true,"deprecated":false,
            "x-vendor":{"not":1},"type":"array","uniqueItems":false,"unevaluatedItems":true})",
        {"[1]"}, {"1"});
}

TEST(JsonSchema, MalformedAndDeepSchemasAreErrors) {
  for (const char* s : {R"({"type":"strin"})", R"({"type":3})", R"({"properties":[]})", R"({"required":"a"})",
                        R"({"minLength":-1})", R"({"enum":"a"})", R"({"anyOf":[]})", R"({"$ref":3})", "false",
                        "3", R"({"items":[false],"minItems":1})", R"({"pattern":"(a"})",
                        R"({"pattern":"a{3,1}"})", R"({"properties":{"a":false},"required":["a"]})"}) {
    EXPECT_NE(refusal(s).rfind("json schema:", 0), std::string::npos) << s << " -> " << refusal(s);
  }
  std::string deep = "{}";
  for (int i = 0; i < 200; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  EXPECT_NE(refusal(deep).find("nested deeper than 64"), std::string::npos);
  std::string deep_pattern(5000, '(');
  EXPECT_NE(refusal(R"({"pattern":")" + deep_pattern + R"("})").find("nested deeper"), std::string::npos);
}

// ---- property check: random schemas, random sentences, an independent validator ----

namespace {

// Shortest expansion (code points) of each rule, for a random walk that must end.
std::vector<uint64_t> min_costs(const Grammar& g) {
  std::vector<uint64_t> cost(g.n_rules(), UINT64_MAX / 4);
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t r = 0; r < g.n_rules(); ++r) {
      for (uint32_t a = g.rule_alts[r]; a < g.rule_alts[r + 1]; ++a) {
        uint64_t c = 0;
        for (uint32_t e = g.alt_start[a]; !g.ends_alternative(e); ++e) {
          c = std::min<uint64_t>(c + (g.elements[e].op == Op::Rule ? cost[g.elements[e].a] : 1),
                                 UINT64_MAX / 4);
        }
        if (c < cost[r]) cost[r] = c, changed = true;
      }
    }
  }
  return cost;
}

// A random sentence of g: alternatives chosen at random until the output is long, then the cheapest.
std::string random_sentence(const Grammar& g, const std::vector<uint64_t>& cost, std::mt19937& rng) {
  std::string out;
  std::vector<uint32_t> stack = {Grammar::kStart};  // elements still to expand, top last
  size_t n = 0;
  while (!stack.empty()) {
    const uint32_t e = stack.back();
    stack.pop_back();
    if (g.ends_alternative(e)) continue;
    stack.push_back(e + 1);
    const Element& el = g.elements[e];
    if (el.op == Op::Chars) {
      const CharRange* r = g.ranges.data() + el.a;
      std::vector<CharRange> printable;
      for (uint32_t i = 0; i < el.b; ++i) {
        const uint32_t lo = std::max<uint32_t>(r[i].lo, 0x20), hi = std::min<uint32_t>(r[i].hi, 0x7E);
        if (lo <= hi) printable.push_back({lo, hi});
      }
      const bool ascii = !printable.empty() && rng() % 8 != 0;
      const CharRange pick = ascii ? printable[rng() % printable.size()] : r[rng() % el.b];
      uint32_t c = pick.lo + (uint32_t)(rng() % ((uint64_t)pick.hi - pick.lo + 1));
      if (c >= 0xD800 && c <= 0xDFFF) c = pick.lo;
      tok::utf8::append(out, c);
      ++n;
      continue;
    }
    const uint32_t rule = el.a;
    const uint32_t a0 = g.rule_alts[rule], a1 = g.rule_alts[rule + 1];
    uint32_t alt = a0 + (uint32_t)(rng() % (a1 - a0));
    if (n > 200 || stack.size() > 400) {  // finish: the cheapest alternative
      uint64_t best = UINT64_MAX;
      for (uint32_t a = a0; a < a1; ++a) {
        uint64_t c = 0;
        for (uint32_t x = g.alt_start[a]; !g.ends_alternative(x); ++x) {
          c = std::min<uint64_t>(c + (g.elements[x].op == Op::Rule ? cost[g.elements[x].a] : 1),
                                 UINT64_MAX / 4);
        }
        if (c < best) best = c, alt = a;
      }
    }
    stack.push_back(g.alt_start[alt]);
  }
  return out;
}

ojson random_value(std::mt19937& rng, int depth);

ojson random_schema(std::mt19937& rng, int depth) {
  const int kind = (int)(rng() % (depth > 2 ? 8 : 13));
  ojson s = ojson::object();
  static const char* const patterns[] = {"^[a-z]{1,5}$", "^\\d{3}-\\d{2}$", "ab",
                                         "^(x|yz)*$",    "^[^a]\\w?$",      "q$"};
  static const char* const formats[] = {"date", "date-time", "uuid", "email"};
  switch (kind) {
    case 0:
      s["type"] = "string";
      if (rng() % 2) s["minLength"] = rng() % 4;
      if (rng() % 2) s["maxLength"] = 4 + rng() % 4;
      break;
    case 1:
      s["type"] = "string";
      if (rng() % 2) {
        s["pattern"] = patterns[rng() % 6];
      } else {
        s["format"] = formats[rng() % 4];
      }
      break;
    case 2: {
      s["type"] = "integer";
      const int lo = (int)(rng() % 200) - 100;
      if (rng() % 2) s[rng() % 2 ? "minimum" : "exclusiveMinimum"] = lo;
      if (rng() % 2) s[rng() % 2 ? "maximum" : "exclusiveMaximum"] = lo + 2 + (int)(rng() % 300);
      break;
    }
    case 3: {
      s["type"] = "number";
      const int lo = (int)(rng() % 20) - 10;
      if (rng() % 2) s[rng() % 2 ? "minimum" : "exclusiveMinimum"] = lo;
      if (rng() % 2) s[rng() % 2 ? "maximum" : "exclusiveMaximum"] = lo + 1 + (int)(rng() % 5);
      break;
    }
    case 4:
      s["type"] = rng() % 2 ? "boolean" : "null";
      break;
    case 5: {
      ojson e = ojson::array();
      for (int i = 0, n = 1 + (int)(rng() % 4); i < n; ++i) e.push_back(random_value(rng, 0));
      s["enum"] = e;
      break;
    }
    case 6:
      s["const"] = random_value(rng, 1);
      break;
    case 7:
      s["type"] = ojson::array({"string", "null"});
      break;
    case 8:
    case 9: {
      s["type"] = "object";
      ojson props = ojson::object(), req = ojson::array();
      for (int i = 0, n = (int)(rng() % 4); i < n; ++i) {
        const std::string name = std::string(1, (char)('a' + rng() % 6));
        props[name] = random_schema(rng, depth + 1);
        if (rng() % 2 && std::find(req.begin(), req.end(), name) == req.end()) req.push_back(name);
      }
      s["properties"] = props;
      if (!req.empty()) s["required"] = req;
      const int add = (int)(rng() % 4);
      if (add == 1) s["additionalProperties"] = false;
      if (add == 2) s["additionalProperties"] = random_schema(rng, depth + 1);
      if (add == 3) s["additionalProperties"] = true;
      break;
    }
    case 10: {
      s["type"] = "array";
      if (rng() % 3 == 0) {
        s["prefixItems"] = ojson::array({random_schema(rng, depth + 1), random_schema(rng, depth + 1)});
      }
      if (rng() % 4) s["items"] = random_schema(rng, depth + 1);
      if (rng() % 2) s["minItems"] = rng() % 3;
      if (rng() % 2) s["maxItems"] = 3 + rng() % 3;
      if (rng() % 6 == 0) s["uniqueItems"] = true;
      break;
    }
    case 11:
      s["anyOf"] = ojson::array({random_schema(rng, depth + 1), random_schema(rng, depth + 1)});
      break;
    default:
      s["allOf"] = ojson::array({ojson{{"type", "object"},
                                       {"properties", {{"p", random_schema(rng, depth + 1)}}},
                                       {"required", {"p"}}},
                                 ojson{{"properties", {{"q", random_schema(rng, depth + 1)}}}}});
      break;
  }
  return s;
}

ojson random_value(std::mt19937& rng, int depth) {
  switch (rng() % (depth > 0 ? 4 : 6)) {
    case 0:
      return (int)(rng() % 100) - 50;
    case 1:
      return std::string(1 + rng() % 3, (char)('a' + rng() % 3));
    case 2:
      return nullptr;
    case 3:
      return rng() % 2 == 0;
    case 4:
      return ojson::array({random_value(rng, depth + 1)});
    default:
      return ojson{{"k", random_value(rng, depth + 1)}};
  }
}

using test::expect_all_valid;
using test::have_python_jsonschema;

}  // namespace

TEST(JsonSchema, RandomSentencesValidateAgainstTheirSchemas) {
  std::mt19937 rng(1234);
  test::TmpDir dir("json_schema_prop");
  const fs::path cases = dir.path() / "cases.jsonl";
  std::ofstream out(cases);
  int n_schemas = 0, n_docs = 0, n_refused = 0;
  for (int i = 0; i < 300; ++i) {
    ojson schema = random_schema(rng, 0);
    if (i % 5 == 0) {  // through a $ref
      schema = ojson{{"$defs", {{"t", schema}}}, {"$ref", "#/$defs/t"}};
    }
    std::shared_ptr<const Grammar> g;
    try {
      g = std::make_shared<const Grammar>(json_schema_to_grammar(schema));
    } catch (const Error& e) {
      ++n_refused;  // e.g. an allOf whose parts conflict
      continue;
    }
    ++n_schemas;
    const std::vector<uint64_t> cost = min_costs(*g);
    for (int k = 0; k < 8; ++k) {
      const std::string doc = random_sentence(*g, cost, rng);
      ASSERT_TRUE(grammar_accepts(g, doc)) << schema.dump() << "\n" << doc;
      ojson parsed;
      try {
        parsed = ojson::parse(doc);
      } catch (const std::exception& e) {
        FAIL() << "not JSON: " << doc << "\nschema " << schema.dump();
      }
      out << ojson{{"schema", schema}, {"doc", parsed}}.dump() << "\n";
      ++n_docs;
    }
  }
  out.close();
  EXPECT_GT(n_schemas, 250) << n_refused << " refused";
  if (!have_python_jsonschema()) GTEST_SKIP() << "python3-jsonschema is not installed: tools/install-deps.sh";
  expect_all_valid(cases, n_docs, dir.path());
}

// ---- JSONSchemaBench sample: coverage per category ----

// Coverage (schemas compiled / schemas in the sample) per category, at least the committed floor; and
// random sentences of every compiled grammar validate against their schema (python3-jsonschema).
TEST(JsonSchema, JsonSchemaBenchCoverage) {
  const fs::path root = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "jsonschemabench";
  const std::map<std::string, double> floor = {{"Github_easy", 0.95},
                                               {"Github_medium", 0.975},
                                               {"Github_hard", 0.875},
                                               {"Glaiveai2K", 1.0},
                                               {"Kubernetes", 1.0}};
  std::map<std::string, std::pair<int, int>> seen;  // category -> (compiled, total)
  std::map<std::string, int> reasons;
  test::TmpDir dir("json_schema_bench");
  const fs::path cases = dir.path() / "cases.jsonl";
  std::ofstream out(cases);
  std::mt19937 rng(77);
  int n_docs = 0;
  for (const auto& [category, min_cov] : floor) {
    ASSERT_TRUE(fs::is_directory(root / category)) << root / category;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(root / category)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      std::ifstream in(f);
      std::stringstream ss;
      ss << in.rdbuf();
      auto& [ok, total] = seen[category];
      ++total;
      const ojson schema = ojson::parse(ss.str());
      std::shared_ptr<const Grammar> g;
      try {
        g = std::make_shared<const Grammar>(json_schema_to_grammar(schema));
      } catch (const Error& e) {
        const std::string why = e.what();
        reasons[why.substr(0, why.find(" at "))]++;
        continue;
      }
      ++ok;
      const std::vector<uint64_t> cost = min_costs(*g);
      for (int k = 0; k < 3; ++k) {
        const std::string doc = random_sentence(*g, cost, rng);
        ASSERT_TRUE(grammar_accepts(g, doc)) << f << "\n" << doc;
        out << ojson{{"schema", schema}, {"doc", ojson::parse(doc)}}.dump() << "\n";
        ++n_docs;
      }
    }
  }
  out.close();
  std::string table = "category        compiled / total   coverage   floor\n";
  for (const auto& [category, c] : seen) {
    const double cov = (double)c.first / c.second;
    table += fmt::format("{:<15} {:>8} / {:<5}   {:>7.1f}%   {:.1f}%\n", category, c.first, c.second,
                         100 * cov, 100 * floor.at(category));
    EXPECT_GE(cov, floor.at(category)) << category;
  }
  std::vector<std::pair<int, std::string>> top;
  for (const auto& [why, n] : reasons) top.emplace_back(n, why);
  std::sort(top.rbegin(), top.rend());
  table += "refused:\n";
  for (const auto& [n, why] : top) table += fmt::format("  {:>3}  {}\n", n, why);
  std::printf("%s", table.c_str());
  if (!have_python_jsonschema()) GTEST_SKIP() << "python3-jsonschema is not installed: tools/install-deps.sh";
  expect_all_valid(cases, n_docs, dir.path());
}

// ---- the fuzz target's body on kept inputs ----

TEST(JsonSchema, FuzzInputsGiveErrorsNotCrashes) {
  const fs::path dir = fs::path(ULTRA_SOURCE_DIR) / "tests/fixtures/fuzz/json_schema";
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string in = ss.str();
    EXPECT_NO_THROW(fuzz::json_schema_one_input(reinterpret_cast<const uint8_t*>(in.data()), in.size()))
        << e.path();
    ++n;
  }
  EXPECT_GT(n, 5);
}
