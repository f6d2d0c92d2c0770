// The chat-template interpreter: the 69 real templates of tests/fixtures/templates rendered byte for byte
// as jinja2 3.1 renders them in HF transformers' environment (renderings.json,
// tools/make_template_fixtures.py), and unit tests of the interpreter itself: expressions, filters,
// whitespace control, loops, macros, namespaces, errors naming the construct and line, and hostile templates
// that must fail cleanly.
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include <pthread.h>
#include <unistd.h>

#include "../fuzz/fuzz_chat_template.h"
#include "chat/builtin_templates.h"
#include "chat/chat_template.h"
#include "cli/common.h"
#include "core/error.h"
#include "sanitized.h"
#include "ultra/model.h"

using namespace ultra;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path tdir() {
  return fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "templates";
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const json& renderings() {
  static const json j = json::parse(slurp(tdir() / "renderings.json"));
  return j;
}

// renderings.json's "now" (naive local time, as Python's datetime.now()).
std::time_t fixture_now() {
  std::tm tm{};
  const std::string s = renderings()["now"].get<std::string>();
  tm.tm_year = std::stoi(s.substr(0, 4)) - 1900;
  tm.tm_mon = std::stoi(s.substr(5, 2)) - 1;
  tm.tm_mday = std::stoi(s.substr(8, 2));
  tm.tm_hour = std::stoi(s.substr(11, 2));
  tm.tm_min = std::stoi(s.substr(14, 2));
  tm.tm_sec = std::stoi(s.substr(17, 2));
  tm.tm_isdst = -1;
  return std::mktime(&tm);
}

// Templates the interpreter does not render byte-identically yet, with the reason.
const std::map<std::string, std::string>& known_gaps() {
  static const std::map<std::string, std::string> gaps = {};
  return gaps;
}

// Renders every case of one template; returns "" when all match, else a description of the first mismatch.
std::string check_template(const std::string& name) {
  const json& r = renderings();
  const json& t = r["templates"][name];
  std::string src = slurp(tdir() / (name + ".jinja"));
  try {
    ChatTemplate tmpl(src, ChatTemplateOptions{r["bos_token"], r["eos_token"], fixture_now()});
    for (const json& c : t["cases"]) {
      const json& conv = r["conversations"][c["conversation"].get<size_t>()];
      const bool agp = c["add_generation_prompt"].get<bool>();
      const std::string where = fmt::format("case conv={} agp={}", c["conversation"].get<int>(), agp);
      if (c.contains("error")) {
        std::string msg = c["error"].get<std::string>();
        if (msg.rfind("TemplateError: ", 0) == 0) msg = msg.substr(15);
        try {
          tmpl.apply(conv, agp);
          return where + ": rendered, expected error " + msg;
        } catch (const Error& e) {
          if (std::string(e.what()).find(msg) == std::string::npos)
            return where + ": error '" + e.what() + "', expected '" + msg + "'";
        }
        continue;
      }
      std::string out;
      try {
        out = tmpl.apply(conv, agp);
      } catch (const Error& e) {
        return where + ": " + e.what();
      }
      const std::string want = c["output"].get<std::string>();
      if (out != want) {
        size_t k = 0;
        while (k < out.size() && k < want.size() && out[k] == want[k]) ++k;
        return where + fmt::format(": differs at byte {}: got [{}] want [{}]", k,
                                   out.substr(k > 40 ? k - 40 : 0, 120),
                                   want.substr(k > 40 ? k - 40 : 0, 120));
      }
    }
  } catch (const Error& e) {
    return std::string("parse: ") + e.what();
  }
  return "";
}

std::vector<std::string> template_names() {
  std::vector<std::string> names;
  for (auto it = renderings()["templates"].begin(); it != renderings()["templates"].end(); ++it)
    names.push_back(it.key());
  return names;
}

class Fixture : public testing::TestWithParam<std::string> {};

TEST_P(Fixture, RendersLikeJinja2) {
  const std::string name = GetParam();
  const std::string problem = check_template(name);
  auto gap = known_gaps().find(name);
  if (gap != known_gaps().end()) {
    GTEST_SKIP() << "known gap: " << gap->second << (problem.empty() ? " (now passes!)" : "");
  }
  EXPECT_EQ(problem, "") << name;
}

INSTANTIATE_TEST_SUITE_P(Templates, Fixture, testing::ValuesIn(template_names()),
                         [](const testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           for (auto& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

TEST(ChatTemplateFixtures, Summary) {
  int ok = 0, n = 0;
  for (const auto& name : template_names()) {
    ++n;
    const std::string p = check_template(name);
    if (p.empty())
      ++ok;
    else
      std::printf("[chat-template] %s: %s\n", name.c_str(), p.c_str());
  }
  std::printf("[chat-template] %d of %d templates render byte-identically\n", ok, n);
  EXPECT_EQ(n, 69);
  EXPECT_EQ(ok + int(known_gaps().size()), n);
}

// ---- unit tests of the interpreter ----

std::string R(const std::string& src, const json& extra = json::object(), const json& msgs = json::array()) {
  ChatTemplate t(src, ChatTemplateOptions{"<s>", "</s>", 0});
  return t.apply(msgs, false, extra);
}

std::string Err(const std::string& src, const json& extra = json::object()) {
  try {
    R(src, extra);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(ChatTemplate, Expressions) {
  EXPECT_EQ(
      R("{{ 1 + 2 * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 7 / 2 }}|{{ 4 / 2 }}"),
      "7|3|-4|2|1024|3.5|2.0");
  EXPECT_EQ(R("{{ 'a' ~ 1 ~ none }}|{{ 'ab' * 3 }}|{{ [1, 2] + [3] }}"), "a1None|ababab|[1, 2, 3]");
  EXPECT_EQ(R("{{ true }}|{{ None }}|{{ ['a', \"b'\"] }}|{{ {'k': 1.5} }}|{{ (1,) }}"),
            "True|None|['a', \"b'\"]|{'k': 1.5}|(1,)");
  EXPECT_EQ(R("{{ 'x' if 1 in [1, 2] else 'y' }}{{ 'a' not in 'abc' }}{{ not false and (0 or 'z') }}"),
            "xFalsez");
  EXPECT_EQ(R("{{ 'hello'[1:] }}|{{ 'hello'[::-1] }}|{{ [1,2,3,4][-2:] }}|{{ 'héllo'[1] }}"),
            "ello|olleh|[3, 4]|é");
  EXPECT_EQ(R("{{ ' a b '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'abc'.startswith('ab') }}|{{ "
              "'{}-{}'.format(1, 'x') }}"),
            "a b|['a', 'b']|True|1-x");
  EXPECT_EQ(R("{{ d.get('a') }}|{{ d.get('z', 3) }}|{{ d.x }}|{% for k, v in d.items() %}{{ k }}={{ v }};{% "
              "endfor %}",
              {{"d", {{"a", 1}, {"x", "y"}}}}),
            "1|3|y|a=1;x=y;");
  EXPECT_EQ(R("{{ 1e20 }}|{{ 0.1 }}|{{ 1.0 }}|{{ 3|float }}|{{ '42'|int + 1 }}"), "1e+20|0.1|1.0|3.0|43");
}

TEST(ChatTemplate, Filters) {
  EXPECT_EQ(
      R("{{ ' x '|trim }}|{{ [3,1,2]|sort|join(',') }}|{{ 'abc'|length }}|{{ [1,2]|first }}{{ [1,2]|last }}"),
      "x|1,2,3|3|12");
  EXPECT_EQ(R("{{ x|default('d') }}|{{ ''|default('d', true) }}|{{ 'ab'|upper }}|{{ 'hello world'|title }}"),
            "d|d|AB|Hello World");
  EXPECT_EQ(R("{{ {'b': [1, 'é'], 'a': none}|tojson }}|{{ [1]|tojson(indent=2) }}"),
            "{\"b\": [1, \"é\"], \"a\": null}|[\n  1\n]");
  EXPECT_EQ(R("{{ m|map(attribute='n')|join(' ') }}|{{ m|selectattr('n', 'equalto', 'b')|list|length }}|"
              "{{ m|rejectattr('n')|list }}",
              {{"m", json::array({{{"n", "a"}}, {{"n", "b"}}, {{"n", ""}}})}}),
            "a b |1|[{'n': ''}]");
  EXPECT_EQ(R("{{ 'a\nb\n\nc'|indent(2) }}"), "a\n  b\n\n  c");
  EXPECT_EQ(R("{{ {'b': 1, 'A': 2}|dictsort }}|{{ [1, 1, 2]|unique|list }}|{{ 2.5|round }}|{{ -3|abs }}"),
            "[('A', 2), ('b', 1)]|[1, 2]|2.0|3");
  EXPECT_NE(Err("{{ x|xmlattr }}").find("line 1: unsupported filter 'xmlattr'"), std::string::npos);
  // A filter block (FireFunction v2's template): the body's text through the filters, in order.
  EXPECT_EQ(R("<{% filter trim %}\n  a {{ x }}\n{% endfilter %}>", {{"x", 1}}), "<a 1>");
  EXPECT_EQ(R("{% set s %}{%- filter upper | replace('A', 'b') -%} a{{ 'c' }} {%- endfilter %}{% endset "
              "%}[{{ s }}]"),
            "[bC]");
  EXPECT_NE(Err("{% filter nope %}x{% endfilter %}").find("unsupported filter 'nope'"), std::string::npos);
  EXPECT_NE(Err("{% filter trim %}x").find("line 1"), std::string::npos);
}

TEST(ChatTemplate, WhitespaceControl) {
  EXPECT_EQ(R("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(R("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(R("x {#- comment -#} y\n{# c #}\nz"), "xy\nz");
  EXPECT_EQ(R("  {%+ if true %}k{% endif %}"), "  k");
}

TEST(ChatTemplate, LoopsAndScopes) {
  EXPECT_EQ(R("{% for x in [1,2,3] %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.revindex }}"
              "{{ loop.previtem }}{{ loop.nextitem }}/{{ loop.length }};{% endfor %}"),
            "1TrueFalse32/3;2FalseFalse213/3;3FalseTrue12/3;");
  EXPECT_EQ(
      R("{% for x in range(10) if x is odd %}{% if x > 5 %}{% break %}{% endif %}{% if x == 3 %}{% continue "
        "%}{% endif %}{{ x }}{% endfor %}"),
      "15");
  EXPECT_EQ(R("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(
      R("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}"),
      "4");
  EXPECT_EQ(R("{% set a, b = [1, 2] %}{{ b }}{{ a }}{% set s %}in{{ a }}{% endset %}{{ s }}"), "21in1");
}

TEST(ChatTemplate, MacrosAndTests) {
  EXPECT_EQ(R("{% macro m(a, b='d') %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }}|{{ m(1, b=2) }}"), "1-d|1-2");
  EXPECT_EQ(R("{{ x is defined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}"
              "{{ 1 is number }}{{ 1.0 is integer }}{{ true is boolean }}{{ 2 is in [1, 2] }}{{ 4 is "
              "divisibleby 2 }}"),
            "FalseTrueTrueTrueTrueTrueFalseTrueTrueTrue");
  EXPECT_EQ(R("{% generation %}g{% endgeneration %}{{ bos_token }}{{ eos_token }}"), "g<s></s>");
}

// Macros are closures over the scopes they are defined in, as in jinja2 (the expected strings are jinja2
// 3.1.6's renderings): a loop's variables, an enclosing macro's parameters, names set in those scopes after
// the definition (late binding), recursion through the macro's own name. Each of these templates stores the
// macro in the very scope it closes over (some also in a namespace): a reference cycle (scope -> macro ->
// scope) that leaks on every render if the macro holds its scopes strongly (checked by making it so:
// LeakSanitizer then reports ~70 KB per render of these, and the heap grows by 25 MB over the 300 renders
// below). LeakSanitizer reports such a leak at exit (the suite's ASan run sets detect_leaks=1); without ASan
// the test checks that the heap in use does not grow over 300 renders of them.
TEST(ChatTemplate, MacroClosures) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% for i in [1,2] %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}{% endfor %}", "12"},
      {"{% macro outer(x) %}{% macro inner() %}[{{ x }}]{% endmacro %}{{ inner() }}{% endmacro %}{{ outer(5) "
       "}}",
       "[5]"},
      {"{% set y = 1 %}{% macro m() %}{{ y }}{% endmacro %}{% set y = 2 %}{{ m() }}", "2"},
      {"{% for i in [1,2] %}{% set z = i * 10 %}{% macro m() %}{{ z }}{% endmacro %}{{ m() }}{% endfor %}",
       "1020"},
      {"{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n }}{% endmacro %}{{ f(3) }}", "0123"},
      {"{% for i in [1] %}{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n }}{{ i }}{% endmacro %}"
       "{{ f(2) }}{% endfor %}",
       "011121"},
      {"{% macro outer() %}{% macro inner(n) %}{% if n > 0 %}{{ inner(n - 1) }}{% endif %}{{ n }}{% endmacro "
       "%}"
       "{{ inner(2) }}{% endmacro %}{{ outer() }}",
       "012"},
      {"{% for i in [1,2] %}{% macro m() %}{{ i }}{% endmacro %}{% set i = 7 %}{{ m() }}{% endfor %}", "77"},
      {"{% set ns = namespace(n=0) %}{% macro m() %}{{ ns.n }}{% endmacro %}{% set ns.m = m %}{% set ns.n = "
       "1 %}"
       "{{ ns.m() }}",
       "1"},
      {"{% macro m(x) %}{% set x = x + 1 %}{{ x }}{% endmacro %}{% set x = 10 %}{{ m(1) }}{{ x }}", "210"},
      {"{% macro m() %}{% set t = 5 %}{{ t }}{% endmacro %}{% set t = 1 %}{{ m() }}{{ t }}", "51"},
      {"{% for a in [1, 2] %}{% for b in [3] %}{% macro m(c) %}{{ a }}{{ b }}{{ c }}{% endmacro %}"
       "{{ m(loop.index) }}{% endfor %}{% endfor %}",
       "131231"},
      {"{% macro outer(x) %}{% macro inner(y) %}{{ x }}{{ y }}{% endmacro %}{{ inner(x * 2) }}{% endmacro %}"
       "{% for i in [1,2] %}{{ outer(i) }}{% endfor %}",
       "1224"},
      {"{% macro a() %}A{{ b() }}{% endmacro %}{% macro b() %}B{% endmacro %}{{ a() }}", "AB"},
      // Called after its loop ended (kept in a namespace), a macro no longer sees the loop's names (jinja2
      // prints its internal sentinel there: "[missing]").
      {"{% set ns = namespace() %}{% for i in [1] %}{% macro m() %}[{{ i }}]{% endmacro %}{% set ns.f = m %}"
       "{% endfor %}{{ ns.f() }}",
       "[]"},
  };
  for (const auto& [src, want] : cases) EXPECT_EQ(R(src), want) << src;

#if !defined(__SANITIZE_ADDRESS__)
  std::vector<ChatTemplate> parsed;
  for (const auto& c : cases) parsed.emplace_back(c.first);
  auto render_all = [&](int times) {
    for (int k = 0; k < times; ++k)
      for (const ChatTemplate& t : parsed) t.apply(json::array(), false);
  };
  render_all(10);
  const size_t before = mallinfo2().uordblks;
  render_all(300);
  const size_t after = mallinfo2().uordblks;
  EXPECT_LT(after, before + (64u << 10))
      << "the heap in use grew by " << after - before << " bytes over 300 renders of each template";
#endif
}

TEST(ChatTemplate, Errors) {
  EXPECT_NE(Err("{{ raise_exception('boom') }}").find("boom"), std::string::npos);
  EXPECT_NE(Err("\n\n{% call x() %}{% endcall %}").find("line 3: unsupported statement 'call'"),
            std::string::npos);
  EXPECT_NE(Err("{{ x.y }}").find("line 1: 'x' is undefined"), std::string::npos);
  EXPECT_NE(Err("{% if x %}").find("unexpected end of template"), std::string::npos);
  EXPECT_NE(Err("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(Err("{{ 'x' is frobnicated }}").find("unsupported test 'frobnicated'"), std::string::npos);
  EXPECT_NE(Err("{{ [].append(1) }}").find("unsafe"), std::string::npos);
}

// Python's round() and int() as jinja2 3.1.6 gives them (outputs from jinja2 itself). Where Python's int
// is bigger than int64 (1e300|int) ultra gives an error naming the value instead of a silently wrong number.
TEST(ChatTemplate, RoundAndIntAsJinja2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"2.5|round", "2.0"},
      {"3.5|round", "4.0"},
      {"-2.5|round", "-2.0"},
      {"0.5|round", "0.0"},
      {"0.125|round(2)", "0.12"},
      {"2.675|round(2)", "2.67"},
      {"5|round", "5"},
      {"7|round(2)", "7"},
      {"true|round", "1"},
      {"1250|round(-2)", "1200"},
      {"1350|round(-2)", "1400"},
      {"-1250|round(-2)", "-1200"},
      {"1234.5|round(-2)", "1200.0"},
      {"149.5|round(-2)", "100.0"},
      {"150.0|round(-2)", "200.0"},
      {"250.0|round(-2)", "200.0"},
      {"-0.4|round", "-0.0"},
      {"1e300|round", "1e+300"},
      {"1e300|round(2)", "1e+300"},
      {"1e307|round(2)", "1e+307"},
      {"1e16|round(-16)", "1e+16"},
      {"1.5|round(400)", "1.5"},
      {"1.5|round(-400)", "0.0"},
      {"5e-324|round(323)", "0.0"},
      {"5|round(0, 'ceil')", "5.0"},
      {"2.1|round(0, 'ceil')", "3.0"},
      {"-2.1|round(0, 'floor')", "-3.0"},
      {"2.15|round(1, 'floor')", "2.1"},
      {"1234|round(-2, 'ceil')", "1300.0"},
      {"(1e308 * 10)|round", "inf"},
      {"(-1e308 * 10)|round(1)", "-inf"},
      {"((1e308 * 10) - (1e308 * 10))|round", "nan"},
      {"((1e308 * 10) - (1e308 * 10))|int", "0"},
      {"3.9|int", "3"},
      {"-3.9|int", "-3"},
      {"9.2e18|int", "9200000000000000000"},
      {"-9.2e18|int", "-9200000000000000000"},
      {"'42'|int", "42"},
      {"' -42 '|int", "-42"},
      {"'+7'|int", "7"},
      {"'4.7'|int", "4"},
      {"'1e3'|int", "1000"},
      {"'nan'|int", "0"},
      {"'inf'|int", "0"},
      {"'x'|int", "0"},
      {"'x'|int(5)", "5"},
      {"'0x10'|int", "0"},
  };
  for (const auto& [expr, want] : cases) {
    std::string got;
    try {
      got = R("{{ " + expr + " }}");
    } catch (const Error& e) {
      got = std::string("error: ") + e.what();
    }
    EXPECT_EQ(got, want) << expr;
  }
  // Errors where Python raises (OverflowError, ValueError) or where its int would exceed int64.
  const std::vector<std::pair<std::string, std::string>> errors = {
      {"1.7e308|round(-308)", "rounded value too large to represent"},
      {"((1e308 * 10) - (1e308 * 10))|round(0, 'ceil')", "cannot convert float NaN to integer"},
      {"(1e308 * 10)|round(0, 'floor')", "cannot convert float infinity to integer"},
      {"(1e308 * 10)|int", "cannot convert float infinity to integer"},
      {"1e300|int", "int: 1e+300 does not fit in a 64-bit integer"},
      {"'1e300'|int", "int: 1e+300 does not fit in a 64-bit integer"},
      {"'99999999999999999999'|int", "int: 99999999999999999999 does not fit in a 64-bit integer"},
      {"9.3e18|int", "does not fit in a 64-bit integer"},
      {"9000000000000000000|round(-19)", "does not fit in a 64-bit integer"},
      {"2.5|round(0, 'up')", "method must be common, ceil or floor"},
  };
  for (const auto& [expr, want] : errors) {
    const std::string e = Err("{{ " + expr + " }}");
    EXPECT_NE(e.find("line 1: "), std::string::npos) << expr << ": " << e;
    EXPECT_NE(e.find(want), std::string::npos) << expr << ": " << e;
  }
}

// Flat chains of operators, attributes, subscripts, filters, tests and calls build a tree as deep as the
// chain is long; evaluating (and freeing) it recursed once per link, and 100,000 links overflowed the stack
// (SIGSEGV). The parser bounds the tree's depth like nesting: a clear error naming the line.
TEST(ChatTemplate, LongFlatChainsAreRejected) {
  const int n = 100000;
  auto rep = [](const std::string& s, int k) {
    std::string out;
    out.reserve(s.size() * size_t(k));
    for (int i = 0; i < k; ++i) out += s;
    return out;
  };
  const std::vector<std::pair<std::string, std::string>> chains = {
      {"1", " + 1"},     {"a", ".a"},           {"'x'", "|trim"},       {"a", "[0]"},   {"f", "()"},
      {"'a'", " ~ 'a'"}, {"true", " and true"}, {"false", " or false"}, {"1", " < 2"},  {"2", " ** 1"},
      {"1", " * 1"},     {"1", " == 1"},        {"x", " is defined"},   {"a", "[0:1]"}, {"'a'", " in 'a'"},
      {"1", " - 1"},     {"1", " // 1"},        {"f", "|trim()"},
  };
  for (const auto& [head, link] : chains) {
    const std::string src = "\n\n{{ " + head + rep(link, n) + " }}";
    const std::string e = Err(src);
    EXPECT_NE(e.find("line 3: expression too deeply nested or too long a chain"), std::string::npos)
        << head << link << ": " << e;
    // The same chain of 150 links is fine (and so a real template's chains are).
    EXPECT_NO_THROW({
      try {
        R("{{ " + head + rep(link, 150) + " }}", {{"a", json::array({json::array()})}});
      } catch (const Error& err) {
        if (std::string(err.what()).find("too long a chain") != std::string::npos) throw;
      }
    }) << head
       << link;
  }
  // In a statement too, and inside other nesting; a flat list of 100,000 items is not a chain.
  EXPECT_NE(Err("{% set x = 1" + rep(" + 1", n) + " %}").find("too long a chain"), std::string::npos);
  EXPECT_NE(Err("{% if true %}{{ [(1" + rep(" ~ 1", n) + ")] }}{% endif %}").find("too long a chain"),
            std::string::npos);
  EXPECT_EQ(R("{{ [" + rep("1, ", n) + "1]|length }}"), std::to_string(n + 1));
  EXPECT_EQ(R("{{ 1" + rep(" + 1", 150) + " }}"), "151");
}

// A macro calling itself from the bottom of a 190-level expression: 62 calls of 190 levels each overflowed an
// 8 MB stack (SIGSEGV); the evaluator stops at a floor of the thread's stack instead, on a small thread too.
TEST(ChatTemplate, MacroRecursionInsideDeepExpressions) {
  std::string chain;
  for (int k = 0; k < 190; ++k) chain += " ~ 0";
  const std::string src =
      "{% macro f(n) %}{% if n < 62 %}{{ f(n + 1)" + chain + " }}{% endif %}{% endmacro %}{{ f(0)|length }}";
  EXPECT_NE(Err(src).find("line 1: template evaluation nested too deeply for the stack"), std::string::npos);
  std::string in_thread;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 512u << 10);
  pthread_t th;
  struct Arg {
    const std::string* src;
    std::string* out;
  } arg{&src, &in_thread};
  ASSERT_EQ(pthread_create(
                &th, &attr,
                [](void* p) -> void* {
                  auto* a = static_cast<Arg*>(p);
                  *a->out = Err(*a->src);
                  return nullptr;
                },
                &arg),
            0);
  pthread_join(th, nullptr);
  pthread_attr_destroy(&attr);
  EXPECT_NE(in_thread.find("nested too deeply for the stack"), std::string::npos) << in_thread;
  // Shallower recursion through the same expression renders.
  const std::string ok =
      "{% macro f(n) %}{% if n < 5 %}{{ f(n + 1)" + chain + " }}{% endif %}{% endmacro %}{{ f(0)|length }}";
  EXPECT_EQ(R(ok), std::to_string(5 * 190));
}

// ---- the render budget ----

std::string RB(const std::string& src, const RenderBudget& b, const json& extra = json::object()) {
  ChatTemplate t(src, ChatTemplateOptions{"<s>", "</s>", 0});
  return t.apply(json::array(), false, extra, b);
}

// The calling thread's CPU seconds: a render's cost whatever the machine's load (the wall clock of a loaded
// CI machine ran past the bounds below).
double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The CPU seconds within which the budget tests below refuse (or finish) a render. SortOfALargeList's two
// refusals take 0.19 s together in the normal build here and 1.4 s under the sanitizers, whose bound leaves
// room for CI machines 3-4x slower than this one.
constexpr double kRefusedWithinS = test::kSanitized ? 4.0 : 1.0;

// Runs f, expects ultra::Error containing `want`, and returns the CPU seconds it took (thread_cpu_s).
template <class F>
double expect_refused(F&& f, const std::string& want) {
  const double t0 = thread_cpu_s();
  try {
    f();
    ADD_FAILURE() << "rendered, expected an error containing '" << want << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  return thread_cpu_s() - t0;
}

size_t peak_rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoul(line.substr(6));
  return 0;
}

// The default budget without the clock: on a loaded test machine the time budget could run out first, and
// these tests check that the memory budget does (in well under a second all the same).
RenderBudget mem_only() {
  RenderBudget b;
  b.max_seconds = 30;
  return b;
}

// Each attack class below took gigabytes or minutes before the render had a budget; now it stops at the
// default budget within a fraction of a second, with an error saying which budget ran out.
TEST(ChatTemplateBudget, ListOfLargeStrings) {
  // 10^7 references to a 1 MB string: was 10^7 copies of it (10 TB).
  const double s = expect_refused(
      [] { RB("{% set s = 'x' * 1000000 %}{% set l = [s] * 10000000 %}{{ l|length }}", mem_only()); },
      "exceeded its memory budget");
  EXPECT_LT(s, kRefusedWithinS);
  // The same by doubling a list of large strings.
  const double s2 = expect_refused(
      [] {
        RB("{% set ns = namespace(l=['x' * 1000000]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}"
           "{% endfor %}{{ ns.l|length }}",
           mem_only());
      },
      "exceeded its memory budget");
  EXPECT_LT(s2, kRefusedWithinS);
  EXPECT_LT(peak_rss_kb(), size_t(1) << 20);  // under 1 GiB for the whole test program
}

TEST(ChatTemplateBudget, SortOfALargeList) {
  // Sorting (case-insensitively: a lowered copy of each key) 1000 strings of 1 MB: was 3 GB.
  const double s =
      expect_refused([] { RB("{% set l = ['X' * 1000000] * 1000 %}{{ (l|sort)|length }}", mem_only()); },
                     "exceeded its memory budget");
  EXPECT_LT(s, kRefusedWithinS);
  const double s2 = expect_refused(
      [] { RB("{{ (range(100000)|map('string')|list * 100)|sort|length }}", mem_only()); }, "budget");
  EXPECT_LT(s2, kRefusedWithinS);
  EXPECT_LT(peak_rss_kb(), size_t(1) << 20);
}

TEST(ChatTemplateBudget, ConcatenationLoop) {
  // A string grown in a loop: each step copied the whole string (and every lookup copied it again): 10^5
  // steps of ~5 MB, about 10^12 bytes copied. Now it is charged as it goes.
  const double s = expect_refused(
      [] {
        RB("{% set ns = namespace(s='') %}{% for i in range(100000) %}{% set ns.s = ns.s ~ 'x' * 100 %}"
           "{% endfor %}{{ ns.s|length }}",
           mem_only());
      },
      "exceeded its memory budget");
  EXPECT_LT(s, kRefusedWithinS);
  // Reading a large string over and over costs the bytes it touches: stopped by the work budget.
  const json big = {{"big", std::string(8u << 20, 'a')}};
  RenderBudget no_clock;  // the work budget, not the clock (a loaded machine), is what this checks
  no_clock.max_seconds = 30;
  const double s2 = expect_refused(
      [&] { RB("{% for i in range(100000) %}{% if 'b' in big %}{% endif %}{% endfor %}", no_clock, big); },
      "exceeded its work budget");
  EXPECT_LT(s2, kRefusedWithinS);
}

TEST(ChatTemplateBudget, LookupsShareValues) {
  // A variable lookup of a 10 MB string is O(1): 10,000 lookups and loop bindings of it render at once.
  const json big = {{"big", std::string(10u << 20, 'a')}};
  RenderBudget b;
  b.max_seconds = 5;  // a loaded test machine; it takes milliseconds
  const double t0 = thread_cpu_s();
  EXPECT_EQ(RB("{% set ns = namespace() %}{% for i in range(10000) %}{% set y = big %}{% set ns.z = [y, y] %}"
               "{% endfor %}{{ ns.z[1]|length }}",
               b, big),
            std::to_string(10u << 20));
  EXPECT_LT(thread_cpu_s() - t0, kRefusedWithinS);
}

// A render that does much small work (each step within every budget but time).
const char* const kSlow =
    "{% for i in range(100000) %}{% for j in range(50) %}{% set x = j %}{% endfor %}{% endfor %}";

TEST(ChatTemplateBudget, CancelledFromAnotherThread) {
  std::atomic<bool> cancel{false};
  RenderBudget b;
  b.max_seconds = 60;
  b.max_work = uint64_t(1) << 40;
  b.cancel = &cancel;
  ChatTemplate t(kSlow);
  std::atomic<bool> started{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    cancel = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::string err;
  try {
    t.apply(json::array(), false, json::object(), b);
  } catch (const Error& e) {
    err = e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  canceller.join();
  EXPECT_EQ(err, "chat template render was cancelled");
  EXPECT_LT(s, 0.5);
  EXPECT_GE(s, 0.04);
  // Already cancelled: refused before rendering.
  EXPECT_EQ(expect_refused([&] { t.apply(json::array(), false, json::object(), b); }, "was cancelled") < 0.1,
            true);
}

TEST(ChatTemplateBudget, WallTime) {
  RenderBudget b;
  b.max_work = uint64_t(1) << 40;
  b.max_seconds = 0.05;
  const double s =
      expect_refused([&] { RB(kSlow, b); }, "chat template render exceeded its time budget (0.05 s)");
  EXPECT_LT(s, 0.5);
  // And with the defaults: the step limit or the 0.25 s budget, whichever comes first.
  EXPECT_LT(expect_refused([&] { RB(kSlow, {}); }, "chat template"), 1.0);
}

// The 69 real templates render byte-identically with a budget of 1/64 of the default bytes and work (and
// half its time): the defaults leave them a wide margin (they fit in 1/512 too).
TEST(ChatTemplateBudget, RealTemplatesStayFarInsideTheDefaults) {
  const json& r = renderings();
  RenderBudget small;
  small.max_bytes = RenderBudget{}.max_bytes / 64;
  small.max_work = RenderBudget{}.max_work / 64;
  small.max_seconds =
      RenderBudget{}.max_seconds / 2;  // they take microseconds; a loaded machine, milliseconds
  double worst = 0;
  for (const auto& name : template_names()) {
    ChatTemplate tmpl(slurp(tdir() / (name + ".jinja")),
                      ChatTemplateOptions{r["bos_token"], r["eos_token"], fixture_now()});
    for (const json& c : r["templates"][name]["cases"]) {
      if (c.contains("error")) continue;
      const json& conv = r["conversations"][c["conversation"].get<size_t>()];
      const auto t0 = std::chrono::steady_clock::now();
      std::string out;
      try {
        out = tmpl.apply(conv, c["add_generation_prompt"].get<bool>(), json::object(), small);
      } catch (const Error& e) {
        ADD_FAILURE() << name << ": " << e.what();
      }
      worst = std::max(worst, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      EXPECT_EQ(out, c["output"].get<std::string>()) << name;
    }
  }
  std::printf("[chat-template] slowest real render: %.3f ms\n", worst * 1e3);
}

// tests/fixtures/fuzz/chat_template/ holds inputs of the chat-template fuzzer (fuzz/fuzz_chat_template.h)
// that once crashed or ran away: 50,000-link flat chains (SIGSEGV before the parser bounded them) and the
// budget's attack classes (gigabytes or minutes before). Each is replayed through the fuzzer's own code and
// must be refused with ultra::Error, quickly.
TEST(FuzzRegression, ChatTemplate) {
  const fs::path dir = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "fuzz" / "chat_template";
  ASSERT_TRUE(fs::is_directory(dir)) << dir << " not found";
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string bytes = slurp(e.path());
    // The thread's CPU time, not the wall clock: a loaded machine (CI runs tests two at a time) must not fail
    // it; the sanitizers' 2-4x and the slowest CI CPUs' 4x are allowed for.
    const double t0 = thread_cpu_s();
    bool rendered = true;
    EXPECT_NO_THROW(rendered = ultra::fuzz::chat_template_one(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                              bytes.size()))
        << e.path();
    EXPECT_FALSE(rendered) << e.path();
    EXPECT_LT(thread_cpu_s() - t0, test::kSanitized ? 8.0 : 2.0) << e.path();
    ++n;
  }
  EXPECT_GE(n, 13);
}

TEST(ChatTemplate, HostileTemplatesFailCleanly) {
  EXPECT_THROW(R("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}"), Error);
  EXPECT_THROW(R("{{ " + std::string(20000, '[')), Error);
  std::string nested;
  for (int k = 0; k < 5000; ++k) nested += "{% if true %}";
  EXPECT_THROW(R(nested), Error);
  EXPECT_THROW(R("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), Error);
  EXPECT_THROW(R("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}"),
               Error);
  EXPECT_THROW(R("{{ 'x' * 1000000000 }}"), Error);
  EXPECT_THROW(R("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"), Error);
  EXPECT_THROW(R("{{ 9223372036854775807 + 1 }}"), Error);
  EXPECT_THROW(R("{{ '"), Error);
  EXPECT_THROW(R("{% for %}"), Error);

  // A list 100000 levels deep is built and freed (iteratively: a recursive destructor overflowed the stack
  // of a server thread); printing, comparing or serializing it is an error past kMaxNesting levels.
  const std::string deep =
      "{% set ns = namespace(x=[]) %}{% for i in range(10000) %}{% for j in range(10) %}{% set ns.x = [ns.x] "
      "%}"
      "{% endfor %}{% endfor %}";
  RenderBudget slow_ok;  // 10^5 loop iterations take longer than the default time budget on a loaded machine
  slow_ok.max_seconds = 30;
  EXPECT_EQ(RB(deep + "{{ ns.x | length }}", slow_ok), "1");
  for (const char* e : {"ns.x", "ns.x | tojson", "ns.x == ns.x", "ns.x in [ns.x]", "[ns.x, ns.x] | sort"})
    EXPECT_THROW(RB(deep + "{{ " + e + " }}", slow_ok), Error) << e;
  // A namespace that holds itself: an error to print, and its memory is freed (LeakSanitizer checks).
  EXPECT_THROW(R("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"), Error);
  EXPECT_EQ(R("{% set ns = namespace() %}{% set ns.me = [ns, {'x': ns}] %}{{ ns.me | length }}"), "2");
}

}  // namespace

namespace {

// The bundled models' play-script template (models/chat_template.jinja, stored in both GGUF files as
// tokenizer.chat_template by tools/gguf_set_metadata.py): renderings as jinja2 3.1.6 gives them in
// transformers' environment (trim_blocks, lstrip_blocks), a system stage direction, the default speakers,
// a message's own name, list content, and user_name / assistant_name as template variables.
TEST(ChatTemplate, BundledPlayScriptTemplate) {
  const std::string src = slurp(fs::path(ULTRA_SOURCE_DIR) / "models" / "chat_template.jinja");
  ASSERT_FALSE(src.empty());
  const ChatTemplate t(src);
  const json msgs = json::parse(R"([
    {"role": "system", "content": "A street in Verona. "},
    {"role": "user", "content": " Good morrow!"},
    {"role": "assistant", "content": "What, art thou here?"},
    {"role": "user", "name": "MERCUTIO",
     "content": [{"type": "text", "text": "Peace, "}, {"type": "image"}, {"type": "text", "text": "peace!"}]}])");
  EXPECT_EQ(
      t.apply(msgs, true),
      "A street in Verona.\n\nROMEO:\nGood morrow!\n\nJULIET:\nWhat, art thou here?\n\nMERCUTIO:\nPeace, "
      "peace!\n\nJULIET:\n");
  EXPECT_EQ(t.apply(json::array({msgs[0], msgs[1]}), false, {{"user_name", "First Citizen"}}),
            "A street in Verona.\n\nFirst Citizen:\nGood morrow!\n\n");
  EXPECT_EQ(t.apply(json::array({msgs[1]}), true, {{"assistant_name", "NURSE"}}),
            "ROMEO:\nGood morrow!\n\nNURSE:\n");
  // Each rendering with the generation prompt is a prefix of the next one with the reply (what lets `ultra
  // chat` keep its cache between turns).
  const std::string first = t.apply(json::array({msgs[1]}), true);
  EXPECT_EQ(t.apply(json::array({msgs[1], msgs[2]}), false).substr(0, first.size()), first);

  // Both bundled models carry it.
  for (const char* m : {"target.gguf", "draft.gguf"})
    EXPECT_EQ(Model::load((fs::path(ULTRA_SOURCE_DIR) / "models" / m).string()).chat_template(), src) << m;
}

}  // namespace

namespace {

// ---- built-in templates (--chat-template NAME) ----

const ChatTemplateOptions& fixture_options() {
  static const ChatTemplateOptions o{renderings()["bos_token"], renderings()["eos_token"], fixture_now()};
  return o;
}

// The built-in `name` rendering fixture conversation `conv`.
std::string render_builtin(const std::string& name, size_t conv, bool agp) {
  const BuiltinChatTemplate* b = find_builtin_chat_template(name);
  if (!b) throw Error("no built-in " + name);
  return ChatTemplate(std::string(b->source), fixture_options())
      .apply(renderings()["conversations"][conv], agp);
}

// renderings.json's output of real template `fixture` for conversation `conv` ("" when it raised).
std::string fixture_output(const std::string& fixture, size_t conv, bool agp) {
  for (const json& c : renderings()["templates"][fixture]["cases"])
    if (c["conversation"].get<size_t>() == conv && c["add_generation_prompt"].get<bool>() == agp)
      return c.value("output", "");
  ADD_FAILURE() << fixture << " has no case " << conv;
  return "";
}

// Each built-in renders conversation 2 of renderings.json (a system message, then user, assistant, user:
// three turns), with the generation prompt, as written here (bos_token <BOS>, eos_token <EOS>).
TEST(BuiltinChatTemplates, SystemAndThreeTurns) {
  const std::map<std::string, std::string> want = {
      {"chatml",
       "<|im_start|>system\nYou answer in one short sentence.<|im_end|>\n<|im_start|>user\nName a "
       "colour.<|im_end|>\n<|im_start|>assistant\nBlue.<|im_end|>\n<|im_start|>user\nAnother one, "
       "please.<|im_end|>\n<|im_start|>assistant\n"},
      {"llama2",
       "<BOS>[INST] <<SYS>>\nYou answer in one short sentence.\n<</SYS>>\n\nName a colour. [/INST] Blue. "
       "<EOS><BOS>[INST] Another one, please. [/INST]"},
      {"llama3",
       "<BOS><|start_header_id|>system<|end_header_id|>\n\nYou answer in one short "
       "sentence.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nName a "
       "colour.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nBlue.<|eot_id|><|start_header_id|>"
       "user<|end_header_id|>\n\nAnother one, please.<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
       "\n\n"},
      {"mistral-v3-tekken",
       "<BOS>[INST]Name a colour.[/INST]Blue.<EOS>[INST]You answer in one short sentence.\n\nAnother one, "
       "please.[/INST]"},
      {"mistral-v7",
       "<BOS>[SYSTEM_PROMPT] You answer in one short sentence.[/SYSTEM_PROMPT][INST] Name a colour.[/INST] "
       "Blue.<EOS>[INST] Another one, please.[/INST]"},
      {"mistral-v7-tekken",
       "<BOS>[SYSTEM_PROMPT]You answer in one short sentence.[/SYSTEM_PROMPT][INST]Name a "
       "colour.[/INST]Blue.<EOS>[INST]Another one, please.[/INST]"},
      {"phi3",
       "<|system|>\nYou answer in one short sentence.<|end|>\n<|user|>\nName a "
       "colour.<|end|>\n<|assistant|>\nBlue.<|end|>\n<|user|>\nAnother one, please.<|end|>\n<|assistant|>\n"},
      {"gemma",
       "<BOS><start_of_turn>user\nYou answer in one short sentence.\n\nName a "
       "colour.<end_of_turn>\n<start_of_turn>model\nBlue.<end_of_turn>\n<start_of_turn>user\nAnother one, "
       "please.<end_of_turn>\n<start_of_turn>model\n"},
      {"zephyr",
       "<|system|>\nYou answer in one short sentence.<EOS>\n<|user|>\nName a "
       "colour.<EOS>\n<|assistant|>\nBlue.<EOS>\n<|user|>\nAnother one, please.<EOS>\n<|assistant|>\n"},
      {"vicuna",
       "You answer in one short sentence.\n\nUSER: Name a colour.\nASSISTANT: Blue.<EOS>\nUSER: Another one, "
       "please.\nASSISTANT:"},
      {"deepseek",
       "<BOS>You answer in one short sentence.### Instruction:\nName a colour.\n### "
       "Response:\nBlue.\n<|EOT|>\n### Instruction:\nAnother one, please.\n### Response:\n"},
      {"deepseek3",
       "<BOS>You answer in one short sentence.<｜User｜>Name a "
       "colour.<｜Assistant｜>Blue.<｜end▁of▁sentence｜><｜User｜>Another one, please.<｜Assistant｜>"},
      {"command-r",
       "<BOS><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You answer in one short "
       "sentence.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Name a "
       "colour.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Blue.<|END_OF_TURN_TOKEN|><|"
       "START_"
       "OF_TURN_TOKEN|><|USER_TOKEN|>Another one, "
       "please.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
      {"granite",
       "<|start_of_role|>system<|end_of_role|>You answer in one short "
       "sentence.<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Name a "
       "colour.<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Blue.<|end_of_text|>\n<|start_of_"
       "role|>user<|end_of_role|>Another one, please.<|end_of_text|>\n<|start_of_role|>assistant<|end_of_"
       "role|>"},
      {"rwkv-world",
       "<BOS>System: You answer in one short sentence.\n\nUser: Name a colour.\n\nAssistant: Blue.\n\nUser: "
       "Another one, please.\n\nAssistant:"},
  };
  ASSERT_EQ(want.size(), builtin_chat_templates().size());
  for (const BuiltinChatTemplate& b : builtin_chat_templates()) {
    const std::string name(b.name);
    ASSERT_TRUE(want.count(name)) << name;
    EXPECT_EQ(render_builtin(name, 2, true), want.at(name)) << name;
    // Every built-in renders every fixture conversation, with and without the generation prompt.
    for (size_t c = 0; c < renderings()["conversations"].size(); ++c)
      for (bool agp : {false, true}) EXPECT_NO_THROW(render_builtin(name, c, agp)) << name << " " << c;
  }
}

// The built-ins against the real templates of tests/fixtures/templates (renderings.json: jinja2's output)
// where one is there: every case of the conversations listed. The real ones add things to conversations
// without a system message (Qwen2.5, Mistral Small, Granite: a default system message; Gemma 2 refuses a
// system message), so those conversations are left out where they differ.
TEST(BuiltinChatTemplates, RenderAsTheRealTemplates) {
  struct Case {
    const char* builtin;
    const char* fixture;
    std::vector<size_t> conversations;
  };
  const Case cases[] = {
      {"chatml", "Qwen-Qwen2.5-7B-Instruct", {1, 2}},
      {"phi3", "microsoft-Phi-3.5-mini-instruct", {0, 1, 2, 3}},
      {"gemma", "google-gemma-2-2b-it", {0, 3}},
      {"mistral-v3-tekken", "mistralai-Mistral-Nemo-Instruct-2407", {0, 1, 2, 3}},
      {"mistral-v7-tekken", "Mistral-Small-3.2-24B-Instruct-2506", {1, 2}},
      {"mistral-v7-tekken", "mistralai-Ministral-3-14B-Reasoning-2512", {1, 2}},
      {"granite", "ibm-granite-granite-3.3-2B-Instruct", {1, 2}},
      {"rwkv-world", "llama-cpp-rwkv-world", {0, 1, 2, 3}},
  };
  for (const Case& c : cases)
    for (size_t conv : c.conversations)
      for (bool agp : {false, true})
        EXPECT_EQ(render_builtin(c.builtin, conv, agp), fixture_output(c.fixture, conv, agp))
            << c.builtin << " vs " << c.fixture << " conversation " << conv << " agp " << agp;

  for (size_t conv = 0; conv < 4; ++conv) {
    // DeepSeek R1's template is V3's plus "<think>\n" after the generation prompt.
    EXPECT_EQ(render_builtin("deepseek3", conv, false),
              fixture_output("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", conv, false));
    EXPECT_EQ(render_builtin("deepseek3", conv, true) + "<think>\n",
              fixture_output("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", conv, true));
  }
  for (size_t conv : {1, 2})
    for (bool agp : {false, true}) {
      // Llama 3.1's template is Llama 3's plus a dated preamble in the system message.
      std::string l31 = fixture_output("meta-llama-Llama-3.1-8B-Instruct", conv, agp);
      const std::string preamble = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
      ASSERT_NE(l31.find(preamble), std::string::npos);
      l31.erase(l31.find(preamble), preamble.size());
      EXPECT_EQ(render_builtin("llama3", conv, agp), l31) << conv << " " << agp;
    }
  // Command R+'s tool-use template writes the same turns after its long system preamble.
  const std::string turns =
      "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Name a colour.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|"
      "CHATBOT_TOKEN|>Blue.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another one, "
      "please.<|END_OF_TURN_TOKEN|>";
  EXPECT_NE(render_builtin("command-r", 2, false).find(turns), std::string::npos);
  EXPECT_NE(fixture_output("CohereForAI-c4ai-command-r-plus-tool_use", 2, false).find(turns),
            std::string::npos);
}

// --chat-template's value: a file, else a built-in's name, else an error that lists the names.
TEST(BuiltinChatTemplates, ChatTemplateArgument) {
  std::string label;
  EXPECT_EQ(cli::chat_template_from_arg("llama3", &label), find_builtin_chat_template("llama3")->source);
  EXPECT_EQ(label, "the built-in 'llama3'");
  const fs::path file = fs::temp_directory_path() / fmt::format("ultra_tmpl_{}.jinja", getpid());
  std::ofstream(file) << "{{ messages | length }}";
  EXPECT_EQ(cli::chat_template_from_arg(file.string(), &label), "{{ messages | length }}");
  EXPECT_EQ(label, file.string());
  fs::remove(file);
  for (const char* bad : {"chatml2", "ChatML", "", "/no/such/dir/t.jinja"}) {
    try {
      cli::chat_template_from_arg(bad);
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(
          msg.find(fmt::format("--chat-template '{}': no such file, and not the name of a built-in", bad)),
          std::string::npos)
          << msg;
      EXPECT_NE(msg.find(builtin_chat_template_names()), std::string::npos) << msg;
    }
  }
  // A directory is a path, refused as a file.
  EXPECT_THROW(cli::chat_template_from_arg(fs::temp_directory_path().string()), Error);
  EXPECT_NE(cli::chat_template_help().find("chatml, llama2, llama3"), std::string::npos);
}

}  // namespace
