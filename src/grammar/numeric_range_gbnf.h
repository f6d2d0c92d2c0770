// Exact numeric ranges as GBNF expressions over JSON number syntax, for json_schema.h's `minimum` /
// `maximum` / `exclusiveMinimum` / `exclusiveMaximum` (the integer part is llama.cpp's idea of splitting a
// range by digit count and by the first digit where the bounds differ; this is our own implementation).
//
// Magnitudes are limited to 16 digits (kMaxRangeInt), as the unbounded `integer` rule is: an upper bound
// beyond it is lowered to it (every number generated still satisfies the bound), a lower bound beyond it is
// refused.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ultra::grammar {

inline constexpr int64_t kMaxRangeInt = 9'999'999'999'999'999;  // 16 digits

// Decimal digits of every integer in [lo, hi] (0 <= lo <= hi <= kMaxRangeInt), without leading zeros.
std::string uint_range_gbnf(int64_t lo, int64_t hi);

// JSON integers in [lo, hi] (an absent side is unbounded, within +-kMaxRangeInt); never "-0".
// Throws ultra::Error when the range is empty.
std::string int_range_gbnf(std::optional<int64_t> lo, std::optional<int64_t> hi);

// JSON numbers without exponent (an integer part and an optional fraction of up to 15 digits) in the range
// with integer bounds lo / hi, each inclusive or strict (exclusive). Callers round a fractional bound
// inwards (ceil a lower one, floor an upper one, then inclusive). Throws ultra::Error when empty.
std::string number_range_gbnf(std::optional<int64_t> lo, bool lo_strict, std::optional<int64_t> hi,
                              bool hi_strict);

}  // namespace ultra::grammar
