// The compiled form of a GBNF grammar: a flat table of rule bodies over Unicode code points, as parsed by
// gbnf_parser.h and walked by grammar_matcher.h. Close to llama.cpp's llama_grammar_element arrays, but a
// character class is one element pointing at a sorted, merged list of inclusive code point ranges (a
// negated class is stored as its complement), so a matcher tests a class with one binary search.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ultra::grammar {

enum class Op : uint8_t {
  End,    // end of the rule's last alternative
  Alt,    // end of one alternative, the next one follows
  Rule,   // reference to rule a
  Chars,  // one code point in ranges[a, a + b) (b == 0: matches nothing)
};

struct Element {
  Op op = Op::End;
  uint32_t a = 0;
  uint32_t b = 0;
};

struct CharRange {
  uint32_t lo = 0, hi = 0;  // inclusive code points
};

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// A rule body is its alternatives one after the other, each ended by Alt, the last by End:
//   value ::= object | "null"   ->   Rule(object) Alt Chars(n) Chars(u) Chars(l) Chars(l) End
// An empty alternative is an Alt or End right away. Repetitions were rewritten into helper rules by the
// parser (named <rule>_<id>, as llama.cpp does), so the table has only sequences, alternatives and refs.
struct Grammar {
  std::vector<Element> elements;        // [n_elements] every rule body; [0] = Rule(root), [1] = End
  std::vector<uint32_t> rule_start;     // [n_rules] index of the rule's first element in `elements`
  std::vector<std::string> rule_names;  // [n_rules] as written, or <rule>_<id> for a synthesized one
  std::vector<CharRange> ranges;        // the character classes' ranges, sorted and disjoint per class
  std::vector<uint32_t> alt_start;      // every alternative's first element, rule by rule
  std::vector<uint32_t> rule_alts;      // [n_rules + 1] rule r's alternatives: alt_start[rule_alts[r]..[r+1])
  uint32_t root = 0;                    // rule id of the start rule

  static constexpr uint32_t kStart = 0;  // the element Rule(root): where a matcher begins

  size_t n_rules() const { return rule_start.size(); }

  // True when the element ends an alternative.
  bool ends_alternative(uint32_t at) const {
    return elements[at].op == Op::End || elements[at].op == Op::Alt;
  }

  // True when the Chars element at `at` matches some code point in [lo, hi] (lo <= hi).
  bool matches_any_in(uint32_t at, uint32_t lo, uint32_t hi) const {
    const Element& e = elements[at];
    const CharRange* r = ranges.data() + e.a;
    size_t first = 0, last = e.b;  // binary search for the first range with r.hi >= lo
    while (first < last) {
      const size_t mid = (first + last) / 2;
      if (r[mid].hi < lo) {
        first = mid + 1;
      } else {
        last = mid;
      }
    }
    return first < e.b && r[first].lo <= hi;
  }

  // True when the Chars element at `at` matches code point c.
  bool matches(uint32_t at, uint32_t c) const { return matches_any_in(at, c, c); }
};

}  // namespace ultra::grammar
