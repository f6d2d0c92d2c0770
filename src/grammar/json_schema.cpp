#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "grammar/gbnf_emit.h"
#include "grammar/gbnf_parser.h"
#include "grammar/grammar_matcher.h"
#include "grammar/numeric_range_gbnf.h"
#include "grammar/regex_to_gbnf.h"
#include "tokenizer/utf8.h"

namespace ultra::grammar {

namespace json_schema_impl {

constexpr uint64_t kMaxCount = 2000;  // the GBNF parser's repetition limit
constexpr size_t kMaxCrossProduct = 64;
// Schemas visited and allOf parts merged in one compilation: distributing siblings into anyOf alternatives
// and allOf cross products can multiply the work; past this the schema is refused, never a hang.
constexpr size_t kMaxWork = 20000;
constexpr size_t kMaxGrammarBytes = size_t{16} << 20;

// Keywords that constrain values and are not implemented: refused, never ignored.
const std::set<std::string> kRefused = {"multipleOf",  "propertyNames", "not",          "if",
                                        "then",        "else",          "contains",     "minContains",
                                        "maxContains", "$dynamicRef",   "$recursiveRef"};

// Keywords that constrain and are implemented (everything else is an annotation or unknown: ignored).
const std::set<std::string> kConstraining = {"type",
                                             "properties",
                                             "patternProperties",
                                             "required",
                                             "dependencies",
                                             "dependentRequired",
                                             "dependentSchemas",
                                             "additionalProperties",
                                             "unevaluatedProperties",
                                             "minProperties",
                                             "maxProperties",
                                             "items",
                                             "prefixItems",
                                             "additionalItems",
                                             "minItems",
                                             "maxItems",
                                             "uniqueItems",
                                             "unevaluatedItems",
                                             "minLength",
                                             "maxLength",
                                             "pattern",
                                             "format",
                                             "minimum",
                                             "maximum",
                                             "exclusiveMinimum",
                                             "exclusiveMaximum",
                                             "enum",
                                             "const",
                                             "anyOf",
                                             "oneOf",
                                             "allOf",
                                             "$ref"};

const std::set<std::string> kObjectKeys = {
    "properties",           "patternProperties",     "required",
    "dependencies",         "dependentRequired",     "dependentSchemas",
    "additionalProperties", "unevaluatedProperties", "minProperties",
    "maxProperties"};
const std::set<std::string> kArrayKeys = {"items",    "prefixItems", "additionalItems", "minItems",
                                          "maxItems", "uniqueItems", "unevaluatedItems"};
const std::set<std::string> kStringKeys = {"minLength", "maxLength", "pattern", "format"};
const std::set<std::string> kNumberKeys = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

const char* const kPrimitiveNames[] = {
    "root",         "space",     "value",   "object", "array",      "string",
    "number",       "integer",   "boolean", "null",   "char",       "integral-part",
    "decimal-part", "key-char",  "hex",     "date",   "time",       "date-time",
    "uuid",         "email",     "uri",     "d28",    "d30",        "d31",
    "year",         "leap-year", "hh",      "mm",     "email-atom", "email-label",
    "uri-char",     "octet",     "h16"};  // and the formats (kFormats), below

const std::set<std::string> kFormats = {"date",     "time",  "date-time",    "uuid",
                                        "email",    "uri",   "ipv4",         "ipv6",
                                        "hostname", "regex", "json-pointer", "relative-json-pointer"};

std::string pointer_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string at(const std::string& path) {
  return path.empty() ? std::string("/") : path;
}

std::string sanitize(const std::string& hint) {
  std::string out;
  for (const char c : hint) {
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (word) {
      out += c;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
    if (out.size() >= 48) break;
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? std::string("r") : out;
}

// The compiler works on ordered_json only (one instantiation of its nlohmann calls, the bulk of this file's
// build time). A nlohmann::json schema arrives converted (its objects then iterate in sorted key order), and
// with sorted_keys every object the compiler builds (merged allOf parts, oneOf exclusions) is put back in
// sorted key order, as nlohmann::json's std::map objects would be: the same iteration order, comparisons
// and dumps, hence the same grammar, as compiling the nlohmann::json itself.
using J = nlohmann::ordered_json;

class Compiler {
 public:
  Compiler(const J& root, const JsonSchemaOptions& opt, bool sorted_keys)
      : root_(root), opt_(opt), sorted_keys_(sorted_keys) {
    for (const char* p : kPrimitiveNames) used_.insert(p);
    for (const std::string& f : kFormats) used_.insert({f, f + "-string"});
  }

  std::string run() {
    const std::string root_expr = visit(root_, "", "root");
    std::string out = "root ::= " + root_expr + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

 private:
  const J& root_;
  JsonSchemaOptions opt_;
  bool sorted_keys_;                                        // the schema was a nlohmann::json (see above)
  std::vector<std::pair<std::string, std::string>> rules_;  // name, body; in creation order
  std::unordered_map<std::string, size_t> rule_at_;         // name -> index in rules_
  std::unordered_set<std::string> used_;                    // every rule name taken
  std::unordered_map<std::string, std::string> ref_rules_;  // $ref -> rule name
  std::vector<std::string> used_log_;                       // used_'s names in insertion order
  std::vector<std::string> ref_log_;                        // ref_rules_'s keys in insertion order
  int depth_ = 0;
  size_t work_ = 0;        // see kMaxWork
  size_t rule_bytes_ = 0;  // text of the rules so far

  void count_work(const std::string& path) {
    if (++work_ > kMaxWork) bad(fmt::format("schema too complex (more than {} expansions)", kMaxWork), path);
  }

  struct DepthGuard {
    int& d;
    ~DepthGuard() { --d; }
  };

  // ---- rules ----

  std::string new_name(const std::string& hint) {
    const std::string base = sanitize(hint);
    std::string name = base;
    for (int i = 1; used_.count(name); ++i) name = fmt::format("{}-{}", base, i);
    use_name(name);
    return name;
  }

  void use_name(const std::string& name) {
    used_.insert(name);
    used_log_.push_back(name);
  }

  // What an alternative that fails to compile has added, to take it back (rollback()).
  struct Mark {
    size_t n_rules, n_used, n_refs, rule_bytes;
  };
  Mark mark() const { return {rules_.size(), used_log_.size(), ref_log_.size(), rule_bytes_}; }
  void rollback(const Mark& m) {
    while (rules_.size() > m.n_rules) {
      rule_at_.erase(rules_.back().first);
      rules_.pop_back();
    }
    while (used_log_.size() > m.n_used) {
      used_.erase(used_log_.back());
      used_log_.pop_back();
    }
    while (ref_log_.size() > m.n_refs) {
      ref_rules_.erase(ref_log_.back());
      ref_log_.pop_back();
    }
    rule_bytes_ = m.rule_bytes;
  }

  void set_rule(const std::string& name, std::string body) {
    rule_bytes_ += name.size() + body.size();
    if (rule_bytes_ > kMaxGrammarBytes)
      fail("json schema: the grammar would exceed {} bytes", kMaxGrammarBytes);
    rule_at_[name] = rules_.size();
    rules_.emplace_back(name, std::move(body));
  }

  std::string add_rule(const std::string& hint, std::string body) {
    const std::string name = new_name(hint);
    set_rule(name, std::move(body));
    return name;
  }

  // A built-in rule (and those it uses), added on first use.
  std::string prim(const std::string& name) {
    if (rule_at_.count(name)) return name;
    std::string body;
    prim_space();
    const std::string sp = " space";
    if (name == "space") {
      return prim_space();
    } else if (name == "value" || name == "object" || name == "array") {
      // Mutually recursive: the three rules are written first, then what they use.
      set_rule("value", "object | array | string | number | boolean | null");
      const std::string kv = "string \":\"" + sp + " value";
      set_rule("object", "\"{\"" + sp + " (" + kv + " (\",\"" + sp + " " + kv + ")*)? \"}\"" + sp);
      set_rule("array", "\"[\"" + sp + " (value (\",\"" + sp + " value)*)? \"]\"" + sp);
      for (const char* dep : {"string", "number", "boolean", "null"}) prim(dep);
      return name;
    } else if (name == "string") {
      body = "\"\\\"\" " + prim("char") + "* \"\\\"\"" + sp;
    } else if (name == "char") {
      body =
          "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | "
          "[dD] [0-7] [0-9a-fA-F]{2}))";
    } else if (name == "key-char") {
      body = "[^\"\\\\\\x00-\\x1F]";
    } else if (name == "integral-part") {
      body = "[0] | [1-9] [0-9]{0,15}";
    } else if (name == "decimal-part") {
      body = "[0-9]{1,16}";
    } else if (name == "number") {
      body = "\"-\"? " + prim("integral-part") + " (\".\" " + prim("decimal-part") +
             ")? ([eE] [-+]? [0-9]{1,2})?" + sp;
    } else if (name == "integer") {
      body = "\"-\"? " + prim("integral-part") + sp;
    } else if (name == "boolean") {
      body = "(\"true\" | \"false\")" + sp;
    } else if (name == "null") {
      body = "\"null\"" + sp;
    } else if (name == "hex") {
      body = "[0-9a-fA-F]";
    } else if (name == "year") {
      body = "\"000\" [1-9] | \"00\" [1-9] [0-9] | \"0\" [1-9] [0-9]{2} | [1-9] [0-9]{3}";
    } else if (name == "leap-year") {
      body =
          "[0-9]{2} (\"0\" [48] | [2468] [048] | [13579] [26]) | (\"0\" [48] | [2468] [048] | [13579] [26]) "
          "\"00\"";
    } else if (name == "d28") {
      body = "\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]";
    } else if (name == "d30") {
      body = prim("d28") + " | \"29\" | \"30\"";
    } else if (name == "d31") {
      body = prim("d30") + " | \"31\"";
    } else if (name == "date") {
      body = prim("year") + " \"-\" ((\"01\" | \"03\" | \"05\" | \"07\" | \"08\" | \"10\" | \"12\") \"-\" " +
             prim("d31") + " | (\"04\" | \"06\" | \"09\" | \"11\") \"-\" " + prim("d30") + " | \"02-\" " +
             prim("d28") + ") | " + prim("leap-year") + " \"-02-29\"";
    } else if (name == "hh") {
      body = "[01] [0-9] | \"2\" [0-3]";
    } else if (name == "mm") {
      body = "[0-5] [0-9]";
    } else if (name == "time") {
      body = prim("hh") + " \":\" " + prim("mm") + " \":\" mm (\".\" [0-9]{1,6})? (\"Z\" | [+-] hh \":\" mm)";
    } else if (name == "date-time") {
      body = prim("date") + " \"T\" " + prim("time");
    } else if (name == "uuid") {
      prim("hex");
      body = "hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}";
    } else if (name == "email-atom") {
      body = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~\\-]{1,32}";
    } else if (name == "email-label") {
      body = "[A-Za-z0-9] ([A-Za-z0-9\\-]{0,30} [A-Za-z0-9])?";
    } else if (name == "email") {
      body = prim("email-atom") + " (\".\" email-atom){0,3} \"@\" " + prim("email-label") +
             " (\".\" email-label){1,3}";
    } else if (name == "octet") {
      body = "\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]";
    } else if (name == "ipv4") {
      body = prim("octet") + " \".\" octet \".\" octet \".\" octet";
    } else if (name == "h16") {
      body = "[0-9a-f]{1,4}";
    } else if (name == "ipv6") {
      body = prim("h16") + " (\":\" h16){7}";
    } else if (name == "hostname") {
      body = prim("email-label") + " (\".\" email-label){0,3}";
    } else if (name == "regex") {  // literal characters only: always a valid regular expression
      body = "[A-Za-z0-9 _\\-]{0,64}";
    } else if (name == "json-pointer") {  // RFC 6901: "/"-separated tokens, ~0 and ~1 escapes
      body = "(\"/\" ([A-Za-z0-9_.:@$+\\- ] | \"~\" [01]){0,32}){0,8}";
    } else if (name == "relative-json-pointer") {
      body = "(\"0\" | [1-9] [0-9]{0,3}) (\"#\" | " + prim("json-pointer") + ")";
    } else if (name == "uri-char") {
      prim("hex");
      body = "[A-Za-z0-9\\-._~:/?#@!$&'()*+,;=] | \"%\" hex hex";
    } else if (name == "uri") {
      body = "[a-zA-Z] [a-zA-Z0-9+.\\-]{0,15} \":\" \"//\"? " + prim("uri-char") + "{1,200}";
    } else {
      fail("json schema: internal error: no built-in rule '{}'", name);
    }
    set_rule(name, body);
    return name;
  }

  std::string prim_space() {
    if (!rule_at_.count("space")) {
      set_rule("space", opt_.whitespace ? fmt::format("(\" \" | \"\\n\" [ \\t]{{0,{}}})?",
                                                      std::min<uint32_t>(opt_.max_indent, 2000))
                                        : std::string("\"\""));
    }
    return "space";
  }

  std::string sp() {  // " space", the rule added on first use
    prim_space();
    return std::string(" space");
  }

  // ---- errors and small readers ----

  [[noreturn]] static void refuse_keyword(const std::string& key, const std::string& path) {
    fail("json schema: unsupported keyword '{}' at {}", key, path + "/" + pointer_escape(key));
  }

  [[noreturn]] static void bad(const std::string& what, const std::string& path) {
    fail("json schema: {} at {}", what, at(path));
  }

  static std::optional<uint64_t> count_of(const J& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    const J& v = s[key];
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return (uint64_t)v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (d >= 0 && d == std::floor(d)) return d > 1e18 ? (uint64_t)1e18 : (uint64_t)d;
    }
    bad(fmt::format("'{}' must be a non-negative integer", key), path + "/" + key);
  }

  static bool has_constraints(const J& s, const std::set<std::string>& except = {}) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      if ((kConstraining.count(it.key()) || kRefused.count(it.key())) && !except.count(it.key())) return true;
    }
    return false;
  }

  // Refuses the keywords we do not implement.
  static void check_keywords(const J& s, const std::string& path) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (kRefused.count(k)) refuse_keyword(k, path);
      if (k == "uniqueItems" && !it->is_boolean())
        bad("'uniqueItems' must be a boolean", path + "/uniqueItems");
      if (k == "unevaluatedItems" && !(it->is_boolean() && it->get<bool>())) refuse_keyword(k, path);
      if (k == "unevaluatedProperties" && !it->is_boolean()) refuse_keyword(k, path);
    }
  }

  // ---- $ref ----

  static std::string percent_decode(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '%' && i + 2 < s.size() && std::isxdigit((unsigned char)s[i + 1]) &&
          std::isxdigit((unsigned char)s[i + 2])) {
        out += (char)std::stoi(s.substr(i + 1, 2), nullptr, 16);
        i += 2;
      } else {
        out += s[i];
      }
    }
    return out;
  }

  // The JSON pointer (decoded, "" for the root) that a local $ref names.
  std::string ref_pointer(const J& ref, const std::string& path) const {
    if (!ref.is_string()) bad("'$ref' must be a string", path + "/$ref");
    const std::string r = ref.get<std::string>();
    const size_t hash = r.find('#');
    const std::string base = r.substr(0, hash);
    if (!base.empty()) {
      const bool self =
          root_.is_object() && root_.contains("$id") && root_["$id"].is_string() &&
          root_["$id"].get<std::string>().substr(0, root_["$id"].get<std::string>().find('#')) == base;
      if (!self) fail("json schema: remote $ref '{}' is not supported at {}", r, path + "/$ref");
    }
    const std::string frag = hash == std::string::npos ? "" : percent_decode(r.substr(hash + 1));
    if (!frag.empty() && frag[0] != '/') {
      fail("json schema: $ref to an anchor ('{}') is not supported at {}", r, path + "/$ref");
    }
    return frag;
  }

  const J& resolve(const std::string& pointer, const std::string& path) const {
    const J* cur = &root_;
    size_t pos = 1;
    while (pos <= pointer.size() && !pointer.empty()) {
      size_t next = pointer.find('/', pos);
      if (next == std::string::npos) next = pointer.size();
      std::string tok = pointer.substr(pos, next - pos);
      std::string unesc;
      for (size_t i = 0; i < tok.size(); ++i) {
        if (tok[i] == '~' && i + 1 < tok.size() && (tok[i + 1] == '0' || tok[i + 1] == '1')) {
          unesc += tok[i + 1] == '0' ? '~' : '/';
          ++i;
        } else {
          unesc += tok[i];
        }
      }
      if (cur->is_object() && cur->contains(unesc)) {
        cur = &(*cur)[unesc];
      } else if (cur->is_array() && !unesc.empty() &&
                 unesc.find_first_not_of("0123456789") == std::string::npos && unesc.size() < 9 &&
                 std::stoul(unesc) < cur->size()) {
        cur = &(*cur)[std::stoul(unesc)];
      } else {
        fail("json schema: $ref target '#{}' not found at {}", pointer, path + "/$ref");
      }
      pos = next + 1;
    }
    return *cur;
  }

  std::string ref_rule(const J& s, const std::string& path) {
    const std::string pointer = ref_pointer(s["$ref"], path);
    auto it = ref_rules_.find(pointer);
    if (it != ref_rules_.end()) return it->second;
    const J& target = resolve(pointer, path);
    const size_t slash = pointer.rfind('/');
    const std::string name =
        new_name(slash == std::string::npos ? std::string("root") : pointer.substr(slash + 1));
    ref_rules_[pointer] = name;
    ref_log_.push_back(pointer);
    const std::string body = visit(target, pointer, name + "-def");
    set_rule(name, body);
    return name;
  }

  // ---- allOf: merging ----

  // The parts of an allOf (and the schema's own keywords), with $refs replaced by their targets and
  // nested allOfs flattened.
  void flatten(const J& s, const std::string& path, std::vector<std::pair<J, std::string>>& out) {
    if (++depth_ > opt_.max_depth) bad(fmt::format("schema nested deeper than {}", opt_.max_depth), path);
    DepthGuard guard{depth_};
    count_work(path);
    if (s.is_boolean()) {
      if (!s.get<bool>()) bad("allOf with a 'false' schema (no value matches)", path);
      return;
    }
    if (!s.is_object()) bad("a schema must be an object or a boolean", path);
    check_keywords(s, path);
    J rest = s;
    rest.erase("allOf");
    rest.erase("$ref");
    if (s.contains("$ref")) {
      const std::string pointer = ref_pointer(s["$ref"], path);
      flatten(resolve(pointer, path), pointer, out);
    }
    if (s.contains("allOf")) {
      const J& parts = s["allOf"];
      if (!parts.is_array() || parts.empty()) bad("'allOf' must be a non-empty array", path + "/allOf");
      for (size_t i = 0; i < parts.size(); ++i) flatten(parts[i], fmt::format("{}/allOf/{}", path, i), out);
    }
    out.emplace_back(std::move(rest), path);
  }

  static std::set<std::string> type_set(const J& t, const std::string& path) {
    std::set<std::string> out;
    auto add = [&](const J& v) {
      static const std::set<std::string> known = {"null",   "boolean", "object", "array",
                                                  "string", "number",  "integer"};
      if (!v.is_string() || !known.count(v.get<std::string>())) bad("unknown 'type'", path + "/type");
      out.insert(v.get<std::string>());
    };
    if (t.is_array()) {
      for (const J& v : t) add(v);
    } else {
      add(t);
    }
    return out;
  }

  static J merge_two(J a, const J& b, const std::string& path) {
    for (auto it = b.begin(); it != b.end(); ++it) {
      const std::string& k = it.key();
      const J& vb = *it;
      if (!a.contains(k)) {
        a[k] = vb;
        continue;
      }
      J& va = a[k];
      if (va == vb) continue;
      if (k == "type") {
        const std::set<std::string> ta = type_set(va, path), tb = type_set(vb, path);
        J both = J::array();
        for (const std::string& t : ta) {
          if (tb.count(t)) {
            both.push_back(t);
          } else if (t == "number" && tb.count("integer")) {
            both.push_back("integer");
          } else if (t == "integer" && tb.count("number")) {
            both.push_back("integer");
          }
        }
        if (both.empty()) bad("allOf: the parts have no 'type' in common", path);
        va = both;
      } else if (k == "properties") {
        if (!va.is_object() || !vb.is_object()) bad("'properties' must be an object", path);
        for (auto p = vb.begin(); p != vb.end(); ++p) {
          if (va.contains(p.key()) && (p->is_boolean() || va[p.key()].is_boolean())) {
            // true is no constraint, false admits nothing
            const bool b_false = p->is_boolean() && !p->get<bool>();
            const bool a_false = va[p.key()].is_boolean() && !va[p.key()].get<bool>();
            if (b_false || a_false) {
              va[p.key()] = false;
            } else if (va[p.key()].is_boolean()) {
              va[p.key()] = *p;
            }
          } else if (va.contains(p.key())) {
            J both = J::object();
            both["allOf"] = J::array({va[p.key()], *p});
            va[p.key()] = both;
          } else {
            va[p.key()] = *p;
          }
        }
      } else if (k == "required") {
        if (!va.is_array() || !vb.is_array()) bad("'required' must be an array", path);
        for (const J& n : vb) {
          if (std::find(va.begin(), va.end(), n) == va.end()) va.push_back(n);
        }
      } else if (k == "enum") {
        if (!va.is_array() || !vb.is_array()) bad("'enum' must be an array", path);
        J both = J::array();
        for (const J& v : va) {
          if (std::find(vb.begin(), vb.end(), v) != vb.end()) both.push_back(v);
        }
        va = both;
      } else if (k == "minimum" || k == "exclusiveMinimum" || k == "minLength" || k == "minItems") {
        if (!va.is_number() || !vb.is_number()) bad(fmt::format("allOf: cannot merge '{}'", k), path);
        if (vb > va) va = vb;
      } else if (k == "maximum" || k == "exclusiveMaximum" || k == "maxLength" || k == "maxItems") {
        if (!va.is_number() || !vb.is_number()) bad(fmt::format("allOf: cannot merge '{}'", k), path);
        if (vb < va) va = vb;
      } else if (k == "items" && !va.is_array() && !vb.is_array()) {
        J both = J::object();
        both["allOf"] = J::array({va, vb});
        va = both;
      } else if (k == "additionalProperties") {
        if (va.is_boolean() && !va.get<bool>()) continue;
        if (vb.is_boolean() && !vb.get<bool>()) {
          va = false;
        } else if (va.is_boolean()) {
          va = vb;
        } else if (!vb.is_boolean()) {
          J both = J::object();
          both["allOf"] = J::array({va, vb});
          va = both;
        }
      } else if (k == "anyOf" || k == "oneOf") {
        if (!va.is_array() || !vb.is_array()) bad(fmt::format("'{}' must be an array", k), path);
        if (va.size() * vb.size() > kMaxCrossProduct) {
          bad(fmt::format("allOf: more than {} combinations of '{}' alternatives", kMaxCrossProduct, k),
              path);
        }
        J alts = J::array();
        for (const J& x : va) {
          for (const J& y : vb) {
            J both = J::object();
            both["allOf"] = J::array({x, y});
            alts.push_back(both);
          }
        }
        va = alts;
      } else if (!kConstraining.count(k)) {
        continue;  // annotations: the first one stays
      } else {
        bad(fmt::format("allOf: cannot merge two different '{}'", k), path);
      }
    }
    return a;
  }

  // `x` with its objects (at every depth) in the key order the schema's own json type iterates them in.
  J keyed(J x) const { return sorted_keys_ ? J(nlohmann::json(x)) : x; }

  J merge_all(const J& s, const std::string& path) {
    std::vector<std::pair<J, std::string>> parts;
    flatten(s, path, parts);
    // A part with additionalProperties false admits only its own properties, whatever the others list.
    std::optional<std::set<std::string>> allowed;
    J merged = J::object();
    for (const auto& [part, part_path] : parts) {
      if (part.contains("additionalProperties") && part["additionalProperties"].is_boolean() &&
          !part["additionalProperties"].get<bool>()) {
        std::set<std::string> own;
        if (part.contains("properties") && part["properties"].is_object()) {
          for (auto it = part["properties"].begin(); it != part["properties"].end(); ++it)
            own.insert(it.key());
        }
        if (allowed) {
          std::set<std::string> both;
          for (const std::string& n : own) {
            if (allowed->count(n)) both.insert(n);
          }
          own = both;
        }
        allowed = own;
      }
      merged = keyed(merge_two(std::move(merged), part, path));
    }
    if (allowed && merged.contains("properties") && merged["properties"].is_object()) {
      J kept = J::object();
      for (auto it = merged["properties"].begin(); it != merged["properties"].end(); ++it) {
        if (allowed->count(it.key())) kept[it.key()] = *it;
      }
      merged["properties"] = keyed(std::move(kept));
    }
    if (allowed && merged.contains("required") && merged["required"].is_array()) {
      for (const J& n : merged["required"]) {
        if (n.is_string() && !allowed->count(n.get<std::string>())) {
          bad(fmt::format("allOf: required property '{}' is excluded by a part's additionalProperties false",
                          n.get<std::string>()),
              path);
        }
      }
    }
    return merged;
  }

  // ---- visiting ----

  std::string any_value() { return prim("value"); }

  // A GBNF expression (a rule name or a parenthesized expression) for the values `s` admits.
  std::string visit(const J& s, const std::string& path, const std::string& hint) {
    if (++depth_ > opt_.max_depth) bad(fmt::format("schema nested deeper than {}", opt_.max_depth), path);
    DepthGuard guard{depth_};
    count_work(path);
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value();
      bad("schema 'false' (no value matches)", path);
    }
    if (!s.is_object()) bad("a schema must be an object or a boolean", path);
    check_keywords(s, path);

    if (s.contains("$ref") && !has_constraints(s, {"$ref"})) return ref_rule(s, path);
    if (s.contains("$ref") || s.contains("allOf")) return visit_merged(merge_all(s, path), path, hint);
    if (s.contains("anyOf") || s.contains("oneOf")) return visit_alternatives(s, path, hint);
    if (s.contains("enum") || s.contains("const")) return visit_enum(s, path, hint);

    std::set<std::string> types;
    if (s.contains("type")) {
      types = type_set(s["type"], path);
    } else {
      for (auto it = s.begin(); it != s.end(); ++it) {
        if (kObjectKeys.count(it.key())) types.insert("object");
        if (kArrayKeys.count(it.key())) types.insert("array");
        if (kStringKeys.count(it.key())) types.insert("string");
        if (kNumberKeys.count(it.key())) types.insert("number");
      }
      if (types.empty()) return any_value();
    }
    if (types.count("integer") && types.count("number")) types.erase("integer");
    std::vector<std::string> alts;
    for (const std::string& t : types)
      alts.push_back(visit_type(s, t, path, types.size() > 1 ? hint + "-" + t : hint));
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out + ")";
  }

  // A schema produced by merging (not part of the document): visited with the path of its origin.
  std::string visit_merged(const J& merged, const std::string& path, const std::string& hint) {
    return visit(merged, path, hint);
  }

  std::string visit_alternatives(const J& s, const std::string& path, const std::string& hint) {
    if (s.contains("anyOf") && s.contains("oneOf")) {
      J both = J::object();
      both["allOf"] = J::array();
      J a = J::object(), b = J::object();
      a["anyOf"] = s["anyOf"];
      b["oneOf"] = s["oneOf"];
      J rest = s;
      rest.erase("anyOf");
      rest.erase("oneOf");
      both["allOf"] = J::array({rest, a, b});
      return visit(merge_all(both, path), path, hint);
    }
    const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
    const J& alts = s[key];
    if (!alts.is_array() || alts.empty())
      bad(fmt::format("'{}' must be a non-empty array", key), path + "/" + key);
    J rest = s;
    rest.erase(key);
    const bool siblings = has_constraints(rest);
    const std::vector<J> exclusions =
        key == std::string("oneOf") ? one_of_exclusions(alts, rest) : std::vector<J>();
    // An alternative that cannot be compiled (unsatisfiable after merging, or using a keyword we refuse) is
    // left out: the others still produce valid values. With none left, the first one's error is reported.
    std::vector<std::string> exprs;
    std::optional<Error> first_error;
    for (size_t i = 0; i < alts.size(); ++i) {
      const std::string alt_path = fmt::format("{}/{}/{}", path, key, i);
      if (alts[i].is_boolean() && !alts[i].get<bool>()) continue;  // matches nothing: no alternative
      const bool exclude = !exclusions.empty() && !exclusions[i].empty();
      if (exclude && exclusions[i].is_boolean()) continue;  // would match another alternative too
      const Mark m = mark();
      try {
        if (!siblings && !exclude) {
          exprs.push_back(visit(alts[i], alt_path, fmt::format("{}-{}", hint, i)));
          continue;
        }
        J both = J::object();
        both["allOf"] = J::array({rest, alts[i]});
        if (exclude) both["allOf"].push_back(exclusions[i]);
        exprs.push_back(visit(merge_all(both, alt_path), alt_path, fmt::format("{}-{}", hint, i)));
      } catch (const Error& e) {
        if (work_ > kMaxWork || rule_bytes_ > kMaxGrammarBytes) throw;
        rollback(m);
        if (!first_error) first_error = e;
      }
    }
    if (exprs.empty() && first_error) throw *first_error;
    if (exprs.empty()) bad(fmt::format("'{}' has no satisfiable alternative", key), path);
    if (exprs.size() == 1) return exprs[0];
    std::string out = "(";
    for (size_t i = 0; i < exprs.size(); ++i) out += (i ? " | " : "") + exprs[i];
    return out + ")";
  }

  // oneOf alternatives told apart by `required` (a common idiom: oneOf [{"required": ["a"]},
  // {"required": ["b"]}]): for alternative i, a schema that keeps out, for every other alternative j, one
  // name that j requires and i does not ({"properties": {name: false}}), so that i's objects do not also
  // match j, or, when a property has disjoint const / enum values in i and j (a tagged union), requires it
  // in i; `false` when some j with only `required` asks for nothing beyond i's (i's objects always match
  // j: i is left out); {} when nothing is needed. Alternatives not told apart these ways (by type, or
  // overlapping optional properties) are not made exclusive.
  std::vector<J> one_of_exclusions(const J& alts, const J& rest) const {
    auto required_of = [](const J& a) {
      std::set<std::string> out;
      if (a.is_object() && a.contains("required") && a["required"].is_array()) {
        for (const J& n : a["required"]) {
          if (n.is_string()) out.insert(n.get<std::string>());
        }
      }
      return out;
    };
    std::vector<std::set<std::string>> req(alts.size());
    std::vector<bool> only_required(alts.size(), false);
    std::vector<std::map<std::string, J>> tags(alts.size());  // property -> its const / enum values
    for (size_t i = 0; i < alts.size(); ++i) {
      const J* a = &alts[i];
      try {
        if (a->is_object() && a->contains("$ref") && !has_constraints(*a, {"$ref"})) {
          a = &resolve(ref_pointer((*a)["$ref"], ""), "");
        }
      } catch (const Error&) {
        continue;  // reported when the alternative is compiled
      }
      req[i] = required_of(*a);
      only_required[i] = a->is_object() && !req[i].empty() && !has_constraints(*a, {"required"});
      if (a->is_object() && a->contains("properties") && (*a)["properties"].is_object()) {
        for (auto p = (*a)["properties"].begin(); p != (*a)["properties"].end(); ++p) {
          if (!p->is_object()) continue;
          if (p->contains("const")) {
            tags[i][p.key()] = J::array({(*p)["const"]});
          } else if (p->contains("enum") && (*p)["enum"].is_array()) {
            tags[i][p.key()] = (*p)["enum"];
          }
        }
      }
    }
    // A property whose const / enum values in i and j are disjoint tells them apart once i requires it.
    auto tag_apart = [&](size_t i, size_t j) -> std::string {
      for (const auto& [name, vi] : tags[i]) {
        auto it = tags[j].find(name);
        if (it == tags[j].end()) continue;
        bool disjoint = true;
        for (const J& v : vi)
          disjoint = disjoint && std::find(it->second.begin(), it->second.end(), v) == it->second.end();
        if (disjoint) return name;
      }
      return "";
    };
    const std::set<std::string> sib = required_of(rest);
    std::vector<J> out(alts.size(), J::object());
    for (size_t i = 0; i < alts.size(); ++i) {
      for (size_t j = 0; j < alts.size(); ++j) {
        if (j == i) continue;
        if (const std::string tag = tag_apart(i, j); !tag.empty()) {
          if (!out[i].contains("required")) out[i]["required"] = J::array();
          out[i]["required"].push_back(tag);
          continue;
        }
        if (req[j].empty()) continue;
        std::string pick;
        for (const std::string& n : req[j]) {
          if (!req[i].count(n) && !sib.count(n)) {
            pick = n;
            break;
          }
        }
        if (pick.empty()) {
          if (only_required[j]) {
            out[i] = false;
            break;
          }
          continue;
        }
        out[i]["properties"][pick] = false;
      }
      out[i] = keyed(std::move(out[i]));
    }
    return out;
  }

  static bool value_has_type(const J& v, const std::string& t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") {
      return v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()));
    }
    return false;
  }

  std::string visit_enum(const J& s, const std::string& path, const std::string& hint) {
    J values = J::array();
    if (s.contains("const")) values.push_back(s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array()) bad("'enum' must be an array", path + "/enum");
      J kept = J::array();
      for (const J& v : s["enum"]) {
        if (!s.contains("const") || v == s["const"]) kept.push_back(v);
      }
      values = kept;
    }
    std::optional<std::set<std::string>> types;
    if (s.contains("type")) types = type_set(s["type"], path);
    const std::optional<uint64_t> min_len = count_of(s, "minLength", path),
                                  max_len = count_of(s, "maxLength", path);
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (kConstraining.count(k) && k != "enum" && k != "const" && k != "type" && k != "minLength" &&
          k != "maxLength") {
        fail("json schema: '{}' beside 'enum' / 'const' is not supported at {}", k,
             path + "/" + pointer_escape(k));
      }
    }
    std::vector<std::string> alts;
    for (const J& v : values) {
      if (types) {
        bool ok = false;
        for (const std::string& t : *types) ok = ok || value_has_type(v, t);
        if (!ok) continue;
      }
      if (v.is_string() && (min_len || max_len)) {
        const std::string str = v.get<std::string>();
        uint64_t n = 0;
        for (const char c : str) n += ((unsigned char)c & 0xC0) != 0x80;
        if ((min_len && n < *min_len) || (max_len && n > *max_len)) continue;
      }
      alts.push_back(gbnf_literal(v.dump()));
    }
    if (alts.empty()) bad("no value of 'enum' / 'const' satisfies the schema", path);
    std::string body = alts.size() == 1 ? alts[0] : "(";
    if (alts.size() > 1) {
      for (size_t i = 0; i < alts.size(); ++i) body += (i ? " | " : "") + alts[i];
      body += ")";
    }
    return add_rule(hint, body + sp());
  }

  std::string visit_type(const J& s, const std::string& t, const std::string& path, const std::string& hint) {
    if (t == "null") return prim("null");
    if (t == "boolean") return prim("boolean");
    if (t == "string") return visit_string(s, path, hint);
    if (t == "integer" || t == "number") return visit_number(s, t == "integer", path, hint);
    if (t == "object") return visit_object(s, path, hint);
    return visit_array(s, path, hint);
  }

  std::string quoted(const std::string& content) { return "\"\\\"\" " + content + " \"\\\"\"" + sp(); }

  std::string visit_string(const J& s, const std::string& path, const std::string& hint) {
    const std::optional<uint64_t> min_len = count_of(s, "minLength", path),
                                  max_len = count_of(s, "maxLength", path);
    if (min_len && max_len && *min_len > *max_len) bad("minLength above maxLength", path);
    std::string format;
    if (s.contains("format")) {
      if (!s["format"].is_string()) bad("'format' must be a string", path + "/format");
      format = s["format"].get<std::string>();
      if (!kFormats.count(format)) format.clear();  // an annotation
    }
    if (!format.empty()) {
      if (s.contains("pattern"))
        fail("json schema: 'pattern' beside 'format' is not supported at {}", path + "/pattern");
      // Lengths: supported when every string of the format satisfies them.
      static const std::map<std::string, std::pair<uint64_t, uint64_t>> format_lengths = {
          {"date", {10, 10}},
          {"time", {9, 21}},
          {"date-time", {20, 32}},
          {"uuid", {36, 36}},
          {"email", {5, 263}},
          {"uri", {3, 619}},
          {"ipv4", {7, 15}},
          {"ipv6", {15, 39}},
          {"hostname", {1, 131}},
          {"regex", {0, 64}},
          {"json-pointer", {0, 8 * 65}},
          {"relative-json-pointer", {1, 4 + 8 * 65}}};
      const auto [flo, fhi] = format_lengths.at(format);
      if ((min_len && *min_len > flo) || (max_len && *max_len < fhi)) {
        const bool lo_bad = min_len && *min_len > flo;
        fail("json schema: '{}' beside 'format' is not supported at {}", lo_bad ? "minLength" : "maxLength",
             path + (lo_bad ? "/minLength" : "/maxLength"));
      }
      const std::string name = format + "-string";
      if (rule_at_.count(name)) return name;
      use_name(name);
      set_rule(name, quoted(prim(format)));
      return name;
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) bad("'pattern' must be a string", path + "/pattern");
      RegexGbnf re;
      try {
        re = regex_to_gbnf(s["pattern"].get<std::string>(), prim("char"), max_len);
      } catch (const Error& e) {
        fail("json schema: {} at {}", e.what(), path + "/pattern");
      }
      // maxLength lowered the pattern's repetitions; minLength is supported when the pattern implies it.
      if (min_len && re.min_len < *min_len) {
        fail("json schema: 'minLength' beside a 'pattern' that does not imply it is not supported at {}",
             path + "/minLength");
      }
      return add_rule(hint, quoted(re.expr));
    }
    if (!min_len && !max_len) return prim("string");
    const uint64_t lo = min_len.value_or(0);
    if (lo > kMaxCount)
      bad(fmt::format("minLength above {} is not supported", kMaxCount), path + "/minLength");
    const uint64_t hi = std::min<uint64_t>(max_len.value_or(UINT64_MAX), kMaxCount);
    const std::string c = prim("char");
    std::string rep;
    if (!max_len) {
      rep = fmt::format("{}{{{},}}", c, lo);
    } else if (hi == 0) {
      rep = "";
    } else {
      rep = fmt::format("{}{{{},{}}}", c, lo, hi);
    }
    return add_rule(hint, rep.empty() ? "\"\\\"\\\"\"" + sp() : quoted(rep));
  }

  // A bound (value, strict) from minimum / exclusiveMinimum (or maximum / exclusiveMaximum), tightest wins.
  static std::optional<std::pair<double, bool>> bound(const J& s, bool lower, const std::string& path) {
    const char* incl = lower ? "minimum" : "maximum";
    const char* excl = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    std::optional<std::pair<double, bool>> out;
    auto take = [&](double v, bool strict) {
      if (!out) {
        out = {v, strict};
        return;
      }
      const bool tighter = lower ? (v > out->first || (v == out->first && strict))
                                 : (v < out->first || (v == out->first && strict));
      if (tighter) out = {v, strict};
    };
    const bool draft4_excl = s.contains(excl) && s[excl].is_boolean() && s[excl].get<bool>();
    if (s.contains(incl)) {
      if (!s[incl].is_number()) bad(fmt::format("'{}' must be a number", incl), path + "/" + incl);
      take(s[incl].get<double>(), draft4_excl);
    }
    if (s.contains(excl) && !s[excl].is_boolean()) {
      if (!s[excl].is_number()) bad(fmt::format("'{}' must be a number", excl), path + "/" + excl);
      take(s[excl].get<double>(), true);
    }
    return out;
  }

  static double clamp_bound(double v) {
    const double cap = (double)kMaxRangeInt + 2;
    return std::max(-cap, std::min(cap, v));
  }

  std::string visit_number(const J& s, bool integer, const std::string& path, const std::string& hint) {
    const auto lo = bound(s, true, path), hi = bound(s, false, path);
    if (!lo && !hi) return prim(integer ? "integer" : "number");
    std::string body;
    try {
      if (integer) {
        std::optional<int64_t> l, h;
        if (lo) {
          const double v = clamp_bound(lo->first);
          l = (int64_t)(lo->second ? std::floor(v) + 1 : std::ceil(v));
        }
        if (hi) {
          const double v = clamp_bound(hi->first);
          h = (int64_t)(hi->second ? std::ceil(v) - 1 : std::floor(v));
        }
        body = int_range_gbnf(l, h);
      } else {
        std::optional<int64_t> l, h;
        bool ls = false, hs = false;
        if (lo) {
          const double v = clamp_bound(lo->first);
          l = (int64_t)std::ceil(v);
          ls = lo->second && v == std::ceil(v);
        }
        if (hi) {
          const double v = clamp_bound(hi->first);
          h = (int64_t)std::floor(v);
          hs = hi->second && v == std::floor(v);
        }
        body = number_range_gbnf(l, ls, h, hs);
      }
    } catch (const Error& e) {
      bad(e.what(), path);
    }
    return add_rule(hint, body + sp());
  }

  // Plain JSON keys (no escapes) other than `names`: a trie of the names, one rule per node.
  std::string other_key(const std::vector<std::string>& names, const std::string& hint) {
    struct TrieNode {
      std::map<uint32_t, size_t> kids;
      bool terminal = false;
    };
    std::vector<TrieNode> trie(1);
    for (const std::string& n : names) {
      size_t node = 0;
      for (size_t i = 0; i < n.size();) {
        const int len = tok::utf8::classify((const unsigned char*)n.data() + i, n.size() - i);
        if (len <= 0) break;  // not UTF-8: no plain key can equal it beyond this point
        const uint32_t c = tok::utf8::decode(n.data() + i, (size_t)len);
        i += (size_t)len;
        auto it = trie[node].kids.find(c);
        if (it == trie[node].kids.end()) {
          trie.emplace_back();
          it = trie[node].kids.emplace(c, trie.size() - 1).first;
        }
        node = it->second;
        if (i == n.size()) trie[node].terminal = true;
      }
      if (n.empty()) trie[0].terminal = true;
    }
    const std::string kc = prim("key-char");
    const std::vector<CharRange> plain =
        subtract_ranges({{0, kMaxCodePoint}}, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0xD800, 0xDFFF}});
    std::vector<std::string> names_of(trie.size());
    const std::string base = new_name(hint + "-other-key");
    for (size_t i = 0; i < trie.size(); ++i)
      names_of[i] = i == 0 ? base : new_name(fmt::format("{}-{}", base, i));
    for (size_t i = 0; i < trie.size(); ++i) {
      std::vector<std::string> alts;
      std::vector<CharRange> kid_set;
      for (const auto& [c, k] : trie[i].kids) {
        kid_set.push_back({c, c});
        if (c < 0x20 || c == '"' || c == '\\') continue;
        alts.push_back(gbnf_class({{c, c}}) + " " + names_of[k]);
      }
      const std::vector<CharRange> diverge = subtract_ranges(plain, normalize_ranges(kid_set));
      if (!diverge.empty()) alts.push_back(gbnf_class(diverge) + " " + kc + "*");
      std::string body = "(";
      for (size_t j = 0; j < alts.size(); ++j) body += (j ? " | " : "") + alts[j];
      body += ")";
      if (!trie[i].terminal) body += "?";
      set_rule(names_of[i], body);
    }
    return base;
  }

  // The listed (and required) properties whose names match a patternProperties regex get its schema
  // merged into theirs (allOf).
  void apply_pattern_properties(const J& s, const std::string& path, J& props,
                                const std::vector<std::string>& required) {
    const J& pp = s["patternProperties"];
    if (!pp.is_object()) bad("'patternProperties' must be an object", path + "/patternProperties");
    std::vector<std::string> names;
    for (auto it = props.begin(); it != props.end(); ++it) names.push_back(it.key());
    for (const std::string& n : required) {
      if (!props.contains(n)) names.push_back(n);
    }
    for (auto it = pp.begin(); it != pp.end(); ++it) {
      const std::string ppath = path + "/patternProperties/" + pointer_escape(it.key());
      std::shared_ptr<const Grammar> g;
      try {
        const RegexGbnf re = regex_to_gbnf(it.key(), "char");
        g = std::make_shared<const Grammar>(parse_gbnf(
            "root ::= " + re.expr +
            "\nchar ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"));
      } catch (const Error& e) {
        fail("json schema: {} at {}", e.what(), ppath);
      }
      for (const std::string& n : names) {
        const std::string encoded = J(n).dump();
        if (!grammar_accepts(g, std::string_view(encoded).substr(1, encoded.size() - 2))) continue;
        if (!props.contains(n)) {
          props[n] = *it;
        } else {
          J both = J::object();
          both["allOf"] = J::array({props[n], *it});
          props[n] = both;
        }
      }
    }
    for (const std::string& n : required) {  // neither listed nor matched: an additional property
      if (props.contains(n)) continue;
      const J add = s.contains("additionalProperties") ? s["additionalProperties"] : J(true);
      if (add.is_boolean() && !add.get<bool>()) {
        bad(fmt::format("required property '{}' is excluded by additionalProperties false", n), path);
      }
      props[n] = add;
    }
    props = keyed(std::move(props));
  }

  std::string visit_object(const J& s, const std::string& path, const std::string& hint) {
    J props = J::object();
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) bad("'properties' must be an object", path + "/properties");
      props = s["properties"];
    }
    std::vector<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) bad("'required' must be an array", path + "/required");
      for (const J& n : s["required"]) {
        if (!n.is_string()) bad("'required' must list strings", path + "/required");
        if (std::find(required.begin(), required.end(), n.get<std::string>()) == required.end()) {
          required.push_back(n.get<std::string>());
        }
      }
    }
    // patternProperties: the listed properties whose names match a pattern also take its schema; no other
    // property is generated (those would have to be checked against every pattern).
    const bool patterned = s.contains("patternProperties");
    if (patterned) apply_pattern_properties(s, path, props, required);
    // additionalProperties: absent (closed when properties are listed), true, false or a schema.
    std::optional<J> additional;
    if (patterned) {
      additional = J(false);
    } else if (s.contains("additionalProperties")) {
      additional = s["additionalProperties"];
    } else if (s.contains("unevaluatedProperties")) {
      additional = s["unevaluatedProperties"];
    }
    const bool closed_by_default = !props.empty() || !required.empty();
    const bool closed =
        additional ? (additional->is_boolean() && !additional->get<bool>()) : closed_by_default;

    // Properties in order: required ones (in properties' order, then the rest of `required`), optional.
    std::vector<std::string> req_names, opt_names, excluded;  // excluded: properties with schema false
    for (auto it = props.begin(); it != props.end(); ++it) {
      const bool is_req = std::find(required.begin(), required.end(), it.key()) != required.end();
      if (it->is_boolean() && !it->get<bool>()) {
        if (is_req)
          bad(fmt::format("required property '{}' has schema false", it.key()), path + "/properties");
        excluded.push_back(it.key());
        continue;
      }
      (is_req ? req_names : opt_names).push_back(it.key());
    }
    for (const std::string& n : required) {
      if (props.contains(n)) continue;
      if (closed && additional)
        bad(fmt::format("required property '{}' is excluded by additionalProperties false", n), path);
      req_names.push_back(n);
    }

    // dependencies / dependentRequired / dependentSchemas: a required property's required dependencies become
    // required too; an optional property whose dependencies are not all required is left out.
    std::vector<std::string> dep_triggers;
    for (const char* key : {"dependencies", "dependentRequired", "dependentSchemas"}) {
      if (!s.contains(key)) continue;
      const J& deps = s[key];
      if (!deps.is_object()) bad(fmt::format("'{}' must be an object", key), path + "/" + key);
      for (auto it = deps.begin(); it != deps.end(); ++it) dep_triggers.push_back(it.key());
      for (bool changed = true; changed;) {
        changed = false;
        for (auto it = deps.begin(); it != deps.end(); ++it) {
          const bool is_req = std::find(req_names.begin(), req_names.end(), it.key()) != req_names.end();
          if (it->is_array()) {
            for (const J& d : *it) {
              if (!d.is_string()) bad(fmt::format("'{}' must list property names", key), path + "/" + key);
              const std::string dn = d.get<std::string>();
              if (!is_req || std::find(req_names.begin(), req_names.end(), dn) != req_names.end()) continue;
              if (closed && !props.contains(dn)) {
                bad(fmt::format("dependency '{}' is excluded by additionalProperties false", dn),
                    path + "/" + key);
              }
              opt_names.erase(std::remove(opt_names.begin(), opt_names.end(), dn), opt_names.end());
              req_names.push_back(dn);
              changed = true;
            }
          } else if (is_req && !(it->is_boolean() && it->get<bool>())) {
            refuse_keyword(key, path);  // a schema that a present property brings in: not merged
          }
        }
      }
      std::vector<std::string> kept;
      for (const std::string& n : opt_names) {
        bool ok = !deps.contains(n);
        if (!ok && deps[n].is_array()) {
          ok = true;
          for (const J& d : deps[n]) {
            ok = ok && std::find(req_names.begin(), req_names.end(), d.get<std::string>()) != req_names.end();
          }
        }
        if (ok) kept.push_back(n);
      }
      opt_names = kept;
    }

    const std::optional<uint64_t> min_props = count_of(s, "minProperties", path),
                                  max_props = count_of(s, "maxProperties", path);
    // minProperties: met by the required properties, or 1 met by a non-empty list.
    const bool non_empty = min_props && *min_props == 1 && req_names.empty();
    if (min_props && *min_props > req_names.size() && !non_empty) refuse_keyword("minProperties", path);
    if (max_props && !(closed && *max_props >= req_names.size() + opt_names.size())) {
      refuse_keyword("maxProperties", path);
    }

    if (!closed && req_names.empty() && opt_names.empty() && (!additional || additional->is_boolean()) &&
        !min_props) {
      return prim("object");
    }
    const std::string comma = "\",\"" + sp() + " ";
    std::string extra;  // the kv of an additional property, or empty
    if (!closed) {
      std::string value_expr;
      if (!additional || (additional->is_boolean() && additional->get<bool>())) {
        value_expr = any_value();
      } else {
        value_expr = visit(*additional, path + "/additionalProperties", hint + "-additional");
      }
      std::vector<std::string> names = req_names;  // and the dependencies' triggers: never additional
      names.insert(names.end(), opt_names.begin(), opt_names.end());
      names.insert(names.end(), dep_triggers.begin(), dep_triggers.end());
      names.insert(names.end(), excluded.begin(), excluded.end());
      if (names.empty()) {
        extra = prim("string") + " \":\"" + sp() + " " + value_expr;
      } else {
        extra =
            "\"\\\"\" " + other_key(names, hint) + " \"\\\"\"" + sp() + " \":\"" + sp() + " " + value_expr;
      }
      extra = add_rule(hint + "-additional-kv", extra);
    }

    auto kv = [&](const std::string& name) {
      // A required name that properties does not list is an additional property: its schema applies.
      if (!props.contains(name)) {
        const bool schema = additional && !additional->is_boolean();
        return gbnf_literal(J(name).dump()) + sp() + " \":\"" + sp() + " " +
               (schema ? visit(*additional, path + "/additionalProperties", hint + "-" + name) : any_value());
      }
      const std::string value =
          visit(props[name], path + "/properties/" + pointer_escape(name), hint + "-" + name);
      return gbnf_literal(J(name).dump()) + sp() + " \":\"" + sp() + " " + value;
    };

    std::string body = "\"{\"" + sp();
    std::vector<std::string> opt_kv;
    for (const std::string& n : opt_names) opt_kv.push_back(add_rule(hint + "-" + n + "-kv", kv(n)));
    // tail[i]: what may follow a property when optional ones i.. remain (each "," kv, then extras).
    const size_t n_opt = opt_kv.size();
    std::vector<std::string> tail(n_opt + 1);
    tail[n_opt] = extra.empty() ? "" : "(" + comma + extra + ")*";
    for (size_t i = n_opt; i-- > 0;) {
      const std::string t = "(" + comma + opt_kv[i] + ")?" + (tail[i + 1].empty() ? "" : " " + tail[i + 1]);
      tail[i] = add_rule(hint + "-tail", t);
    }
    if (!req_names.empty()) {
      for (size_t i = 0; i < req_names.size(); ++i) body += (i ? " " + comma : " ") + kv(req_names[i]);
      if (!tail[0].empty()) body += " " + tail[0];
    } else if (n_opt > 0 || !extra.empty()) {
      // first[i]: a non-empty list whose first property is optional one i or a later one (or an extra).
      std::string next = extra.empty() ? "" : extra + (tail[n_opt].empty() ? "" : " " + tail[n_opt]);
      for (size_t i = n_opt; i-- > 0;) {
        std::string alt = opt_kv[i] + (tail[i + 1].empty() ? "" : " " + tail[i + 1]);
        if (!next.empty()) alt += " | " + next;
        next = add_rule(hint + "-first", alt);
      }
      body += " (" + next + ")" + (non_empty ? "" : "?");
    } else if (non_empty) {
      refuse_keyword("minProperties", path);
    }
    body += " \"}\"" + sp();
    return add_rule(hint, body);
  }

  std::string visit_array(const J& s, const std::string& path, const std::string& hint) {
    std::vector<std::pair<const J*, std::string>> prefix;  // schema, path
    std::optional<J> rest;                                 // absent: no further items
    const bool items_list = s.contains("items") && s["items"].is_array();
    auto schema_list = [&](const J& list, const std::string& p) {
      for (size_t i = 0; i < list.size(); ++i) prefix.emplace_back(&list[i], fmt::format("{}/{}", p, i));
    };
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) bad("'prefixItems' must be an array", path + "/prefixItems");
      schema_list(s["prefixItems"], path + "/prefixItems");
      if (s.contains("items")) rest = s["items"];
    } else if (items_list) {
      schema_list(s["items"], path + "/items");
      if (s.contains("additionalItems")) rest = s["additionalItems"];
    } else {
      rest = s.contains("items") ? s["items"] : J(true);
    }
    const std::string rest_path =
        path + (items_list && !s.contains("prefixItems") ? "/additionalItems" : "/items");
    if (rest && rest->is_boolean() && !rest->get<bool>()) rest.reset();
    const uint64_t min = count_of(s, "minItems", path).value_or(0);
    std::optional<uint64_t> max_in = count_of(s, "maxItems", path);
    // uniqueItems true: met by arrays of at most one item (a narrower grammar; more needs item comparison).
    if (s.contains("uniqueItems") && s["uniqueItems"].get<bool>()) {
      if (min > 1) refuse_keyword("uniqueItems", path);
      max_in = std::min<uint64_t>(max_in.value_or(1), 1);
    }
    if (max_in && min > *max_in) bad("minItems above maxItems", path);
    if (min > kMaxCount)
      bad(fmt::format("minItems above {} is not supported", kMaxCount), path + "/minItems");
    const uint64_t max = std::min<uint64_t>(max_in.value_or(UINT64_MAX), kMaxCount);
    const size_t k = std::min<size_t>(prefix.size(), max);
    if (!rest && min > k) {
      if (!s.contains("prefixItems") && !items_list) bad("minItems above the items allowed", path);
      rest = J(true);  // a tuple without a rest schema: further items are any values
    }
    const std::string comma = "\",\"" + sp() + " ";
    std::string tail;  // items k.. (each but the very first preceded by ",")
    if (rest && max > k) {
      const std::string item = visit(*rest, rest_path, hint + "-item");
      const uint64_t rmin = min > k ? min - k : 0, rmax = max - k;
      if (k == 0) {
        const uint64_t more_min = rmin ? rmin - 1 : 0, more_max = rmax - 1;
        std::string more;
        if (more_max == 0) {
          more = "";
        } else if (max_in || more_max != kMaxCount - 1) {
          more = fmt::format("({}{}){{{},{}}}", comma, item, more_min, more_max);
        } else {
          more = fmt::format("({}{}){{{},}}", comma, item, more_min);
        }
        tail = item + (more.empty() ? "" : " " + more);
        if (rmin == 0) tail = "(" + tail + ")?";
      } else if (!max_in) {
        tail = fmt::format("({}{}){{{},}}", comma, item, rmin);
      } else {
        tail = fmt::format("({}{}){{{},{}}}", comma, item, rmin, rmax);
      }
    }
    for (size_t i = k; i-- > 0;) {
      const std::string item = visit(*prefix[i].first, prefix[i].second, fmt::format("{}-{}", hint, i));
      std::string e = (i ? comma : std::string()) + item + (tail.empty() ? "" : " " + tail);
      if (i >= min) e = "(" + e + ")?";
      tail = k > 1 ? add_rule(fmt::format("{}-from-{}", hint, i), e) : e;
    }
    return add_rule(hint, "\"[\"" + sp() + (tail.empty() ? "" : " " + tail) + " \"]\"" + sp());
  }
};

std::string compile(const J& schema, const JsonSchemaOptions& options, bool sorted_keys) {
  try {
    Compiler c(schema, options, sorted_keys);
    return c.run();
  } catch (const nlohmann::json::exception& e) {
    fail("json schema: {}", e.what());
  }
}

// Refuses a grammar with a rule that derives no finite string (a recursive schema without a way out, e.g.
// a required property whose schema is the object itself): a sampler could follow it forever.
void check_productive(const Grammar& g) {
  std::vector<bool> productive(g.n_rules(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t r = 0; r < g.n_rules(); ++r) {
      if (productive[r]) continue;
      for (uint32_t a = g.rule_alts[r]; a < g.rule_alts[r + 1] && !productive[r]; ++a) {
        bool all = true;
        for (uint32_t e = g.alt_start[a]; !g.ends_alternative(e) && all; ++e) {
          all = g.elements[e].op != Op::Rule || productive[g.elements[e].a];
        }
        if (all) productive[r] = changed = true;
      }
    }
  }
  for (uint32_t r = 0; r < g.n_rules(); ++r) {
    if (!productive[r]) {
      fail("json schema: no finite JSON value matches the schema (rule '{}' only recurses)", g.rule_names[r]);
    }
  }
}

Grammar compile_grammar(const J& schema, const JsonSchemaOptions& options, bool sorted_keys) {
  const std::string text = compile(schema, options, sorted_keys);
  Grammar g;
  try {
    g = parse_gbnf(text);
  } catch (const Error& e) {
    fail("json schema: the compiled grammar is refused: {}", e.what());
  }
  check_productive(g);
  return g;
}

}  // namespace json_schema_impl

std::string json_schema_to_gbnf(const nlohmann::json& schema, const JsonSchemaOptions& options) {
  return json_schema_impl::compile(nlohmann::ordered_json(schema), options, /*sorted_keys=*/true);
}
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  return json_schema_impl::compile(schema, options, /*sorted_keys=*/false);
}
Grammar json_schema_to_grammar(const nlohmann::json& schema, const JsonSchemaOptions& options) {
  return json_schema_impl::compile_grammar(nlohmann::ordered_json(schema), options, /*sorted_keys=*/true);
}
Grammar json_schema_to_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  return json_schema_impl::compile_grammar(schema, options, /*sorted_keys=*/false);
}

}  // namespace ultra::grammar
