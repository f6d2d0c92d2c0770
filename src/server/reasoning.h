// A chat output's reasoning ("thinking") returned apart from its answer, as message.reasoning_content
// (delta.reasoning_content when streamed), the field llama.cpp's server (--reasoning-format auto) and vLLM's
// reasoning parsers fill. Two syntaxes, detected from the chat template's text:
//   Think    <think>REASONING</think>ANSWER (DeepSeek R1, QwQ, Qwen3, SmolLM3, ...): the block is taken only
//            at the start of the output (after white space), or when the prompt itself ends inside one
//            (DeepSeek R1's template ends the prompt with "<think>\n"); an unclosed block is reasoning.
//   Harmony  gpt-oss's messages: <|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY,
//            ended by <|end|> (then <|start|>assistant and the next header), <|return|> or <|call|>. The
//            "analysis" channel is reasoning, "final" and "commentary" are the answer, and a message to
//            "functions.NAME" (on any channel; the recipient may also stand after <|start|>assistant) is a
//            call of tool NAME whose arguments are BODY. Text outside any header is answer.
// The markers are control tokens in gpt-oss's vocabulary: a Harmony output is generated with their text kept
// (GenRequest::keep_special), and every marker is taken out here.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_calls.h"

namespace ultra::server {

enum class ReasoningSyntax { None, Think, Harmony };

// The syntax a template's source writes ("" = the server's built-in fallback format: None): Harmony when it
// holds "<|channel|>", Think when it holds "<think>", else None.
ReasoningSyntax detect_reasoning(std::string_view template_source);
// "none", "think", "harmony".
const char* reasoning_syntax_name(ReasoningSyntax s);

// Whether a prompt's text (its last few tokens' text is enough) ends inside a thinking block: "<think>"
// followed by white space only.
bool prompt_opens_thinking(std::string_view prompt_tail);
// The same for a prompt's tokens (its last 8 tokens' text, control tokens' included).
bool prompt_opens_thinking(const Tokenizer& tok, std::span<const int32_t> prompt);

struct ReasoningSplit {
  std::string reasoning;        // the reasoning's text
  std::string content;          // the answer's text
  std::vector<ToolCall> calls;  // Harmony's calls (finish() only; ids made there)
};

// An output as it streams: push() returns the text that is certainly reasoning and certainly answer (ready
// to send), holding back a tail that could begin a marker (and a Harmony tool call's body until its message
// ends); finish() returns the rest, a tail that began no marker returned as the text it is.
class ReasoningStream {
 public:
  ReasoningStream(ReasoningSyntax syntax, bool in_thinking);
  ReasoningSplit push(std::string_view text);
  ReasoningSplit finish();

 private:
  enum class Place { Start, Thinking, Answer, Header, Body };
  void run(ReasoningSplit& out, bool at_end);
  void end_message(ReasoningSplit& out);

  ReasoningSyntax syntax_;
  Place place_;
  std::string pending_;        // text received, not yet placed
  std::string header_;         // Harmony: the current message's header (between the markers)
  std::string call_;           // Harmony: the tool called by the current message ("" = none)
  bool to_reasoning_ = false;  // Harmony: the current message's body is reasoning
  bool loose_ = false;         // Harmony: text outside any message was answer since the last marker
  bool trim_ = false;          // Think: white space after </think> is dropped until the answer begins
  std::string args_;           // Harmony: the current call's body
  std::vector<std::pair<std::string, std::string>> calls_;  // Harmony: (name, arguments) ended
};

// The whole output at once (push() of all of it, then finish()).
ReasoningSplit split_reasoning(std::string_view text, ReasoningSyntax syntax, bool in_thinking);

}  // namespace ultra::server
