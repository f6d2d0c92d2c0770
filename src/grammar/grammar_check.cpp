#include "grammar/grammar_check.h"

#include <string>

#include "core/error.h"

namespace ultra::grammar {

namespace check_detail {

// Calls f(first, last) for each alternative of rule r: its elements are [first, last).
template <typename F>
void for_each_alternative(const Grammar& g, uint32_t r, F f) {
  for (uint32_t k = g.rule_alts[r]; k < g.rule_alts[r + 1]; ++k) {
    uint32_t last = g.alt_start[k];
    while (!g.ends_alternative(last)) ++last;
    f(g.alt_start[k], last);
  }
}

}  // namespace check_detail

std::vector<bool> nullable_rules(const Grammar& g) {
  // Worklist: an alternative made of rule references only becomes empty-capable once all of them are.
  const size_t n = g.n_rules();
  std::vector<bool> nullable(n, false);
  std::vector<uint32_t> alt_rule, alt_remaining;  // [n_candidate_alternatives]
  std::vector<std::vector<uint32_t>> occurs(n);   // [n_rules] candidate alternatives that reference it
  std::vector<uint32_t> queue;
  for (uint32_t r = 0; r < n; ++r) {
    check_detail::for_each_alternative(g, r, [&](uint32_t first, uint32_t last) {
      uint32_t n_refs = 0;
      for (uint32_t i = first; i < last; ++i) {
        if (g.elements[i].op != Op::Rule) return;  // a code point is always consumed
        ++n_refs;
      }
      if (n_refs == 0) {
        if (!nullable[r]) queue.push_back(r);
        nullable[r] = true;
        return;
      }
      const auto k = (uint32_t)alt_rule.size();
      alt_rule.push_back(r);
      alt_remaining.push_back(n_refs);
      for (uint32_t i = first; i < last; ++i) occurs[g.elements[i].a].push_back(k);
    });
  }
  while (!queue.empty()) {
    const uint32_t s = queue.back();
    queue.pop_back();
    for (uint32_t k : occurs[s]) {
      if (--alt_remaining[k] == 0 && !nullable[alt_rule[k]]) {
        nullable[alt_rule[k]] = true;
        queue.push_back(alt_rule[k]);
      }
    }
  }
  return nullable;
}

void check_left_recursion(const Grammar& g) {
  const size_t n = g.n_rules();
  const std::vector<bool> nullable = nullable_rules(g);
  // Left-corner graph: r -> s when s can be the first thing r matches (only empty-capable rules before it).
  std::vector<std::vector<uint32_t>> corner(n);
  for (uint32_t r = 0; r < n; ++r) {
    check_detail::for_each_alternative(g, r, [&](uint32_t first, uint32_t last) {
      for (uint32_t i = first; i < last && g.elements[i].op == Op::Rule; ++i) {
        corner[r].push_back(g.elements[i].a);
        if (!nullable[g.elements[i].a]) break;
      }
    });
  }
  // Iterative depth-first search (rule chains can be thousands deep): a reference to a rule still on the
  // path closes a cycle.
  enum : uint8_t { kUnseen, kOnPath, kDone };
  std::vector<uint8_t> state(n, kUnseen);
  std::vector<std::pair<uint32_t, uint32_t>> path;  // (rule, next edge to follow)
  for (uint32_t start = 0; start < n; ++start) {
    if (state[start] != kUnseen) continue;
    path.push_back({start, 0});
    state[start] = kOnPath;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == corner[r].size()) {
        state[r] = kDone;
        path.pop_back();
        continue;
      }
      const uint32_t s = corner[r][next++];
      if (state[s] == kUnseen) {
        state[s] = kOnPath;
        path.push_back({s, 0});
      } else if (state[s] == kOnPath) {
        std::string cycle;
        size_t i = path.size();
        while (path[i - 1].first != s) --i;
        for (; i <= path.size(); ++i) cycle += g.rule_names[path[i - 1].first] + " -> ";
        cycle += g.rule_names[s];
        fail(
            "GBNF grammar: left recursion: {} (a rule must match a character before it can reach itself "
            "again; rewrite it with repetition, e.g. expr ::= term (\"+\" term)*)",
            cycle);
      }
    }
  }
}

}  // namespace ultra::grammar
