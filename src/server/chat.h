// Chat messages -> prompt text: the one place where /v1/chat/completions renders a conversation: the
// model's own Jinja template (ultra::ChatTemplate, src/chat/chat_template.h; or --chat-template's) when
// there is one, else the built-in fallback format.
//
// Fallback format (documented in README.md): each message as "<|ROLE|>\nCONTENT\n", then "<|assistant|>\n"
// when add_generation_prompt.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"

namespace ultra::server {

// messages: a JSON array of {"role": string, "content": string | [{"type":"text","text":...}, ...]}
// (validated by the caller). tmpl: the template, or null for the fallback. kwargs: chat_template_kwargs
// (template variables; unused by the fallback). Throws ultra::Error when the template raises.
std::string render_chat(const ChatTemplate* tmpl, const nlohmann::json& messages, bool add_generation_prompt,
                        const nlohmann::json& kwargs = nlohmann::json::object());

// The text of a message's content (a string, or the concatenated "text" parts of a list).
std::string message_text(const nlohmann::json& content);

}  // namespace ultra::server
