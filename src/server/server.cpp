#include "server/server.h"

#include "core/error.h"
#include "server/json_text.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>

#include "server/chat.h"
#include "server/constraints.h"
#include "server/reasoning.h"
#include "server/tool_calls.h"
#include "tokenizer/utf8.h"
#include "ultra/error.h"

namespace ultra::server {

using json = nlohmann::json;

namespace {

// An error answered as {"error": {...}} with an HTTP status.
struct ApiError {
  ApiError(int status_, std::string message_, std::string type_ = "invalid_request_error",
           std::string param_ = "", std::string code_ = "")
      : status(status_),
        message(std::move(message_)),
        type(std::move(type_)),
        param(std::move(param_)),
        code(std::move(code_)) {}
  int status;
  std::string message;
  std::string type;
  std::string param;  // "" -> null
  std::string code;   // "" -> null
};

// Every response body: ill-formed UTF-8 in a string (a detokenized piece of a character, a parser's message
// quoting the bad input) is written as U+FFFD instead of failing the response.
std::string to_text(const json& j) {
  return dump_replacing(j);
}

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

http::Reply json_reply(const json& j, int status = 200) {
  http::Reply r;
  r.status = status;
  r.body = to_text(j);
  return r;
}

http::Reply error_reply(const ApiError& e) {
  http::Reply r = json_reply(error_body(e), e.status);
  if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

// What the HTTP layer itself refuses (413, 415, 431, 400 for malformed HTTP, 503 for too many connections).
http::Reply layer_error(int status, const std::string& msg) {
  const char* type = status == 503   ? "unavailable_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  return error_reply(ApiError{status, msg, type});
}

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError{400, msg, "invalid_request_error", param};
}

// Constant-time comparison (the time depends on the lengths only).
bool same_secret(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? (unsigned char)a[i] : 0,
                        y = i < b.size() ? (unsigned char)b[i] : 0;
    diff |= (unsigned)(x ^ y);
  }
  return diff == 0;
}

// Request bodies nested deeper than this are refused while they are parsed, before anything copies or
// walks them (a copy of a JSON value recurses once per level).
constexpr int kMaxBodyDepth = 128;

json parse_body(const http::Request& req) {
  struct TooDeep {};
  std::string field;  // the top-level field being parsed: named when one of its numbers is out of range
  const json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth > kMaxBodyDepth) throw TooDeep{};
    if (ev == json::parse_event_t::key && depth == 1) field = parsed.get<std::string>();
    return true;
  };
  json j;
  try {
    j = parse_json_text(req.body, cb);
  } catch (const TooDeep&) {
    throw ApiError{400, fmt::format("the request body is nested deeper than {} levels", kMaxBodyDepth),
                   "invalid_request_error", field};
  } catch (const json::out_of_range& e) {  // a number beyond double's range (1e400)
    throw ApiError{400,
                   field.empty() ? "the request body holds a number out of range"
                                 : fmt::format("'{}' holds a number out of range", field.substr(0, 64)),
                   "invalid_request_error", field.substr(0, 64)};
  } catch (const json::exception& e) {
    throw ApiError{400, fmt::format("the request body is not valid JSON: {}", e.what())};
  }
  if (!j.is_object()) throw ApiError{400, "the request body must be a JSON object"};
  return j;
}

// The fields a completion request may carry. Known and implemented fields are read below; known fields
// that ask for something ultra does not do are refused when they ask for it (functions, echo, ...);
// unknown ones are ignored with a line in the log.
const std::set<std::string, std::less<>> kCommonFields = {"model",
                                                          "max_tokens",
                                                          "temperature",
                                                          "top_p",
                                                          "n",
                                                          "stream",
                                                          "stream_options",
                                                          "stop",
                                                          "presence_penalty",
                                                          "frequency_penalty",
                                                          "seed",
                                                          "user",
                                                          "logit_bias",
                                                          "logprobs",
                                                          "metadata",
                                                          "store",
                                                          "service_tier",
                                                          "top_k",
                                                          "min_p",
                                                          "repeat_penalty",
                                                          "repetition_penalty",
                                                          "repeat_last_n",
                                                          "ignore_eos",
                                                          "cache_prompt",
                                                          "grammar",
                                                          "json_schema",
                                                          "response_format"};
const std::set<std::string, std::less<>> kCompletionFields = {"prompt", "echo", "best_of", "suffix"};
const std::set<std::string, std::less<>> kChatFields = {"messages",
                                                        "max_completion_tokens",
                                                        "top_logprobs",
                                                        "tools",
                                                        "tool_choice",
                                                        "parallel_tool_calls",
                                                        "functions",
                                                        "function_call",
                                                        "modalities",
                                                        "audio",
                                                        "prediction",
                                                        "reasoning_effort",
                                                        "reasoning_format",
                                                        "web_search_options",
                                                        "chat_template",
                                                        "chat_template_kwargs",
                                                        "add_generation_prompt",
                                                        "allow_special_in_content"};

// A chat request's messages: a list (non-empty for a completion) of objects with a string role.
void check_messages(const json& j, bool non_empty) {
  if (!j.contains("messages") || !j["messages"].is_array() || (non_empty && j["messages"].empty()))
    bad("messages", "'messages' must be a non-empty list of {role, content} objects");
  for (const auto& m : j["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      bad("messages", "each message must be an object with a string 'role'");
    if (m.contains("content") && !m["content"].is_null() && !m["content"].is_string() &&
        !m["content"].is_array())
      bad("messages", "a message's 'content' must be a string or a list of parts");
  }
}

bool present(const json& j, const char* k) {
  return j.contains(k) && !j[k].is_null();
}

// Refuses what ultra parses but does not implement; logs the names of unknown fields.
void check_fields(const json& j, bool chat) {
  const auto unsupported = [](const char* k, const char* what) {
    throw ApiError{400, fmt::format("'{}' is not supported: {}", k, what), "invalid_request_error", k,
                   "unsupported_parameter"};
  };
  if (chat) {
    if (present(j, "functions")) unsupported("functions", "ultra does not call functions");
    if (present(j, "function_call") && j["function_call"] != "none")
      unsupported("function_call", "ultra does not call functions");
    if (present(j, "modalities") && j["modalities"] != json::array({"text"}))
      unsupported("modalities", "text only");
    if (present(j, "audio")) unsupported("audio", "text only");
    if (present(j, "prediction")) unsupported("prediction", "no predicted outputs");
    if (present(j, "web_search_options")) unsupported("web_search_options", "no web search");
  } else {
    if (present(j, "echo") && j["echo"] != false) unsupported("echo", "the prompt is not echoed");
    if (present(j, "best_of") && j["best_of"] != 1) unsupported("best_of", "only best_of = 1");
    if (present(j, "suffix") && j["suffix"] != "") unsupported("suffix", "no insertion (suffix)");
  }
  std::string unknown;
  int n_unknown = 0;
  for (const auto& [k, v] : j.items()) {
    if (kCommonFields.count(k) || (chat ? kChatFields : kCompletionFields).count(k)) continue;
    if (n_unknown++ < 8) unknown += fmt::format("{}'{}'", unknown.empty() ? "" : ", ", k.substr(0, 64));
  }
  if (n_unknown > 0)
    fmt::print(stderr, "ultra serve: ignoring unknown request field{} {}{}\n", n_unknown > 1 ? "s" : "",
               unknown, n_unknown > 8 ? fmt::format(" and {} more", n_unknown - 8) : "");
}

// Typed optional fields: absent or null -> the default; anything of the wrong type -> 400 naming it.
double get_number(const json& j, const char* k, double def, double lo, double hi) {
  if (!j.contains(k) || j[k].is_null()) return def;
  if (!j[k].is_number()) bad(k, fmt::format("'{}' must be a number", k));
  const double v = j[k].get<double>();
  if (!(v >= lo && v <= hi)) bad(k, fmt::format("'{}' must be in [{}, {}], got {}", k, lo, hi, v));
  return v;
}

int64_t get_int(const json& j, const char* k, int64_t def, int64_t lo, int64_t hi) {
  if (!j.contains(k) || j[k].is_null()) return def;
  if (!j[k].is_number_integer()) bad(k, fmt::format("'{}' must be an integer", k));
  const int64_t v = j[k].is_number_unsigned() ? (int64_t)std::min<uint64_t>(j[k].get<uint64_t>(), INT64_MAX)
                                              : j[k].get<int64_t>();
  if (v < lo || v > hi) bad(k, fmt::format("'{}' must be in [{}, {}], got {}", k, lo, hi, v));
  return v;
}

bool get_bool(const json& j, const char* k, bool def) {
  if (!j.contains(k) || j[k].is_null()) return def;
  if (!j[k].is_boolean()) bad(k, fmt::format("'{}' must be a boolean", k));
  return j[k].get<bool>();
}

std::string get_string(const json& j, const char* k, const std::string& def) {
  if (!j.contains(k) || j[k].is_null()) return def;
  if (!j[k].is_string()) bad(k, fmt::format("'{}' must be a string", k));
  return j[k].get<std::string>();
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:016x}", prefix, rng());
}

int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// What both completion endpoints share once the prompt is tokenized.
struct Job {
  std::shared_ptr<GenRequest> req;
  bool stream = false;
  bool include_usage = false;
  bool chat = false;
  std::string model;
  std::string id;
  int64_t created = 0;
  int n_prompt = 0;
  int n = 1;                                      // choices
  std::vector<std::shared_ptr<GenRequest>> reqs;  // [n] req and its copies, one per choice
  ToolRequest tools;                              // active(): the output is parsed for tool calls
  ToolFamily tool_family;
  // The output's reasoning goes to reasoning_content (None: all of it is content); in_thinking: the prompt
  // ends inside a <think> block.
  ReasoningSyntax reasoning = ReasoningSyntax::None;
  bool in_thinking = false;
};

// Completions per request (n): each runs in a KV slot of its own, with seed + i; the prompt is prefilled once
// (in the first's slot) and copied to the others' (GenRequest::forks).
constexpr int kMaxChoices = 16;

// Fills the sampling and stopping fields of `job` from the body; checks prompt + max_tokens <= n_ctx.
void parse_generation(const json& j, Job& job, const Scheduler& sched) {
  GenRequest& r = *job.req;
  job.model = get_string(j, "model", "ultra");
  job.stream = get_bool(j, "stream", false);
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    if (!j["stream_options"].is_object()) bad("stream_options", "'stream_options' must be an object");
    job.include_usage = get_bool(j["stream_options"], "include_usage", false);
  }
  job.n = (int)get_int(j, "n", 1, 1, kMaxChoices);
  // logprobs: chat takes a boolean and top_logprobs (0..20), completions an integer (the alternatives).
  constexpr int kMaxTop = SamplingParams::kMaxProbs;
  if (job.chat) {
    r.logprobs = get_bool(j, "logprobs", false);
    r.n_top = (int)get_int(j, "top_logprobs", 0, 0, kMaxTop);
    if (r.n_top > 0 && !r.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  } else if (j.contains("logprobs") && !j["logprobs"].is_null()) {
    if (!j["logprobs"].is_number_integer())
      bad("logprobs",
          fmt::format("'logprobs' must be an integer in [0, {}] (the alternatives per token)", kMaxTop));
    r.logprobs = true;
    r.n_top = (int)get_int(j, "logprobs", 0, 0, kMaxTop);
  }

  SamplingParams& p = r.sampling;
  p.temperature = (float)get_number(j, "temperature", p.temperature, 0, 100);
  p.top_p = (float)get_number(j, "top_p", p.top_p, 0, 1);
  p.top_k = (int)get_int(j, "top_k", p.top_k, -1, 1 << 30);
  p.min_p = (float)get_number(j, "min_p", p.min_p, 0, 1);
  p.presence_penalty = (float)get_number(j, "presence_penalty", p.presence_penalty, -2, 2);
  p.frequency_penalty = (float)get_number(j, "frequency_penalty", p.frequency_penalty, -2, 2);
  const char* rp = j.contains("repetition_penalty") ? "repetition_penalty" : "repeat_penalty";
  p.repeat_penalty = (float)get_number(j, rp, p.repeat_penalty, 0, 100);
  p.repeat_last_n = (int)get_int(j, "repeat_last_n", p.repeat_last_n, -1, SamplingParams::kMaxHistory);
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (!j["seed"].is_number_integer()) bad("seed", "'seed' must be an integer");
    p.seed = j["seed"].is_number_unsigned() ? j["seed"].get<uint64_t>() : (uint64_t)j["seed"].get<int64_t>();
  } else {
    p.seed = std::random_device{}() | ((uint64_t)std::random_device{}() << 32);
  }
  if (r.logprobs) p.n_probs = std::max(1, r.n_top);  // >= 1: greedy rows compute the logprob only then
  try {
    if (present(j, "logit_bias")) parse_logit_bias(j["logit_bias"], sched.n_sample_vocab(), p);
    r.grammar = request_grammar(j);
    if (job.tools.forced() && job.reasoning == ReasoningSyntax::Harmony)
      throw FieldError("tool_choice",
                       "'tool_choice' \"required\" or a named function is not supported with this model's "
                       "harmony format (gpt-oss): its calls are headed by control tokens a grammar cannot "
                       "write; use \"auto\"");
    if (job.tools.forced()) {  // the call is enforced by a grammar
      if (!r.grammar.empty())
        throw FieldError("tool_choice",
                         "'tool_choice' \"required\" or a named function constrains the output, and so does "
                         "'grammar' / 'json_schema' / 'response_format': give one");
      r.grammar = tool_call_grammar(job.tools, job.tool_family);
    }
  } catch (const FieldError& e) {
    bad(e.param, e.what());
  }
  // the families' markers may be control tokens, and harmony's are
  r.keep_special = job.tools.active() || job.reasoning == ReasoningSyntax::Harmony;
  if (job.tools.active() && !job.tools.forced() && r.grammar.empty() &&
      job.reasoning != ReasoningSyntax::Harmony) {
    LazyToolGrammar lazy = lazy_tool_grammar(job.tools, job.tool_family);  // "auto": a call once begun
    r.lazy_trigger = std::move(lazy.trigger);                              // is well formed
    r.lazy_grammar = std::move(lazy.grammar);
  }
  try {
    p.validate();
  } catch (const Error& e) {
    bad("", e.what());
  }
  r.ignore_eos = get_bool(j, "ignore_eos", false);
  r.cache_prompt = get_bool(j, "cache_prompt", true);

  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const auto& x : s) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or a list of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of strings");
    }
    std::erase_if(r.stop, [](const std::string& x) { return x.empty(); });
  }

  job.n_prompt = (int)r.prompt.size();
  if (r.prompt.empty()) bad(job.chat ? "messages" : "prompt", "the prompt is empty (no tokens)");
  const int n_ctx = sched.n_ctx();
  const char* mk = j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null()
                       ? "max_completion_tokens"
                       : "max_tokens";
  const bool given = j.contains(mk) && !j[mk].is_null();
  const int64_t max_tokens = get_int(j, mk, 0, 1, INT32_MAX);
  if (!given) {
    if (job.n_prompt >= n_ctx)
      throw ApiError{400,
                     fmt::format("the prompt has {} tokens, which leaves no room in the context of {} tokens",
                                 job.n_prompt, n_ctx),
                     "invalid_request_error", job.chat ? "messages" : "prompt", "context_length_exceeded"};
    r.max_tokens = n_ctx - job.n_prompt;
  } else {
    if (job.n_prompt + max_tokens > n_ctx)
      throw ApiError{400,
                     fmt::format("the prompt ({} tokens) plus {} ({}) is over the context of {} tokens",
                                 job.n_prompt, mk, max_tokens, n_ctx),
                     "invalid_request_error", mk, "context_length_exceeded"};
    r.max_tokens = (int)max_tokens;
  }
}

// Choice i of n: the request's input with seed + i.
std::shared_ptr<GenRequest> choice_copy(const GenRequest& r, int i) {
  auto c = std::make_shared<GenRequest>();
  c->prompt = r.prompt;
  c->sampling = r.sampling;
  c->sampling.seed = r.sampling.seed + (uint64_t)i;
  c->max_tokens = r.max_tokens;
  c->stop = r.stop;
  c->ignore_eos = r.ignore_eos;
  c->logprobs = r.logprobs;
  c->n_top = r.n_top;
  c->cache_prompt = r.cache_prompt;
  c->grammar = r.grammar;
  c->keep_special = r.keep_special;
  c->lazy_trigger = r.lazy_trigger;
  c->lazy_grammar = r.lazy_grammar;
  return c;
}

// A token's bytes as a JSON string: ill-formed UTF-8 (a piece of a multi-byte character) becomes U+FFFD;
// the exact bytes go in "bytes".
std::string valid_utf8(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const int k = tok::utf8::classify((const unsigned char*)s.data() + i, s.size() - i);
    if (k > 0) {
      out.append(s.substr(i, (size_t)k));
      i += (size_t)k;
    } else {
      out += "\xEF\xBF\xBD";
      i += k < 0 ? (size_t)-k : s.size() - i;
    }
  }
  return out;
}

json token_bytes(std::string_view s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back((int)c);
  return b;
}

// OpenAI's logprobs of a choice: chat {"content": [{token, logprob, bytes, top_logprobs}]}; completions
// {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}.
json logprobs_json(const Tokenizer& tok, bool chat, const std::vector<TokenLogprobs>& lp) {
  if (chat) {
    json content = json::array();
    for (const TokenLogprobs& e : lp) {
      const std::string_view piece = tok.token_to_piece(e.token);
      json top = json::array();
      for (const TokenLogprob& t : e.top) {
        const std::string_view p = tok.token_to_piece(t.token);
        top.push_back({{"token", valid_utf8(p)}, {"logprob", t.logprob}, {"bytes", token_bytes(p)}});
      }
      content.push_back({{"token", valid_utf8(piece)},
                         {"logprob", e.logprob},
                         {"bytes", token_bytes(piece)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprobs& e : lp) {
    tokens.push_back(valid_utf8(tok.token_to_piece(e.token)));
    logprobs.push_back(e.logprob);
    json top = json::object();
    for (const TokenLogprob& t : e.top) top[valid_utf8(tok.token_to_piece(t.token))] = t.logprob;
    tops.push_back(top);
    offsets.push_back(e.offset);
  }
  return {{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json usage_json(const Job& job, int n_completion, int n_cached) {
  return {{"prompt_tokens", job.n_prompt},
          {"completion_tokens", n_completion},
          {"total_tokens", job.n_prompt + n_completion},
          {"prompt_tokens_details", {{"cached_tokens", n_cached}}}};
}

json chunk_json(const Job& job, const std::string& text, const json& finish, bool first,
                const json& logprobs = nullptr, size_t index = 0, const std::string& reasoning = "") {
  json choice = {{"index", index}, {"finish_reason", finish}, {"logprobs", logprobs}};
  if (job.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
    if (!text.empty() || (first && reasoning.empty())) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return {{"id", job.id},
          {"object", job.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", job.created},
          {"model", job.model},
          {"choices", json::array({choice})}};
}

// message.tool_calls (streamed: delta.tool_calls, whose entries carry their index).
json tool_calls_json(const std::vector<ToolCall>& calls) {
  json a = json::array();
  for (const ToolCall& c : calls)
    a.push_back(
        {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return a;
}

// A stream's delta.tool_calls: per delta its call's index, on a call's first its id, type and name, and the
// next piece of its arguments.
json tool_deltas_json(const std::vector<ToolCallDelta>& deltas) {
  json a = json::array();
  for (const ToolCallDelta& d : deltas) {
    json c = {{"index", d.index}, {"function", {{"arguments", d.arguments}}}};
    if (!d.id.empty()) {
      c["id"] = d.id;
      c["type"] = "function";
      c["function"]["name"] = d.name;
    }
    a.push_back(std::move(c));
  }
  return a;
}

std::string sse(const json& j) {
  return "data: " + to_text(j) + "\n\n";
}

// A completion's reply as the scheduler produces it: the whole JSON answer once the generation is done, or
// SSE events as text becomes final. Polled on the HTTP layer's I/O thread whenever the scheduler wakes it.
class GenProducer final : public http::Producer {
 public:
  GenProducer(Job job, Tokenizer tok) : job_(std::move(job)), tok_(std::move(tok)) {
    for (const auto& r : job_.reqs) {
      Choice c;
      c.req = r;
      if (job_.reasoning != ReasoningSyntax::None)
        c.reasoning_stream.emplace(job_.reasoning, job_.in_thinking);
      if (job_.tools.active() && job_.reasoning != ReasoningSyntax::Harmony)  // harmony's calls: reasoning.h
        c.tool_stream.emplace(job_.tool_family, job_.tools);
      choices_.push_back(std::move(c));
    }
  }

  bool streamed() const override { return job_.stream; }

  void subscribe(std::function<void()> wake) override {
    for (Choice& c : choices_) {
      std::lock_guard lk(c.req->m);
      c.req->on_update = wake;
    }
  }

  bool poll(http::Reply& out) override {
    bool all_done = true;
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      if (c.done) continue;
      GenRequest& r = *c.req;
      std::string part;
      std::vector<TokenLogprobs> lp;
      {
        std::lock_guard lk(r.m);
        part = std::move(r.text);
        r.text.clear();
        lp.assign(std::make_move_iterator(r.logprobs_out.begin()),
                  std::make_move_iterator(r.logprobs_out.end()));
        r.logprobs_out.clear();
        if (r.done) {
          r.on_update = nullptr;
          c.done = true;
          c.finish_reason = r.finish_reason;
          c.error = r.error;
          c.n_completion = r.n_completion;
          c.n_cached = r.n_cached;
        }
      }
      const bool failed = c.done && (!c.error.empty() || c.finish_reason == "cancelled");
      std::string thought;  // reasoning_content's part
      if (c.reasoning_stream) {
        ReasoningSplit sp = c.reasoning_stream->push(part);
        if (c.done && !failed) {
          ReasoningSplit fin = c.reasoning_stream->finish();
          sp.reasoning += fin.reasoning;
          sp.content += fin.content;
          if (job_.tools.active())
            c.calls = std::move(fin.calls);
          else
            for (const ToolCall& k : fin.calls) sp.content += k.arguments;  // no tools: no calls
          if (!c.calls.empty() && c.finish_reason == "stop") c.finish_reason = "tool_calls";
        }
        part = std::move(sp.content);
        thought = std::move(sp.reasoning);
      }
      if (c.tool_stream) {  // text that may be a tool call is held back until the output is parsed
        part = c.tool_stream->push(part);
        if (c.done && !failed) {
          ToolParse fin = c.tool_stream->finish();
          part += fin.content;
          c.calls = std::move(fin.calls);
          if (!c.calls.empty() && c.finish_reason == "stop") c.finish_reason = "tool_calls";
        }
      }
      if (!c.done) all_done = false;
      if (!job_.stream) {
        c.text += part;
        c.reasoning += thought;
        c.lp.insert(c.lp.end(), std::make_move_iterator(lp.begin()), std::make_move_iterator(lp.end()));
        continue;
      }
      if (!part.empty() || !thought.empty() || !lp.empty() || (c.first && job_.chat)) {
        const json lpj = r.logprobs ? logprobs_json(tok_, job_.chat, lp) : json(nullptr);
        out.body += sse(chunk_json(job_, part, nullptr, c.first, lpj, i, thought));
        c.first = false;
      }
      // OpenAI's delta.tool_calls: the arguments in pieces as they are written; calls found by the reasoning
      // parser (harmony's, at the end) each whole.
      std::vector<ToolCallDelta> d;
      if (c.tool_stream) {
        d = c.tool_stream->take_deltas();
      } else if (c.done) {
        for (size_t k = 0; k < c.calls.size(); ++k)
          d.push_back({k, c.calls[k].id, c.calls[k].name, c.calls[k].arguments});
      }
      if (!d.empty()) {
        json chunk = chunk_json(job_, "", nullptr, false, nullptr, i);
        chunk["choices"][0]["delta"] = {{"tool_calls", tool_deltas_json(d)}};
        out.body += sse(chunk);
      }
      if (c.done && !failed) out.body += sse(chunk_json(job_, "", c.finish_reason, false, nullptr, i));
    }
    if (!all_done) return false;
    if (!job_.stream) {
      out = whole_reply();
      return true;
    }
    if (const Choice* f = failed_choice()) {
      if (!f->error.empty())
        out.body += sse(error_body(ApiError{500, f->error, "server_error"}));
      else  // the server is shutting down (a client that left reads nothing)
        out.body += sse(error_body(ApiError{503, "the server is shutting down; the generation was cut short",
                                            "unavailable_error", "", "shutdown"}));
    } else if (job_.include_usage) {
      json u = chunk_json(job_, "", nullptr, false);
      u["choices"] = json::array();
      u["usage"] = usage();
      out.body += sse(u);
    }
    out.body += "data: [DONE]\n\n";
    return true;
  }

  void cancel() override {
    for (Choice& c : choices_) {
      c.req->cancelled = true;  // the scheduler frees the slot before its next step
      std::lock_guard lk(c.req->m);
      c.req->on_update = nullptr;
    }
  }

 private:
  // One of the n completions.
  struct Choice {
    std::shared_ptr<GenRequest> req;
    bool first = true;  // streamed: the role is sent with the first chunk
    bool done = false;  // the request's results below are read
    std::string finish_reason, error;
    int n_completion = 0, n_cached = 0;
    std::string text;       // not streamed: the text so far
    std::string reasoning;  // not streamed: the reasoning so far
    std::vector<TokenLogprobs> lp;
    std::optional<ReasoningStream> reasoning_stream;  // takes the reasoning out (first)
    std::optional<ToolCallStream> tool_stream;        // tools active: finds the calls in the output
    // The parsed calls, once the generation is done (finish_reason "tool_calls" when it ended by itself; at
    // max_tokens it stays "length").
    std::vector<ToolCall> calls;
  };

  const Choice* failed_choice() const {
    for (const Choice& c : choices_)
      if (!c.error.empty()) return &c;
    for (const Choice& c : choices_)
      if (c.finish_reason == "cancelled") return &c;
    return nullptr;
  }

  // The prompt once; the completions' tokens added up; the cached prompt tokens of the first choice.
  json usage() const {
    int n = 0;
    for (const Choice& c : choices_) n += c.n_completion;
    return usage_json(job_, n, choices_[0].n_cached);
  }

  http::Reply whole_reply() {
    if (const Choice* f = failed_choice()) {
      if (!f->error.empty()) return error_reply(ApiError{500, f->error, "server_error"});
      return error_reply(ApiError{503, "the server is shutting down", "unavailable_error", "", "shutdown"});
    }
    json choices = json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& c = choices_[i];
      json choice = {{"index", i},
                     {"logprobs", c.req->logprobs ? logprobs_json(tok_, job_.chat, c.lp) : json(nullptr)},
                     {"finish_reason", c.finish_reason}};
      if (job_.chat && !c.calls.empty())
        choice["message"] = {{"role", "assistant"},
                             {"content", c.text.empty() ? json(nullptr) : json(c.text)},
                             {"tool_calls", tool_calls_json(c.calls)}};
      else if (job_.chat)
        choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      else
        choice["text"] = c.text;
      if (job_.chat && !c.reasoning.empty()) choice["message"]["reasoning_content"] = c.reasoning;
      choices.push_back(std::move(choice));
    }
    return json_reply({{"id", job_.id},
                       {"object", job_.chat ? "chat.completion" : "text_completion"},
                       {"created", job_.created},
                       {"model", job_.model},
                       {"choices", std::move(choices)},
                       {"usage", usage()}});
  }

  Job job_;
  Tokenizer tok_;  // a handle: the reply keeps the vocabulary alive
  std::vector<Choice> choices_;
};

}  // namespace

std::string model_id(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "dir/" -> "dir"
  const std::string name = p.filename().string();
  return name.empty() ? path : name;
}

Server::Server(ServerOptions opts) : opts_(std::move(opts)) {
  http_ = std::make_unique<http::Server>(opts_.limits, handlers());
}

Server::~Server() {
  stop();
  http_.reset();  // joins the workers while the routes' state is alive
}

int Server::bind(const std::string& host, int port) {
  return http_->bind(host, port);
}

bool Server::listen() {
  return http_->run();
}

void Server::stop() {
  if (http_) http_->stop();
}

void Server::attach(std::shared_ptr<Scheduler> scheduler) {
  const Model& m = scheduler->model();
  tmpl_opts_ = chat_template_options(m);
  const std::string& src = opts_.chat_template.empty() ? m.chat_template() : opts_.chat_template;
  if (!src.empty()) {
    try {
      tmpl_ = std::make_unique<ChatTemplate>(src, tmpl_opts_);
    } catch (const Error& e) {
      fail("{}'s chat template cannot be run: {} (give one with --chat-template FILE or NAME)",
           opts_.chat_template.empty() ? m.info().path : opts_.chat_template_label, e.what());
    }
    tmpl_source_ = opts_.chat_template.empty() ? "model" : opts_.chat_template_label;
  }
  tmpl_family_ = detect_tool_family(src);
  tmpl_reasoning_ = detect_reasoning(src);
  sched_ = std::move(scheduler);
  ready_ = true;
}

const std::string& Server::chat_template_source() const {
  return tmpl_source_;
}

// How a chat request's messages become prompt text: through the request's own "chat_template" (as vLLM takes
// it), else the server's; "chat_template_kwargs" are extra template variables; "add_generation_prompt"
// (default true). The fields are checked and the request's own template parsed once, here; the function
// renders any messages array with them (encode_chat renders more than once).
std::function<std::string(const nlohmann::json&)> Server::chat_renderer(const nlohmann::json& j,
                                                                        const http::Request& req,
                                                                        const nlohmann::json* tools) const {
  static const json kNoKwargs = json::object();
  if (j.contains("chat_template_kwargs") && !j["chat_template_kwargs"].is_object())
    bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
  const json* kwargs = j.contains("chat_template_kwargs") ? &j["chat_template_kwargs"] : &kNoKwargs;
  // The template's `tools` variable and the like (chat_template_kwargs cannot override them).
  std::shared_ptr<const json> with_tools;
  if (tools) {
    json extra = *kwargs;
    for (const auto& [k, v] : tools->items()) extra[k] = v;
    with_tools = std::make_shared<const json>(std::move(extra));
    kwargs = with_tools.get();
  }
  const bool agp = get_bool(j, "add_generation_prompt", true);
  std::shared_ptr<const ChatTemplate> own;
  if (j.contains("chat_template")) {
    if (!j["chat_template"].is_string()) bad("chat_template", "'chat_template' must be a string");
    try {
      own = std::make_shared<const ChatTemplate>(j["chat_template"].get<std::string>(), tmpl_opts_);
    } catch (const Error& e) {
      bad("chat_template", std::string("the chat template cannot be run: ") + e.what());
    }
  }
  // Bounded in bytes, work and time; stopped when the client leaves or the server stops.
  RenderBudget budget;
  budget.cancel = req.gone.get();
  const ChatTemplate* t = own ? own.get() : tmpl_.get();
  return [own, with_tools, t, kwargs, agp, budget](const json& messages) {
    try {
      return render_chat(t, messages, agp, *kwargs, budget);
    } catch (const Error& e) {
      bad("messages", std::string("the chat template refused the conversation: ") + e.what());
    }
  };
}

// A chat request's tools: checked, and the messages and the renderer prepared for them (the family is the
// request's own template's when it brings one, else the server's).
Server::ChatInput Server::chat_input(const nlohmann::json& j, const http::Request& req) const {
  ChatInput in;
  try {
    in.tools = parse_tool_request(j);
  } catch (const FieldError& e) {
    bad(e.param, e.what());
  }
  const bool own = j.contains("chat_template") && j["chat_template"].is_string();
  in.family = own ? detect_tool_family(j["chat_template"].get<std::string>()) : tmpl_family_;
  in.reasoning = own ? detect_reasoning(j["chat_template"].get<std::string>()) : tmpl_reasoning_;
  // "reasoning_format" (llama.cpp's): "auto" (or "deepseek") takes the reasoning out into reasoning_content,
  // "none" leaves the output as it is in content.
  const std::string rf = get_string(j, "reasoning_format", opts_.reasoning_format);
  if (rf == "none")
    in.reasoning = ReasoningSyntax::None;
  else if (rf != "auto" && rf != "deepseek")
    bad("reasoning_format", "'reasoning_format' must be \"auto\", \"deepseek\" or \"none\"");
  try {
    in.messages = prepare_tool_messages(j["messages"], in.family, in.tools);
  } catch (const FieldError& e) {
    bad(e.param, e.what());
  }
  if (in.reasoning == ReasoningSyntax::Harmony)  // gpt-oss's template reads an assistant's reasoning as
    for (json& m : in.messages)                  // `thinking` (as llama.cpp passes it)
      if (m.is_object() && m.contains("reasoning_content") && !m.contains("thinking"))
        m["thinking"] = m["reasoning_content"];
  const bool give = in.tools.active() && in.family.template_takes_tools;
  // FireFunction's template needs its variables with no tools too.
  const json vars = give || in.family.syntax == ToolSyntax::FireFunction
                        ? tool_template_variables(in.family, give ? in.tools : ToolRequest{})
                        : json();
  in.render = chat_renderer(j, req, vars.is_null() ? nullptr : &vars);
  return in;
}

http::Handlers Server::handlers() {
  http::Handlers h;
  h.error = layer_error;

  // Authentication, from the head alone: an unauthorised body is never read.
  h.check_head = [this](const http::Request& req) -> std::optional<http::Reply> {
    if (opts_.api_key.empty() || req.path == "/health") return std::nullopt;
    const std::string_view auth = req.header("authorization");
    const std::string_view prefix = "Bearer ";
    if (auth.size() > prefix.size() && auth.substr(0, prefix.size()) == prefix &&
        same_secret(auth.substr(prefix.size()), opts_.api_key))
      return std::nullopt;
    return error_reply(ApiError{401, "invalid or missing API key (expected 'Authorization: Bearer KEY')",
                                "authentication_error", "", "invalid_api_key"});
  };

  // The cheap GET routes, answered on the I/O thread.
  h.quick = [this](const http::Request& req, http::Reply& res) {
    if (req.method != "GET") return false;
    if (req.path == "/health") {
      res = json_reply(ready_ ? json{{"status", "ok"}} : json{{"status", "loading"}}, ready_ ? 200 : 503);
      return true;
    }
    if (req.path != "/v1/models" && req.path != "/metrics") return false;
    if (!ready_) {
      res = error_reply(ApiError{503, "the model is loading", "unavailable_error"});
      return true;
    }
    if (req.path == "/v1/models") {
      const json m = {{"id", opts_.model_name},
                      {"object", "model"},
                      {"created", now_s()},
                      {"owned_by", "ultra"},
                      {"meta", {{"n_ctx", sched_->n_ctx()}, {"n_slots", sched_->n_slots()}}}};
      res = json_reply({{"object", "list"}, {"data", json::array({m})}});
      return true;
    }
    const SchedulerStats& st = sched_->stats();
    std::string out;
    auto metric = [&](const char* name, const char* type, const char* help, int64_t v) {
      out += fmt::format("# HELP ultra_{0} {1}\n# TYPE ultra_{0} {2}\nultra_{0} {3}\n", name, help, type, v);
    };
    metric("requests_total", "counter", "generation requests accepted", st.requests_total);
    metric("prompt_tokens_total", "counter", "prompt tokens admitted", st.prompt_tokens_total);
    metric("prompt_tokens_cached_total", "counter", "prompt tokens found in a slot's cache (prefix reuse)",
           st.prompt_tokens_cached_total);
    metric("prompt_tokens_shared_total", "counter",
           "prompt tokens copied from another choice's slot (n > 1: the prompt is prefilled once)",
           st.prompt_tokens_shared_total);
    metric("prompt_tokens_prefilled_total", "counter", "prompt tokens run through the model",
           st.prompt_tokens_prefilled_total);
    metric("generated_tokens_total", "counter", "tokens generated", st.generated_tokens_total);
    metric("steps_total", "counter", "batched steps run", st.steps_total);
    metric("queue_depth", "gauge", "requests waiting for a slot", st.queue_depth);
    metric("busy_slots", "gauge", "KV slots held by requests", st.busy_slots);
    metric("slots", "gauge", "KV slots", sched_->n_slots());
    metric("http_connections", "gauge", "open HTTP connections", (int64_t)http_->connections());
    out +=
        "# HELP ultra_time_to_first_token_seconds time from a request's arrival to its first token\n"
        "# TYPE ultra_time_to_first_token_seconds histogram\n";
    for (size_t b = 0; b < SchedulerStats::kTtftBuckets; ++b)
      out += fmt::format("ultra_time_to_first_token_seconds_bucket{{le=\"{}\"}} {}\n",
                         SchedulerStats::kTtftBounds[b], st.ttft_le[b].load());
    out += fmt::format("ultra_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {}\n", st.ttft_count.load());
    out += fmt::format("ultra_time_to_first_token_seconds_sum {}\n", (double)st.ttft_sum_us.load() * 1e-6);
    out += fmt::format("ultra_time_to_first_token_seconds_count {}\n", st.ttft_count.load());
    res.content_type = "text/plain; version=0.0.4";
    res.body = std::move(out);
    return true;
  };

  h.handle = [this](http::Request& req) {
    try {
      return handle(req);
    } catch (const ApiError& e) {
      return error_reply(e);
    }
  };
  return h;
}

// The routes that parse a body, on a worker thread.
http::Reply Server::handle(http::Request& req) {
  const bool post = req.method == "POST";
  const bool known = req.path == "/tokenize" || req.path == "/detokenize" || req.path == "/apply-template" ||
                     req.path == "/v1/completions" || req.path == "/v1/chat/completions";
  if (!post || !known)
    throw ApiError{404,
                   fmt::format("unknown route: {} {}", req.method.substr(0, 16), req.path.substr(0, 256)),
                   "not_found_error"};
  if (!ready_) throw ApiError{503, "the model is loading", "unavailable_error"};
  if (req.path == "/v1/completions") return complete(req, false);
  if (req.path == "/v1/chat/completions") return complete(req, true);

  const json j = parse_body(req);
  if (req.path == "/tokenize") {
    if (!j.contains("content") || !j["content"].is_string()) bad("content", "'content' must be a string");
    const bool add_special = get_bool(j, "add_special", false);
    const auto ids = sched_->model().tokenizer()->encode(j["content"].get<std::string>(), add_special, true);
    return json_reply({{"tokens", ids}});
  }
  if (req.path == "/detokenize") {
    const Tokenizer& tok = *sched_->model().tokenizer();
    if (!j.contains("tokens") || !j["tokens"].is_array()) bad("tokens", "'tokens' must be a list of ids");
    std::vector<int32_t> ids;
    for (const auto& t : j["tokens"]) {
      if (!t.is_number_integer() ||
          (t.is_number_unsigned() && t.get<uint64_t>() >= (uint64_t)tok.n_vocab()) || t.get<int64_t>() < 0 ||
          t.get<int64_t>() >= tok.n_vocab())
        bad("tokens", fmt::format("'tokens' must hold ids in [0, {})", tok.n_vocab()));
      ids.push_back(t.get<int32_t>());
    }
    return json_reply({{"content", tok.decode(ids)}});
  }
  check_messages(j, false);
  const ChatInput in = chat_input(j, req);
  return json_reply({{"prompt", in.render(in.messages)}});  // /apply-template
}

http::Reply Server::complete(http::Request& req, bool chat) {
  const json j = parse_body(req);
  check_fields(j, chat);
  const Tokenizer& tok = *sched_->model().tokenizer();
  Job job;
  job.chat = chat;
  job.req = std::make_shared<GenRequest>();
  job.id = random_id(chat ? "chatcmpl-" : "cmpl-");
  job.created = now_s();
  if (chat) {
    check_messages(j, true);
    // The template's own text may hold control tokens, the messages' text does not (unless allowed): a
    // message cannot forge a turn. No double BOS.
    const bool allow = get_bool(j, "allow_special_in_content", opts_.allow_special_in_content);
    ChatInput in = chat_input(j, req);
    if (!allow && in.tools.active() && in.family.template_takes_tools) {
      try {
        check_tools_special(tok, in.tools);
      } catch (const FieldError& e) {
        bad(e.param, e.what());
      }
    }
    try {
      job.req->prompt = encode_chat(tok, in.messages, in.render, allow);
    } catch (const Error& e) {
      bad("messages", e.what());
    }
    job.tools = std::move(in.tools);
    job.tool_family = in.family;
    job.reasoning = in.reasoning;
    job.in_thinking = job.reasoning == ReasoningSyntax::Think && prompt_opens_thinking(tok, job.req->prompt);
  } else {
    if (!j.contains("prompt")) bad("prompt", "'prompt' is required");
    const json& p = j["prompt"];
    const auto is_ids = [](const json& a) {
      return a.is_array() && !a.empty() &&
             std::all_of(a.begin(), a.end(), [](const json& x) { return x.is_number_integer(); });
    };
    if (p.is_string()) {
      job.req->prompt = tok.encode(p.get<std::string>(), true, true);
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      job.req->prompt = tok.encode(p[0].get<std::string>(), true, true);
    } else if (is_ids(p)) {
      for (const auto& x : p) {
        if (x.is_number_unsigned() && x.get<uint64_t>() > (uint64_t)INT64_MAX)
          bad("prompt", fmt::format("prompt token {} is out of the vocabulary [0, {})", x.get<uint64_t>(),
                                    tok.n_vocab()));
        const int64_t v = x.get<int64_t>();
        if (v < 0 || v >= tok.n_vocab())
          bad("prompt", fmt::format("prompt token {} is out of the vocabulary [0, {})", v, tok.n_vocab()));
        job.req->prompt.push_back((int32_t)v);
      }
    } else {
      bad("prompt", "'prompt' must be a string or a list of token ids (one prompt)");
    }
  }
  parse_generation(j, job, *sched_);
  if (*req.gone) throw ApiError{499, "the client went away"};  // nothing is sent; the slot is not taken
  job.reqs.push_back(job.req);
  for (int i = 1; i < job.n; ++i) job.reqs.push_back(choice_copy(*job.req, i));
  // The other choices are the first's forks: its prompt is prefilled once and copied to their slots.
  job.req->forks.assign(job.reqs.begin() + 1, job.reqs.end());
  if (!sched_->submit(job.req))
    throw ApiError{503, "the server is busy (the request queue is full); retry later", "unavailable_error",
                   "", "queue_full"};
  const bool stream = job.stream;
  http::Reply r;
  if (stream) {
    r.content_type = "text/event-stream";
    r.headers.emplace_back("Cache-Control", "no-cache");
  }
  r.later = std::make_shared<GenProducer>(std::move(job), tok);
  return r;
}

}  // namespace ultra::server
