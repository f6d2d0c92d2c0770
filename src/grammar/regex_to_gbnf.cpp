#include "grammar/regex_to_gbnf.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "core/error.h"
#include "grammar/gbnf_emit.h"
#include "tokenizer/utf8.h"

namespace ultra::grammar {

namespace regex_impl {

constexpr uint64_t kMaxCount = 2000;  // the GBNF parser's repetition limit
constexpr int kMaxDepth = 64;         // nested groups; the parser recurses once per level

struct Node {
  enum Kind { Set, Any, Seq, Alt, Repeat, Bol, Eol } kind = Seq;  // Any: the padding of an unanchored end
  std::vector<CharRange> set;                                     // Set: normalized code points
  std::vector<Node> kids;                                         // Seq, Alt: the parts; Repeat: one
  uint64_t min = 0, max = 0;  // Repeat counts, max kRegexUnbounded for none
};

Node make_node(Node::Kind kind) {
  Node n;
  n.kind = kind;
  return n;
}

uint64_t add_len(uint64_t a, uint64_t b) {
  return (a == kRegexUnbounded || b == kRegexUnbounded || a + b < a) ? kRegexUnbounded : a + b;
}
uint64_t mul_len(uint64_t a, uint64_t n) {
  if (a == 0 || n == 0) return 0;
  if (a == kRegexUnbounded || n == kRegexUnbounded || a > kRegexUnbounded / n) return kRegexUnbounded;
  return a * n;
}

const std::vector<CharRange> kDigit = {{'0', '9'}};
const std::vector<CharRange> kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const std::vector<CharRange> kSpace = {{'\t', '\r'}, {' ', ' '}};
const std::vector<CharRange> kAscii = {{0, 0x7F}};

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  Node parse() {
    Node n = alternation(0);
    if (pos_ < p_.size()) error("unmatched ')'");
    return n;
  }

  [[noreturn]] void error(const std::string& why) const {
    fail("pattern /{}/: {} at offset {}", std::string(p_), why, pos_);
  }

 private:
  std::string_view p_;
  size_t pos_ = 0;

  bool at_end() const { return pos_ >= p_.size(); }
  char peek(size_t k = 0) const { return pos_ + k < p_.size() ? p_[pos_ + k] : '\0'; }

  uint32_t next_code_point() {
    const int n = tok::utf8::classify((const unsigned char*)p_.data() + pos_, p_.size() - pos_);
    if (n <= 0) error("invalid UTF-8");
    const uint32_t v = tok::utf8::decode(p_.data() + pos_, (size_t)n);
    pos_ += (size_t)n;
    return v;
  }

  Node alternation(int depth) {
    if (depth > kMaxDepth) error(fmt::format("groups nested deeper than {}", kMaxDepth));
    Node alt = make_node(Node::Alt);
    alt.kids.push_back(sequence(depth));
    while (peek() == '|' && !at_end()) {
      ++pos_;
      alt.kids.push_back(sequence(depth));
    }
    if (alt.kids.size() == 1) return std::move(alt.kids[0]);
    return alt;
  }

  Node sequence(int depth) {
    Node seq = make_node(Node::Seq);
    while (!at_end() && peek() != '|' && peek() != ')') {
      Node atom_node = atom(depth);
      quantify(atom_node);
      seq.kids.push_back(std::move(atom_node));
    }
    return seq;
  }

  uint64_t count() {
    if (!(peek() >= '0' && peek() <= '9')) error("expected a repetition count");
    uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9' && !at_end()) {
      v = std::min<uint64_t>(v * 10 + (uint64_t)(peek() - '0'), kRegexUnbounded / 20);
      ++pos_;
    }
    return v;
  }

  // A `{` that does not start a valid quantifier is a literal in ECMAScript's Annex B; refused here as
  // ambiguous.
  void quantify(Node& atom_node) {
    if (at_end()) return;
    uint64_t min = 0, max = 0;
    const char c = peek();
    if (c == '?' || c == '*' || c == '+') {
      ++pos_;
      min = c == '+' ? 1 : 0;
      max = c == '?' ? 1 : kRegexUnbounded;
    } else if (c == '{') {
      ++pos_;
      min = count();
      max = min;
      if (peek() == ',') {
        ++pos_;
        max = peek() == '}' ? kRegexUnbounded : count();
      }
      if (peek() != '}' || at_end()) error("expected '}' to close a repetition count");
      ++pos_;
      if (max < min) error("repetition count {m,n} with n < m");
    } else {
      return;
    }
    if (peek() == '?' && !at_end()) ++pos_;  // lazy: the same language
    if (peek() == '?' || peek() == '*' || peek() == '+' || peek() == '{') {
      if (!at_end()) error("nothing to repeat");
    }
    if (atom_node.kind == Node::Bol || atom_node.kind == Node::Eol) error("quantified anchor");
    if (min > kMaxCount) error(fmt::format("repetition count {} above the limit of {}", min, kMaxCount));
    if (max != kRegexUnbounded && max > kMaxCount) max = kMaxCount;
    Node rep = make_node(Node::Repeat);
    rep.min = min;
    rep.max = max;
    rep.kids.push_back(std::move(atom_node));
    atom_node = std::move(rep);
  }

  static Node set_node(std::vector<CharRange> set) {
    Node n = make_node(Node::Set);
    n.set = normalize_ranges(std::move(set));
    return n;
  }

  uint32_t hex(int n_digits) {
    uint32_t v = 0;
    for (int i = 0; i < n_digits; ++i) {
      const char c = peek();
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (d < 0 || at_end()) error("expected a hexadecimal digit");
      v = v * 16 + (uint32_t)d;
      ++pos_;
    }
    return v;
  }

  // After a backslash: a class escape (returns the set) or a single code point (a one-element set).
  std::vector<CharRange> escape(bool in_class) {
    if (at_end()) error("pattern ends with '\\'");
    const char c = p_[pos_++];
    switch (c) {
      case 'd':
        return kDigit;
      case 'D':
        return subtract_ranges(kAscii, kDigit);
      case 'w':
        return kWord;
      case 'W':
        return subtract_ranges(kAscii, kWord);
      case 's':
        return kSpace;
      case 'S':
        return subtract_ranges(kAscii, normalize_ranges({{0, 0x20}, {0x7F, 0x7F}}));
      case 't':
        return {{'\t', '\t'}};
      case 'n':
        return {{'\n', '\n'}};
      case 'r':
        return {{'\r', '\r'}};
      case 'f':
        return {{'\f', '\f'}};
      case 'v':
        return {{'\v', '\v'}};
      case '0':
        if (peek() >= '0' && peek() <= '9') error("octal escapes are not supported");
        return {{0, 0}};
      case 'x': {
        const uint32_t v = hex(2);
        return {{v, v}};
      }
      case 'u': {
        if (peek() == '{') error("\\u{...} escapes are not supported");
        const uint32_t v = hex(4);
        if (v >= 0xD800 && v <= 0xDFFF) error("surrogate escapes are not supported");
        return {{v, v}};
      }
      case 'b':
        if (in_class) return {{'\b', '\b'}};
        error("word boundaries (\\b) are not supported");
      case 'B':
        error("word boundaries (\\B) are not supported");
      case 'p':
      case 'P':
        error("Unicode property escapes (\\p) are not supported");
      case 'k':
        error("back references are not supported");
      case 'c':
        error("control escapes (\\c) are not supported");
      default:
        if (c >= '1' && c <= '9') error("back references are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) error(fmt::format("unknown escape \\{}", c));
        --pos_;
        const uint32_t v = next_code_point();  // escaped punctuation stands for itself
        return {{v, v}};
    }
  }

  Node char_class() {
    const size_t start = pos_ - 1;
    const bool negate = peek() == '^';
    if (negate) ++pos_;
    std::vector<CharRange> set;
    bool shorthand = false;  // \d \w \s or a negation inside: Python and JavaScript differ beyond ASCII
    while (true) {
      if (at_end()) {
        pos_ = start;
        error("unterminated character class");
      }
      if (peek() == ']') break;  // [] matches nothing: refused below when empty
      std::vector<CharRange> lo_set;
      if (peek() == '\\') {
        ++pos_;
        const char kind = peek();
        lo_set = escape(true);
        shorthand = shorthand || kind == 'd' || kind == 'w' || kind == 's' || kind == 'D' || kind == 'W' ||
                    kind == 'S';
      } else {
        const uint32_t v = next_code_point();
        lo_set = {{v, v}};
      }
      const bool single = lo_set.size() == 1 && lo_set[0].lo == lo_set[0].hi;
      if (single && peek() == '-' && peek(1) != ']' && pos_ + 1 < p_.size()) {
        ++pos_;
        std::vector<CharRange> hi_set;
        if (peek() == '\\') {
          ++pos_;
          hi_set = escape(true);
        } else {
          const uint32_t v = next_code_point();
          hi_set = {{v, v}};
        }
        if (hi_set.size() != 1 || hi_set[0].lo != hi_set[0].hi) error("class escape as the end of a range");
        if (hi_set[0].lo < lo_set[0].lo) error("character range out of order");
        set.push_back({lo_set[0].lo, hi_set[0].lo});
      } else {
        set.insert(set.end(), lo_set.begin(), lo_set.end());
      }
    }
    ++pos_;  // ]
    std::vector<CharRange> s = normalize_ranges(std::move(set));
    if (negate && shorthand) {
      // [^\s...] must also exclude what Python's \s adds (\x1c-\x1f) and its Unicode digits / word /
      // space characters: the complement is taken within ASCII.
      s.push_back({0x1C, 0x1F});
      s = subtract_ranges(kAscii, normalize_ranges(std::move(s)));
    } else if (negate) {
      s = complement_ranges(s);
    }
    if (s.empty()) error("empty character class");
    return set_node(std::move(s));
  }

  Node atom(int depth) {
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (peek() == '?') {
        ++pos_;
        if (peek() == ':') {
          ++pos_;
        } else if (peek() == '<' && peek(1) != '=' && peek(1) != '!') {
          while (!at_end() && peek() != '>') ++pos_;  // named group: the name is not needed
          if (at_end()) error("unterminated group name");
          ++pos_;
        } else {
          error("lookaround and group flags are not supported");
        }
      }
      Node inner = alternation(depth + 1);
      if (peek() != ')' || at_end()) error("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') {
      ++pos_;
      return char_class();
    }
    if (c == '.') {
      ++pos_;
      return set_node(complement_ranges(normalize_ranges({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}})));
    }
    if (c == '^') {
      ++pos_;
      return make_node(Node::Bol);
    }
    if (c == '$') {
      ++pos_;
      return make_node(Node::Eol);
    }
    if (c == '\\') {
      ++pos_;
      return set_node(escape(false));
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') error("nothing to repeat");
    const uint32_t v = next_code_point();
    return set_node({{v, v}});
  }
};

// Min / max length in code points.
std::pair<uint64_t, uint64_t> lengths(const Node& n) {
  switch (n.kind) {
    case Node::Set:
    case Node::Any:
      return {1, 1};
    case Node::Bol:
    case Node::Eol:
      return {0, 0};
    case Node::Seq: {
      uint64_t lo = 0, hi = 0;
      for (const Node& k : n.kids) {
        const auto [a, b] = lengths(k);
        lo = add_len(lo, a);
        hi = add_len(hi, b);
      }
      return {lo, hi};
    }
    case Node::Alt: {
      uint64_t lo = kRegexUnbounded, hi = 0;
      for (const Node& k : n.kids) {
        const auto [a, b] = lengths(k);
        lo = std::min(lo, a);
        hi = std::max(hi, b);
      }
      return {lo, hi};
    }
    case Node::Repeat: {
      const auto [a, b] = lengths(n.kids[0]);
      return {mul_len(a, n.min), mul_len(b, n.max)};
    }
  }
  return {0, 0};
}

// The node's language without the empty string (nullopt when nothing is left), so that a repetition of a
// part that can be empty, e.g. (a*)*, is written as one whose body cannot, (a+)*: the GBNF parser refuses
// the first as left recursion.
std::optional<Node> non_empty(const Node& n) {
  switch (n.kind) {
    case Node::Set:
    case Node::Any:
      return n;
    case Node::Bol:
    case Node::Eol:
      return std::nullopt;
    case Node::Repeat: {
      if (n.max == 0) return std::nullopt;
      if (lengths(n.kids[0]).first > 0) {
        Node r = n;
        r.min = std::max<uint64_t>(r.min, 1);
        return r;
      }
      std::optional<Node> body = non_empty(n.kids[0]);
      if (!body) return std::nullopt;
      Node r = make_node(Node::Repeat);
      r.min = 1;
      r.max = n.max;
      r.kids.push_back(std::move(*body));
      return r;
    }
    case Node::Alt: {
      Node alt = make_node(Node::Alt);
      for (const Node& k : n.kids) {
        if (std::optional<Node> x = non_empty(k)) alt.kids.push_back(std::move(*x));
      }
      if (alt.kids.empty()) return std::nullopt;
      return alt;
    }
    case Node::Seq: {
      if (lengths(n).first > 0) return n;
      // Every part can be empty: the first non-empty part is i, the ones before it empty.
      Node alt = make_node(Node::Alt);
      for (size_t i = 0; i < n.kids.size(); ++i) {
        std::optional<Node> first = non_empty(n.kids[i]);
        if (!first) continue;
        Node seq = make_node(Node::Seq);
        seq.kids.push_back(std::move(*first));
        seq.kids.insert(seq.kids.end(), n.kids.begin() + (long)i + 1, n.kids.end());
        alt.kids.push_back(std::move(seq));
      }
      if (alt.kids.empty()) return std::nullopt;
      return alt;
    }
  }
  return std::nullopt;
}

bool has_anchor(const Node& n) {
  if (n.kind == Node::Bol || n.kind == Node::Eol) return true;
  for (const Node& k : n.kids) {
    if (has_anchor(k)) return true;
  }
  return false;
}

class Emitter {
 public:
  Emitter(const Parser& parser, const std::string& any_char) : parser_(parser), any_char_(any_char) {}

  std::string emit(const Node& n) {
    switch (n.kind) {
      case Node::Any:
        return any_char_;
      case Node::Set: {
        const std::string e = json_encoded_char(n.set);
        if (e.empty()) parser_.error("a character class of only surrogates");
        return e;
      }
      case Node::Bol:
      case Node::Eol:
        parser_.error("anchors are supported only at the start and end of the pattern or an alternative");
      case Node::Seq: {
        std::string out;
        std::string run;  // consecutive plain characters, written as one literal
        auto flush = [&] {
          if (!run.empty()) out += (out.empty() ? "" : " ") + gbnf_literal(run);
          run.clear();
        };
        for (const Node& k : n.kids) {
          if (k.kind == Node::Set && k.set.size() == 1 && k.set[0].lo == k.set[0].hi && k.set[0].lo >= 0x20 &&
              k.set[0].lo != '"' && k.set[0].lo != '\\' && k.set[0].lo < 0x80) {
            run += (char)k.set[0].lo;
            continue;
          }
          flush();
          const std::string e = emit(k);
          if (!e.empty()) out += (out.empty() ? "" : " ") + e;
        }
        flush();
        return out.empty() ? "" : "(" + out + ")";
      }
      case Node::Alt: {
        std::string out = "(";
        for (size_t i = 0; i < n.kids.size(); ++i) {
          const std::string e = emit(n.kids[i]);
          out += (i ? " | " : "") + (e.empty() ? std::string("\"\"") : e);
        }
        return out + ")";
      }
      case Node::Repeat: {
        if (n.max > 1 && lengths(n.kids[0]).first == 0) {  // (e){m,n} with e nullable = (e minus ""){0,n}
          std::optional<Node> body = non_empty(n.kids[0]);
          if (!body) return "";
          Node r = make_node(Node::Repeat);
          r.min = 0;
          r.max = n.max;
          r.kids.push_back(std::move(*body));
          return emit(r);
        }
        std::string e = emit(n.kids[0]);
        if (e.empty() || n.max == 0) return "";
        if (n.min == 0 && n.max == 1) return e + "?";
        if (n.min == 0 && n.max == kRegexUnbounded) return e + "*";
        if (n.min == 1 && n.max == kRegexUnbounded) return e + "+";
        if (n.max == kRegexUnbounded) return fmt::format("{}{{{},}}", e, n.min);
        if (n.min == n.max) return fmt::format("{}{{{}}}", e, n.min);
        return fmt::format("{}{{{},{}}}", e, n.min, n.max);
      }
    }
    return "";
  }

 private:
  const Parser& parser_;
  const std::string& any_char_;
};

// The node restricted to strings of at most `limit` code points, by lowering repetition counts (a subset of
// its language: nullopt when even its shortest string is longer).
std::optional<Node> cap(const Node& n, uint64_t limit) {
  const auto [lo, hi] = lengths(n);
  if (lo > limit) return std::nullopt;
  if (hi <= limit) return n;
  switch (n.kind) {
    case Node::Seq: {
      std::vector<uint64_t> rest_min(n.kids.size() + 1, 0);  // fewest code points of kids i..
      for (size_t i = n.kids.size(); i-- > 0;) rest_min[i] = rest_min[i + 1] + lengths(n.kids[i]).first;
      std::vector<size_t> n_var(n.kids.size() + 1, 0);  // kids i.. whose length varies: they share the slack
      for (size_t i = n.kids.size(); i-- > 0;) {
        const auto [a, b] = lengths(n.kids[i]);
        n_var[i] = n_var[i + 1] + (b > a);
      }
      Node out = make_node(Node::Seq);
      uint64_t left = limit;
      for (size_t i = 0; i < n.kids.size(); ++i) {
        const uint64_t own_min = rest_min[i] - rest_min[i + 1];
        const uint64_t share = n_var[i] > 1 ? (left - rest_min[i]) / n_var[i] : left - rest_min[i];
        std::optional<Node> k = cap(n.kids[i], own_min + share);
        if (!k) return std::nullopt;
        left -= lengths(*k).second;
        out.kids.push_back(std::move(*k));
      }
      return out;
    }
    case Node::Alt: {
      Node out = make_node(Node::Alt);
      for (const Node& k : n.kids) {
        if (std::optional<Node> x = cap(k, limit)) out.kids.push_back(std::move(*x));
      }
      if (out.kids.empty()) return std::nullopt;
      return out;
    }
    case Node::Repeat: {
      std::optional<Node> body = cap(n.kids[0], n.min > 0 ? limit / n.min : limit);
      if (!body) return n.min == 0 ? std::optional<Node>(make_node(Node::Seq)) : std::nullopt;
      const uint64_t unit = lengths(*body).second;
      uint64_t max = unit == 0 ? n.max : std::min(n.max, limit / unit);
      max = std::min(max, kMaxCount);
      if (max < n.min) return std::nullopt;
      Node out = make_node(Node::Repeat);
      out.min = n.min;
      out.max = max;
      out.kids.push_back(std::move(*body));
      return out;
    }
    default:
      return n;
  }
}

RegexGbnf convert(std::string_view pattern, const std::string& any_char, std::optional<uint64_t> max_len) {
  Parser parser(pattern);
  Node root = parser.parse();
  std::vector<Node> alts;
  if (root.kind == Node::Alt) {
    alts = std::move(root.kids);
  } else {
    alts.push_back(std::move(root));
  }
  Emitter emitter(parser, any_char);
  Node pad = make_node(Node::Repeat);  // any characters before / after an end without an anchor
  pad.min = 0;
  pad.max = kRegexUnbounded;
  pad.kids.push_back(make_node(Node::Any));
  RegexGbnf out;
  out.min_len = kRegexUnbounded;
  std::string expr;
  for (Node& alt : alts) {
    if (alt.kind != Node::Seq) {
      Node seq = make_node(Node::Seq);
      seq.kids.push_back(std::move(alt));
      alt = std::move(seq);
    }
    bool bol = false, eol = false;
    while (!alt.kids.empty() && alt.kids.front().kind == Node::Bol) {
      bol = true;
      alt.kids.erase(alt.kids.begin());
    }
    while (!alt.kids.empty() && alt.kids.back().kind == Node::Eol) {
      eol = true;
      alt.kids.pop_back();
    }
    if (has_anchor(alt)) {
      parser.error("anchors are supported only at the start and end of the pattern or an alternative");
    }
    if (!bol) alt.kids.insert(alt.kids.begin(), pad);
    if (!eol) alt.kids.push_back(pad);
    if (max_len) {
      std::optional<Node> capped = cap(alt, *max_len);
      if (!capped) continue;
      alt = std::move(*capped);
    }
    const auto [lo, hi] = lengths(alt);
    out.min_len = std::min(out.min_len, lo);
    out.max_len = std::max(out.max_len, hi);
    const std::string e = emitter.emit(alt);
    expr += (expr.empty() ? "" : " | ") + (e.empty() ? std::string("\"\"") : e);
  }
  if (expr.empty()) parser.error(fmt::format("no matching string is at most {} characters long", *max_len));
  out.expr = "(" + expr + ")";
  return out;
}

}  // namespace regex_impl

RegexGbnf regex_to_gbnf(std::string_view pattern, const std::string& any_char,
                        std::optional<uint64_t> max_len) {
  return regex_impl::convert(pattern, any_char, max_len);
}

}  // namespace ultra::grammar
