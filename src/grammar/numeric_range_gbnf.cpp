#include "grammar/numeric_range_gbnf.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace ultra::grammar {

namespace numeric_range_impl {

std::string uint_range_impl(int64_t lo, int64_t hi);

int64_t pow10(int n) {
  int64_t v = 1;
  for (int i = 0; i < n; ++i) v *= 10;
  return v;
}

int n_digits(int64_t v) {
  int n = 1;
  while (v >= 10) {
    v /= 10;
    ++n;
  }
  return n;
}

std::string digit_class(char lo, char hi) {
  if (lo == hi) return fmt::format("\"{}\"", lo);
  return fmt::format("[{}-{}]", lo, hi);
}

std::string any_digits(size_t n) {
  if (n == 0) return "";
  if (n == 1) return "[0-9]";
  return fmt::format("[0-9]{{{}}}", n);
}

std::string join_alts(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

std::string cat(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + " " + b;
}

// Every digit string of a's length between a and b (equal lengths, a <= b; leading zeros allowed).
std::string same_length(const std::string& a, const std::string& b) {
  if (a.empty()) return "";
  if (a == b) return fmt::format("\"{}\"", a);
  size_t i = 0;
  while (a[i] == b[i]) ++i;
  const std::string prefix = i ? fmt::format("\"{}\"", a.substr(0, i)) : "";
  const char da = a[i], db = b[i];
  const std::string ra = a.substr(i + 1), rb = b.substr(i + 1);
  const size_t n = ra.size();
  const bool lo_zeros = ra.find_first_not_of('0') == std::string::npos;
  const bool hi_nines = rb.find_first_not_of('9') == std::string::npos;
  std::vector<std::string> alts;
  if (!lo_zeros) alts.push_back(cat(digit_class(da, da), same_length(ra, std::string(n, '9'))));
  const char first = lo_zeros ? da : (char)(da + 1), last = hi_nines ? db : (char)(db - 1);
  if (first <= last) alts.push_back(cat(digit_class(first, last), any_digits(n)));
  if (!hi_nines) alts.push_back(cat(digit_class(db, db), same_length(std::string(n, '0'), rb)));
  return cat(prefix, join_alts(alts));
}

const char* kAnyFrac = "(\".\" [0-9]{1,6})?";
const char* kZeroFrac = "(\".\" [0]{1,6})?";
const char* kNonzeroFrac = "\".\" [0-9]{0,5} [1-9]";

// Non-negative numbers m with A (<, <=) m (<, <=) B; B absent: unbounded.
void magnitude_alts(int64_t a, bool a_strict, std::optional<int64_t> b, bool b_strict,
                    std::vector<std::string>& alts) {
  const int64_t top = b.value_or(kMaxRangeInt);
  if (b && a == *b) {
    if (!a_strict && !b_strict) alts.push_back(cat(uint_range_impl(a, a), kZeroFrac));
    return;
  }
  if (b && a > *b) return;
  alts.push_back(cat(uint_range_impl(a, a), a_strict ? kNonzeroFrac : kAnyFrac));
  const int64_t mid_hi = b ? *b - 1 : kMaxRangeInt;
  if (a + 1 <= mid_hi) alts.push_back(cat(uint_range_impl(a + 1, mid_hi), kAnyFrac));
  if (b && !b_strict) alts.push_back(cat(uint_range_impl(top, top), kZeroFrac));
}

// A lower bound above the supported magnitudes (or an upper one below them) cannot be met; the other
// sides are clamped (the numbers generated still satisfy the bound).
void clamp_bounds(std::optional<int64_t>& lo, bool& lo_strict, std::optional<int64_t>& hi, bool& hi_strict) {
  if ((lo && *lo > kMaxRangeInt) || (hi && *hi < -kMaxRangeInt)) {
    fail("a numeric bound beyond the supported magnitudes (up to {})", kMaxRangeInt);
  }
  if (lo && *lo < -kMaxRangeInt) lo = -kMaxRangeInt, lo_strict = false;
  if (hi && *hi > kMaxRangeInt) hi = kMaxRangeInt, hi_strict = false;
}

std::string uint_range_impl(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  int full_from = 0, full_to = 0;  // a run of lengths whose every number is in range: one alternative
  auto flush = [&] {
    if (full_from == 0) return;
    if (full_from == full_to) {
      alts.push_back(full_from == 1 ? "[1-9]" : fmt::format("[1-9] {}", any_digits((size_t)full_from - 1)));
    } else {
      alts.push_back(fmt::format("[1-9] [0-9]{{{},{}}}", full_from - 1, full_to - 1));
    }
    full_from = full_to = 0;
  };
  for (int len = n_digits(lo); len <= n_digits(hi); ++len) {
    int64_t a = std::max(lo, len == 1 ? 0 : pow10(len - 1));
    const int64_t b = std::min(hi, pow10(len) - 1);
    if (len == 1 && a == 0) {
      alts.push_back("\"0\"");
      a = 1;
    }
    if (a > b) continue;
    if (a == pow10(len - 1) && b == pow10(len) - 1) {
      if (full_from == 0) full_from = len;
      full_to = len;
      continue;
    }
    flush();
    alts.push_back(same_length(std::to_string(a), std::to_string(b)));
  }
  flush();
  return join_alts(alts);
}

std::string int_range_impl(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  bool strict = false;
  clamp_bounds(lo, strict, hi, strict);
  const int64_t l = lo.value_or(-kMaxRangeInt), h = hi.value_or(kMaxRangeInt);
  if (l > h) fail("no integer in [{}, {}]", l, h);
  std::vector<std::string> alts;
  if (l < 0) {  // "-" and magnitudes in [max(1, -h), -l]
    const int64_t a = std::max<int64_t>(1, -h), b = -l;
    if (a <= b) alts.push_back("\"-\" " + uint_range_impl(a, b));
  }
  if (h >= 0) alts.push_back(uint_range_impl(std::max<int64_t>(0, l), h));
  return join_alts(alts);
}

std::string number_range_impl(std::optional<int64_t> lo, bool lo_strict, std::optional<int64_t> hi,
                              bool hi_strict) {
  clamp_bounds(lo, lo_strict, hi, hi_strict);
  std::vector<std::string> alts;
  // v >= 0: magnitude from max(lo, 0) to hi.
  if (!hi || *hi > 0 || (*hi == 0 && !hi_strict)) {
    const bool from_lo = lo && *lo >= 0;
    magnitude_alts(from_lo ? *lo : 0, from_lo && lo_strict, hi, hi_strict, alts);
  }
  // v < 0 written "-" m: m from max(-hi, 0) to -lo ("-0" and "-0.0" are 0, inside whenever 0 is).
  if (!lo || *lo < 0) {
    std::vector<std::string> neg;
    const bool from_hi = hi && *hi <= 0;
    magnitude_alts(from_hi ? -*hi : 0, from_hi && hi_strict, lo ? std::optional<int64_t>(-*lo) : std::nullopt,
                   lo_strict, neg);
    if (!neg.empty()) alts.push_back("\"-\" " + join_alts(neg));
  }
  if (alts.empty()) fail("no number in the range");
  return join_alts(alts);
}

}  // namespace numeric_range_impl

std::string uint_range_gbnf(int64_t lo, int64_t hi) {
  return numeric_range_impl::uint_range_impl(lo, hi);
}

std::string int_range_gbnf(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  return numeric_range_impl::int_range_impl(lo, hi);
}

std::string number_range_gbnf(std::optional<int64_t> lo, bool lo_strict, std::optional<int64_t> hi,
                              bool hi_strict) {
  return numeric_range_impl::number_range_impl(lo, lo_strict, hi, hi_strict);
}

}  // namespace ultra::grammar
