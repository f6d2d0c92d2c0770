// Parsing the JSON files we read (safetensors headers and index files, config.json, generation_config.json,
// tokenizer.json, tokenizer_config.json) with the checks nlohmann::json leaves out.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ultra {

// Deepest nesting of objects/arrays accepted. Real files need few levels (tokenizer.json: ~7, with
// post-processor and normalizer sequences; config.json: 2-4); the bound stops a file of nested "[" or
// {"a": from costing memory and time in proportion to its length before any error is reported.
constexpr int kMaxJsonDepth = 64;

// JSON text -> json. Throws ultra::Error naming `name` on invalid JSON, on nesting deeper than
// kMaxJsonDepth (as soon as the parser gets there), and on a key repeated within one object (nlohmann
// would silently keep the last one; which one counts is then ambiguous).
nlohmann::json parse_json(std::string_view text, const std::string& name);

}  // namespace ultra
