// Jinja values: Python's str(), repr(), json.dumps, equality and ordering of them.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "chat/jinja.h"
#include "core/error.h"

namespace ultra::jinja {

void error_at(int line, const std::string& what) {
  fail("chat template line {}: {}", line, what);
}

void release_later(void* p, void (*destroy)(void*)) {
  thread_local std::vector<std::pair<void*, void (*)(void*)>> pending;
  thread_local bool draining = false;
  pending.emplace_back(p, destroy);
  if (draining) return;  // an outer call is freeing a container that held this one: it frees this one too
  draining = true;
  while (!pending.empty()) {
    const auto [q, d] = pending.back();
    pending.pop_back();
    d(q);  // may queue the containers it held
  }
  draining = false;
}

Meter*& Meter::slot() {
  thread_local Meter* current = nullptr;
  return current;
}

Meter::Meter(const Budget& b)
    : budget_(b), saved_(slot()), start_(std::chrono::steady_clock::now()), next_check_(kCheckEvery) {
  if (budget_.cancel && budget_.cancel->load(std::memory_order_relaxed))
    fail("chat template render was cancelled");  // before installing: no destructor runs after a throw
  slot() = this;
}

Meter::~Meter() {
  slot() = saved_;
}

double Meter::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Meter::over_bytes() const {
  fail("chat template render exceeded its memory budget ({} bytes allocated, at most {})", bytes_,
       budget_.max_bytes);
}

void Meter::check() {
  next_check_ = work_ + kCheckEvery;
  if (work_ > budget_.max_work)
    fail("chat template render exceeded its work budget ({} units of steps and bytes touched)",
         budget_.max_work);
  if (budget_.cancel && budget_.cancel->load(std::memory_order_relaxed))
    fail("chat template render was cancelled");
  if (seconds() > budget_.max_seconds)
    fail("chat template render exceeded its time budget ({} s)", budget_.max_seconds);
}

static void check_nesting(int depth) {
  if (depth > kMaxNesting) fail("chat template: a value is nested deeper than {} levels", kMaxNesting);
}

Value Value::make_dict(bool is_namespace) {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::shared_ptr<Dict>(new Dict(), IterativeDelete<Dict>{});
  v.dict->is_namespace = is_namespace;
  return v;
}

Value Value::function(std::string name, std::function<Value(Interp&, CallArgs&)> fn) {
  Value v;
  v.kind = Kind::Func;
  v.func = std::make_shared<Func>(Func{std::move(name), std::move(fn)});
  return v;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return b;
    case Kind::Int:
      return i != 0;
    case Kind::Float:
      return f != 0;
    case Kind::String:
      return !s.empty();
    case Kind::List:
      return !list->empty();
    case Kind::Dict:
      return dict->is_namespace || !dict->items.empty();
    case Kind::Func:
      return true;
  }
  return false;
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  charge_alloc(sizeof(items[0]) + key.size());
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::get(size_t idx, const char* name) const {
  if (idx < pos.size()) return &pos[idx];
  if (name)
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
  return nullptr;
}

const char* kind_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return v.tuple ? "tuple" : "list";
    case Kind::Dict:
      return v.dict->is_namespace ? "Namespace" : "dict";
    case Kind::Func:
      return "function";
  }
  return "?";
}

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: exponent form when exp < -4 or >= 16.
  char buf[64];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string e(buf);
  const size_t epos = e.find('e');
  std::string mant = e.substr(0, epos);
  const int exp = std::atoi(e.c_str() + epos + 1);
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  } else if (exp < 0) {
    out = "0." + std::string(size_t(-exp - 1), '0') + digits;
  } else {
    if (digits.size() <= size_t(exp) + 1) {
      out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
  }
  if (neg) out.insert(out.begin(), '-');
  return out;
}

constexpr size_t kMaxBuilt = 32u << 20;

// A string that repr() or json.dumps() is building: shared strings let a small list stand for gigabytes of
// text, so the size is bounded (and charged as work) while it grows, not once it is done.
static void check_built(const std::string& out) {
  charge_touch(out.size());
  if (out.size() > kMaxBuilt)
    fail("chat template: a value's text exceeds the size limit ({} bytes)", kMaxBuilt);
}

static std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += char(c);
    }
  }
  out += q;
  return out;
}

std::string repr(const Value& v, int depth) {
  check_nesting(depth);
  switch (v.kind) {
    case Kind::String:
      return repr_string(v.s);
    case Kind::List: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += repr((*v.list)[k], depth + 1);
        check_built(out);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Kind::Dict: {
      std::string out = v.dict->is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr(key_value(k)) + ": " + repr(x, depth + 1);
        check_built(out);
      }
      return out + (v.dict->is_namespace ? "}>" : "}");
    }
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return v.b ? "True" : "False";
    case Kind::Int:
      return std::to_string(v.i);
    case Kind::Float:
      return py_float(v.f);
    case Kind::String:
      return v.s;
    case Kind::List:
    case Kind::Dict:
      return repr(v);
    case Kind::Func:
      return "<function " + v.func->name + ">";
  }
  return "";
}

static void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += char(c);
    }
  }
  out += '"';
}

static void json_rec(std::string& out, const Value& v, int indent, bool sort_keys, const std::string& isep,
                     const std::string& ksep, int level) {
  if (level > 200) fail("chat template: tojson: value nested too deeply");
  auto newline = [&](int lvl) {
    if (indent >= 0) {
      out += '\n';
      out.append(size_t(indent) * size_t(lvl), ' ');
    }
  };
  switch (v.kind) {
    case Kind::Undefined:
      fail("chat template: tojson: Object of type Undefined is not JSON serializable");
    case Kind::None:
      out += "null";
      return;
    case Kind::Bool:
      out += v.b ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.i);
      return;
    case Kind::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : py_float(v.f);
      return;
    case Kind::String:
      json_string(out, v.s);
      return;
    case Kind::List: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += isep;
        newline(level + 1);
        json_rec(out, (*v.list)[k], indent, sort_keys, isep, ksep, level + 1);
        check_built(out);
      }
      newline(level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.dict->is_namespace)
        fail("chat template: tojson: Object of type Namespace is not JSON serializable");
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      bool first = true;
      for (auto* kv : items) {
        if (!first) out += isep;
        first = false;
        newline(level + 1);
        json_string(out, to_str(key_value(kv->first)));
        out += ksep;
        json_rec(out, kv->second, indent, sort_keys, isep, ksep, level + 1);
        check_built(out);
      }
      newline(level);
      out += '}';
      return;
    }
    case Kind::Func:
      fail("chat template: tojson: Object of type function is not JSON serializable");
  }
}

std::string to_json(const Value& v, int indent, bool sort_keys, const std::string& item_sep,
                    const std::string& key_sep) {
  std::string out;
  json_rec(out, v, indent, sort_keys, item_sep, key_sep, 0);
  return out;
}

Value from_json(const nlohmann::json& j, int depth) {
  // The messages come from requests: nesting is bounded before it can exhaust the stack.
  if (depth > kMaxJsonDepth) fail("chat template: the input is nested deeper than {} levels", kMaxJsonDepth);
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return Value::number(double(u));
      return Value::integer(int64_t(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::number(j.get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      for (const auto& x : j) items.push_back(from_json(x, depth + 1));
      return Value::make_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::make_dict();
      for (auto it = j.begin(); it != j.end(); ++it) {
        charge_alloc(sizeof(d.dict->items[0]) + it.key().size());
        d.dict->items.emplace_back(it.key(), from_json(it.value(), depth + 1));
      }
      return d;
    }
    default:
      return Value::none();
  }
}

bool equals(const Value& a, const Value& b, int depth) {
  check_nesting(depth);
  charge_touch(a.is_string() && b.is_string() ? std::min(a.s.size(), b.s.size()) : 0);
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) return a.as_double() == b.as_double();
    const int64_t x = a.kind == Kind::Bool ? a.b : a.i, y = b.kind == Kind::Bool ? b.b : b.i;
    return x == y;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return a.s == b.s;
    case Kind::List: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k], depth + 1)) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict == b.dict) return true;
      if (a.dict->is_namespace || b.dict->is_namespace) return false;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(v, *o, depth + 1)) return false;
      }
      return true;
    }
    case Kind::Func:
      return a.func == b.func;
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b, int line, int depth) {
  check_nesting(depth);
  charge_touch(a.is_string() && b.is_string() ? std::min(a.s.size(), b.s.size()) : 0);
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const int64_t x = a.kind == Kind::Bool ? a.b : a.i, y = b.kind == Kind::Bool ? b.b : b.i;
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.s.get().compare(b.s.get());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      const int c = compare((*a.list)[k], (*b.list)[k], line, depth + 1);
      if (c) return c;
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  error_at(line,
           fmt::format("'<' not supported between instances of '{}' and '{}'", kind_name(a), kind_name(b)));
}

std::string dict_key(const Value& k, int line) {
  if (k.is_string()) return k.s;
  if (k.kind == Kind::Int) return "\x01" + std::to_string(k.i);
  if (k.kind == Kind::Bool) return "\x01" + std::to_string(int(k.b));
  error_at(line, fmt::format("unsupported: dict key of type '{}'", kind_name(k)));
}

Value key_value(const std::string& k) {
  if (!k.empty() && k[0] == '\x01') return Value::integer(std::strtoll(k.c_str() + 1, nullptr, 10));
  return Value::string(k);
}

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    const unsigned char c = s[k];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (k + n > s.size()) n = 1;
    out.push_back(s.substr(k, n));
    k += n;
  }
  return out;
}

size_t code_point_count(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

}  // namespace ultra::jinja
