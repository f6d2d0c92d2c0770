#include "server/chat.h"

#include <algorithm>

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

ChatTemplateOptions chat_template_options(const Model& model) {
  ChatTemplateOptions o;
  if (const Tokenizer* t = model.tokenizer()) {
    if (t->bos() >= 0) o.bos_token = std::string(t->token_to_piece(t->bos()));
    if (t->eos() >= 0) o.eos_token = std::string(t->token_to_piece(t->eos()));
  }
  return o;
}

std::vector<int32_t> encode_chat_prompt(const Tokenizer& tok, const std::string& text) {
  const bool has_bos = tok.bos() >= 0 && tok.add_bos() && text.starts_with(tok.token_to_piece(tok.bos()));
  return tok.encode(text, /*add_special=*/!has_bos, /*parse_special=*/true);
}

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopStrings::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  // The earliest complete stop string ends the text there.
  size_t cut = std::string::npos;
  for (const std::string& st : stops_) cut = std::min(cut, held_.find(st));
  std::string out;
  if (cut != std::string::npos) {
    out = held_.substr(0, cut);
    held_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest tail that is a proper prefix of a stop string.
  size_t keep = 0;
  for (const std::string& st : stops_)
    for (size_t k = std::min(st.size() - 1, held_.size()); k > keep; --k)
      if (held_.compare(held_.size() - k, k, st, 0, k) == 0) {
        keep = k;
        break;
      }
  out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStrings::flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace ultra::server
