#include "server/chat.h"

namespace ultra::server {

std::string message_text(const nlohmann::json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  if (content.is_array())
    for (const auto& part : content)
      if (part.is_object() && part.value("type", "") == "text" && part.contains("text") &&
          part["text"].is_string())
        out += part["text"].get<std::string>();
  return out;
}

std::string render_chat(const ChatTemplate* tmpl, const nlohmann::json& messages, bool add_generation_prompt,
                        const nlohmann::json& kwargs) {
  if (tmpl) return tmpl->apply(messages, add_generation_prompt, kwargs);
  std::string out;
  for (const auto& m : messages) {
    out += "<|" + m["role"].get<std::string>() + "|>\n";
    if (m.contains("content")) out += message_text(m["content"]);
    out += "\n";
  }
  if (add_generation_prompt) out += "<|assistant|>\n";
  return out;
}

}  // namespace ultra::server
