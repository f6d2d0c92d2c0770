// Chat messages -> prompt text: the one place where /v1/chat/completions renders a conversation: the
// model's own Jinja template (ultra::ChatTemplate, src/chat/chat_template.h; or --chat-template's) when
// there is one, else the built-in fallback format.
//
// Fallback format (documented in README.md): each message as "<|ROLE|>\nCONTENT\n", then "<|assistant|>\n"
// when add_generation_prompt.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"
#include "ultra/model.h"

namespace ultra::server {

// messages: a JSON array of {"role": string, "content": string | [{"type":"text","text":...}, ...]}
// (validated by the caller). tmpl: the template, or null for the fallback. kwargs: chat_template_kwargs
// (template variables; unused by the fallback). Throws ultra::Error when the template raises.
std::string render_chat(const ChatTemplate* tmpl, const nlohmann::json& messages, bool add_generation_prompt,
                        const nlohmann::json& kwargs = nlohmann::json::object());

// The text of a message's content (a string, or the concatenated "text" parts of a list).
std::string message_text(const nlohmann::json& content);

// The template variables bos_token / eos_token: the model's BOS and EOS text (empty when it has none).
ChatTemplateOptions chat_template_options(const Model& model);

// A rendered chat prompt's tokens: special tokens written in the text are parsed, and the BOS the
// vocabulary adds is not added when the text already starts with the BOS text (no double BOS).
std::vector<int32_t> encode_chat_prompt(const Tokenizer& tok, const std::string& text);

// Stop strings over streamed text: push() takes newly generated text and returns what is final, holding
// back a tail that could be the beginning of a stop string (so that no part of a stop string ever leaks
// into a stream); once a stop string is complete, stopped() is true and the text before it has been
// returned. flush() returns what is held back when the generation ends for another reason.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);
  std::string push(std::string_view text);
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;  // non-empty strings
  std::string held_;
  bool stopped_ = false;
};

}  // namespace ultra::server
