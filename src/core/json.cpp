#include "core/json.h"

#include <unordered_set>
#include <vector>

#include "core/error.h"

namespace ultra {

using nlohmann::json;

nlohmann::json parse_json(std::string_view text, const std::string& name) {
  std::vector<std::unordered_set<std::string>> keys;  // one set per open object
  // depth: the number of containers open around the event's value.
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) fail("{}: JSON nested deeper than {} levels", name, kMaxJsonDepth);
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        keys.pop_back();
        break;
      case json::parse_event_t::key: {
        auto& key = parsed.get_ref<const std::string&>();
        if (!keys.back().insert(key).second) fail("{}: JSON key '{}' appears twice in one object", name, key);
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), on_event);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", name, e.what());
  }
}

nlohmann::json parse_json_text(std::string_view text, const nlohmann::json::parser_callback_t& cb,
                               bool allow_exceptions) {
  return json::parse(text, cb, allow_exceptions);
}

nlohmann::ordered_json parse_ordered_json_text(std::string_view text, bool allow_exceptions) {
  return nlohmann::ordered_json::parse(text, nullptr, allow_exceptions);
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump();
}

}  // namespace ultra
