// The body of the JSON Schema compiler fuzz target (fuzz/fuzz_json_schema.cpp), shared with
// tests/test_json_schema.cpp. Input: a JSON text (a schema), then optionally a NUL and a text to match.
// The text either fails to parse as JSON, or compiles, or the compiler throws ultra::Error; a schema that
// compiles has its grammar run over the text with fuzz_grammar.h's checks (snapshot, restore and replay
// agree). Anything else (another exception, a crash, a stack overflow, a sanitizer report, a hang) is a
// finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/json.h"
#include "fuzz_grammar.h"
#include "grammar/json_schema.h"

namespace ultra::fuzz {

// Returns true when the schema compiled.
inline bool json_schema_one_input(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  const std::string_view schema_text = all.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? std::string_view() : all.substr(nul + 1);
  nlohmann::json schema;
  try {
    schema = parse_json(schema_text, "schema");  // depth-limited, as the server parses requests
  } catch (const Error&) {
    return false;
  }
  std::shared_ptr<const grammar::Grammar> g;
  try {
    g = std::make_shared<const grammar::Grammar>(grammar::json_schema_to_grammar(schema));
  } catch (const Error&) {
    return false;
  }
  grammar_match_checks(g, text);
  return true;
}

}  // namespace ultra::fuzz
