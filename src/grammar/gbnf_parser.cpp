#include "grammar/gbnf_parser.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "grammar/grammar_check.h"
#include "tokenizer/utf8.h"

namespace ultra::grammar {

namespace gbnf_parse {

constexpr uint64_t kMaxRepetition = 2000;  // as llama.cpp's MAX_REPETITION_THRESHOLD
constexpr uint64_t kNoMax = UINT64_MAX;    // x{m,}
constexpr size_t kMaxElements = size_t{1} << 21;
constexpr size_t kMaxRules = size_t{1} << 16;
constexpr int kMaxGroupDepth = 128;  // nested ( ): the parser recurses once per level
constexpr size_t kUndefined = SIZE_MAX;

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// Sorts and merges ranges; with `negate`, returns the complement over [0, kMaxCodePoint].
std::vector<CharRange> normalize(std::vector<CharRange> set, bool negate) {
  std::sort(set.begin(), set.end(), [](CharRange a, CharRange b) { return a.lo < b.lo; });
  std::vector<CharRange> merged;
  for (CharRange r : set) {
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  if (!negate) return merged;
  std::vector<CharRange> out;
  uint32_t next = 0;  // first code point not yet covered
  for (CharRange r : merged) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

class Parser {
 public:
  explicit Parser(std::string_view src) : src_(src) {}

  Grammar run(std::string_view root) {
    skip_space(true);
    while (!at_end()) parse_rule();
    for (size_t id = 0; id < rules_.size(); ++id) {
      if (defined_at_[id] == kUndefined) error_at(first_ref_[id], "undefined rule '" + names_[id] + "'");
    }
    const auto it = ids_.find(std::string(root));
    if (it == ids_.end()) fail("GBNF grammar: no rule named '{}' (the start rule)", root);
    return flatten(it->second);
  }

 private:
  std::string_view src_;
  size_t pos_ = 0;
  std::vector<std::vector<Element>> rules_;        // [n_rules] bodies
  std::vector<std::string> names_;                 // [n_rules]
  std::vector<size_t> defined_at_;                 // [n_rules] offset of the definition, or kUndefined
  std::vector<size_t> first_ref_;                  // [n_rules] offset of the first reference
  std::unordered_map<std::string, uint32_t> ids_;  // names written in the grammar -> rule id
  std::vector<CharRange> ranges_;
  size_t n_elements_ = 0;  // elements emitted so far (an upper bound on the table's size)
  int depth_ = 0;          // nesting of ( )

  bool at_end() const { return pos_ >= src_.size(); }
  char peek(size_t k = 0) const { return pos_ + k < src_.size() ? src_[pos_ + k] : '\0'; }

  // "line 3, column 7" for a byte offset (columns count code points).
  std::string where(size_t at) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else if (((unsigned char)src_[i] & 0xC0) != 0x80) {
        ++col;
      }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(col);
  }

  // What is at the current position, for "expected X, found Y".
  std::string found() const {
    if (at_end()) return "the end of the grammar";
    const char c = peek();
    if (c == '\n' || c == '\r') return "the end of the line";
    const size_t n = tok::utf8::unit_len(src_.data() + pos_, src_.size() - pos_);
    if ((unsigned char)c < 0x20) return fmt::format("byte 0x{:02x}", (unsigned char)c);
    return fmt::format("'{}'", src_.substr(pos_, n));
  }

  [[noreturn]] void error_at(size_t at, const std::string& msg) const {
    fail("GBNF grammar, {}: {}", where(at), msg);
  }
  [[noreturn]] void expected(const std::string& what) const {
    error_at(pos_, "expected " + what + ", found " + found());
  }

  void skip_space(bool newline_ok) {
    while (!at_end()) {
      const char c = peek();
      if (c == '#') {
        while (!at_end() && peek() != '\n' && peek() != '\r') ++pos_;
      } else if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string_view parse_name(const char* what) {
    const size_t start = pos_;
    while (!at_end() && is_word_char(peek())) ++pos_;
    if (pos_ == start) expected(what);
    return src_.substr(start, pos_ - start);
  }

  uint32_t add_rule(std::string name) {
    if (rules_.size() >= kMaxRules) error_at(pos_, "more than " + std::to_string(kMaxRules) + " rules");
    rules_.emplace_back();
    names_.push_back(std::move(name));
    defined_at_.push_back(kUndefined);
    first_ref_.push_back(pos_);
    return (uint32_t)(rules_.size() - 1);
  }

  // The id of a named rule, created at its first mention (reference or definition).
  uint32_t symbol(std::string_view name, size_t at) {
    const auto it = ids_.find(std::string(name));
    if (it != ids_.end()) return it->second;
    const uint32_t id = add_rule(std::string(name));
    first_ref_[id] = at;
    ids_.emplace(std::string(name), id);
    return id;
  }

  // A helper rule for a group or a repetition, named like llama.cpp's: <rule>_<id>.
  uint32_t synthesized(const std::string& base, size_t at) {
    const uint32_t id = add_rule(base + "_" + std::to_string(rules_.size()));
    defined_at_[id] = at;
    return id;
  }

  void reserve_elements(uint64_t n, size_t at) {
    if (n > kMaxElements || n_elements_ + n > kMaxElements) {
      error_at(at, "the grammar is too large (more than " + std::to_string(kMaxElements) +
                       " elements after expanding repetitions)");
    }
    n_elements_ += n;
  }

  void push(std::vector<Element>& body, Element e) {
    reserve_elements(1, pos_);
    body.push_back(e);
  }

  void push_class(std::vector<Element>& body, std::vector<CharRange> set, bool negate) {
    const std::vector<CharRange> norm = normalize(std::move(set), negate);
    push(body, {Op::Chars, (uint32_t)ranges_.size(), (uint32_t)norm.size()});
    ranges_.insert(ranges_.end(), norm.begin(), norm.end());
  }

  uint32_t parse_hex(int n_digits) {
    uint32_t v = 0;
    for (int i = 0; i < n_digits; ++i) {
      const char c = peek();
      int d;
      if (is_digit(c)) {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        expected(std::to_string(n_digits) + " hex digits");
      }
      v = v * 16 + (uint32_t)d;
      ++pos_;
    }
    return v;
  }

  // One character of a literal or class: an escape or one UTF-8 code point.
  uint32_t parse_char() {
    const size_t at = pos_;
    if (at_end()) expected("a character");
    if (peek() == '\\') {
      ++pos_;
      const char c = peek();
      if (at_end()) expected("an escape character after '\\'");
      ++pos_;
      uint32_t v;
      switch (c) {
        case 'x':
          v = parse_hex(2);
          break;
        case 'u':
          v = parse_hex(4);
          break;
        case 'U':
          v = parse_hex(8);
          break;
        case 't':
          return '\t';
        case 'r':
          return '\r';
        case 'n':
          return '\n';
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
          return (uint32_t)c;
        default:
          --pos_;
          error_at(at,
                   "unknown escape: after '\\' expected one of x u U t r n \\ \" [ ] -, found " + found());
      }
      if (v > kMaxCodePoint) error_at(at, fmt::format("code point U+{:X} is above U+10FFFF", v));
      return v;
    }
    const int n = tok::utf8::classify((const unsigned char*)src_.data() + pos_, src_.size() - pos_);
    if (n <= 0) error_at(at, "invalid UTF-8");
    const uint32_t v = tok::utf8::decode(src_.data() + pos_, (size_t)n);
    pos_ += (size_t)n;
    return v;
  }

  uint64_t parse_count() {
    if (!is_digit(peek())) expected("a repetition count");
    uint64_t v = 0;
    const size_t at = pos_;
    while (is_digit(peek())) {
      v = std::min<uint64_t>(v * 10 + (uint64_t)(peek() - '0'), kMaxRepetition + 1);
      ++pos_;
    }
    if (v > kMaxRepetition) {
      error_at(at, "repetition count above the limit of " + std::to_string(kMaxRepetition));
    }
    return v;
  }

  // Rewrites the symbol body[last_sym_start..] repeated min..max times, as llama.cpp does:
  //   S{m,n} -> S (m times) S'(n-m),  S'(k) ::= S S'(k-1) | ,  S'(1) ::= S |
  //   S{m,}  -> S (m times) S',       S'    ::= S S' |
  void repeat(std::vector<Element>& body, size_t last_sym_start, uint64_t min, uint64_t max,
              const std::string& name, size_t at) {
    if (last_sym_start >= body.size()) error_at(at, "expected a symbol before the repetition operator");
    if (max != kNoMax && max < min) error_at(at, "repetition {m,n} with n < m");
    const std::vector<Element> prev(body.begin() + (ptrdiff_t)last_sym_start, body.end());
    const bool no_max = max == kNoMax;
    const uint64_t n_opt = no_max ? 1 : max - min;
    reserve_elements((min > 0 ? min - 1 : 0) * prev.size() + n_opt * (prev.size() + 3) + 1, at);
    if (min == 0) {
      body.resize(last_sym_start);
    } else {
      for (uint64_t i = 1; i < min; ++i) body.insert(body.end(), prev.begin(), prev.end());
    }
    uint32_t last_rec = 0;
    for (uint64_t i = 0; i < n_opt; ++i) {
      const uint32_t id = synthesized(name, at);
      std::vector<Element> rec = prev;
      if (i > 0 || no_max) rec.push_back({Op::Rule, no_max ? id : last_rec, 0});
      rec.push_back({Op::Alt, 0, 0});
      rec.push_back({Op::End, 0, 0});
      rules_[id] = std::move(rec);
      last_rec = id;
    }
    if (n_opt > 0) body.push_back({Op::Rule, last_rec, 0});
  }

  void parse_sequence(std::vector<Element>& body, const std::string& name, bool nested) {
    size_t last_sym_start = body.size();  // where the last symbol's elements begin (none yet)
    while (!at_end()) {
      const size_t at = pos_;
      const char c = peek();
      if (c == '"') {
        ++pos_;
        last_sym_start = body.size();
        while (at_end() || peek() != '"') {
          if (at_end()) error_at(at, "unterminated string literal");
          const uint32_t v = parse_char();
          push_class(body, {{v, v}}, false);
        }
        ++pos_;
      } else if (c == '[') {
        ++pos_;
        const bool negate = peek() == '^';
        if (negate) ++pos_;
        std::vector<CharRange> set;
        while (at_end() || peek() != ']') {
          if (at_end()) error_at(at, "unterminated character class");
          const size_t range_at = pos_;
          const uint32_t lo = parse_char();
          uint32_t hi = lo;
          if (peek() == '-' && peek(1) != ']' && pos_ + 1 < src_.size()) {
            ++pos_;
            hi = parse_char();
            if (hi < lo) error_at(range_at, "character range with its end before its start");
          }
          set.push_back({lo, hi});
        }
        if (set.empty()) error_at(at, "empty character class");
        ++pos_;
        last_sym_start = body.size();
        push_class(body, std::move(set), negate);
      } else if (c == '<' || c == '!') {
        error_at(at, "token references (<...>, <[id]>, !<...>) are not supported");
      } else if (is_word_char(c)) {
        const std::string_view ref = parse_name("a rule name");
        last_sym_start = body.size();
        push(body, {Op::Rule, symbol(ref, at), 0});
      } else if (c == '(') {
        if (depth_ >= kMaxGroupDepth)
          error_at(at, "groups nested deeper than " + std::to_string(kMaxGroupDepth));
        ++pos_;
        skip_space(true);
        const uint32_t id = synthesized(name, at);
        ++depth_;
        parse_alternates(id, name, true);
        --depth_;
        if (peek() != ')' || at_end()) expected("')' to close the group opened at " + where(at));
        ++pos_;
        last_sym_start = body.size();
        push(body, {Op::Rule, id, 0});
      } else if (c == '.') {
        ++pos_;
        last_sym_start = body.size();
        push_class(body, {{0, kMaxCodePoint}}, false);
      } else if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        repeat(body, last_sym_start, c == '+' ? 1 : 0, c == '?' ? 1 : kNoMax, name, at);
      } else if (c == '{') {
        ++pos_;
        skip_space(nested);
        const uint64_t min = parse_count();
        uint64_t max = min;
        skip_space(nested);
        if (peek() == ',') {
          ++pos_;
          skip_space(nested);
          max = is_digit(peek()) ? parse_count() : kNoMax;
          skip_space(nested);
        }
        if (peek() != '}' || at_end()) expected("',' or '}' in the repetition {m,n}");
        ++pos_;
        repeat(body, last_sym_start, min, max, name, at);
      } else {
        break;
      }
      skip_space(nested);
    }
  }

  void parse_alternates(uint32_t rule_id, const std::string& name, bool nested) {
    std::vector<Element> body;
    parse_sequence(body, name, nested);
    while (peek() == '|' && !at_end()) {
      push(body, {Op::Alt, 0, 0});
      ++pos_;
      skip_space(true);
      parse_sequence(body, name, nested);
    }
    push(body, {Op::End, 0, 0});
    rules_[rule_id] = std::move(body);
  }

  void parse_rule() {
    const size_t at = pos_;
    const std::string name(parse_name("a rule name"));
    skip_space(false);
    if (src_.substr(pos_, 3) != "::=") expected("'::=' after the rule name '" + name + "'");
    pos_ += 3;
    skip_space(true);
    const uint32_t id = symbol(name, at);
    if (defined_at_[id] != kUndefined) {
      error_at(at, "rule '" + name + "' is defined twice (first at " + where(defined_at_[id]) + ")");
    }
    defined_at_[id] = at;
    parse_alternates(id, name, false);
    if (peek() == '\r' && !at_end()) {
      ++pos_;
      if (peek() == '\n') ++pos_;
    } else if (peek() == '\n' && !at_end()) {
      ++pos_;
    } else if (!at_end()) {
      expected("a symbol, '|' or the end of the line");
    }
    skip_space(true);
  }

  Grammar flatten(uint32_t root) {
    Grammar g;
    g.root = root;
    g.elements.reserve(n_elements_ + 2);
    g.elements.push_back({Op::Rule, root, 0});  // Grammar::kStart
    g.elements.push_back({Op::End, 0, 0});
    g.rule_alts.push_back(0);
    for (const std::vector<Element>& body : rules_) {
      const auto start = (uint32_t)g.elements.size();
      g.rule_start.push_back(start);
      g.alt_start.push_back(start);
      for (size_t i = 0; i < body.size(); ++i) {
        g.elements.push_back(body[i]);
        if (body[i].op == Op::Alt) g.alt_start.push_back(start + (uint32_t)i + 1);
      }
      g.rule_alts.push_back((uint32_t)g.alt_start.size());
    }
    g.rule_names = std::move(names_);
    g.ranges = std::move(ranges_);
    return g;
  }
};

}  // namespace gbnf_parse

Grammar parse_gbnf(std::string_view text, std::string_view root) {
  Grammar g = gbnf_parse::Parser(text).run(root);
  check_left_recursion(g);
  return g;
}

}  // namespace ultra::grammar
