// Parser of llama.cpp's GBNF grammar syntax (grammars/README.md there) into the rule table of grammar.h:
//
//   name ::= alternatives              one rule per line; `root` is the start rule by default
//   a b | c                            sequences and alternatives; a newline ends the rule except inside
//                                      ( ) and after `|` or `::=`
//   "lit\n\x41\u00e9\U0001F600"        literals; escapes \x \u \U \t \r \n \\ \" \[ \] \-
//   [a-z_] [^"\\] .                    character classes with ranges and negation; `.` is any code point
//   ( ... )  x*  x+  x?  x{m} x{m,} x{m,n}   grouping and repetition (m, n <= 2000)
//   # comment                          to the end of the line
//
// Repetitions are rewritten into right-recursive helper rules exactly as llama.cpp does, so the languages
// are the same. Token references (`<think>`, `<[id]>`, `!<...>`) need a vocabulary and are refused for
// now. Errors throw ultra::Error with the line and column and what was expected; undefined rules, a
// missing start rule, a rule defined twice and left recursion (which a top-down matcher cannot run) are
// refused too.
#pragma once

#include <string_view>

#include "grammar/grammar.h"

namespace ultra::grammar {

Grammar parse_gbnf(std::string_view text, std::string_view root = "root");

}  // namespace ultra::grammar
