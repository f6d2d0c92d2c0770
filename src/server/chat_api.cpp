// The public chat API (include/ultra/chat.h) over the server's own renderer (server/chat.h): one code path
// for `ultra serve`, `ultra chat` and the Python package.
#include "ultra/chat.h"

#include <optional>

#include "core/error.h"
#include "server/chat.h"
#include "server/json_text.h"

namespace ultra {

// A named namespace: ultra_app is compiled in unity units, where anonymous namespaces of several files meet.
namespace chat_api {

nlohmann::json parse_json(std::string_view text, const char* what) {
  nlohmann::json j = server::parse_json_text(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail("{}: not valid JSON", what);
  return j;
}

// The server's checks of a chat request's "messages" (server.cpp).
nlohmann::json parse_messages(std::string_view text) {
  nlohmann::json j = parse_json(text, "messages");
  if (!j.is_array() || j.empty()) fail("messages: must be a non-empty list of {{role, content}} objects");
  for (const auto& m : j) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      fail("messages: each message must be an object with a string 'role'");
    if (m.contains("content") && !m["content"].is_string() && !m["content"].is_array() &&
        !m["content"].is_null())
      fail("messages: a message's 'content' must be a string or a list of parts");
  }
  return j;
}

nlohmann::json parse_kwargs(std::string_view text) {
  nlohmann::json j = parse_json(text, "chat_template_kwargs");
  if (!j.is_object()) fail("chat_template_kwargs: must be an object");
  return j;
}

}  // namespace chat_api

struct ChatFormatter::Impl {
  Model model;
  std::optional<ChatTemplate> tmpl;
};

ChatFormatter::ChatFormatter(const Model& model, const std::string& template_source)
    : impl_(std::make_unique<Impl>(Impl{model, std::nullopt})) {
  if (!model.tokenizer()) fail("{}: this model has no tokenizer, which a chat needs", model.info().path);
  const std::string& src = template_source.empty() ? model.chat_template() : template_source;
  if (!src.empty()) impl_->tmpl.emplace(src, server::chat_template_options(model));
}
ChatFormatter::~ChatFormatter() = default;
ChatFormatter::ChatFormatter(ChatFormatter&&) noexcept = default;
ChatFormatter& ChatFormatter::operator=(ChatFormatter&&) noexcept = default;

bool ChatFormatter::has_template() const {
  return impl_->tmpl.has_value();
}

std::string ChatFormatter::render(std::string_view messages_json, bool add_generation_prompt,
                                  std::string_view kwargs_json) const {
  const nlohmann::json messages = chat_api::parse_messages(messages_json);
  return server::render_chat(impl_->tmpl ? &*impl_->tmpl : nullptr, messages, add_generation_prompt,
                             chat_api::parse_kwargs(kwargs_json));
}

std::vector<int32_t> ChatFormatter::encode(std::string_view messages_json, bool add_generation_prompt,
                                           bool allow_special_in_content,
                                           std::string_view kwargs_json) const {
  const nlohmann::json messages = chat_api::parse_messages(messages_json);
  const nlohmann::json kwargs = chat_api::parse_kwargs(kwargs_json);
  const ChatTemplate* t = impl_->tmpl ? &*impl_->tmpl : nullptr;
  return server::encode_chat(
      *impl_->model.tokenizer(), messages,
      [&](const nlohmann::json& m) { return server::render_chat(t, m, add_generation_prompt, kwargs); },
      allow_special_in_content);
}

struct StopStrings::Impl {
  server::StopStrings stops;
};

StopStrings::StopStrings(std::vector<std::string> stops)
    : impl_(std::make_unique<Impl>(Impl{server::StopStrings(std::move(stops))})) {}
StopStrings::~StopStrings() = default;
StopStrings::StopStrings(StopStrings&&) noexcept = default;
StopStrings& StopStrings::operator=(StopStrings&&) noexcept = default;

std::string StopStrings::push(std::string_view text) {
  return impl_->stops.push(text);
}
std::string StopStrings::flush() {
  return impl_->stops.flush();
}
bool StopStrings::stopped() const {
  return impl_->stops.stopped();
}

}  // namespace ultra
