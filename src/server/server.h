// The HTTP layer of `ultra serve`: OpenAI-compatible routes on cpp-httplib, JSON parsing and validation,
// OpenAI-shaped errors ({"error": {"message", "type", "param", "code"}}). Generation itself is the
// Scheduler's (scheduler.h); this layer validates a request, queues it and streams or collects its text.
//
//   POST /v1/completions, /v1/chat/completions   (stream: SSE "data: {...}\n\n" chunks, then "data: [DONE]")
//   GET  /v1/models, /health, /metrics
//   POST /tokenize {"content"} -> {"tokens"}, /detokenize {"tokens"} -> {"content"}
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "chat/chat_template.h"
#include "server/scheduler.h"

namespace httplib {
class Server;
}

namespace ultra::server {

struct ServerOptions {
  std::string api_key;               // "": no authentication
  std::string model_name = "ultra";  // what /v1/models lists
  size_t max_body = 1 << 20;         // bytes; larger bodies get 413
  int n_http_threads = 32;           // connections served at once
  // The chat template's source (--chat-template): "" = the model's own, else the fallback format when the
  // model has none. chat_template_label: what messages call it (a path, "the built-in 'chatml'").
  std::string chat_template;
  std::string chat_template_label = "--chat-template";
};

class Server {
 public:
  explicit Server(ServerOptions opts);
  ~Server();

  // Binds host:port (port 0: any free port); returns the port, or -1 when it cannot bind.
  int bind(const std::string& host, int port);
  // Serves until stop(); returns false on a socket error.
  bool listen();
  void stop();

  // Until a scheduler is attached /health answers 503 {"status":"loading"} and the other routes 503.
  // Parses the chat template (options' or the model's): throws ultra::Error naming what the interpreter
  // cannot run.
  void attach(std::shared_ptr<Scheduler> scheduler);
  // "model", the options' chat_template_label or "fallback": where chat prompts come from.
  const std::string& chat_template_source() const;

 private:
  void routes();
  std::string render_request(const nlohmann::json& j) const;
  ServerOptions opts_;
  std::unique_ptr<httplib::Server> http_;
  std::shared_ptr<Scheduler> sched_;
  std::unique_ptr<ChatTemplate> tmpl_;  // null: the fallback format
  ChatTemplateOptions tmpl_opts_;       // the model's BOS / EOS text
  std::string tmpl_source_ = "fallback";
  std::atomic<bool> ready_{false};
};

}  // namespace ultra::server
