// The routes of `ultra serve` over the event-driven HTTP layer (http.h): OpenAI-compatible endpoints, JSON
// parsing and validation, OpenAI-shaped errors ({"error": {"message", "type", "param", "code"}}).
// Generation itself is the Scheduler's (scheduler.h); a route validates a request, queues it and hands the
// HTTP layer a producer that streams or collects its text as the scheduler wakes it.
//
//   POST /v1/completions, /v1/chat/completions   (stream: SSE "data: {...}\n\n" chunks, then "data: [DONE]")
//   GET  /v1/models, /health, /metrics
//   POST /tokenize {"content"} -> {"tokens"}, /detokenize {"tokens"} -> {"content"}
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "chat/chat_template.h"
#include "server/http.h"
#include "server/scheduler.h"
#include "server/tool_calls.h"

namespace ultra::server {

struct ServerOptions {
  std::string api_key;               // "": no authentication
  std::string model_name = "ultra";  // what /v1/models lists
  // Connections, deadlines, head and body sizes (413 over max_body, after chunked decoding), and the worker
  // threads that parse, render and tokenize requests.
  http::Limits limits;
  // The chat template's source (--chat-template): "" = the model's own, else the fallback format when the
  // model has none. chat_template_label: what messages call it (a path, "the built-in 'chatml'").
  std::string chat_template;
  std::string chat_template_label = "--chat-template";
  // Parse special-token text inside messages as control tokens (a request's "allow_special_in_content"
  // overrides it); off: a message cannot forge a turn.
  bool allow_special_in_content = false;
};

// The id /v1/models lists for a model read from `path`: the file's name (a directory's own name), not the
// path it was read from.
std::string model_id(const std::string& path);

class Server {
 public:
  explicit Server(ServerOptions opts);
  ~Server();

  // Binds host:port (port 0: any free port); returns the port, or -1 when it cannot bind.
  int bind(const std::string& host, int port);
  // Serves on the calling thread until stop(); false when it was never bound.
  bool listen();
  // From any thread: stops accepting; replies under way get a moment to finish (cancel the scheduler's
  // requests first, so that they do).
  void stop();

  // Until a scheduler is attached /health answers 503 {"status":"loading"} and the other routes 503.
  // Parses the chat template (options' or the model's): throws ultra::Error naming what the interpreter
  // cannot run.
  void attach(std::shared_ptr<Scheduler> scheduler);
  // "model", the options' chat_template_label or "fallback": where chat prompts come from.
  const std::string& chat_template_source() const;

 private:
  http::Handlers handlers();
  http::Reply handle(http::Request& req);
  http::Reply complete(http::Request& req, bool chat);
  // tools: the template's `tools` variable, or null.
  std::function<std::string(const nlohmann::json&)> chat_renderer(const nlohmann::json& j,
                                                                  const http::Request& req,
                                                                  const nlohmann::json* tools) const;
  struct ChatInput {
    ToolRequest tools;
    ToolFamily family;
    nlohmann::json messages;  // as the template gets them (prepare_tool_messages)
    std::function<std::string(const nlohmann::json&)> render;
  };
  ChatInput chat_input(const nlohmann::json& j, const http::Request& req) const;
  ServerOptions opts_;
  std::unique_ptr<http::Server> http_;
  std::shared_ptr<Scheduler> sched_;
  std::unique_ptr<ChatTemplate> tmpl_;  // null: the fallback format
  ChatTemplateOptions tmpl_opts_;       // the model's BOS / EOS text
  std::string tmpl_source_ = "fallback";
  ToolFamily tmpl_family_;  // how the server's template renders and the model writes tool calls
  std::atomic<bool> ready_{false};
};

}  // namespace ultra::server
