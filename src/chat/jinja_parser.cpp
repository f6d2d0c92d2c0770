// Jinja parser: tokens to the syntax tree, with jinja2's operator precedence.
#include <fmt/format.h>

#include <algorithm>

#include "chat/jinja.h"

namespace ultra::jinja {

namespace {

constexpr int kMaxDepth = 200;

struct Parser {
  const std::vector<Token>& t;
  size_t p = 0;
  int depth = 0;

  struct DepthGuard {
    Parser& ps;
    explicit DepthGuard(Parser& x) : ps(x) {
      if (++ps.depth > kMaxDepth) error_at(ps.cur().line, "template nested too deeply");
    }
    ~DepthGuard() { --ps.depth; }
  };

  const Token& cur() const { return t[p]; }
  const Token& peek(size_t k = 1) const { return t[std::min(p + k, t.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    ++p;
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    ++p;
    return true;
  }
  std::string describe(const Token& k) const {
    switch (k.type) {
      case Tok::Text:
        return "template text";
      case Tok::VarBegin:
        return "'{{'";
      case Tok::VarEnd:
        return "'}}'";
      case Tok::BlockBegin:
        return "'{%'";
      case Tok::BlockEnd:
        return "'%}'";
      case Tok::End:
        return "end of template";
      case Tok::String:
        return "string literal";
      default:
        return "'" + k.text + "'";
    }
  }
  [[noreturn]] void unexpected(const char* expected) {
    error_at(cur().line, fmt::format("expected {}, got {}", expected, describe(cur())));
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) unexpected((std::string("'") + op + "'").c_str());
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) unexpected("a name");
    return t[p++].text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) unexpected("'%}'");
    ++p;
  }

  // Sets the depth of a node whose operands are parsed, and bounds it: the evaluator and the destructor
  // recurse once per level, and a flat chain (`1 + 1 + ...`, `a.b.c...`, `x|f|f...`, `f()()...`) builds a
  // tree as deep as it is long, which the parser's own (loop, not recursion) does not see. The tree's depth
  // plus the parser's nesting at this point is bounded like nesting alone.
  ExprP done(ExprP n) {
    int d = 0;
    auto see = [&](const ExprP& x) {
      if (x) d = std::max(d, x->depth);
    };
    see(n->a);
    see(n->b);
    see(n->c);
    see(n->step);
    for (const auto& x : n->items) see(x);
    for (const auto& kv : n->kwargs) see(kv.second);
    n->depth = d + 1;
    if (depth + n->depth > kMaxDepth)
      error_at(n->line,
               fmt::format("expression too deeply nested or too long a chain of operators (more than "
                           "{} levels)",
                           kMaxDepth));
    return n;
  }

  ExprP make(EK k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ---- expressions ----
  ExprP expression(bool with_cond = true) {
    DepthGuard g(*this);
    ExprP e = parse_or();
    if (with_cond && is_name("if")) {
      const int line = cur().line;
      ++p;
      auto c = make(EK::Cond, line);
      c->b = parse_or();
      if (accept_name("else")) c->c = expression();
      c->a = std::move(e);
      return done(std::move(c));
    }
    return e;
  }
  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      auto n = make(EK::Or, cur().line);
      ++p;
      n->a = std::move(e);
      n->b = parse_and();
      e = done(std::move(n));
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      auto n = make(EK::And, cur().line);
      ++p;
      n->a = std::move(e);
      n->b = parse_not();
      e = done(std::move(n));
    }
    return e;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this);
      auto n = make(EK::Not, cur().line);
      ++p;
      n->a = parse_not();
      return done(std::move(n));
    }
    return parse_compare();
  }
  ExprP binary(const std::string& op, ExprP a, ExprP b, int line) {
    auto n = make(EK::Binary, line);
    n->name = op;
    n->a = std::move(a);
    n->b = std::move(b);
    return done(std::move(n));
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    while (true) {
      const int line = cur().line;
      std::string op;
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = t[p++].text;
      } else if (is_name("in")) {
        ++p;
        op = "in";
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        p += 2;
        op = "not in";
      } else {
        break;
      }
      e = binary(op, std::move(e), parse_math1(), line);
    }
    return e;
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const int line = cur().line;
      const std::string op = t[p++].text;
      e = binary(op, std::move(e), parse_concat(), line);
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      ++p;
      e = binary("~", std::move(e), parse_math2(), line);
    }
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const int line = cur().line;
      const std::string op = t[p++].text;
      e = binary(op, std::move(e), parse_pow(), line);
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary();
    while (is_op("**")) {
      const int line = cur().line;
      ++p;
      e = binary("**", std::move(e), parse_unary(), line);
    }
    return e;
  }
  ExprP parse_unary(bool with_filter = true) {
    DepthGuard g(*this);
    ExprP e;
    if (is_op("-") || is_op("+")) {
      auto n = make(EK::Unary, cur().line);
      n->name = t[p++].text;
      n->a = parse_unary(false);
      e = done(std::move(n));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }
  ExprP parse_primary() {
    const Token& k = cur();
    const int line = k.line;
    if (k.type == Tok::Name) {
      ++p;
      auto n = make(EK::Literal, line);
      if (k.text == "true" || k.text == "True") {
        n->value = Value::boolean(true);
      } else if (k.text == "false" || k.text == "False") {
        n->value = Value::boolean(false);
      } else if (k.text == "none" || k.text == "None") {
        n->value = Value::none();
      } else {
        n->kind = EK::Name;
        n->name = k.text;
      }
      return n;
    }
    if (k.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += t[p++].text;
      auto n = make(EK::Literal, line);
      n->value = Value::string(std::move(s));
      return n;
    }
    if (k.type == Tok::Int || k.type == Tok::Float) {
      ++p;
      auto n = make(EK::Literal, line);
      n->value = k.type == Tok::Int ? Value::integer(k.ival) : Value::number(k.fval);
      return n;
    }
    if (accept_op("(")) {
      if (accept_op(")")) return make(EK::Tuple, line);
      ExprP e = expression();
      if (is_op(",")) {
        auto tup = make(EK::Tuple, line);
        tup->items.push_back(std::move(e));
        while (accept_op(",")) {
          if (is_op(")")) break;
          tup->items.push_back(expression());
        }
        e = done(std::move(tup));
      }
      expect_op(")");
      return e;
    }
    if (accept_op("[")) {
      auto n = make(EK::List, line);
      while (!is_op("]")) {
        if (!n->items.empty()) {
          expect_op(",");
          if (is_op("]")) break;
        }
        n->items.push_back(expression());
      }
      expect_op("]");
      return done(std::move(n));
    }
    if (accept_op("{")) {
      auto n = make(EK::Dict, line);
      while (!is_op("}")) {
        if (!n->items.empty()) {
          expect_op(",");
          if (is_op("}")) break;
        }
        n->items.push_back(expression());
        expect_op(":");
        n->items.push_back(expression());
      }
      expect_op("}");
      return done(std::move(n));
    }
    unexpected("an expression");
  }
  void parse_args(Expr& call) {
    // after '('
    while (!is_op(")")) {
      if (!call.items.empty() || !call.kwargs.empty()) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) error_at(cur().line, "unsupported: *args / **kwargs in a call");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string name = t[p].text;
        p += 2;
        call.kwargs.emplace_back(std::move(name), expression());
      } else {
        if (!call.kwargs.empty()) error_at(cur().line, "positional argument follows keyword argument");
        call.items.push_back(expression());
      }
    }
    expect_op(")");
  }
  ExprP parse_postfix(ExprP e) {
    while (true) {
      const int line = cur().line;
      if (accept_op(".")) {
        auto n = make(EK::Attr, line);
        if (cur().type == Tok::Int) {
          n->kind = EK::Item;
          auto idx = make(EK::Literal, line);
          idx->value = Value::integer(t[p++].ival);
          n->b = std::move(idx);
        } else {
          n->name = expect_name();
        }
        n->a = std::move(e);
        e = done(std::move(n));
      } else if (accept_op("[")) {
        ExprP lo, hi, st;
        bool slice = false;
        if (!is_op(":")) lo = expression();
        if (accept_op(":")) {
          slice = true;
          if (!is_op("]") && !is_op(":")) hi = expression();
          if (accept_op(":"))
            if (!is_op("]")) st = expression();
        }
        expect_op("]");
        auto n = make(slice ? EK::Slice : EK::Item, line);
        n->a = std::move(e);
        n->b = std::move(lo);
        n->c = std::move(hi);
        n->step = std::move(st);
        e = done(std::move(n));
      } else if (accept_op("(")) {
        auto n = make(EK::Call, line);
        n->a = std::move(e);
        parse_args(*n);
        e = done(std::move(n));
      } else {
        return e;
      }
    }
  }
  std::string dotted_name() {
    std::string n = expect_name();
    while (is_op(".") && peek().type == Tok::Name) {
      ++p;
      n += "." + t[p++].text;
    }
    return n;
  }
  ExprP parse_filter_expr(ExprP e) {
    while (true) {
      const int line = cur().line;
      if (accept_op("|")) {
        auto n = make(EK::Filter, line);
        n->name = dotted_name();
        n->a = std::move(e);
        if (accept_op("(")) parse_args(*n);
        e = done(std::move(n));
      } else if (is_name("is")) {
        ++p;
        auto n = make(EK::Test, line);
        n->negated = accept_name("not");
        n->name = dotted_name();
        n->a = std::move(e);
        if (accept_op("(")) {
          parse_args(*n);
        } else {
          const Token& k = cur();
          const bool arg_follows =
              k.type == Tok::String || k.type == Tok::Int || k.type == Tok::Float ||
              (k.type == Tok::Op && (k.text == "(" || k.text == "[" || k.text == "{" || k.text == "-")) ||
              (k.type == Tok::Name && k.text != "else" && k.text != "or" && k.text != "and" &&
               k.text != "is" && k.text != "if" && k.text != "in" && k.text != "not");
          if (arg_follows) n->items.push_back(parse_primary_postfix());
        }
        e = done(std::move(n));
      } else if (accept_op("(")) {
        auto n = make(EK::Call, line);
        n->a = std::move(e);
        parse_args(*n);
        e = done(std::move(n));
      } else {
        return e;
      }
    }
  }
  ExprP parse_primary_postfix() { return parse_postfix(parse_primary()); }

  // ---- statements ----
  // Parses nodes until a block tag whose keyword is one of `ends`; leaves p at that keyword.
  Body parse_body(const std::vector<std::string>& ends, std::string* found) {
    DepthGuard g(*this);
    Body body;
    while (true) {
      const Token& k = cur();
      if (k.type == Tok::End) {
        if (ends.empty()) return body;
        error_at(k.line, fmt::format("unexpected end of template: expected '{{% {} %}}'", ends.front()));
      }
      if (k.type == Tok::Text) {
        auto n = std::make_unique<Node>();
        n->kind = NK::Text;
        n->line = k.line;
        n->text = k.text;
        body.push_back(std::move(n));
        ++p;
      } else if (k.type == Tok::VarBegin) {
        ++p;
        auto n = std::make_unique<Node>();
        n->kind = NK::Output;
        n->line = k.line;
        n->expr = expression();
        if (cur().type != Tok::VarEnd) unexpected("'}}'");
        ++p;
        body.push_back(std::move(n));
      } else if (k.type == Tok::BlockBegin) {
        const Token& kw = peek();
        if (kw.type != Tok::Name) {
          ++p;
          unexpected("a statement keyword");
        }
        for (const auto& e : ends)
          if (kw.text == e) {
            ++p;
            if (found) *found = kw.text;
            return body;
          }
        p += 2;
        body.push_back(statement(kw));
      } else {
        unexpected("template text or a tag");
      }
    }
  }

  NodeP statement(const Token& kw) {
    auto n = std::make_unique<Node>();
    n->line = kw.line;
    const std::string& w = kw.text;
    if (w == "if") {
      n->kind = NK::If;
      ExprP cond = expression();
      expect_block_end();
      while (true) {
        std::string found;
        Body b = parse_body({"elif", "else", "endif"}, &found);
        ++p;  // keyword
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (found == "elif") {
          cond = expression();
          expect_block_end();
        } else if (found == "else") {
          expect_block_end();
          Body eb = parse_body({"endif"}, nullptr);
          ++p;
          expect_block_end();
          n->branches.emplace_back(nullptr, std::move(eb));
          break;
        } else {
          expect_block_end();
          break;
        }
      }
      return n;
    }
    if (w == "for") {
      n->kind = NK::For;
      n->targets.push_back(expect_name());
      while (accept_op(",")) n->targets.push_back(expect_name());
      if (!accept_name("in")) unexpected("'in'");
      n->expr = expression(false);
      if (accept_name("if")) n->filter = expression(false);
      if (is_name("recursive")) error_at(cur().line, "unsupported: recursive for loops");
      expect_block_end();
      std::string found;
      n->body = parse_body({"else", "endfor"}, &found);
      ++p;
      expect_block_end();
      if (found == "else") {
        n->else_body = parse_body({"endfor"}, nullptr);
        ++p;
        expect_block_end();
      }
      return n;
    }
    if (w == "set") {
      std::string first = expect_name();
      if (accept_op(".")) {
        auto ns = make(EK::Name, kw.line);
        ns->name = first;
        n->target_attr = std::move(ns);
        first = expect_name();
      }
      n->targets.push_back(first);
      while (!n->target_attr && accept_op(",")) n->targets.push_back(expect_name());
      if (accept_op("=")) {
        n->kind = NK::Set;
        n->expr = expression();
        if (is_op(",")) {
          auto tup = make(EK::Tuple, kw.line);
          tup->items.push_back(std::move(n->expr));
          while (accept_op(",")) tup->items.push_back(expression());
          n->expr = done(std::move(tup));
        }
        expect_block_end();
        return n;
      }
      if (is_op("|")) error_at(cur().line, "unsupported: filter on a block set");
      expect_block_end();
      n->kind = NK::SetBlock;
      n->body = parse_body({"endset"}, nullptr);
      ++p;
      expect_block_end();
      return n;
    }
    if (w == "macro") {
      n->kind = NK::Macro;
      n->targets.push_back(expect_name());
      expect_op("(");
      while (!is_op(")")) {
        if (!n->params.empty()) expect_op(",");
        std::string name = expect_name();
        ExprP def;
        if (accept_op("=")) def = expression();
        n->params.emplace_back(std::move(name), std::move(def));
      }
      expect_op(")");
      expect_block_end();
      n->body = parse_body({"endmacro"}, nullptr);
      ++p;
      if (cur().type == Tok::Name) ++p;
      expect_block_end();
      return n;
    }
    if (w == "break" || w == "continue") {
      n->kind = w == "break" ? NK::Break : NK::Continue;
      expect_block_end();
      return n;
    }
    if (w == "filter") {  // {% filter f(args) | g %}...{% endfilter %}: the body's text through the filters
      n->kind = NK::FilterBlock;
      ExprP chain;  // Filter nodes, the first applied innermost (its base `a` null)
      do {
        auto f = make(EK::Filter, cur().line);
        f->name = dotted_name();
        f->a = std::move(chain);
        if (accept_op("(")) parse_args(*f);
        chain = done(std::move(f));
      } while (accept_op("|"));
      n->expr = std::move(chain);
      expect_block_end();
      n->body = parse_body({"endfilter"}, nullptr);
      ++p;
      expect_block_end();
      return n;
    }
    if (w == "generation") {
      n->kind = NK::Generation;
      expect_block_end();
      n->body = parse_body({"endgeneration"}, nullptr);
      ++p;
      expect_block_end();
      return n;
    }
    error_at(kw.line, fmt::format("unsupported statement '{}'", w));
  }
};

}  // namespace

Body parse(const std::vector<Token>& tokens) {
  Parser ps{tokens};
  return ps.parse_body({}, nullptr);
}

}  // namespace ultra::jinja
