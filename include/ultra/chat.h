// Chat conversations -> prompt tokens, and stop strings over streamed text, exactly as `ultra serve` does
// them for /v1/chat/completions and its "stop" field: for programs and bindings (the Python package) that
// drive a Context themselves and must render the same prompt as the server.
//
//   ultra::ChatFormatter chat(model);  // the model's own template, else the fallback format
//   std::vector<int32_t> ids = chat.encode(R"([{"role":"user","content":"Hi"}])");
//
// Implemented by the command's own library (ultra_app: src/server/chat_api.cpp over the server's renderer and
// Jinja interpreter), which the `ultra` command and the Python extension link; not part of the installed
// library (ultra::ultra), so this header is not installed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ultra/model.h"

namespace ultra {

class ChatFormatter {
 public:
  // The model's chat template (Model::chat_template()), or template_source when it is not empty; without
  // either, the server's fallback format ("<|ROLE|>\nCONTENT\n" per message, then "<|assistant|>\n").
  // Throws ultra::Error when the template cannot be parsed, or the model has no tokenizer.
  explicit ChatFormatter(const Model& model, const std::string& template_source = "");
  ~ChatFormatter();
  ChatFormatter(ChatFormatter&&) noexcept;
  ChatFormatter& operator=(ChatFormatter&&) noexcept;

  // messages_json: a JSON array of {"role": string, "content": string | [{"type": "text", "text": ...}]}
  // (checked as the server checks a request); kwargs_json: a JSON object of extra template variables
  // (chat_template_kwargs). Throws ultra::Error for malformed JSON, messages the server refuses, or a
  // template that raises.
  std::string render(std::string_view messages_json, bool add_generation_prompt = true,
                     std::string_view kwargs_json = "{}") const;
  // The prompt's token ids as the server computes them (control tokens recognised in the template's own
  // text, not in message contents unless allow_special_in_content; no double BOS).
  std::vector<int32_t> encode(std::string_view messages_json, bool add_generation_prompt = true,
                              bool allow_special_in_content = false,
                              std::string_view kwargs_json = "{}") const;
  // Whether a Jinja template (the model's or the given one) renders, rather than the fallback format.
  bool has_template() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Stop strings over streamed text, as the server holds them back: push() takes newly generated text and
// returns what is final, keeping back a tail that could begin a stop string (no part of a stop string
// ever reaches the output); once one is complete, stopped() is true and the text before it has been
// returned. flush() returns what is held back when generation ends for another reason. Empty strings in
// `stops` are ignored.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);
  ~StopStrings();
  StopStrings(StopStrings&&) noexcept;
  StopStrings& operator=(StopStrings&&) noexcept;

  std::string push(std::string_view text);
  std::string flush();
  bool stopped() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ultra
