#include "server/chat.h"

#include <algorithm>
#include <optional>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"

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
                        const nlohmann::json& kwargs, const RenderBudget& budget) {
  if (tmpl) return tmpl->apply(messages, add_generation_prompt, kwargs, budget);
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

namespace {

using json = nlohmann::json;
using Span = Tokenizer::Span;

// Which strings of the messages become placeholders (see encode_chat in chat.h).
enum class Cover { All, Contents, None };

// Where a JSON node sits in a message, as far as covering it goes.
enum class Kind { Other, Message, Role, Type, Content, ContentPart, PartText };

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// 16 random letters a..y; a placeholder is the nonce, the string's index in decimal and 'z'.
std::string make_nonce() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s(16, 'a');
  for (char& c : s) c = (char)('a' + rng() % 25);
  return s;
}

// The messages with the strings that `cover` names replaced by placeholders (values: the strings by
// index, each distinct string once). Every string left as it is (and every object key) is checked for the
// text of a control token: ultra::Error when one has it.
struct Substitution {
  json messages;
  std::vector<std::string> values;

  Substitution(const Tokenizer& t, const json& in, Cover cover, const std::string& nonce) : messages(in) {
    std::unordered_map<std::string, size_t> index;
    auto check = [&](const std::string& s, const std::string& where) {
      size_t at = 0;
      const int32_t id = t.find_special(s, &at);
      if (id < 0) return;
      const std::string_view tok_text = t.token_to_piece(id);
      const char* why =
          cover == Cover::All
              ? "only the text of messages is kept apart from the chat template's own special tokens, not a "
                "message's role, a \"type\" or an object key"
          : cover == Cover::Contents
              ? "and the chat template uses that field so that it cannot be kept apart from the template's "
                "own special tokens (only message contents are)"
              : "and the chat template transforms the text of messages so that it cannot be kept apart from "
                "the template's own special tokens";
      fail(
          "{} contains the text of the special token '{}' (at byte {}): {}; remove it, or allow special "
          "tokens in message content (allow_special_in_content) to let it through as a control token",
          where, tok_text, at, why);
    };
    auto covered = [cover](Kind k) {
      switch (cover) {
        case Cover::All:
          return k != Kind::Role && k != Kind::Type;
        case Cover::Contents:
          return k == Kind::Content || k == Kind::PartText;
        case Cover::None:
          break;
      }
      return false;
    };
    struct Item {
      json* j;
      std::string where;
      Kind kind;
    };
    std::vector<Item> stack{{&messages, "messages", Kind::Other}};
    while (!stack.empty()) {
      Item it = std::move(stack.back());
      stack.pop_back();
      json& j = *it.j;
      if (j.is_string()) {
        const std::string& v = j.get_ref<const std::string&>();
        if (v.empty()) continue;
        if (!covered(it.kind)) {
          check(v, it.where);
          continue;
        }
        const auto [pos, added] = index.try_emplace(v, values.size());
        if (added) values.push_back(v);
        j = nonce + std::to_string(pos->second) + 'z';
      } else if (j.is_array()) {
        const bool top = it.j == &messages;
        for (size_t i = 0; i < j.size(); ++i)
          stack.push_back({&j[i], it.where + "[" + std::to_string(i) + "]",
                           top                        ? Kind::Message
                           : it.kind == Kind::Content ? Kind::ContentPart
                                                      : Kind::Other});
      } else if (j.is_object()) {
        for (auto& [key, val] : j.items()) {
          check(key, "a key of " + it.where);
          Kind k = key == "type" ? Kind::Type : Kind::Other;
          if (it.kind == Kind::Message && key == "role") k = Kind::Role;
          if (it.kind == Kind::Message && key == "content") k = Kind::Content;
          if (it.kind == Kind::ContentPart && key == "text") k = Kind::PartText;
          stack.push_back({&val, it.where + "." + key, k});
        }
      }
    }
  }
};

// The byte spans of the values in `real` when `real` is `templ` (a rendering with placeholders) with each
// placeholder replaced by its value, or by the value with whitespace cut from either end (trim, strip);
// nullopt when it is not. Spans: ascending, non-empty. A search with backtracking over where the values
// end (failed states remembered), given up past a work bound proportional to the text.
std::optional<std::vector<Span>> match_rendering(const std::string& templ, const std::string& real,
                                                 const std::string& nonce,
                                                 const std::vector<std::string>& values) {
  // templ = seg[0] value[occ[0]] seg[1] ... value[occ[m-1]] seg[m]
  std::vector<std::string_view> seg;
  std::vector<size_t> occ;
  for (size_t pos = 0;;) {
    const size_t f = templ.find(nonce, pos);
    if (f == std::string::npos) {
      seg.push_back(std::string_view(templ).substr(pos));
      break;
    }
    size_t d = f + nonce.size(), i = 0;
    const size_t d0 = d;
    while (d < templ.size() && templ[d] >= '0' && templ[d] <= '9' && d - d0 < 9)
      i = i * 10 + (templ[d++] - '0');
    if (d == d0 || d >= templ.size() || templ[d] != 'z' || i >= values.size()) return std::nullopt;
    seg.push_back(std::string_view(templ).substr(pos, f - pos));
    occ.push_back(i);
    pos = d + 1;
  }
  // Whitespace at either end of each value: the span may leave out up to that much.
  std::vector<std::pair<size_t, size_t>> slack(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string& v = values[i];
    size_t lead = 0, trail = 0;
    while (lead < v.size() && is_ws(v[lead])) ++lead;
    while (trail < v.size() - lead && is_ws(v[v.size() - 1 - trail])) ++trail;
    if (lead == v.size()) trail = lead;
    slack[i] = {lead, trail};
  }

  const std::string_view r(real);
  size_t work = 0;
  const size_t max_work = 16 * real.size() + (1u << 20);
  std::unordered_set<uint64_t> failed;  // (k, p): occurrence k at byte p cannot lead to a match
  const auto key = [&](size_t k, size_t p) { return (uint64_t)k * (real.size() + 1) + p; };
  // Occurrence k begins at byte p. Its candidates are the value's bytes [a, b): a from 0 up to the end of
  // its leading whitespace; for each a, b from the longest that matches down to where its trailing
  // whitespace begins (the value whole first). lo, nb: the current a's smallest b and the b left to try;
  // len: the current candidate's length.
  struct Frame {
    size_t k, p, a = 0, lo = 0, nb = 0, len = 0;
    bool a_ready = false;
  };
  std::vector<Frame> st;
  // Segment k at byte p: 0 no match, 1 the whole text matched, 2 a frame for occurrence k was pushed.
  const auto enter = [&](size_t k, size_t p) {
    if (r.substr(p, seg[k].size()) != seg[k]) return 0;
    p += seg[k].size();
    if (k == occ.size()) return p == real.size() ? 1 : 0;
    if (failed.contains(key(k, p))) return 0;
    st.push_back({k, p});
    return 2;
  };
  // The length of the common prefix of r from byte p and v from byte a, at most n (counted as work).
  const auto common = [&](size_t p, std::string_view v, size_t a, size_t n) {
    size_t i = 0;
    while (i < n && p + i < r.size() && a + i < v.size() && r[p + i] == v[a + i]) ++i;
    work += i + 1;
    return i;
  };
  int e = enter(0, 0);
  while (e != 1) {
    if (st.empty()) return std::nullopt;
    if (work > max_work) return std::nullopt;
    Frame& f = st.back();
    const std::string& v = values[occ[f.k]];
    const auto [lead, trail] = slack[occ[f.k]];
    bool found = false;
    while (!found && f.a <= lead) {
      if (!f.a_ready) {
        // From a, the value up to its trailing whitespace must follow; then as much of that as matches.
        const size_t lo = std::max(f.a, v.size() - trail);
        if (common(f.p, v, f.a, lo - f.a) != lo - f.a) {
          ++f.a;
          continue;
        }
        f.lo = lo;
        f.nb = common(f.p + (lo - f.a), v, lo, v.size() - lo) + 1;
        f.a_ready = true;
      }
      if (f.nb == 0) {
        f.a_ready = false;
        ++f.a;
        continue;
      }
      f.len = f.lo + --f.nb - f.a;
      found = true;
    }
    if (!found) {
      failed.insert(key(f.k, f.p));
      st.pop_back();
      continue;
    }
    e = enter(f.k + 1, f.p + f.len);  // may push: f is not used after this
  }
  std::vector<Span> spans;
  for (const Frame& f : st)
    if (f.len > 0) spans.push_back({f.p, f.p + f.len});
  return spans;
}

}  // namespace

std::vector<int32_t> encode_chat(const Tokenizer& tok, const nlohmann::json& messages,
                                 const std::function<std::string(const nlohmann::json&)>& render,
                                 bool allow_special_in_content) {
  const std::string real = render(messages);
  if (allow_special_in_content) return encode_chat_prompt(tok, real);
  for (const Cover cover : {Cover::All, Cover::Contents}) {
    std::string nonce = make_nonce();
    for (int tries = 0; tries < 4 && real.find(nonce) != std::string::npos; ++tries) nonce = make_nonce();
    if (real.find(nonce) != std::string::npos) break;
    const Substitution sub(tok, messages, cover, nonce);  // throws for special text left uncovered
    std::string templ;
    try {
      templ = render(sub.messages);
    } catch (...) {
      continue;  // the template refuses placeholders (e.g. it checks a field's form): cover less
    }
    const std::optional<std::vector<Span>> spans = match_rendering(templ, real, nonce, sub.values);
    if (!spans) continue;
    // No double BOS, as encode_chat_prompt, unless the BOS text at the start is a message's.
    const std::string_view bos = tok.bos() >= 0 ? tok.token_to_piece(tok.bos()) : std::string_view();
    const bool has_bos = tok.bos() >= 0 && tok.add_bos() && std::string_view(real).starts_with(bos) &&
                         (spans->empty() || spans->front().begin >= bos.size());
    return tok.encode_with_literal(real, *spans, /*add_special=*/!has_bos);
  }
  // The template transforms the strings: nothing can be kept apart, so nothing may hold special text.
  (void)Substitution(tok, messages, Cover::None, "");
  return encode_chat_prompt(tok, real);
}

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

size_t partial_marker_tail(std::string_view text, std::string_view marker) {
  if (marker.empty()) return 0;
  for (size_t k = std::min(marker.size() - 1, text.size()); k > 0; --k)
    if (text.substr(text.size() - k) == marker.substr(0, k)) return k;
  return 0;
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
  for (const std::string& st : stops_) keep = std::max(keep, partial_marker_tail(held_, st));
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
