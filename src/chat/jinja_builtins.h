// The interpreter state the evaluator and the builtins (filters, tests, methods, global functions) share.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "chat/jinja.h"

namespace ultra::jinja {

class Interp {
 public:
  Interp(const Globals& g, const Limits& l);
  virtual ~Interp();

  Globals globals;
  Limits limits;
  // The scopes in effect, outermost first: the template's top level, then one per loop iteration and macro
  // call. Shared because a macro refers to the scopes it was defined in (jinja2's closures: a macro defined
  // in a loop or in another macro sees that loop's or macro's names when it is called) -- weakly, since the
  // innermost of them holds the macro itself: a strong reference would be a cycle (scope -> macro ->
  // scope) that is never freed. A macro called after its scope ended (stored in a namespace) no longer sees
  // that scope's names.
  using Scope = std::map<std::string, Value>;
  std::vector<std::shared_ptr<Scope>> frames_;
  void push_scope() { frames_.push_back(std::make_shared<Scope>()); }
  std::string* out_ = nullptr;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  // The namespaces made by namespace(): emptied when the render ends, which breaks any cycle a template
  // made through them ({% set ns.me = ns %}) so that its memory is freed.
  std::vector<std::weak_ptr<Dict>> namespaces_;

  void step(int line);
  // Lowest address the evaluator's frames may reach on this thread (see jinja_eval.cpp); null: unchecked.
  const char* stack_floor_ = nullptr;
  void set_stack_floor();
  void check_stack(int line) const;
  Value lookup(const std::string& name) const;
  void set_var(const std::string& name, Value v);
  Value eval_expr(const Expr& e);

  // jinja_builtins.cpp
  Value get_attr(const Value& base, const std::string& name, int line);
  Value get_item(const Value& base, const Value& idx, int line);
  std::vector<Value> iterate(const Value& v, int line);
  bool contains(const Value& container, const Value& item, int line);
  Value apply_filter(const std::string& name, Value base, CallArgs& args);
  bool apply_test(const std::string& name, const Value& v, CallArgs& args);
  Value call_method(const Value& obj, const std::string& name, CallArgs& args);
  bool call_dict_method(const Value& obj, const std::string& name, CallArgs& args, Value& result);
};

void install_globals(Interp& in);

}  // namespace ultra::jinja
