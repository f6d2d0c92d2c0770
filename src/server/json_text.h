// JSON text in and out for the server and the command line: nlohmann's parser and serializer are large
// templates, and every translation unit (or unity batch) that calls json::parse or dump() itself compiles
// its own copy (seconds each, most under ASan; one per json type and input type). These compile them once,
// in json_text.cpp, and do exactly what the nlohmann call beside each does. (ultra_app uses no src/core
// header but core/error.h, so core/json.h's equivalents are not shared.)
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ultra::server {

// json::parse(text, cb, allow_exceptions): throws nlohmann's exceptions (and whatever `cb` throws), or
// without exceptions returns a discarded value on invalid JSON.
nlohmann::json parse_json_text(std::string_view text, const nlohmann::json::parser_callback_t& cb = nullptr,
                               bool allow_exceptions = true);
// ordered_json::parse(text, nullptr, allow_exceptions).
nlohmann::ordered_json parse_ordered_json_text(std::string_view text, bool allow_exceptions = true);
// j.dump(indent, ' ', false, error_handler_t::replace): ill-formed UTF-8 in a string is written as U+FFFD
// instead of throwing.
std::string dump_replacing(const nlohmann::json& j, int indent = -1);
std::string dump_replacing(const nlohmann::ordered_json& j, int indent = -1);
// j.dump(): throws nlohmann::json::type_error on ill-formed UTF-8.
std::string dump_json(const nlohmann::json& j);

}  // namespace ultra::server
