#include "grammar/gbnf_emit.h"

#include <fmt/format.h>

#include <algorithm>

namespace ultra::grammar {

std::vector<CharRange> normalize_ranges(std::vector<CharRange> set) {
  std::sort(set.begin(), set.end(), [](const CharRange& x, const CharRange& y) { return x.lo < y.lo; });
  std::vector<CharRange> out;
  for (const CharRange& r : set) {
    if (!out.empty() && r.lo <= out.back().hi + 1) {
      out.back().hi = std::max(out.back().hi, r.hi);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<CharRange> complement_ranges(const std::vector<CharRange>& set) {
  std::vector<CharRange> out;
  uint32_t next = 0;
  for (const CharRange& r : set) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

std::vector<CharRange> subtract_ranges(const std::vector<CharRange>& a, const std::vector<CharRange>& b) {
  const std::vector<CharRange> not_b = complement_ranges(b);
  std::vector<CharRange> out;  // a intersected with not_b
  size_t i = 0, j = 0;
  while (i < a.size() && j < not_b.size()) {
    const uint32_t lo = std::max(a[i].lo, not_b[j].lo), hi = std::min(a[i].hi, not_b[j].hi);
    if (lo <= hi) out.push_back({lo, hi});
    if (a[i].hi < not_b[j].hi) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

std::string gbnf_literal(std::string_view utf8) {
  std::string out = "\"";
  for (const char ch : utf8) {
    const auto c = (unsigned char)ch;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02X}", c);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

namespace gbnf_emit_impl {

std::string class_char(uint32_t c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
    return std::string(1, (char)c);
  if (c <= 0xFF) return fmt::format("\\x{:02X}", c);
  if (c <= 0xFFFF) return fmt::format("\\u{:04X}", c);
  return fmt::format("\\U{:08X}", c);
}

}  // namespace gbnf_emit_impl

std::string gbnf_class(const std::vector<CharRange>& set) {
  std::string out = "[";
  for (const CharRange& r : set) {
    out += gbnf_emit_impl::class_char(r.lo);
    if (r.hi != r.lo) out += "-" + gbnf_emit_impl::class_char(r.hi);
  }
  return out + "]";
}

std::string json_encoded_char(const std::vector<CharRange>& set_in) {
  const std::vector<CharRange> set = subtract_ranges(normalize_ranges(set_in), {{0xD800, 0xDFFF}});
  // Raw: everything but control characters, the quote and the backslash.
  const std::vector<CharRange> raw = subtract_ranges(set, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
  std::vector<std::string> alts;
  if (!raw.empty()) alts.push_back(gbnf_class(raw));
  auto has = [&](uint32_t c) {
    for (const CharRange& r : set) {
      if (r.lo <= c && c <= r.hi) return true;
    }
    return false;
  };
  if (has('"')) alts.push_back(gbnf_literal("\\\""));
  if (has('\\')) alts.push_back(gbnf_literal("\\\\"));
  const bool all_controls = subtract_ranges({{0, 0x1F}}, set).empty();
  if (all_controls) alts.push_back(gbnf_literal("\\") + " ([bfnrt] | \"u00\" [01] [0-9a-fA-F])");
  for (uint32_t c = 0; c < 0x20 && !all_controls; ++c) {
    if (!has(c)) continue;
    switch (c) {
      case '\n':
        alts.push_back(gbnf_literal("\\n"));
        break;
      case '\t':
        alts.push_back(gbnf_literal("\\t"));
        break;
      case '\r':
        alts.push_back(gbnf_literal("\\r"));
        break;
      case '\b':
        alts.push_back(gbnf_literal("\\b"));
        break;
      case '\f':
        alts.push_back(gbnf_literal("\\f"));
        break;
      default:
        alts.push_back(gbnf_literal(fmt::format("\\u{:04x}", c)));
    }
  }
  if (alts.empty()) return "";
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

}  // namespace ultra::grammar
