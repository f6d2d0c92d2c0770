#include "server/json_text.h"

namespace ultra::server {

nlohmann::json parse_json_text(std::string_view text, const nlohmann::json::parser_callback_t& cb,
                               bool allow_exceptions) {
  return nlohmann::json::parse(text, cb, allow_exceptions);
}

nlohmann::ordered_json parse_ordered_json_text(std::string_view text, bool allow_exceptions) {
  return nlohmann::ordered_json::parse(text, nullptr, allow_exceptions);
}

std::string dump_replacing(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string dump_replacing(const nlohmann::ordered_json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump();
}

}  // namespace ultra::server
