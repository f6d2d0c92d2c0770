#include "server/server.h"

#include "core/error.h"

#include <fmt/format.h>
#include <httplib.h>

#include <sys/socket.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "server/chat.h"
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
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(to_text(error_body(e)), "application/json");
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

json parse_body(const httplib::Request& req) {
  json j;
  try {
    j = json::parse(req.body);
  } catch (const json::parse_error& e) {
    throw ApiError{400, fmt::format("the request body is not valid JSON: {}", e.what())};
  }
  if (!j.is_object()) throw ApiError{400, "the request body must be a JSON object"};
  return j;
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
};

// Fills the sampling and stopping fields of `job` from the body; checks prompt + max_tokens <= n_ctx.
void parse_generation(const json& j, Job& job, const Scheduler& sched) {
  GenRequest& r = *job.req;
  job.model = get_string(j, "model", "ultra");
  job.stream = get_bool(j, "stream", false);
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    if (!j["stream_options"].is_object()) bad("stream_options", "'stream_options' must be an object");
    job.include_usage = get_bool(j["stream_options"], "include_usage", false);
  }
  if (get_int(j, "n", 1, 1, 1 << 20) != 1) bad("n", "only n = 1 is supported");
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
                const json& logprobs = nullptr) {
  json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", logprobs}};
  if (job.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
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

std::string sse(const json& j) {
  return "data: " + to_text(j) + "\n\n";
}

}  // namespace

Server::Server(ServerOptions opts) : opts_(std::move(opts)), http_(std::make_unique<httplib::Server>()) {
  const int n = opts_.n_http_threads;
  http_->new_task_queue = [n] { return new httplib::ThreadPool((size_t)n); };
  http_->set_payload_max_length(opts_.max_body);
  // Responses go out as several writes (headers, body, SSE events): without TCP_NODELAY, Nagle's algorithm
  // waits for the client's delayed ACK (40 ms) before each small one.
  http_->set_tcp_nodelay(true);
  routes();
}

Server::~Server() {
  stop();
}

int Server::bind(const std::string& host, int port) {
  // cpp-httplib listens with a backlog of 5 (compiled into Debian's library): 32 clients connecting at once
  // overflowed it and some saw their connection reset. The listening socket is caught as it is created
  // (keeping httplib's own options) and listen() is called again with the system's maximum.
  int fd = -1;
  http_->set_socket_options([&fd](socket_t sock) {
    httplib::default_socket_options(sock);
    fd = sock;
  });
  const int bound = port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (bound >= 0 && fd >= 0) ::listen(fd, SOMAXCONN);
  return bound;
}

bool Server::listen() {
  return http_->listen_after_bind();
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
  sched_ = std::move(scheduler);
  ready_ = true;
}

const std::string& Server::chat_template_source() const {
  return tmpl_source_;
}

// The prompt text of a chat request: its messages through the request's own "chat_template" (as vLLM takes
// it), else the server's; "chat_template_kwargs" are extra template variables; "add_generation_prompt"
// (default true).
std::string Server::render_request(const nlohmann::json& j) const {
  if (!j.contains("messages") || !j["messages"].is_array())
    bad("messages", "'messages' must be a list of {role, content} objects");
  const json kwargs = j.value("chat_template_kwargs", json::object());
  if (!kwargs.is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
  const bool agp = get_bool(j, "add_generation_prompt", true);
  std::unique_ptr<ChatTemplate> own;
  const ChatTemplate* t = tmpl_.get();
  if (j.contains("chat_template")) {
    if (!j["chat_template"].is_string()) bad("chat_template", "'chat_template' must be a string");
    try {
      own = std::make_unique<ChatTemplate>(j["chat_template"].get<std::string>(), tmpl_opts_);
    } catch (const Error& e) {
      bad("chat_template", std::string("the chat template cannot be run: ") + e.what());
    }
    t = own.get();
  }
  try {
    return render_chat(t, j["messages"], agp, kwargs);
  } catch (const Error& e) {
    bad("messages", std::string("the chat template refused the conversation: ") + e.what());
  }
}

void Server::routes() {
  httplib::Server& s = *http_;

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opts_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string_view prefix = "Bearer ";
    const bool ok = auth.size() > prefix.size() && auth.compare(0, prefix.size(), prefix) == 0 &&
                    same_secret(std::string_view(auth).substr(prefix.size()), opts_.api_key);
    if (ok) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError{401, "invalid or missing API key (expected 'Authorization: Bearer KEY')",
                             "authentication_error", "", "invalid_api_key"});
    return httplib::Server::HandlerResponse::Handled;
  });

  s.set_error_handler(httplib::Server::HandlerWithResponse(
      [](const httplib::Request& req, httplib::Response& res) -> httplib::Server::HandlerResponse {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        if (res.status == 404)
          send_error(res, ApiError{404, fmt::format("unknown route: {} {}", req.method, req.path),
                                   "not_found_error"});
        else if (res.status == 413)
          send_error(
              res,
              ApiError{413,
                       req.get_header_value("Content-Type").starts_with("application/x-www-form-urlencoded")
                           ? "the request body is too large for a form (8192 bytes): send it as "
                             "Content-Type: application/json"
                           : "the request body is too large",
                       "invalid_request_error"});
        else
          send_error(res, ApiError{res.status, fmt::format("HTTP error {}", res.status), "server_error"});
        return httplib::Server::HandlerResponse::Handled;
      }));

  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    send_error(res, ApiError{500, msg, "server_error"});
  });

  // Runs a handler body that may throw ApiError; answers 503 until the model is loaded.
  auto guarded = [this](auto fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      if (!ready_) {
        res.set_header("Retry-After", "1");
        send_error(res, ApiError{503, "the model is loading", "unavailable_error"});
        return;
      }
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
        if (e.status == 503) res.set_header("Retry-After", "1");
      }
    };
  };

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (!ready_) {
      res.status = 503;
      res.set_content(R"({"status":"loading"})", "application/json");
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });

  s.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
          json m = {{"id", opts_.model_name},
                    {"object", "model"},
                    {"created", now_s()},
                    {"owned_by", "ultra"},
                    {"meta", {{"n_ctx", sched_->n_ctx()}, {"n_slots", sched_->n_slots()}}}};
          res.set_content(to_text(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
        }));

  s.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
          const SchedulerStats& st = sched_->stats();
          std::string out;
          auto metric = [&](const char* name, const char* type, const char* help, int64_t v) {
            out += fmt::format("# HELP ultra_{0} {1}\n# TYPE ultra_{0} {2}\nultra_{0} {3}\n", name, help,
                               type, v);
          };
          metric("requests_total", "counter", "generation requests accepted", st.requests_total);
          metric("prompt_tokens_total", "counter", "prompt tokens admitted", st.prompt_tokens_total);
          metric("prompt_tokens_cached_total", "counter",
                 "prompt tokens found in a slot's cache (prefix reuse)", st.prompt_tokens_cached_total);
          metric("generated_tokens_total", "counter", "tokens generated", st.generated_tokens_total);
          metric("steps_total", "counter", "batched steps run", st.steps_total);
          metric("queue_depth", "gauge", "requests waiting for a slot", st.queue_depth);
          metric("busy_slots", "gauge", "KV slots held by requests", st.busy_slots);
          metric("slots", "gauge", "KV slots", sched_->n_slots());
          out +=
              "# HELP ultra_time_to_first_token_seconds time from a request's arrival to its first token\n"
              "# TYPE ultra_time_to_first_token_seconds histogram\n";
          for (size_t b = 0; b < SchedulerStats::kTtftBuckets; ++b)
            out += fmt::format("ultra_time_to_first_token_seconds_bucket{{le=\"{}\"}} {}\n",
                               SchedulerStats::kTtftBounds[b], st.ttft_le[b].load());
          out += fmt::format("ultra_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {}\n",
                             st.ttft_count.load());
          out +=
              fmt::format("ultra_time_to_first_token_seconds_sum {}\n", (double)st.ttft_sum_us.load() * 1e-6);
          out += fmt::format("ultra_time_to_first_token_seconds_count {}\n", st.ttft_count.load());
          res.set_content(out, "text/plain; version=0.0.4");
        }));

  s.Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
           const json j = parse_body(req);
           if (!j.contains("content") || !j["content"].is_string())
             bad("content", "'content' must be a string");
           const bool add_special = get_bool(j, "add_special", false);
           const auto ids =
               sched_->model().tokenizer()->encode(j["content"].get<std::string>(), add_special, true);
           res.set_content(to_text(json{{"tokens", ids}}), "application/json");
         }));

  s.Post("/detokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
           const json j = parse_body(req);
           const Tokenizer& tok = *sched_->model().tokenizer();
           if (!j.contains("tokens") || !j["tokens"].is_array())
             bad("tokens", "'tokens' must be a list of ids");
           std::vector<int32_t> ids;
           for (const auto& t : j["tokens"]) {
             if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.n_vocab())
               bad("tokens", fmt::format("'tokens' must hold ids in [0, {})", tok.n_vocab()));
             ids.push_back(t.get<int32_t>());
           }
           res.set_content(to_text(json{{"content", tok.decode(ids)}}), "application/json");
         }));

  s.Post("/apply-template", guarded([this](const httplib::Request& req, httplib::Response& res) {
           const json j = parse_body(req);
           res.set_content(to_text(json{{"prompt", render_request(j)}}), "application/json");
         }));

  auto complete = [this](const httplib::Request& req, httplib::Response& res, bool chat) {
    const json j = parse_body(req);
    const Tokenizer& tok = *sched_->model().tokenizer();
    Job job;
    job.chat = chat;
    job.req = std::make_shared<GenRequest>();
    job.id = random_id(chat ? "chatcmpl-" : "cmpl-");
    job.created = now_s();
    if (chat) {
      if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty())
        bad("messages", "'messages' must be a non-empty list of {role, content} objects");
      for (const auto& m : j["messages"]) {
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
          bad("messages", "each message must be an object with a string 'role'");
        if (m.contains("content") && !m["content"].is_null() && !m["content"].is_string() &&
            !m["content"].is_array())
          bad("messages", "a message's 'content' must be a string or a list of parts");
      }
      const std::string text = render_request(j);
      // No double BOS: a template that writes the BOS text itself gets none added.
      job.req->prompt = encode_chat_prompt(tok, text);
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
    if (!sched_->submit(job.req))
      throw ApiError{503, "the server is busy (the request queue is full); retry later", "unavailable_error",
                     "", "queue_full"};

    if (!job.stream) {
      std::string text, part;
      std::vector<TokenLogprobs> lp;
      while (!job.req->wait_text(part, 1000, &lp)) text += part;
      text += part;
      GenRequest& r = *job.req;
      std::lock_guard lk(r.m);
      if (!r.error.empty()) throw ApiError{500, r.error, "server_error"};
      if (r.finish_reason == "cancelled")
        throw ApiError{503, "the server is shutting down", "unavailable_error"};
      json choice = {{"index", 0},
                     {"logprobs", r.logprobs ? logprobs_json(tok, chat, lp) : json(nullptr)},
                     {"finish_reason", r.finish_reason}};
      if (chat)
        choice["message"] = {{"role", "assistant"}, {"content", text}};
      else
        choice["text"] = text;
      json out = {{"id", job.id},
                  {"object", chat ? "chat.completion" : "text_completion"},
                  {"created", job.created},
                  {"model", job.model},
                  {"choices", json::array({choice})},
                  {"usage", usage_json(job, r.n_completion, r.n_cached)}};
      res.set_content(to_text(out), "application/json");
      return;
    }

    auto first = std::make_shared<bool>(true);
    res.set_header("Cache-Control", "no-cache");
    const Tokenizer tk = tok;  // a handle: the stream keeps the vocabulary alive
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, first, tk](size_t, httplib::DataSink& sink) {
          std::string part;
          std::vector<TokenLogprobs> lp;
          const bool done = job.req->wait_text(part, 100, &lp);
          if (!part.empty() || !lp.empty() || (*first && job.chat)) {
            const json lpj = job.req->logprobs ? logprobs_json(tk, job.chat, lp) : json(nullptr);
            const std::string ev = sse(chunk_json(job, part, nullptr, *first, lpj));
            *first = false;
            if (!sink.write(ev.data(), ev.size())) return false;
          }
          if (!done) return true;
          std::string tail;
          {
            GenRequest& r = *job.req;
            std::lock_guard lk(r.m);
            if (!r.error.empty()) {
              tail = sse(error_body(ApiError{500, r.error, "server_error"}));
            } else {
              const json finish = r.finish_reason == "cancelled" ? json("length") : json(r.finish_reason);
              tail = sse(chunk_json(job, "", finish, false));
              if (job.include_usage) {
                json u = chunk_json(job, "", nullptr, false);
                u["choices"] = json::array();
                u["usage"] = usage_json(job, r.n_completion, r.n_cached);
                tail += sse(u);
              }
            }
          }
          tail += "data: [DONE]\n\n";
          if (!sink.write(tail.data(), tail.size())) return false;
          sink.done();
          return true;
        },
        [job](bool) { job.req->cancelled = true; });
  };

  s.Post("/v1/completions", guarded([complete](const httplib::Request& req, httplib::Response& res) {
           complete(req, res, false);
         }));
  s.Post("/v1/chat/completions", guarded([complete](const httplib::Request& req, httplib::Response& res) {
           complete(req, res, true);
         }));
}

}  // namespace ultra::server
