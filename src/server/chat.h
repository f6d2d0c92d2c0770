// Chat messages -> prompt text: the one place where /v1/chat/completions renders a conversation: the
// model's own Jinja template (ultra::ChatTemplate, src/chat/chat_template.h; or --chat-template's) when
// there is one, else the built-in fallback format.
//
// Fallback format (documented in README.md): each message as "<|ROLE|>\nCONTENT\n", then "<|assistant|>\n"
// when add_generation_prompt.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"
#include "ultra/model.h"

namespace ultra::server {

// messages: a JSON array of {"role": string, "content": string | [{"type":"text","text":...}, ...]}
// (validated by the caller). tmpl: the template, or null for the fallback. kwargs: chat_template_kwargs
// (template variables; unused by the fallback); budget: the render's bounds and cancel flag. Throws
// ultra::Error when the template raises or runs out of its budget.
std::string render_chat(const ChatTemplate* tmpl, const nlohmann::json& messages, bool add_generation_prompt,
                        const nlohmann::json& kwargs = nlohmann::json::object(),
                        const RenderBudget& budget = {});

// The text of a message's content (a string, or the concatenated "text" parts of a list).
std::string message_text(const nlohmann::json& content);

// The template variables bos_token / eos_token: the model's BOS and EOS text (empty when it has none).
ChatTemplateOptions chat_template_options(const Model& model);

// A rendered chat prompt's tokens: special tokens written in the text are parsed, and the BOS the
// vocabulary adds is not added when the text already starts with the BOS text (no double BOS). Parses
// special-token text that messages contain too: encode_chat() is the one for requests.
std::vector<int32_t> encode_chat_prompt(const Tokenizer& tok, const std::string& text);

// Renders `messages` with `render` and tokenizes the result: the template's own text with special-token
// parsing on, the text of message contents with it off (unless allow_special_in_content); no double BOS.
// render: the caller's (messages -> prompt text with its template). Called 1 to 3 times: what it throws on
// the real messages passes through; on the placeholder renderings anything it throws is caught (that
// rendering is not used).
//
// How: the messages are rendered once more with every user string replaced by a random placeholder (one
// per distinct string, so equal strings stay equal), which tells the template's own text apart; the real
// rendering must be that text with each placeholder replaced by its string, or by the string with
// whitespace (spaces, tabs, newlines) cut from either end (as trim / strip do). Then the real rendering is
// tokenized with control tokens recognised only outside the strings' spans (Tokenizer::
// encode_with_literal), so a conversation whose strings hold no special-token text gets exactly the ids
// of encode_chat_prompt(render(messages)).
// Which strings: first every string in a message but its "role" and any "type" (content, the text of
// content parts, name, reasoning_content, tool_call_id, tool_calls' function names and arguments, ...);
// when the template does more with some of them than print them (tojson, slicing, comparisons, a
// raise_exception on their form), the contents alone (string contents and text parts); when even those do
// not come back, none. Any string left out (at least "role", "type" and object keys) that holds the text
// of a control token is refused: ultra::Error naming the message, the field and the token text (which the
// server answers with 400). Not covered: what the caller passes to render other than messages (tools,
// chat_template_kwargs).
// allow_special_in_content: the old behaviour, encode_chat_prompt(tok, render(messages)).
std::vector<int32_t> encode_chat(const Tokenizer& tok, const nlohmann::json& messages,
                                 const std::function<std::string(const nlohmann::json&)>& render,
                                 bool allow_special_in_content);

// The length of the longest tail of `text` that is a proper prefix of `marker` (0: none): streamed text that
// may still become the marker, held back until more comes (stop strings, tool-call and reasoning markers).
size_t partial_marker_tail(std::string_view text, std::string_view marker);

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
