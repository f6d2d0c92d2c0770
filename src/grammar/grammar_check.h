// Checks of a parsed grammar that the matcher relies on: which rules can match the empty string, and that
// no rule can reach itself before consuming a code point (left recursion, direct or through rules that
// may be empty), which would make a top-down matcher's stacks grow without end.
#pragma once

#include <vector>

#include "grammar/grammar.h"

namespace ultra::grammar {

// [n_rules] true for the rules that can match the empty string.
std::vector<bool> nullable_rules(const Grammar& g);

// Throws ultra::Error naming the cycle, e.g. "left recursion: expr -> expr".
void check_left_recursion(const Grammar& g);

}  // namespace ultra::grammar
