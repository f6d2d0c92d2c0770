// Helpers that write GBNF text (the syntax of gbnf_parser.h) for the compilers that generate grammars
// (json_schema.h, regex_to_gbnf.h): quoted literals, character classes, and the JSON encoding of one code
// point from a set (what a JSON string's content must contain for that code point).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace ultra::grammar {

// Sorts and merges the ranges (inclusive code points).
std::vector<CharRange> normalize_ranges(std::vector<CharRange> set);
// Complement over [0, kMaxCodePoint] of a normalized set.
std::vector<CharRange> complement_ranges(const std::vector<CharRange>& set);
// a minus b, both normalized.
std::vector<CharRange> subtract_ranges(const std::vector<CharRange>& a, const std::vector<CharRange>& b);

// "text" as a GBNF literal (UTF-8 passes through; quotes, backslashes and control bytes are escaped).
std::string gbnf_literal(std::string_view utf8);
// [ranges] as a GBNF character class; the set must be normalized and non-empty.
std::string gbnf_class(const std::vector<CharRange>& set);

// A GBNF expression (a class, or a parenthesized alternation) matching the JSON string encoding of exactly
// one code point of `set`: the code point itself where JSON allows it raw, `\"` and `\\` for the quote and
// backslash, `\n` `\t` `\r` `\b` `\f` and `\u00XX` for control characters. Surrogates (U+D800..U+DFFF) are
// left out. Returns "" when nothing is left.
std::string json_encoded_char(const std::vector<CharRange>& set);

}  // namespace ultra::grammar
