// Jinja builtins: filters, tests, the methods of str / dict / list that templates call, and the globals
// (range, dict, namespace, raise_exception, strftime_now) of HF transformers' environment.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "chat/jinja_builtins.h"
#include "core/error.h"

namespace ultra::jinja {

namespace {

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string strip(const std::string& s, const std::string* chars, bool left, bool right) {
  auto drop = [&](char c) { return chars ? chars->find(c) != std::string::npos : is_ws(c); };
  size_t a = 0, b = s.size();
  if (left)
    while (a < b && drop(s[a])) ++a;
  if (right)
    while (b > a && drop(s[b - 1])) --b;
  return s.substr(a, b - a);
}

std::string upper(std::string s) {
  for (auto& c : s)
    if (c >= 'a' && c <= 'z') c = char(c - 32);
  return s;
}
std::string lower(std::string s) {
  for (auto& c : s)
    if (c >= 'A' && c <= 'Z') c = char(c + 32);
  return s;
}
bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (unsigned char)c >= 0x80;
}
std::string title(std::string s) {
  bool prev = false;
  for (auto& c : s) {
    if (is_alpha(c)) {
      if (!prev && c >= 'a' && c <= 'z') c = char(c - 32);
      if (prev && c >= 'A' && c <= 'Z') c = char(c + 32);
      prev = true;
    } else {
      prev = std::isdigit((unsigned char)c) || c == '\'';
    }
  }
  return s;
}
std::string capitalize(std::string s) {
  s = lower(s);
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = char(s[0] - 32);
  return s;
}
std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count,
                    size_t limit) {
  std::string out;
  if (from.empty()) {
    std::vector<std::string> cps = code_points(s);
    int64_t n = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (k < cps.size()) out += cps[k];
      if (out.size() > limit) fail("chat template: replace result exceeds the size limit");
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (true) {
    const size_t f = s.find(from, pos);
    if (f == std::string::npos || (count >= 0 && n >= count)) break;
    out.append(s, pos, f - pos);
    out += to;
    if (out.size() > limit) fail("chat template: replace result exceeds the size limit");
    pos = f + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::vector<Value> split(const std::string& s, const Value* sep, int64_t maxsplit, int line) {
  std::vector<Value> out;
  if (!sep || sep->is_none()) {
    size_t k = 0;
    while (true) {
      while (k < s.size() && is_ws(s[k])) ++k;
      if (k >= s.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) >= maxsplit) {
        std::string rest = s.substr(k);
        while (!rest.empty() && is_ws(rest.back())) rest.pop_back();
        out.push_back(Value::string(rest));
        break;
      }
      size_t e = k;
      while (e < s.size() && !is_ws(s[e])) ++e;
      out.push_back(Value::string(s.substr(k, e - k)));
      k = e;
    }
    return out;
  }
  if (!sep->is_string()) error_at(line, "split: separator must be a string");
  if (sep->s.empty()) error_at(line, "split: empty separator");
  size_t pos = 0;
  while (true) {
    const size_t f = s.find(sep->s, pos);
    if (f == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) >= maxsplit)) break;
    out.push_back(Value::string(s.substr(pos, f - pos)));
    pos = f + sep->s.size();
  }
  out.push_back(Value::string(s.substr(pos)));
  return out;
}

int64_t int_arg(const CallArgs& a, size_t idx, const char* name, int64_t def) {
  const Value* v = a.get(idx, name);
  if (!v || v->is_none()) return def;
  if (v->kind == Kind::Bool) return v->b;
  if (v->kind != Kind::Int) error_at(a.line, fmt::format("argument '{}' must be an integer", name));
  return v->i;
}
bool bool_arg(const CallArgs& a, size_t idx, const char* name, bool def) {
  const Value* v = a.get(idx, name);
  return v ? v->truthy() : def;
}
std::string str_arg(const CallArgs& a, size_t idx, const char* name, const std::string& def) {
  const Value* v = a.get(idx, name);
  if (!v) return def;
  if (!v->is_string()) error_at(a.line, fmt::format("argument '{}' must be a string", name));
  return v->s;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string py_format(const std::string& fmt_s, const CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t k = 0; k < fmt_s.size(); ++k) {
    const char c = fmt_s[k];
    if (c == '{') {
      if (k + 1 < fmt_s.size() && fmt_s[k + 1] == '{') {
        out += '{';
        ++k;
        continue;
      }
      const size_t e = fmt_s.find('}', k);
      if (e == std::string::npos) error_at(a.line, "format: single '{' in format string");
      const std::string field = fmt_s.substr(k + 1, e - k - 1);
      if (field.find_first_of(":!.[") != std::string::npos)
        error_at(a.line, "unsupported: format spec in str.format");
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_idx < a.pos.size() ? &a.pos[auto_idx] : nullptr;
        ++auto_idx;
      } else if (std::all_of(field.begin(), field.end(),
                             [](char d) { return std::isdigit((unsigned char)d); })) {
        const size_t i = std::stoul(field);
        v = i < a.pos.size() ? &a.pos[i] : nullptr;
      } else {
        for (const auto& [kk, vv] : a.kw)
          if (kk == field) v = &vv;
      }
      if (!v) error_at(a.line, fmt::format("format: no argument for '{{{}}}'", field));
      out += to_str(*v);
      k = e;
    } else if (c == '}') {
      if (k + 1 < fmt_s.size() && fmt_s[k + 1] == '}') ++k;
      out += '}';
    } else {
      out += c;
    }
  }
  return out;
}

// Python's round(x, nd) of a float: the decimal rounding, half to even, of x's exact binary value (as
// CPython's double_round, via the exact decimal expansion glibc's printf gives), read back as a double.
double py_round(double x, int64_t nd, int line) {
  if (!std::isfinite(x)) return x;  // nan and infinities round to themselves
  if (nd > 323) return x;           // CPython's NDIGITS_MAX: no digit of a double is that far right
  if (nd < -308) return 0.0 * x;    // CPython's NDIGITS_MIN: 0 with x's sign
  if (nd >= 0) {
    char buf[700];
    std::snprintf(buf, sizeof buf, "%.*f", int(nd), x);  // exact, rounded half to even
    return std::strtod(buf, nullptr);
  }
  // nd < 0: round the exact integer and fraction digits at 10^-nd.
  char buf[1500];
  std::snprintf(buf, sizeof buf, "%.1100f",
                std::fabs(x));  // exact: a double has at most 1074 fraction digits
  const std::string all(buf);
  const size_t dot = all.find('.');
  const std::string ip = all.substr(0, dot), fp = all.substr(dot + 1);
  const size_t drop = size_t(-nd);
  std::string kept = ip.size() > drop ? ip.substr(0, ip.size() - drop) : "0";
  const std::string dropped =
      (ip.size() > drop ? ip.substr(ip.size() - drop) : std::string(drop - ip.size(), '0') + ip) + fp;
  bool up = dropped[0] > '5';
  if (dropped[0] == '5') {
    const bool rest = dropped.find_first_not_of('0', 1) != std::string::npos;
    up = rest || (kept.back() - '0') % 2 == 1;
  }
  if (up) {
    size_t k = kept.size();
    while (k > 0 && kept[k - 1] == '9') kept[--k] = '0';
    if (k == 0)
      kept.insert(kept.begin(), '1');
    else
      ++kept[k - 1];
  }
  const double r = std::strtod((kept + "e" + std::to_string(drop)).c_str(), nullptr);
  if (std::isinf(r)) error_at(line, "round: rounded value too large to represent");
  return std::signbit(x) ? -r : r;
}

}  // namespace

// jinja2's round filter: method "common" is Python's round(value, precision) -- an int stays an int
// (rounded half to even at 10^-precision when precision < 0), a float is rounded half to even as a decimal
// and nan / inf stay as they are; "ceil" and "floor" are math.ceil / math.floor(value * 10**precision) /
// 10**precision, a float, and an error for nan and inf as in Python.
static Value round_filter(const Value& v, const CallArgs& a) {
  const int line = a.line;
  if (!v.is_number()) error_at(line, "round needs a number");
  const int64_t prec = int_arg(a, 0, "precision", 0);
  const std::string method = str_arg(a, 1, "method", "common");
  if (method != "common" && method != "ceil" && method != "floor")
    error_at(line, "round: method must be common, ceil or floor");
  const bool is_int = v.kind == Kind::Int || v.kind == Kind::Bool;
  const int64_t iv = v.kind == Kind::Bool ? v.b : v.i;
  if (method == "common") {
    if (!is_int) return Value::number(py_round(v.f, prec, line));
    if (prec >= 0) return Value::integer(iv);
    if (prec < -19) return Value::integer(0);  // |int64| < 10^19 / 2
    __int128 m = 1;
    for (int64_t k = 0; k < -prec; ++k) m *= 10;
    const __int128 x = iv;
    __int128 q = x / m, r = x % m;
    if (r < 0) {
      r += m;
      q -= 1;
    }
    if (2 * r > m || (2 * r == m && (q % 2 != 0))) q += 1;
    const __int128 out = q * m;
    if (out > INT64_MAX || out < INT64_MIN)
      error_at(line, fmt::format("round: the result for {} does not fit in a 64-bit integer", iv));
    return Value::integer(int64_t(out));
  }
  if (prec > 308) error_at(line, "round: int too large to convert to float");
  const double m = std::pow(10.0, double(prec));
  if (m == 0) error_at(line, "round: float division by zero");
  const double x = (is_int ? double(iv) : v.f) * m;
  if (std::isnan(x)) error_at(line, "round: cannot convert float NaN to integer");
  if (std::isinf(x)) error_at(line, "round: cannot convert float infinity to integer");
  return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / m);
}

Value Interp::get_attr(const Value& base, const std::string& name, int line) {
  if (base.is_undefined())
    error_at(line, fmt::format("'{}' is undefined", base.s.empty() ? "value" : base.s.get()));
  if (base.is_dict()) {
    const Value* v = base.dict->find(name);
    return v ? *v : Value::undefined(name);
  }
  return Value::undefined(name);
}

Value Interp::get_item(const Value& base, const Value& idx, int line) {
  if (base.is_undefined())
    error_at(line, fmt::format("'{}' is undefined", base.s.empty() ? "value" : base.s.get()));
  if (base.is_dict()) {
    if (!idx.is_string() && idx.kind != Kind::Int && idx.kind != Kind::Bool) return Value::undefined();
    const Value* v = base.dict->find(dict_key(idx, line));
    return v ? *v : Value::undefined(idx.s);
  }
  if ((base.is_list() || base.is_string()) && (idx.kind == Kind::Int || idx.kind == Kind::Bool)) {
    int64_t i = idx.kind == Kind::Bool ? idx.b : idx.i;
    if (base.is_list()) {
      const int64_t n = int64_t(base.list->size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined();
      return (*base.list)[size_t(i)];
    }
    // Code point i, found by walking the string (no copy of it).
    const std::string& s = base.s;
    charge_touch(s.size());
    const int64_t n = int64_t(code_point_count(s));
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined();
    size_t from = 0;
    for (int64_t seen = -1; from < s.size(); ++from)
      if ((static_cast<unsigned char>(s[from]) & 0xC0) != 0x80 && ++seen == i) break;
    size_t to = from + 1;
    while (to < s.size() && (static_cast<unsigned char>(s[to]) & 0xC0) == 0x80) ++to;
    return Value::string(s.substr(from, to - from));
  }
  return Value::undefined();
}

std::vector<Value> Interp::iterate(const Value& v, int line) {
  switch (v.kind) {
    case Kind::Undefined:
      return {};
    case Kind::List:
      charge_alloc(v.list->size() * sizeof(Value));
      return *v.list;
    case Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(key_value(kv.first));
      return keys;
    }
    case Kind::String: {
      charge_alloc(v.s.size() * (sizeof(Value) + sizeof(std::string)));
      std::vector<Value> out;
      for (auto& c : code_points(v.s)) out.push_back(Value::string(std::move(c)));
      return out;
    }
    default:
      error_at(line, fmt::format("'{}' object is not iterable", kind_name(v)));
  }
}

bool Interp::contains(const Value& c, const Value& item, int line) {
  if (c.is_string()) {
    if (!item.is_string()) error_at(line, "'in <string>' requires string as left operand");
    charge_touch(c.s.size());
    return c.s.get().find(item.s.get()) != std::string::npos;
  }
  if (c.is_list()) {
    for (const auto& x : *c.list)
      if (equals(x, item)) return true;
    return false;
  }
  if (c.is_dict())
    return (item.is_string() || item.kind == Kind::Int) && c.dict->find(dict_key(item, line)) != nullptr;
  if (c.is_undefined()) return false;
  error_at(line, fmt::format("argument of type '{}' is not iterable", kind_name(c)));
}

// Attribute lookup for map / selectattr / sort / join: dotted, items first.
static Value attr_path(Interp& in, const Value& v, const std::string& path, int line) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (cur.is_undefined()) return cur;
    Value key = !part.empty() && std::all_of(part.begin(), part.end(),
                                             [](char c) { return std::isdigit((unsigned char)c); })
                    ? Value::integer(std::stoll(part))
                    : Value::string(part);
    cur = cur.is_dict() ? in.get_item(cur, Value::string(part), line) : in.get_item(cur, key, line);
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

bool Interp::apply_test(const std::string& name, const Value& v, CallArgs& a) {
  const int line = a.line;
  auto arg = [&]() -> const Value& {
    if (a.pos.empty()) error_at(line, fmt::format("test '{}' needs an argument", name));
    return a.pos[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.dict->is_namespace;
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || (v.is_dict() && !v.dict->is_namespace) || v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Kind::Int;
  if (name == "float") return v.kind == Kind::Float;
  if (name == "boolean") return v.kind == Kind::Bool;
  if (name == "true") return v.kind == Kind::Bool && v.b;
  if (name == "false") return v.kind == Kind::Bool && !v.b;
  if (name == "callable") return v.kind == Kind::Func;
  if (name == "odd" || name == "even") {
    if (v.kind != Kind::Int) error_at(line, fmt::format("test '{}' needs an integer", name));
    return (((v.i % 2) + 2) % 2 == 1) == (name == "odd");
  }
  if (name == "divisibleby") {
    const Value& d = arg();
    if (v.kind != Kind::Int || d.kind != Kind::Int || d.i == 0)
      error_at(line, "divisibleby needs non-zero integers");
    return v.i % d.i == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, arg());
  if (name == "ne" || name == "!=") return !equals(v, arg());
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, arg(), line) < 0;
  if (name == "le" || name == "<=") return compare(v, arg(), line) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, arg(), line) > 0;
  if (name == "ge" || name == ">=") return compare(v, arg(), line) >= 0;
  if (name == "in") return contains(arg(), v, line);
  if (name == "lower") return v.is_string() && lower(v.s) == v.s;
  if (name == "upper") return v.is_string() && upper(v.s) == v.s;
  if (name == "sameas") {
    const Value& o = arg();
    if (v.kind != o.kind) return false;
    if (v.is_list()) return v.list == o.list;
    if (v.is_dict()) return v.dict == o.dict;
    return equals(v, o);
  }
  if (name == "escaped") return false;
  error_at(line, fmt::format("unsupported test '{}'", name));
}

static Value sorted(Interp& in, std::vector<Value> items, bool reverse, bool case_sensitive,
                    const Value* attribute, int line) {
  auto key = [&](const Value& v) {
    Value k = attribute && attribute->is_string() ? attr_path(in, v, attribute->s, line) : v;
    if (!case_sensitive && k.is_string()) k.s = lower(k.s);
    return k;
  };
  charge_alloc(items.size() * 2 * sizeof(Value));
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& v : items) keyed.emplace_back(key(v), std::move(v));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first, line) < 0 : compare(x.first, y.first, line) < 0;
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::make_list(std::move(out));
}

Value Interp::apply_filter(const std::string& name, Value v, CallArgs& a) {
  const int line = a.line;
  if (v.is_string()) charge_touch(v.s.size());
  auto need_str = [&]() -> std::string { return v.is_string() ? v.s.get() : to_str(v); };
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    if (name == "safe") return v;
    return Value::string(html_escape(need_str()));
  }
  if (name == "trim") {
    const Value* chars = a.get(0, "chars");
    const std::string* cs = chars && chars->is_string() ? &chars->s.get() : nullptr;
    return Value::string(strip(need_str(), cs, true, true));
  }
  if (name == "tojson") {
    const Value* ind = a.get(0, "indent");
    int indent = -1;
    if (ind && !ind->is_none()) {
      if (ind->kind != Kind::Int || ind->i < 0 || ind->i > 64) error_at(line, "tojson: unsupported indent");
      indent = int(ind->i);
    }
    std::string isep = indent >= 0 ? "," : ", ", ksep = ": ";
    if (const Value* sep = a.get(99, "separators"); sep && sep->is_list() && sep->list->size() == 2) {
      isep = to_str((*sep->list)[0]);
      ksep = to_str((*sep->list)[1]);
    }
    const bool sort_keys = bool_arg(a, 99, "sort_keys", false);
    std::string s = to_json(v, indent, sort_keys, isep, ksep);
    if (s.size() > limits.max_output) error_at(line, "tojson result exceeds the size limit");
    return Value::string(std::move(s));
  }
  if (name == "length" || name == "count") {
    switch (v.kind) {
      case Kind::Undefined:
        return Value::integer(0);
      case Kind::String:
        return Value::integer(int64_t(code_point_count(v.s)));
      case Kind::List:
        return Value::integer(int64_t(v.list->size()));
      case Kind::Dict:
        return Value::integer(int64_t(v.dict->items.size()));
      default:
        error_at(line, fmt::format("object of type '{}' has no len()", kind_name(v)));
    }
  }
  if (name == "string") return v.is_string() ? v : Value::string(to_str(v));
  if (name == "list") return Value::make_list(iterate(v, line));
  if (name == "first") {
    std::vector<Value> items = iterate(v, line);
    return items.empty() ? Value::undefined() : items.front();
  }
  if (name == "last") {
    std::vector<Value> items = iterate(v, line);
    return items.empty() ? Value::undefined() : items.back();
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<std::string> cps = code_points(v.s);
      std::string s;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) s += *it;
      return Value::string(s);
    }
    std::vector<Value> items = iterate(v, line);
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (name == "join") {
    const std::string sep = str_arg(a, 0, "d", "");
    const Value* attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& x : iterate(v, line)) {
      if (!first) out += sep;
      first = false;
      out += to_str(attr && attr->is_string() ? attr_path(*this, x, attr->s, line) : x);
      if (out.size() > limits.max_output) error_at(line, "join result exceeds the size limit");
    }
    return Value::string(std::move(out));
  }
  if (name == "default" || name == "d") {
    const bool boolean = bool_arg(a, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !v.truthy())) {
      const Value* d = a.get(0, "default_value");
      return d ? *d : Value::string("");
    }
    return v;
  }
  if (name == "upper") return Value::string(upper(need_str()));
  if (name == "lower") return Value::string(lower(need_str()));
  if (name == "title") return Value::string(title(need_str()));
  if (name == "capitalize") return Value::string(capitalize(need_str()));
  if (name == "replace") {
    const Value* from = a.get(0, "old");
    const Value* to = a.get(1, "new");
    if (!from || !to) error_at(line, "replace needs two arguments");
    return Value::string(
        replace(need_str(), to_str(*from), to_str(*to), int_arg(a, 2, "count", -1), limits.max_output));
  }
  if (name == "int") {
    // jinja2 3.1: int(value) for a number, int(value, 10) for a string, else int(float(value)), else the
    // default. Python's int is unbounded: a result outside int64 is an error naming the value here, not a
    // silently wrong number. A float infinity is an error (Python's OverflowError escapes jinja2), a NaN
    // gives the default (ValueError, caught), and so do the strings "inf" and "nan" (caught there).
    const int64_t def = int_arg(a, 0, "default", 0);
    if (v.kind == Kind::Int) return v;
    if (v.kind == Kind::Bool) return Value::integer(v.b);
    auto from_double = [&](double d) {
      if (std::isnan(d)) return Value::integer(def);
      if (std::isinf(d)) error_at(line, "int: cannot convert float infinity to integer");
      if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
        error_at(line, fmt::format("int: {} does not fit in a 64-bit integer", py_float(d)));
      return Value::integer(int64_t(d));
    };
    if (v.kind == Kind::Float) return from_double(v.f);
    if (v.is_string()) {
      const std::string s = strip(v.s, nullptr, true, true);
      const bool digits =
          !s.empty() && s.find_first_not_of("0123456789", s[0] == '+' || s[0] == '-') == std::string::npos &&
          s.find_first_of("0123456789") != std::string::npos;
      if (digits) {
        errno = 0;
        const long long x = std::strtoll(s.c_str(), nullptr, 10);
        if (errno == ERANGE) error_at(line, fmt::format("int: {} does not fit in a 64-bit integer", s));
        return Value::integer(x);
      }
      // float(s): decimal notation or inf / nan (strtod would also take hexadecimal, which Python does not).
      char* end = nullptr;
      const double d = s.find_first_of("xX") == std::string::npos ? std::strtod(s.c_str(), &end) : 0;
      if (!s.empty() && end && *end == 0) return std::isinf(d) ? Value::integer(def) : from_double(d);
    }
    return Value::integer(def);
  }
  if (name == "float") {
    if (v.is_number()) return Value::number(v.as_double());
    if (v.is_string()) {
      const std::string s = strip(v.s, nullptr, true, true);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == 0) return Value::number(d);
    }
    const Value* d = a.get(0, "default");
    return d ? *d : Value::number(0.0);
  }
  if (name == "abs") {
    if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
    if (v.kind == Kind::Int) {
      if (v.i == INT64_MIN) error_at(line, "integer overflow");
      return Value::integer(v.i < 0 ? -v.i : v.i);
    }
    if (v.kind == Kind::Bool) return Value::integer(v.b);
    error_at(line, fmt::format("bad operand type for abs(): '{}'", kind_name(v)));
  }
  if (name == "round") return round_filter(v, a);
  if (name == "indent") {
    const Value* w = a.get(0, "width");
    std::string ind = w && w->is_string()
                          ? w->s.get()
                          : std::string(size_t(std::clamp<int64_t>(int_arg(a, 0, "width", 4), 0, 256)), ' ');
    const bool first = bool_arg(a, 1, "first", false), blank = bool_arg(a, 2, "blank", false);
    std::string s = need_str() + "\n";
    std::vector<std::string> lines;
    {
      size_t pos = 0;
      while (pos < s.size()) {
        size_t e = s.find_first_of("\r\n", pos);
        if (e == std::string::npos) {
          lines.push_back(s.substr(pos));
          break;
        }
        lines.push_back(s.substr(pos, e - pos));
        pos = e + ((s[e] == '\r' && e + 1 < s.size() && s[e + 1] == '\n') ? 2 : 1);
      }
    }
    std::string rv;
    if (blank) {
      for (size_t k = 0; k < lines.size(); ++k) rv += (k ? "\n" + ind : "") + lines[k];
    } else {
      rv = lines.empty() ? "" : lines[0];
      for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].empty() ? "" : ind + lines[k]);
    }
    if (first) rv = ind + rv;
    return Value::string(rv);
  }
  if (name == "wordcount") return Value::integer(int64_t(split(need_str(), nullptr, -1, line).size()));
  if (name == "items") {
    if (v.is_undefined()) return Value::make_list();
    if (!v.is_dict()) error_at(line, "items filter needs a mapping");
    std::vector<Value> out;
    for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_list({key_value(k), x}, true));
    return Value::make_list(std::move(out));
  }
  if (name == "dictsort") {
    if (!v.is_dict()) error_at(line, "dictsort needs a mapping");
    const bool cs = bool_arg(a, 0, "case_sensitive", false);
    const std::string by = str_arg(a, 1, "by", "key");
    const bool rev = bool_arg(a, 2, "reverse", false);
    std::vector<Value> pairs;
    for (const auto& [k, x] : v.dict->items) pairs.push_back(Value::make_list({key_value(k), x}, true));
    const Value attr = Value::string(by == "value" ? "1" : "0");
    return sorted(*this, std::move(pairs), rev, cs, &attr, line);
  }
  if (name == "sort") {
    return sorted(*this, iterate(v, line), bool_arg(a, 0, "reverse", false),
                  bool_arg(a, 1, "case_sensitive", false), a.get(2, "attribute"), line);
  }
  if (name == "unique") {
    const bool cs = bool_arg(a, 0, "case_sensitive", false);
    const Value* attr = a.get(1, "attribute");
    std::vector<Value> out, seen;
    for (auto& x : iterate(v, line)) {
      Value k = attr && attr->is_string() ? attr_path(*this, x, attr->s, line) : x;
      if (!cs && k.is_string()) k.s = lower(k.s);
      bool dup = false;
      for (const auto& s : seen) dup |= equals(s, k);
      if (!dup) {
        seen.push_back(k);
        out.push_back(x);
      }
    }
    return Value::make_list(std::move(out));
  }
  if (name == "map") {
    std::vector<Value> out;
    if (!v.truthy()) return Value::make_list();
    const Value* attr = nullptr;
    for (const auto& [k, x] : a.kw)
      if (k == "attribute") attr = &x;
    if (attr) {
      const Value* def = nullptr;
      for (const auto& [k, x] : a.kw)
        if (k == "default") def = &x;
      for (const auto& x : iterate(v, line)) {
        Value r = attr_path(*this, x, to_str(*attr), line);
        out.push_back(r.is_undefined() && def ? *def : r);
      }
    } else {
      if (a.pos.empty() || !a.pos[0].is_string()) error_at(line, "map needs a filter name or attribute=");
      const std::string f = a.pos[0].s;
      CallArgs rest;
      rest.line = line;
      rest.pos.assign(a.pos.begin() + 1, a.pos.end());
      rest.kw = a.kw;
      for (auto& x : iterate(v, line)) {
        CallArgs c = rest;
        out.push_back(apply_filter(f, x, c));
      }
    }
    return Value::make_list(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool want = name == "select" || name == "selectattr";
    size_t k0 = 0;
    std::string attr;
    if (by_attr) {
      if (a.pos.empty() || !a.pos[0].is_string())
        error_at(line, fmt::format("{} needs an attribute name", name));
      attr = a.pos[0].s;
      k0 = 1;
    }
    std::string test;
    CallArgs targs;
    targs.line = line;
    if (a.pos.size() > k0) {
      if (!a.pos[k0].is_string()) error_at(line, fmt::format("{}: test name must be a string", name));
      test = a.pos[k0].s;
      targs.pos.assign(a.pos.begin() + long(k0) + 1, a.pos.end());
    }
    std::vector<Value> out;
    if (!v.truthy()) return Value::make_list();
    for (auto& x : iterate(v, line)) {
      Value subject = by_attr ? attr_path(*this, x, attr, line) : x;
      const bool r = test.empty() ? subject.truthy() : apply_test(test, subject, targs);
      if (r == want) out.push_back(x);
    }
    return Value::make_list(std::move(out));
  }
  if (name == "sum") {
    const Value* attr = a.get(0, "attribute");
    Value acc = a.get(1, "start") ? *a.get(1, "start") : Value::integer(0);
    for (auto& x : iterate(v, line)) {
      Value y = attr && attr->is_string() ? attr_path(*this, x, attr->s, line) : x;
      if (!y.is_number() || !acc.is_number()) error_at(line, "sum needs numbers");
      if (acc.kind == Kind::Float || y.kind == Kind::Float)
        acc = Value::number(acc.as_double() + y.as_double());
      else if (__builtin_add_overflow(acc.kind == Kind::Bool ? int64_t(acc.b) : acc.i,
                                      y.kind == Kind::Bool ? int64_t(y.b) : y.i, &acc.i))
        error_at(line, "integer overflow");
      else
        acc.kind = Kind::Int;
    }
    return acc;
  }
  if (name == "min" || name == "max") {
    std::vector<Value> items = iterate(v, line);
    if (items.empty()) return Value::undefined();
    Value best = items[0];
    for (auto& x : items) {
      const int c = compare(x, best, line);
      if (name == "min" ? c < 0 : c > 0) best = x;
    }
    return best;
  }
  if (name == "attr") {
    if (a.pos.empty() || !a.pos[0].is_string()) error_at(line, "attr needs a name");
    return get_attr(v, a.pos[0].s, line);
  }
  if (name == "center") {
    const int64_t w = std::clamp<int64_t>(int_arg(a, 0, "width", 80), 0, 4096);
    std::string s = need_str();
    const int64_t n = int64_t(code_point_count(s));
    if (n >= w) return Value::string(s);
    const int64_t total = w - n, left = total / 2 + (total & w & 1);
    return Value::string(std::string(size_t(left), ' ') + s + std::string(size_t(total - left), ' '));
  }
  error_at(line, fmt::format("unsupported filter '{}'", name));
}

bool Interp::call_dict_method(const Value& obj, const std::string& name, CallArgs& a, Value& r) {
  const Dict& d = *obj.dict;
  if (name == "get") {
    const Value* k = a.get(0, "key");
    if (!k) error_at(a.line, "get needs a key");
    const Value* v = k->is_string() || k->kind == Kind::Int ? d.find(dict_key(*k, a.line)) : nullptr;
    const Value* def = a.get(1, "default");
    r = v ? *v : def ? *def : Value::none();
    return true;
  }
  if (name == "items" || name == "keys" || name == "values") {
    std::vector<Value> out;
    for (const auto& [k, x] : d.items)
      out.push_back(name == "items"  ? Value::make_list({key_value(k), x}, true)
                    : name == "keys" ? key_value(k)
                                     : x);
    r = Value::make_list(std::move(out));
    return true;
  }
  if (name == "update" || name == "pop" || name == "setdefault" || name == "clear" || name == "popitem")
    error_at(a.line, fmt::format("access to attribute '{}' of 'dict' object is unsafe", name));
  return false;
}

Value Interp::call_method(const Value& obj, const std::string& name, CallArgs& a) {
  const int line = a.line;
  if (obj.is_list()) {
    if (name == "index" || name == "count") {
      if (a.pos.empty()) error_at(line, fmt::format("list.{} needs an argument", name));
      int64_t n = 0;
      for (size_t k = 0; k < obj.list->size(); ++k)
        if (equals((*obj.list)[k], a.pos[0])) {
          if (name == "index") return Value::integer(int64_t(k));
          ++n;
        }
      if (name == "index") error_at(line, "list.index(x): x not in list");
      return Value::integer(n);
    }
    if (name == "append" || name == "pop" || name == "extend" || name == "insert" || name == "remove" ||
        name == "sort" || name == "reverse" || name == "clear")
      error_at(line, fmt::format("access to attribute '{}' of '{}' object is unsafe", name, kind_name(obj)));
    error_at(line, fmt::format("unsupported method '{}' of '{}'", name, kind_name(obj)));
  }
  const std::string& s = obj.s;
  charge_touch(s.size());
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = a.get(0, "chars");
    const std::string* cs = chars && chars->is_string() ? &chars->s.get() : nullptr;
    return Value::string(strip(s, cs, name != "rstrip", name != "lstrip"));
  }
  if (name == "split")
    return Value::make_list(split(s, a.get(0, "sep"), int_arg(a, 1, "maxsplit", -1), line));
  if (name == "rsplit") {
    const Value* sep = a.get(0, "sep");
    const int64_t maxsplit = int_arg(a, 1, "maxsplit", -1);
    if (maxsplit < 0 || !sep || !sep->is_string() || sep->s.empty())
      return Value::make_list(split(s, sep, maxsplit, line));
    std::vector<Value> out;
    size_t end = s.size();
    while (int64_t(out.size()) < maxsplit) {
      const size_t f = end >= sep->s.size() ? s.rfind(sep->s, end - sep->s.size()) : std::string::npos;
      if (f == std::string::npos) break;
      out.insert(out.begin(), Value::string(s.substr(f + sep->s.size(), end - f - sep->s.size())));
      end = f;
    }
    out.insert(out.begin(), Value::string(s.substr(0, end)));
    return Value::make_list(std::move(out));
  }
  if (name == "splitlines") {
    std::vector<Value> out;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t e = s.find_first_of("\r\n", pos);
      if (e == std::string::npos) {
        out.push_back(Value::string(s.substr(pos)));
        break;
      }
      out.push_back(Value::string(s.substr(pos, e - pos)));
      pos = e + ((s[e] == '\r' && e + 1 < s.size() && s[e + 1] == '\n') ? 2 : 1);
    }
    return Value::make_list(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    const Value* p = a.get(0, "prefix");
    if (!p) error_at(line, fmt::format("{} needs an argument", name));
    std::vector<Value> cands = p->is_list() ? *p->list : std::vector<Value>{*p};
    for (const auto& c : cands) {
      if (!c.is_string()) error_at(line, fmt::format("{} argument must be str", name));
      if (c.s.size() <= s.size() &&
          (name == "startswith" ? s.compare(0, c.s.size(), c.s) == 0
                                : s.compare(s.size() - c.s.size(), c.s.size(), c.s) == 0))
        return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "upper") return Value::string(upper(s));
  if (name == "lower") return Value::string(lower(s));
  if (name == "title") return Value::string(title(s));
  if (name == "capitalize") return Value::string(capitalize(s));
  if (name == "replace") {
    if (a.pos.size() < 2 || !a.pos[0].is_string() || !a.pos[1].is_string())
      error_at(line, "replace needs two strings");
    return Value::string(replace(s, a.pos[0].s, a.pos[1].s, int_arg(a, 2, "count", -1), limits.max_output));
  }
  if (name == "format") {
    std::string r = py_format(s, a);
    if (r.size() > limits.max_output) error_at(line, "format result exceeds the size limit");
    return Value::string(std::move(r));
  }
  if (name == "join") {
    if (a.pos.empty()) error_at(line, "join needs an argument");
    std::string out;
    bool first = true;
    for (const auto& x : iterate(a.pos[0], line)) {
      if (!x.is_string()) error_at(line, "sequence item: expected str instance");
      if (!first) out += s;
      first = false;
      out += x.s.get();
      if (out.size() > limits.max_output) error_at(line, "join result exceeds the size limit");
    }
    return Value::string(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    if (a.pos.empty() || !a.pos[0].is_string()) error_at(line, fmt::format("{} needs a string", name));
    const std::string& sub = a.pos[0].s;
    if (name == "count") {
      if (sub.empty()) return Value::integer(int64_t(code_point_count(s)) + 1);
      int64_t n = 0;
      for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) ++n;
      return Value::integer(n);
    }
    const size_t f = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (f == std::string::npos) {
      if (name == "index") error_at(line, "substring not found");
      return Value::integer(-1);
    }
    return Value::integer(int64_t(code_point_count(s.substr(0, f))));
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum") {
    if (s.empty()) return Value::boolean(false);
    for (unsigned char c : s) {
      const bool ok = name == "isdigit"   ? std::isdigit(c)
                      : name == "isalpha" ? std::isalpha(c)
                      : name == "isspace" ? is_ws(char(c))
                                          : std::isalnum(c);
      if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  if (name == "islower") return Value::boolean(lower(s) == s && upper(s) != s);
  if (name == "isupper") return Value::boolean(upper(s) == s && lower(s) != s);
  error_at(line, fmt::format("unsupported method '{}' of 'str'", name));
}

void install_globals(Interp& in) {
  in.set_var("range", Value::function("range", [](Interp& it, CallArgs& a) {
               int64_t start = 0, stop, step = 1;
               if (a.pos.empty() || a.pos.size() > 3) error_at(a.line, "range expects 1 to 3 arguments");
               for (const auto& v : a.pos)
                 if (v.kind != Kind::Int) error_at(a.line, "range arguments must be integers");
               if (a.pos.size() == 1) {
                 stop = a.pos[0].i;
               } else {
                 start = a.pos[0].i;
                 stop = a.pos[1].i;
                 if (a.pos.size() == 3) step = a.pos[2].i;
               }
               if (step == 0) error_at(a.line, "range() arg 3 must not be zero");
               std::vector<Value> out;
               for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
                 if (out.size() >= 100000) error_at(a.line, "range too large");
                 it.step(a.line);
                 out.push_back(Value::integer(k));
                 if ((step > 0 && k > INT64_MAX - step) || (step < 0 && k < INT64_MIN - step)) break;
               }
               return Value::make_list(std::move(out));
             }));
  auto make_dict = [](bool ns) {
    return [ns](Interp& it, CallArgs& a) {
      Value d = Value::make_dict(ns);
      if (ns) it.namespaces_.push_back(d.dict);
      for (const auto& p : a.pos) {
        if (!p.is_dict()) error_at(a.line, ns ? "namespace() takes a mapping" : "dict() takes a mapping");
        for (const auto& [k, v] : p.dict->items) d.dict->set(k, v);
      }
      for (const auto& [k, v] : a.kw) d.dict->set(k, v);
      return d;
    };
  };
  in.set_var("dict", Value::function("dict", make_dict(false)));
  in.set_var("namespace", Value::function("namespace", make_dict(true)));
  in.set_var("raise_exception", Value::function("raise_exception", [](Interp&, CallArgs& a) -> Value {
               const std::string msg = a.pos.empty() ? std::string("raise_exception") : to_str(a.pos[0]);
               fail("chat template line {}: {}", a.line, msg);
             }));
  in.set_var("strftime_now", Value::function("strftime_now", [](Interp& it, CallArgs& a) {
               if (a.pos.empty() || !a.pos[0].is_string())
                 error_at(a.line, "strftime_now needs a format string");
               const std::time_t t = it.globals.now ? std::time_t(it.globals.now) : std::time(nullptr);
               std::tm tm{};
               localtime_r(&t, &tm);
               char buf[512];
               const std::string& f = a.pos[0].s;
               if (f.size() > 200) error_at(a.line, "strftime_now format too long");
               const size_t n = std::strftime(buf, sizeof buf, f.c_str(), &tm);
               return Value::string(std::string(buf, n));
             }));
}

}  // namespace ultra::jinja
