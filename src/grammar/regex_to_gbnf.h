// A JSON Schema `pattern` (an ECMA-262 regular expression) -> a GBNF expression over the JSON encoding of
// a string's content (between its quotes), for json_schema.h.
//
// Supported subset: literals; `.`; classes [a-z], [^...] with escapes; \d \w \s and their negations;
// \t \n \r \f \v \0 \xHH \uHHHH and escaped punctuation; groups ( ), (?: ), (?<name> ); alternation |;
// quantifiers ? * + {m} {m,} {m,n} (lazy forms `?` are the same language); anchors ^ at the start and $ at
// the end of the pattern or of a top-level alternative. Refused with ultra::Error: lookaround, back
// references, \b \B, \p{..}, anchors elsewhere, counts above 2000 (an upper count above 2000 is lowered to
// 2000: the strings generated still match).
//
// Semantics: `pattern` matches anywhere in the string (Python's re.search, as jsonschema does), so an end
// without an anchor is padded with any characters. Shorthand classes are the ASCII sets (\d = [0-9],
// \w = [A-Za-z0-9_], \s = [ \t\n\r\f\v]) and their negations exclude every Unicode digit / word /
// whitespace character that Python or JavaScript counts (ASCII-only complements), so a generated string
// matches under both engines; `.` is any code point but line terminators.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ultra::grammar {

inline constexpr uint64_t kRegexUnbounded = UINT64_MAX;

struct RegexGbnf {
  std::string expr;      // GBNF expression matching the JSON-encoded content of a matching string
  uint64_t min_len = 0;  // fewest code points of a matching string
  uint64_t max_len = 0;  // most code points, kRegexUnbounded when unbounded
};

// `any_char`: a GBNF expression for one JSON string character (escapes included), used to pad an end
// without an anchor. With `max_len` (a maxLength beside the pattern), repetition counts are lowered so
// that no string is longer (a subset of the pattern's strings; alternatives that cannot fit are left out).
// Throws ultra::Error "pattern /.../: <reason> at offset N".
RegexGbnf regex_to_gbnf(std::string_view pattern, const std::string& any_char,
                        std::optional<uint64_t> max_len = std::nullopt);

}  // namespace ultra::grammar
