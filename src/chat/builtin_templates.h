// Built-in chat templates, by llama.cpp's names (`--chat-template chatml`, as llama.cpp's --chat-template
// takes them; names from llama.cpp's src/llama-chat.cpp). Each is a Jinja source run by the same
// interpreter as a model's own template (chat_template.h), written after the model family's real template
// (tests/test_chat_template.cpp checks each against the real one's renderings where the fixtures hold it).
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace ultra {

struct BuiltinChatTemplate {
  std::string_view name;    // llama.cpp's name: "chatml", "llama3", ...
  std::string_view family;  // the models whose template it follows
  std::string_view source;  // Jinja
};

// All built-ins, in the order --help lists them.
std::span<const BuiltinChatTemplate> builtin_chat_templates();

// The built-in called `name`, or nullptr.
const BuiltinChatTemplate* find_builtin_chat_template(std::string_view name);

// "chatml, llama2, ..." (for help texts and errors).
std::string builtin_chat_template_names();

}  // namespace ultra
