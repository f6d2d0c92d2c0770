// Jinja evaluator: statements, expressions, scoping (jinja2's: a for loop's body is a fresh scope each
// iteration, each macro call another, and a macro sees the scopes it was defined in: a closure, referring to
// them weakly, see Interp::frames_), loop variables, macros, and the limits that keep a hostile template
// from running away (nesting, macro recursion, steps, output size).
#include <fmt/format.h>

#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "chat/jinja.h"
#include "chat/jinja_builtins.h"
#include "core/error.h"

namespace ultra::jinja {

namespace {

enum class Flow { Normal, Break, Continue };

bool checked_add(int64_t a, int64_t b, int64_t* r) {
  return !__builtin_add_overflow(a, b, r);
}

}  // namespace

class InterpImpl : public Interp {
 public:
  using Interp::Interp;

  Flow exec(const Body& body) {
    for (const auto& n : body) {
      const Flow f = exec(*n);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  void emit(const std::string& s) {
    charge_touch(s.size());
    out_->append(s);
    if (out_->size() > limits.max_output) error_at(0, "output exceeds the size limit");
  }

  Flow exec(const Node& n) {
    step(n.line);
    check_stack(n.line);
    switch (n.kind) {
      case NK::Text:
        emit(n.text);
        return Flow::Normal;
      case NK::Output: {
        const Value v = eval(*n.expr);
        if (v.is_string())
          emit(v.s);
        else
          emit(to_str(v));
        return Flow::Normal;
      }
      case NK::If:
        for (const auto& [cond, body] : n.branches)
          if (!cond || eval(*cond).truthy()) return exec(body);
        return Flow::Normal;
      case NK::For:
        return exec_for(n);
      case NK::Set: {
        Value v = eval(*n.expr);
        assign(n, std::move(v));
        return Flow::Normal;
      }
      case NK::SetBlock:
      case NK::FilterBlock: {
        std::string buf;
        std::string* saved = out_;
        out_ = &buf;
        try {
          exec(n.body);
        } catch (...) {
          out_ = saved;
          throw;
        }
        out_ = saved;
        if (n.kind == NK::SetBlock) {
          assign(n, Value::string(std::move(buf)));
        } else {
          emit(to_str(filter_chain(*n.expr, Value::string(std::move(buf)))));
        }
        return Flow::Normal;
      }
      case NK::Macro: {
        const Node* node = &n;
        // The closure: weak references to the scopes the macro is defined in (see Interp::frames_).
        std::vector<std::weak_ptr<Scope>> scopes(frames_.begin(), frames_.end());
        set_var(n.targets[0],
                Value::function(n.targets[0], [node, scopes = std::move(scopes)](Interp& in, CallArgs& a) {
                  return static_cast<InterpImpl&>(in).call_macro(*node, scopes, a);
                }));
        return Flow::Normal;
      }
      case NK::Break:
        return Flow::Break;
      case NK::Continue:
        return Flow::Continue;
      case NK::Generation:
        return exec(n.body);
    }
    return Flow::Normal;
  }

  void assign(const Node& n, Value v) {
    if (n.target_attr) {
      Value ns = eval(*n.target_attr);
      if (!ns.is_dict() || !ns.dict->is_namespace)
        error_at(n.line, "cannot assign attribute on non-namespace object");
      ns.dict->set(n.targets[0], std::move(v));
      return;
    }
    if (n.targets.size() == 1) {
      set_var(n.targets[0], std::move(v));
      return;
    }
    std::vector<Value> items = iterate(v, n.line);
    if (items.size() != n.targets.size())
      error_at(n.line, fmt::format("cannot unpack {} values into {} names", items.size(), n.targets.size()));
    for (size_t k = 0; k < items.size(); ++k) set_var(n.targets[k], std::move(items[k]));
  }

  Flow exec_for(const Node& n) {
    Value seq = eval(*n.expr);
    std::vector<Value> all = iterate(seq, n.line);
    std::vector<Value> items;
    if (n.filter) {
      for (auto& x : all) {
        step(n.line);
        push_scope();
        try {
          bind_targets(n, x);
          const bool keep = eval(*n.filter).truthy();
          frames_.pop_back();
          if (keep) items.push_back(std::move(x));
        } catch (...) {
          frames_.pop_back();
          throw;
        }
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) {
      if (!n.else_body.empty()) return exec(n.else_body);
      return Flow::Normal;
    }
    const int64_t len = int64_t(items.size());
    for (int64_t k = 0; k < len; ++k) {
      step(n.line);
      push_scope();
      try {
        Value loop;
        {
          const Meter::Pause bookkeeping;
          loop = Value::make_dict();
          Dict& d = *loop.dict;
          d.set("index", Value::integer(k + 1));
          d.set("index0", Value::integer(k));
          d.set("revindex", Value::integer(len - k));
          d.set("revindex0", Value::integer(len - k - 1));
          d.set("first", Value::boolean(k == 0));
          d.set("last", Value::boolean(k == len - 1));
          d.set("length", Value::integer(len));
          d.set("depth", Value::integer(1));
          d.set("depth0", Value::integer(0));
          d.set("previtem", k > 0 ? items[size_t(k - 1)] : Value::undefined("previtem"));
          d.set("nextitem", k + 1 < len ? items[size_t(k + 1)] : Value::undefined("nextitem"));
          d.set("cycle", Value::function("cycle", [k](Interp&, CallArgs& a) {
                  if (a.pos.empty()) return Value::undefined();
                  return a.pos[size_t(k) % a.pos.size()];
                }));
        }
        set_var("loop", std::move(loop));
        bind_targets(n, items[size_t(k)]);
        const Flow f = exec(n.body);
        frames_.pop_back();
        if (f == Flow::Break) break;
      } catch (...) {
        frames_.pop_back();
        throw;
      }
    }
    return Flow::Normal;
  }

  void bind_targets(const Node& n, const Value& x) {
    if (n.targets.size() == 1) {
      set_var(n.targets[0], x);
      return;
    }
    std::vector<Value> parts = iterate(x, n.line);
    if (parts.size() != n.targets.size())
      error_at(n.line, fmt::format("cannot unpack {} values into {} names", parts.size(), n.targets.size()));
    for (size_t k = 0; k < parts.size(); ++k) set_var(n.targets[k], parts[k]);
  }

  Value call_macro(const Node& m, const std::vector<std::weak_ptr<Scope>>& scopes, CallArgs& a) {
    if (call_depth_ >= limits.max_call_depth) error_at(m.line, "macro calls nested too deeply");
    if (a.pos.size() > m.params.size())
      error_at(a.line,
               fmt::format("macro '{}' takes no more than {} argument(s)", m.targets[0], m.params.size()));
    // The macro sees the scopes it was defined in that still exist (their names as they are now: jinja2's
    // late binding), and sets names in a scope of its own.
    std::vector<std::shared_ptr<Scope>> saved;
    saved.swap(frames_);
    for (const auto& w : scopes)
      if (auto sc = w.lock()) frames_.push_back(std::move(sc));
    push_scope();
    std::string buf;
    std::string* saved_out = out_;
    out_ = &buf;
    ++call_depth_;
    try {
      for (const auto& [k, v] : a.kw) {
        bool known = false;
        for (const auto& pr : m.params) known |= pr.first == k;
        if (!known) error_at(a.line, fmt::format("macro '{}' has no parameter '{}'", m.targets[0], k));
      }
      for (size_t k = 0; k < m.params.size(); ++k) {
        const Value* v = a.get(k, m.params[k].first.c_str());
        if (v)
          set_var(m.params[k].first, *v);
        else if (m.params[k].second)
          set_var(m.params[k].first, eval(*m.params[k].second));
        else
          set_var(m.params[k].first, Value::undefined(m.params[k].first));
      }
      exec(m.body);
    } catch (...) {
      --call_depth_;
      out_ = saved_out;
      frames_.swap(saved);
      throw;
    }
    --call_depth_;
    out_ = saved_out;
    frames_.swap(saved);
    return Value::string(std::move(buf));
  }

  // ---- expressions ----
  Value eval(const Expr& e) {
    step(e.line);
    check_stack(e.line);
    switch (e.kind) {
      case EK::Literal:
        return e.value;
      case EK::Name:
        return lookup(e.name);
      case EK::List:
      case EK::Tuple: {
        std::vector<Value> items;
        for (const auto& x : e.items) items.push_back(eval(*x));
        return Value::make_list(std::move(items), e.kind == EK::Tuple);
      }
      case EK::Dict: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
          Value key = eval(*e.items[k]);
          d.dict->set(dict_key(key, e.line), eval(*e.items[k + 1]));
        }
        return d;
      }
      case EK::Attr: {
        Value base = eval(*e.a);
        return get_attr(base, e.name, e.line);
      }
      case EK::Item: {
        Value base = eval(*e.a);
        Value idx = eval(*e.b);
        return get_item(base, idx, e.line);
      }
      case EK::Slice:
        return slice(e);
      case EK::Call:
        return call(e);
      case EK::Filter: {
        Value base = eval(*e.a);
        CallArgs args = eval_args(e);
        return apply_filter(e.name, std::move(base), args);
      }
      case EK::Test: {
        if (e.name == "defined" || e.name == "undefined") {
          const bool def = !eval(*e.a).is_undefined();
          return Value::boolean((e.name == "defined") == def ? !e.negated : e.negated);
        }
        Value base = eval(*e.a);
        CallArgs args = eval_args(e);
        const bool r = apply_test(e.name, base, args);
        return Value::boolean(e.negated ? !r : r);
      }
      case EK::Unary: {
        Value v = eval(*e.a);
        if (!v.is_number())
          error_at(e.line, fmt::format("bad operand type for unary {}: '{}'", e.name, kind_name(v)));
        if (e.name == "+") return v.kind == Kind::Bool ? Value::integer(v.b) : v;
        if (v.kind == Kind::Float) return Value::number(-v.f);
        const int64_t x = v.kind == Kind::Bool ? v.b : v.i;
        if (x == INT64_MIN) error_at(e.line, "integer overflow");
        return Value::integer(-x);
      }
      case EK::Binary:
        return binary(e);
      case EK::And: {
        Value a = eval(*e.a);
        return a.truthy() ? eval(*e.b) : a;
      }
      case EK::Or: {
        Value a = eval(*e.a);
        return a.truthy() ? a : eval(*e.b);
      }
      case EK::Not:
        return Value::boolean(!eval(*e.a).truthy());
      case EK::Cond:
        if (eval(*e.b).truthy()) return eval(*e.a);
        return e.c ? eval(*e.c) : Value::undefined();
    }
    return Value::undefined();
  }

  // A {% filter %} block's chain (EK::Filter nodes, the innermost's base null) applied to v.
  Value filter_chain(const Expr& f, Value v) {
    if (f.a) v = filter_chain(*f.a, std::move(v));
    CallArgs args = eval_args(f);
    return apply_filter(f.name, std::move(v), args);
  }

  CallArgs eval_args(const Expr& e) {
    CallArgs a;
    a.line = e.line;
    for (const auto& x : e.items) a.pos.push_back(eval(*x));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
    return a;
  }

  Value call(const Expr& e) {
    if (e.a->kind == EK::Attr) {
      Value obj = eval(*e.a->a);
      const std::string& name = e.a->name;
      if (obj.is_undefined())
        error_at(e.line, fmt::format("'{}' is undefined", obj.s.empty() ? "value" : obj.s.get()));
      if (obj.is_dict() && !obj.dict->is_namespace) {
        CallArgs a = eval_args(e);
        Value r;
        if (call_dict_method(obj, name, a, r)) return r;
      } else if (obj.is_string() || obj.is_list()) {
        CallArgs a = eval_args(e);
        return call_method(obj, name, a);
      }
      Value f = get_attr(obj, name, e.line);
      return invoke(f, e, name);
    }
    Value f = eval(*e.a);
    return invoke(f, e, e.a->kind == EK::Name ? e.a->name : std::string("expression"));
  }

  Value invoke(const Value& f, const Expr& e, const std::string& what) {
    if (f.kind != Kind::Func) {
      if (f.is_undefined()) error_at(e.line, fmt::format("'{}' is undefined", what));
      error_at(e.line, fmt::format("'{}' object is not callable", kind_name(f)));
    }
    CallArgs a = eval_args(e);
    return f.func->fn(*this, a);
  }

  Value slice(const Expr& e) {
    Value base = eval(*e.a);
    auto opt = [&](const ExprP& x, bool& has) -> int64_t {
      has = false;
      if (!x) return 0;
      Value v = eval(*x);
      if (v.is_none()) return 0;
      if (v.kind != Kind::Int) error_at(e.line, "slice indices must be integers or None");
      has = true;
      return v.i;
    };
    bool hlo, hhi, hst;
    int64_t lo = opt(e.b, hlo), hi = opt(e.c, hhi), st = opt(e.step, hst);
    if (!hst) st = 1;
    if (st == 0) error_at(e.line, "slice step cannot be zero");
    // Strings are sliced by code point: offs[k] is the byte offset of code point k (offs[n] = size).
    std::vector<size_t> offs;
    int64_t n;
    if (base.is_list()) {
      n = int64_t(base.list->size());
    } else if (base.is_string()) {
      const std::string& s = base.s;
      charge_alloc(s.size() * sizeof(size_t));
      for (size_t k = 0; k < s.size(); ++k)
        if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80) offs.push_back(k);
      n = int64_t(offs.size());
      offs.push_back(s.size());
    } else if (base.is_undefined()) {
      error_at(e.line, fmt::format("'{}' is undefined", base.s.empty() ? "value" : base.s.get()));
    } else {
      error_at(e.line, fmt::format("'{}' object is not subscriptable", kind_name(base)));
    }
    auto norm = [&](int64_t v, bool has, int64_t def_pos, int64_t def_neg) {
      if (!has) return st > 0 ? def_pos : def_neg;
      if (v < 0) v += n;
      if (st > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t a = norm(lo, hlo, 0, n - 1), b = norm(hi, hhi, n, -1);
    std::vector<Value> items;
    std::string s;
    // The indices a, a+st, ... up to b (excluded); stops before a step past b (st may be huge).
    const uint64_t ast = st > 0 ? uint64_t(st) : uint64_t(0) - uint64_t(st);
    for (int64_t k = a; st > 0 ? k < b : k > b; k += st) {
      if (base.is_list()) {
        items.push_back((*base.list)[size_t(k)]);
      } else {
        const size_t from = offs[size_t(k)], to = offs[size_t(k) + 1];
        s.append(base.s.get(), from, to - from);
      }
      if (uint64_t(st > 0 ? b - k : k - b) <= ast) break;
    }
    if (base.is_list()) return Value::make_list(std::move(items), base.tuple);
    return Value::string(std::move(s));
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    Value a = eval(*e.a);
    Value b = eval(*e.b);
    const int line = e.line;
    if (op == "==") return Value::boolean(equals(a, b));
    if (op == "!=") return Value::boolean(!equals(a, b));
    if (op == "<") return Value::boolean(compare(a, b, line) < 0);
    if (op == ">") return Value::boolean(compare(a, b, line) > 0);
    if (op == "<=") return Value::boolean(compare(a, b, line) <= 0);
    if (op == ">=") return Value::boolean(compare(a, b, line) >= 0);
    if (op == "in") return Value::boolean(contains(b, a, line));
    if (op == "not in") return Value::boolean(!contains(b, a, line));
    if (op == "~") {
      std::string xs, ys;
      const std::string& x = a.is_string() ? a.s.get() : (xs = to_str(a));
      const std::string& y = b.is_string() ? b.s.get() : (ys = to_str(b));
      if (x.size() + y.size() > limits.max_output) error_at(line, "result exceeds the size limit");
      return Value::string(x + y);
    }
    auto bad = [&]() -> Value {
      error_at(line, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, kind_name(a),
                                 kind_name(b)));
    };
    const bool ints =
        (a.kind == Kind::Int || a.kind == Kind::Bool) && (b.kind == Kind::Int || b.kind == Kind::Bool);
    const int64_t x = a.kind == Kind::Bool ? a.b : a.i, y = b.kind == Kind::Bool ? b.b : b.i;
    if (op == "+") {
      if (ints) {
        int64_t r;
        if (!checked_add(x, y, &r)) error_at(line, "integer overflow");
        return Value::integer(r);
      }
      if (a.is_number() && b.is_number()) return Value::number(a.as_double() + b.as_double());
      if (a.is_string() && b.is_string()) {
        if (a.s.size() + b.s.size() > limits.max_output) error_at(line, "result exceeds the size limit");
        return Value::string(a.s.get() + b.s.get());
      }
      if (a.is_list() && b.is_list()) {
        std::vector<Value> items = *a.list;
        items.insert(items.end(), b.list->begin(), b.list->end());
        return check_size(Value::make_list(std::move(items), a.tuple), line);
      }
      return bad();
    }
    if (op == "-") {
      if (ints) {
        int64_t r;
        if (__builtin_sub_overflow(x, y, &r)) error_at(line, "integer overflow");
        return Value::integer(r);
      }
      if (a.is_number() && b.is_number()) return Value::number(a.as_double() - b.as_double());
      return bad();
    }
    if (op == "*") {
      if (ints) {
        int64_t r;
        if (__builtin_mul_overflow(x, y, &r)) error_at(line, "integer overflow");
        return Value::integer(r);
      }
      if (a.is_number() && b.is_number()) return Value::number(a.as_double() * b.as_double());
      const Value* seq = a.is_string() || a.is_list() ? &a : b.is_string() || b.is_list() ? &b : nullptr;
      const Value* cnt = seq == &a ? &b : &a;
      if (seq && (cnt->kind == Kind::Int || cnt->kind == Kind::Bool)) {
        const int64_t times = cnt->kind == Kind::Bool ? cnt->b : cnt->i;
        const size_t unit = seq->is_string() ? seq->s.size() : seq->list->size();
        if (times > 0 && unit > 0 && uint64_t(times) > limits.max_output / unit)
          error_at(line, "result exceeds the size limit");
        if (seq->is_string()) {
          std::string s;
          for (int64_t k = 0; k < times; ++k) s += seq->s.get();
          return Value::string(std::move(s));
        }
        // Charged before it is built: [big] * n is n values, however large big is.
        if (times > 0) charge_alloc(uint64_t(times) * unit * sizeof(Value));
        std::vector<Value> items;
        for (int64_t k = 0; k < times; ++k) items.insert(items.end(), seq->list->begin(), seq->list->end());
        return Value::make_list(std::move(items));
      }
      return bad();
    }
    if (op == "/") {
      if (!a.is_number() || !b.is_number()) return bad();
      if (b.as_double() == 0) error_at(line, "division by zero");
      return Value::number(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (a.is_string() && op == "%") error_at(line, "unsupported: printf-style string formatting with '%'");
      if (!a.is_number() || !b.is_number()) return bad();
      if (ints) {
        if (y == 0) error_at(line, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) error_at(line, "integer overflow");
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          q -= 1;
          r += y;
        }
        return Value::integer(op == "//" ? q : r);
      }
      const double fx = a.as_double(), fy = b.as_double();
      if (fy == 0) error_at(line, "float division by zero");
      if (op == "//") return Value::number(std::floor(fx / fy));
      double r = std::fmod(fx, fy);
      if (r != 0 && ((r < 0) != (fy < 0))) r += fy;
      return Value::number(r);
    }
    if (op == "**") {
      if (!a.is_number() || !b.is_number()) return bad();
      if (ints && y >= 0) {
        int64_t r = 1, base = x, ex = y;
        while (ex > 0) {
          if (ex & 1)
            if (__builtin_mul_overflow(r, base, &r)) error_at(line, "integer overflow");
          ex >>= 1;
          if (ex > 0 && __builtin_mul_overflow(base, base, &base)) error_at(line, "integer overflow");
        }
        return Value::integer(r);
      }
      return Value::number(std::pow(a.as_double(), b.as_double()));
    }
    error_at(line, fmt::format("unsupported operator '{}'", op));
  }

  Value check_size(Value v, int line) {
    if ((v.is_string() && v.s.size() > limits.max_output) ||
        (v.is_list() && v.list->size() > limits.max_output))
      error_at(line, "result exceeds the size limit");
    return v;
  }
};

Interp::Interp(const Globals& g, const Limits& l) : globals(g), limits(l) {}

// The parser bounds a template's nesting and its expressions' depth, and macro calls nest at most
// max_call_depth deep, but their product (a macro that calls itself from inside a 200-level expression)
// can still outrun a thread's stack: the evaluator stops at a floor that leaves a reserve of the stack for
// the builtins the deepest level calls.
void Interp::set_stack_floor() {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return;
  void* lo = nullptr;
  size_t size = 0;
  const int rc = pthread_attr_getstack(&attr, &lo, &size);
  pthread_attr_destroy(&attr);
  const char* here = static_cast<const char*>(__builtin_frame_address(0));
  const char* bottom = static_cast<const char*>(lo);
  if (rc != 0 || here <= bottom || here > bottom + size) return;
  const size_t avail = size_t(here - bottom);
  stack_floor_ = bottom + std::min<size_t>(avail / 4, 256u << 10);
}

void Interp::check_stack(int line) const {
  if (static_cast<const char*>(__builtin_frame_address(0)) < stack_floor_)
    error_at(line,
             "template evaluation nested too deeply for the stack (macro calls inside deep expressions)");
}
Interp::~Interp() {
  for (const auto& w : namespaces_)
    if (const auto d = w.lock()) d->items.clear();
}

void Interp::step(int line) {
  if (++steps_ > limits.max_steps) error_at(line, "template evaluation exceeds the step limit");
  if (Meter* m = Meter::current()) m->work(1);
}

Value Interp::lookup(const std::string& name) const {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
    auto f = (*it)->find(name);
    if (f != (*it)->end()) return f->second;
  }
  return Value::undefined(name);
}

void Interp::set_var(const std::string& name, Value v) {
  (*frames_.back())[name] = std::move(v);
}

Value Interp::eval_expr(const Expr& e) {
  return static_cast<InterpImpl&>(*this).eval(e);
}

std::string render(const Body& body, const Globals& g, const nlohmann::json& messages,
                   bool add_generation_prompt, const nlohmann::json& extra, const Limits& limits) {
  const Meter meter(Meter::Budget{limits.max_bytes, limits.max_work, limits.max_seconds, limits.cancel});
  InterpImpl in(g, limits);
  in.set_stack_floor();
  in.push_scope();
  install_globals(in);
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) in.set_var(it.key(), from_json(it.value()));
  in.set_var("messages", from_json(messages));
  in.set_var("add_generation_prompt", Value::boolean(add_generation_prompt));
  in.set_var("bos_token", Value::string(g.bos_token));
  in.set_var("eos_token", Value::string(g.eos_token));
  std::string out;
  in.out_ = &out;
  const Flow f = in.exec(body);
  (void)f;
  return out;
}

}  // namespace ultra::jinja
