// Chat messages -> prompt text: the one place where /v1/chat/completions renders a conversation.
//
// This version always uses the built-in fallback format below; the model's own Jinja template
// (ultra::ChatTemplate, src/chat/chat_template.h) plugs in here once the interpreter exists.
//
// Fallback format (documented in README.md): each message as "<|ROLE|>\nCONTENT\n", then "<|assistant|>\n"
// when add_generation_prompt. The prompt is encoded with the tokenizer's own special tokens (BOS).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace ultra::server {

// messages: a JSON array of {"role": string, "content": string | [{"type":"text","text":...}, ...]}
// (validated by the caller). kwargs: chat_template_kwargs (unused by the fallback).
std::string render_chat(const nlohmann::json& messages, bool add_generation_prompt,
                        const nlohmann::json& kwargs = nlohmann::json::object());

// The text of a message's content (a string, or the concatenated "text" parts of a list).
std::string message_text(const nlohmann::json& content);

}  // namespace ultra::server
