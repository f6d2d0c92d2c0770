// Chat templates: the Jinja template a model ships (GGUF `tokenizer.chat_template`, HF
// tokenizer_config.json `chat_template`) run by ultra's own interpreter of the Jinja subset real templates
// use, in the environment HF transformers gives apply_chat_template: trim_blocks and lstrip_blocks,
// loop controls, `tojson` as json.dumps(x, ensure_ascii=False, ...), raise_exception(msg), strftime_now(fmt),
// and the variables messages, add_generation_prompt, bos_token, eos_token plus any extra keyword variables
// (vLLM's / llama.cpp's chat_template_kwargs).
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace ultra {

struct ChatTemplateOptions {
  std::string bos_token;  // the model's BOS and EOS strings (empty when it has none)
  std::string eos_token;
  // The time strftime_now() formats: 0 = now. Tests pin it.
  std::time_t now = 0;
};

class ChatTemplate {
 public:
  // Parses the template; throws ultra::Error naming the construct and its line when the template uses
  // something the interpreter does not support or is not valid Jinja.
  ChatTemplate(const std::string& source, ChatTemplateOptions options = {});
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders messages (a JSON array of {"role", "content", ...} objects). extra: a JSON object whose members
  // become template variables (they override nothing of the above but add to it). Throws ultra::Error with
  // the template's message on raise_exception(), and on a runtime error (naming it and the line).
  std::string apply(const nlohmann::json& messages, bool add_generation_prompt,
                    const nlohmann::json& extra = nlohmann::json::object()) const;

  const std::string& source() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ultra
