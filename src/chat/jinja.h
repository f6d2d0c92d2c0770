// ultra's Jinja interpreter (the subset chat templates use, with jinja2 3.1's semantics in HF transformers'
// environment): values, tokens, the syntax tree, and the entry points of the lexer, parser and evaluator.
// Internal to src/chat; the public face is chat_template.h.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace ultra::jinja {

// ---- the budget of a render ----

// What one render may spend (see RenderBudget in chat_template.h) besides the per-value limits of Limits.
// A render installs a Meter for its thread; creating a string, list or dict charges its bytes to it, and
// the evaluator and builtins charge the work they do. Outside a render (parsing) nothing is charged.
//
// Work is counted in units: one per evaluated node or loop iteration (a step), plus one per kBytesPerWork
// bytes a step reads or writes (copying, comparing, searching, appending to the output).
constexpr size_t kBytesPerWork = 64;

class Meter {
 public:
  struct Budget {
    size_t max_bytes;
    uint64_t max_work;
    double max_seconds;
    const std::atomic<bool>* cancel;
  };
  explicit Meter(const Budget& b);  // installs itself for the calling thread
  ~Meter();                         // uninstalls
  Meter(const Meter&) = delete;
  Meter& operator=(const Meter&) = delete;

  static Meter* current() { return slot(); }
  // While one exists, nothing is charged on this thread: the bookkeeping of the evaluator itself (a loop's
  // `loop` object, rebuilt each iteration and freed with it) is paid for by the step it belongs to.
  class Pause {
   public:
    Pause() : saved_(slot()) { slot() = nullptr; }
    ~Pause() { slot() = saved_; }
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    Meter* saved_;
  };
  // Charges `bytes` allocated (they count as touched too); throws ultra::Error past max_bytes.
  void alloc(size_t bytes) {
    bytes_ += bytes;
    if (bytes_ > budget_.max_bytes) over_bytes();
    work(1 + bytes / kBytesPerWork);
  }
  // Charges work units; every kCheckEvery units also the wall clock and the cancel flag.
  void work(uint64_t units) {
    work_ += units;
    if (work_ >= next_check_) check();
  }
  void touch(size_t bytes) { work(1 + bytes / kBytesPerWork); }
  size_t bytes() const { return bytes_; }
  uint64_t work_done() const { return work_; }
  double seconds() const;

 private:
  static constexpr uint64_t kCheckEvery = 4096;
  // This thread's meter. A function rather than a thread_local member: GCC's UBSan reports accesses to a
  // thread_local static member from another translation unit as stores to a null pointer.
  static Meter*& slot();
  [[noreturn]] void over_bytes() const;
  void check();
  Budget budget_;
  Meter* saved_;
  std::chrono::steady_clock::time_point start_;
  size_t bytes_ = 0;
  uint64_t work_ = 0;
  uint64_t next_check_ = 0;
};

inline void charge_alloc(size_t bytes) {
  if (Meter* m = Meter::current()) m->alloc(bytes);
}
inline void charge_touch(size_t bytes) {
  if (Meter* m = Meter::current()) m->touch(bytes);
}

// ---- values ----

// An immutable string shared between the values that hold it: copying a value (a variable lookup, a loop
// binding, a list element) is O(1) whatever the string's length. Making one from a std::string charges the
// render's Meter. Reads as a const std::string&.
class Str {
 public:
  Str() = default;
  Str(std::string s) {  // NOLINT(google-explicit-constructor): values are made from strings everywhere
    if (s.empty()) return;
    charge_alloc(s.size() + 64);
    p_ = std::make_shared<const std::string>(std::move(s));
  }
  const std::string& get() const { return p_ ? *p_ : empty_string(); }
  operator const std::string&() const { return get(); }  // NOLINT(google-explicit-constructor)
  size_t size() const { return get().size(); }
  bool empty() const { return get().empty(); }
  const char* c_str() const { return get().c_str(); }
  friend bool operator==(const Str& a, const Str& b) { return a.p_ == b.p_ || a.get() == b.get(); }
  friend bool operator==(const Str& a, const std::string& b) { return a.get() == b; }
  friend bool operator==(const Str& a, const char* b) { return a.get() == b; }

 private:
  static const std::string& empty_string() {
    static const std::string e;
    return e;
  }
  std::shared_ptr<const std::string> p_;
};

struct Value;
struct Dict;

// Values nested deeper than this are an error where they are printed, compared or converted (a template
// can build a list 10^5 levels deep, or a namespace that holds itself).
constexpr int kMaxNesting = 200;

// Containers are freed iteratively: destroying a deeply nested value would otherwise recurse once per level
// (and overflow the stack). The deleter of every list and dict hands the object to release_later.
void release_later(void* p, void (*destroy)(void*));
template <class T>
struct IterativeDelete {
  void operator()(T* p) const {
    release_later(p, [](void* q) { delete static_cast<T*>(q); });
  }
};
struct Func;
struct CallArgs;
class Interp;

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Func };

struct Value {
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  Str s;  // String; for Undefined, the name that was undefined
  std::shared_ptr<std::vector<Value>> list;
  bool tuple = false;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Func> func;

  static Value undefined(std::string name = {}) {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value none() {
    Value v;
    v.kind = Kind::None;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.kind = Kind::Bool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.kind = Kind::Int;
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v;
    v.kind = Kind::Float;
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v;
    v.kind = Kind::String;
    v.s = Str(std::move(x));
    return v;
  }
  static Value string(Str x) {
    Value v;
    v.kind = Kind::String;
    v.s = std::move(x);
    return v;
  }
  static Value make_list(std::vector<Value> items = {}, bool is_tuple = false) {
    charge_alloc(items.size() * sizeof(Value) + 64);
    Value v;
    v.kind = Kind::List;
    v.list = std::shared_ptr<std::vector<Value>>(new std::vector<Value>(std::move(items)),
                                                 IterativeDelete<std::vector<Value>>{});
    v.tuple = is_tuple;
    return v;
  }
  static Value make_dict(bool is_namespace = false);
  static Value function(std::string name, std::function<Value(Interp&, CallArgs&)> fn);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  double as_double() const { return kind == Kind::Float ? f : kind == Kind::Bool ? (b ? 1 : 0) : double(i); }
  bool truthy() const;
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  int line = 0;
  // Argument `idx` (positional) or `name` (keyword); nullptr when absent.
  const Value* get(size_t idx, const char* name) const;
};

struct Func {
  std::string name;
  std::function<Value(Interp&, CallArgs&)> fn;
};

const char* kind_name(const Value& v);
std::string to_str(const Value& v);               // Python str()
std::string repr(const Value& v, int depth = 0);  // Python repr()
std::string py_float(double d);                   // Python repr of a float
std::string to_json(const Value& v, int indent, bool sort_keys, const std::string& item_sep,
                    const std::string& key_sep);  // json.dumps(ensure_ascii=False)
// JSON -> Value; throws ultra::Error for input nested deeper than kMaxJsonDepth.
constexpr int kMaxJsonDepth = 128;
Value from_json(const nlohmann::json& j, int depth = 0);
bool equals(const Value& a, const Value& b, int depth = 0);
// <0, 0, >0; throws (via the callback's message) when the values are not orderable.
int compare(const Value& a, const Value& b, int line, int depth = 0);

// Dict keys are strings; an integer key is stored as "\x01" + its digits (Python dicts with int keys).
std::string dict_key(const Value& k, int line);
Value key_value(const std::string& k);

// UTF-8 code point helpers (Python indexes strings by code point).
std::vector<std::string> code_points(const std::string& s);
size_t code_point_count(const std::string& s);

// ---- tokens ----

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
  Tok type;
  std::string text;  // Text, Name, String (unescaped), Op, Int/Float spelling
  int line;
  int64_t ival = 0;
  double fval = 0;
};

std::vector<Token> lex(const std::string& source);

// ---- syntax tree ----

struct Expr;
using ExprP = std::unique_ptr<Expr>;

enum class EK {
  Literal,
  Name,
  List,
  Tuple,
  Dict,
  Attr,
  Item,
  Slice,
  Call,
  Filter,
  Test,
  Unary,
  Binary,
  And,
  Or,
  Not,
  Cond
};

struct Expr {
  EK kind;
  int line = 0;
  Value value;               // Literal
  std::string name;          // Name, Attr (attribute), Filter / Test name, Unary / Binary op
  std::vector<ExprP> items;  // List/Tuple/Dict (key, value pairs flattened); Call/Filter/Test positional args
  std::vector<std::pair<std::string, ExprP>> kwargs;
  ExprP a, b, c;  // operands: Attr/Item/Slice/Call/Filter/Test base = a; Item index = b; Slice a[b:c:items]
  bool negated = false;  // Test: `is not`
  ExprP step;            // Slice step
  int depth = 1;         // levels of the tree under (and including) this node: the evaluator's recursion
};

struct Node;
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

enum class NK { Text, Output, If, For, Set, SetBlock, FilterBlock, Macro, Break, Continue, Generation };

struct Node {
  NK kind;
  int line = 0;
  std::string text;  // Text
  ExprP expr;        // Output; If cond; For iterable; Set value; FilterBlock the filters (EK::Filter chain)
  std::vector<std::pair<ExprP, Body>> branches;  // If: (cond, body) with cond null for else
  std::vector<std::string> targets;  // For / Set names (tuple unpacking when >1); Macro name = targets[0]
  ExprP target_attr;                 // Set ns.attr: the namespace expression; targets[0] the attribute
  ExprP filter;                      // For ... if cond
  Body body, else_body;
  std::vector<std::pair<std::string, ExprP>> params;  // Macro parameters (default or null)
};

Body parse(const std::vector<Token>& tokens);

// ---- evaluation ----

struct Limits {
  size_t max_output = 16u << 20;   // bytes of output or of any one string
  int max_call_depth = 64;         // nested macro calls
  uint64_t max_steps = 5'000'000;  // evaluated nodes and loop iterations
  // The render's budget (Meter): total bytes allocated, work units, wall time, a cancel flag.
  size_t max_bytes = 64u << 20;
  uint64_t max_work = uint64_t(1) << 24;
  double max_seconds = 0.25;
  const std::atomic<bool>* cancel = nullptr;
};

struct Globals {
  std::string bos_token, eos_token;
  int64_t now = 0;
};

std::string render(const Body& body, const Globals& g, const nlohmann::json& messages,
                   bool add_generation_prompt, const nlohmann::json& extra, const Limits& limits = {});

// Error helper: "chat template line N: ..."
[[noreturn]] void error_at(int line, const std::string& what);

}  // namespace ultra::jinja
