// The body of the GBNF grammar fuzz target (fuzz/fuzz_grammar.cpp), shared with tests/test_grammar.cpp.
// Input: a grammar, then optionally a NUL and a text to match. The grammar either parses or throws
// ultra::Error; a grammar that parses is run over the text in two halves with a snapshot between them,
// and must give the same answers after a restore and in one go. Anything else (another exception, a
// crash, a sanitizer report, a hang) is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "core/error.h"
#include "grammar/gbnf_parser.h"
#include "grammar/grammar_matcher.h"

namespace ultra::fuzz {

inline void grammar_require(bool ok, const char* what) {
  if (!ok) throw std::logic_error(std::string("fuzz invariant failed: ") + what);
}

// Runs a parsed grammar over the text in two halves with a snapshot between them and checks that restore,
// replay, one go and reset agree (a Matcher hitting its node limit throws ultra::Error: a clean refusal).
inline void grammar_match_checks(const std::shared_ptr<const grammar::Grammar>& g, std::string_view text) {
  grammar::Matcher::Limits limits;
  limits.reserve_nodes = 64;
  limits.max_nodes = size_t{1} << 16;  // keeps each input fast; hitting it throws ultra::Error
  try {
    grammar::Matcher m(g, limits);
    const std::string_view first = text.substr(0, text.size() / 2), second = text.substr(text.size() / 2);
    const size_t n1 = m.accept_bytes(first);
    grammar_require(n1 <= first.size(), "accepted count in range");
    if (n1 < first.size()) return;
    const grammar::Matcher::Snapshot mid = m.snapshot();
    const bool complete_mid = m.is_complete();
    const size_t n2 = m.accept_bytes(second);
    const bool complete_end = m.is_complete();
    grammar_require(!complete_end || !m.is_pending_utf8(), "complete only between code points");
    m.restore(mid);
    grammar_require(m.is_complete() == complete_mid, "restore gives back completeness");
    grammar_require(m.accept_bytes(second) == n2 && m.is_complete() == complete_end, "replay after restore");
    grammar::Matcher whole(g, limits);
    grammar_require(whole.accept_bytes(text) == n1 + n2 && whole.is_complete() == complete_end,
                    "one go equals two halves");
    whole.reset();
    grammar_require(whole.accept_bytes(text) == n1 + n2, "reset starts over");
  } catch (const Error&) {
    // The node limit: a clean refusal.
  }
}

// Returns true when the grammar parsed.
inline bool grammar_one_input(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string_view gtext = all.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? std::string_view() : all.substr(nul + 1);
  std::shared_ptr<const grammar::Grammar> g;
  try {
    g = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(gtext));
  } catch (const Error&) {
    return false;
  }
  grammar_match_checks(g, text);
  return true;
}

}  // namespace ultra::fuzz
