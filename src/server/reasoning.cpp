// Reasoning apart from the answer: the Think and Harmony syntaxes (reasoning.h).
#include "server/reasoning.h"
#include "server/json_text.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "server/chat.h"

namespace ultra::server {

namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
// Harmony's markers.
constexpr std::string_view kChannel = "<|channel|>", kMessage = "<|message|>", kEnd = "<|end|>",
                           kStart = "<|start|>", kReturn = "<|return|>", kCall = "<|call|>";

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// The longest tail of s that is a proper prefix of one of the markers: text that may still become one.
size_t marker_prefix_tail(std::string_view s, std::initializer_list<std::string_view> markers) {
  size_t best = 0;
  for (std::string_view m : markers) best = std::max(best, partial_marker_tail(s, m));
  return best;
}

// The first of the markers in s: its position (npos when none) and which.
size_t find_first(std::string_view s, std::initializer_list<std::string_view> markers,
                  std::string_view& which) {
  size_t at = std::string_view::npos;
  for (std::string_view m : markers)
    if (const size_t p = s.find(m); p < at) {
      at = p;
      which = m;
    }
  return at;
}

// A Harmony header's recipient: the word after "to=" ("" when none).
std::string recipient(std::string_view header) {
  const size_t p = header.find("to=");
  if (p == std::string_view::npos) return "";
  size_t e = p + 3;
  while (e < header.size() && !is_blank(header[e]) && header[e] != '<') ++e;
  return std::string(header.substr(p + 3, e - p - 3));
}

// A Harmony header's channel: the word after <|channel|> ("" when none).
std::string channel(std::string_view header) {
  const size_t p = header.find(kChannel);
  if (p == std::string_view::npos) return "";
  size_t b = p + kChannel.size(), e = b;
  while (e < header.size() && !is_blank(header[e]) && header[e] != '<') ++e;
  return std::string(header.substr(b, e - b));
}

}  // namespace

ReasoningSyntax detect_reasoning(std::string_view src) {
  if (src.find(kChannel) != std::string_view::npos) return ReasoningSyntax::Harmony;
  if (src.find(kThinkOpen) != std::string_view::npos) return ReasoningSyntax::Think;
  return ReasoningSyntax::None;
}

const char* reasoning_syntax_name(ReasoningSyntax s) {
  switch (s) {
    case ReasoningSyntax::Think:
      return "think";
    case ReasoningSyntax::Harmony:
      return "harmony";
    default:
      return "none";
  }
}

bool prompt_opens_thinking(std::string_view tail) {
  while (!tail.empty() && is_blank(tail.back())) tail.remove_suffix(1);
  return tail.ends_with(kThinkOpen);
}

bool prompt_opens_thinking(const Tokenizer& tok, std::span<const int32_t> prompt) {
  std::string tail;
  for (size_t i = prompt.size() - std::min<size_t>(prompt.size(), 8); i < prompt.size(); ++i)
    tail += tok.token_to_piece(prompt[i]);
  return prompt_opens_thinking(tail);
}

ReasoningStream::ReasoningStream(ReasoningSyntax syntax, bool in_thinking)
    : syntax_(syntax),
      place_(syntax == ReasoningSyntax::Think && in_thinking ? Place::Thinking : Place::Start) {}

ReasoningSplit ReasoningStream::push(std::string_view text) {
  ReasoningSplit out;
  pending_ += text;
  run(out, false);
  return out;
}

ReasoningSplit ReasoningStream::finish() {
  ReasoningSplit out;
  run(out, true);
  if (syntax_ == ReasoningSyntax::Harmony && (place_ == Place::Body || place_ == Place::Header))
    end_message(out);
  for (auto& [name, args] : calls_) out.calls.push_back(ToolCall{new_call_id(), name, args});
  calls_.clear();
  return out;
}

// A Harmony message ends (<|end|>, <|call|>, <|return|>, or the output): a call's body becomes the call (its
// arguments a JSON object; anything else is answer text, as a malformed call is elsewhere); a header never
// closed by <|message|> is dropped.
void ReasoningStream::end_message(ReasoningSplit& out) {
  if (place_ == Place::Body && !call_.empty()) {
    const nlohmann::ordered_json a = parse_ordered_json_text(args_, /*allow_exceptions=*/false);
    if (a.is_object())
      calls_.emplace_back(call_, dump_replacing(a));
    else
      out.content += args_;
  }
  call_.clear();
  args_.clear();
  header_.clear();
  place_ = Place::Start;
}

void ReasoningStream::run(ReasoningSplit& out, bool at_end) {
  if (syntax_ == ReasoningSyntax::None) {
    out.content += pending_;
    pending_.clear();
    return;
  }
  if (syntax_ == ReasoningSyntax::Think) {
    for (;;) {
      if (place_ == Place::Start) {  // only white space so far: a block may still open
        const size_t b = std::find_if_not(pending_.begin(), pending_.end(), is_blank) - pending_.begin();
        const std::string_view rest = std::string_view(pending_).substr(b);
        if (rest.starts_with(kThinkOpen)) {
          pending_.erase(0, b + kThinkOpen.size());
          place_ = Place::Thinking;
          continue;
        }
        if (!at_end && kThinkOpen.starts_with(rest)) return;  // "", "<", "<th", ...: wait
        place_ = Place::Answer;
      }
      if (place_ == Place::Thinking) {
        const size_t e = pending_.find(kThinkClose);
        if (e != std::string::npos) {
          out.reasoning += pending_.substr(0, e);
          pending_.erase(0, e + kThinkClose.size());
          trim_ = true;  // the white space between the block and the answer is neither
          place_ = Place::Answer;
          continue;
        }
        const size_t keep = at_end ? 0 : marker_prefix_tail(pending_, {kThinkClose});
        out.reasoning += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      if (trim_) {  // Answer
        pending_.erase(0, std::find_if_not(pending_.begin(), pending_.end(), is_blank) - pending_.begin());
        if (pending_.empty()) return;
        trim_ = false;
      }
      out.content += pending_;
      pending_.clear();
      return;
    }
  }
  // Harmony
  for (;;) {
    if (place_ == Place::Header) {
      const size_t m = pending_.find(kMessage);
      if (m == std::string::npos) {
        // the header so far moves to header_ (a tail that may begin the marker stays), so that a runaway
        // header is scanned once, not again with every piece; a header never closed is dropped
        const size_t keep = at_end ? 0 : partial_marker_tail(pending_, kMessage);
        header_ += std::string_view(pending_).substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      header_ += pending_.substr(0, m);
      pending_.erase(0, m + kMessage.size());
      const std::string ch = channel(header_), to = recipient(header_);
      call_ = to.starts_with("functions.") ? to.substr(10) : "";
      to_reasoning_ = call_.empty() && ch == "analysis";
      place_ = Place::Body;
      continue;
    }
    // Start (between messages) and Body: text up to the next marker
    std::string_view which;
    const size_t at = find_first(pending_, {kChannel, kEnd, kStart, kReturn, kCall}, which);
    const size_t n =
        at != std::string::npos
            ? at
            : pending_.size() -
                  (at_end ? 0
                          : marker_prefix_tail(pending_, {kChannel, kMessage, kEnd, kStart, kReturn, kCall}));
    const std::string_view text = std::string_view(pending_).substr(0, n);
    const bool blank = text.find_first_not_of(" \t\r\n") == std::string_view::npos;
    if (place_ == Place::Start && blank && !loose_ && at == std::string::npos && !at_end)
      return;  // white space between messages is dropped, before text outside them is not: wait
    if (place_ == Place::Body && !call_.empty())
      args_ += text;
    else if (place_ == Place::Body && to_reasoning_)
      out.reasoning += text;
    else if (place_ == Place::Body || !blank || loose_) {
      out.content += text;  // an answer's body, or text outside any message
      loose_ = place_ == Place::Start;
    }
    if (at == std::string::npos) {
      pending_.erase(0, n);
      return;
    }
    loose_ = false;
    if (which == kChannel || which == kStart) {
      // a new header: <|start|>ROLE[ to=R]<|channel|>... or a bare <|channel|>...
      if (place_ == Place::Body) end_message(out);
      header_ = which == kStart ? "" : std::string(kChannel);
      pending_.erase(0, at + which.size());
      place_ = Place::Header;
      continue;
    }
    pending_.erase(0, at + which.size());  // <|end|>, <|return|>, <|call|>
    end_message(out);
  }
}

ReasoningSplit split_reasoning(std::string_view text, ReasoningSyntax syntax, bool in_thinking) {
  ReasoningStream s(syntax, in_thinking);
  ReasoningSplit a = s.push(text), b = s.finish();
  a.reasoning += b.reasoning;
  a.content += b.content;
  a.calls = std::move(b.calls);
  return a;
}

}  // namespace ultra::server
