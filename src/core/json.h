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

// nlohmann's parser and serializer are large templates: every translation unit that calls json::parse or
// dump() itself compiles its own copy (seconds each, most under ASan; one per json type and input type).
// These compile them once, here, and do exactly what the nlohmann call beside each does (the library's; the
// server has its own, server/json_text.h).
//
// json::parse(text, cb, allow_exceptions): throws nlohmann's exceptions (and whatever `cb` throws), or
// without exceptions returns a discarded value on invalid JSON.
nlohmann::json parse_json_text(std::string_view text, const nlohmann::json::parser_callback_t& cb = nullptr,
                               bool allow_exceptions = true);
// ordered_json::parse(text, nullptr, allow_exceptions).
nlohmann::ordered_json parse_ordered_json_text(std::string_view text, bool allow_exceptions = true);
// j.dump(): throws nlohmann::json::type_error on ill-formed UTF-8.
std::string dump_json(const nlohmann::json& j);

}  // namespace ultra
