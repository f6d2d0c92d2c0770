// ultra serve: an OpenAI-compatible HTTP server with continuous batching (src/server/).
//   ultra serve [-m MODEL] [--host 127.0.0.1] [--port 8080] [--parallel N] [-c CTX] [-t N] [--api-key KEY]
//               [--chat-template FILE|NAME] [--reasoning-format auto|none]
// Listens before the model is loaded (/health answers 503 until it is; with --tp N under mpirun -np N, after
// rank 0 has loaded its shard); SIGINT/SIGTERM stop it: queued and
// running requests are cancelled (streams end with an error event, then [DONE]), and it exits 0.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "server/server.h"
#include "ultra/model.h"

namespace ultra::cli {

int cmd_serve(int argc, char** argv) {
  CLI::App app{"ultra serve: an OpenAI-compatible HTTP server with continuous batching", "ultra serve"};
  ModelFlags mf;
  mf.add(app);
  mf.add_tp(app);
  std::string host = "127.0.0.1", api_key, alias;
  int port = 8080, parallel = 4, queue = 64, http_threads = 4;
  size_t max_body = 1 << 20, max_connections = 4096;
  double timeout = 30;
  app.add_option("--host", host, "address to listen on (default: loopback only)")->capture_default_str();
  app.add_option("--port", port, "TCP port (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--parallel", parallel, "sequences generated at once (KV slots)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--queue", queue, "requests that may wait for a slot; more get 503")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option(
         "--http-threads", http_threads,
         "threads that parse, render and tokenize requests (connections are served by one I/O thread)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--max-connections", max_connections,
                 "open connections; beyond, the longest-idle one is closed, else 503")
      ->capture_default_str()
      ->check(CLI::Range((size_t)1, (size_t)1 << 20));
  app.add_option("--timeout", timeout,
                 "seconds to read a request body, to wait for the next request on a connection and for each "
                 "write; a request head must arrive within min(10, this)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--max-body", max_body,
                 "largest request body in bytes (after chunked decoding); larger get 413")
      ->capture_default_str()
      ->check(CLI::Range((size_t)1, (size_t)1 << 30));
  app.add_option("-a,--alias", alias, "the model's id in /v1/models (default: the model file's name)");
  app.add_option("--api-key", api_key, "require 'Authorization: Bearer KEY' (all routes but /health)");
  bool allow_special = false;
  app.add_flag("--allow-special-in-content", allow_special,
               "parse special-token text inside chat messages as control tokens (default: plain text, so a "
               "message cannot forge a turn); a request's \"allow_special_in_content\" overrides it");
  std::string chat_template_arg;
  app.add_option("--chat-template", chat_template_arg, chat_template_help())->type_name("FILE|NAME");
  std::string reasoning_format = "auto";
  app.add_option(
         "--reasoning-format", reasoning_format,
         "auto: a reasoning model's thinking (<think>...</think>, gpt-oss's analysis channel) goes to "
         "message.reasoning_content; none: it stays in content (a request's \"reasoning_format\" "
         "overrides it)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none", "deepseek"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  mf.resolve_model();
  std::string chat_template_label;
  const std::string chat_template = app.count("--chat-template")
                                        ? chat_template_from_arg(chat_template_arg, &chat_template_label)
                                        : std::string();

  // --tp: the model split over the ranks of the MPI job is loaded before listening (rank 0 alone serves; the
  // other ranks run its steps and return here when it is done).
  std::optional<Model> split;
  if (mf.tp > 1) {
    split.emplace(Model::load(mf.model, mf.load_params()));
    if (tp_follower_ran(*split)) return 0;
  }

  // SIGINT/SIGTERM are taken by a thread of ours (blocked everywhere else, before any thread starts).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  server::ServerOptions so;
  so.api_key = api_key;
  so.limits.max_body = max_body;
  so.limits.n_workers = http_threads;
  so.limits.max_connections = max_connections;
  so.limits.head_timeout = std::min(10.0, timeout);
  so.limits.body_timeout = so.limits.idle_timeout = so.limits.write_timeout = timeout;
  so.allow_special_in_content = allow_special;
  so.reasoning_format = reasoning_format;
  so.model_name = !alias.empty() ? alias : server::model_id(mf.model);
  so.chat_template = chat_template;
  if (!chat_template_label.empty()) so.chat_template_label = chat_template_label;
  server::Server srv(so);
  const int bound = srv.bind(host, port);
  if (bound < 0) fail("cannot listen on {}:{}", host, port);
  fmt::print(stderr, "ultra serve: listening on http://{}:{} (loading {})\n", host, bound, mf.model);

  std::atomic<bool> fatal{false};  // a split model's step failed (the scheduler's on_fatal): exit 1
  std::mutex sched_m;
  std::shared_ptr<server::Scheduler> sched;
  std::thread sig_thread([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    fmt::print(stderr, "ultra serve: signal {}, shutting down\n", sig);
    std::shared_ptr<server::Scheduler> s;
    {
      std::lock_guard lk(sched_m);
      s = sched;
    }
    if (s) s->shutdown();
    srv.stop();
  });
  std::thread http_thread([&] { srv.listen(); });

  int rc = 0;
  try {
    Model model = split ? *split : Model::load(mf.model, mf.load_params());
    ContextParams cp = mf.context_params();
    cp.n_slots = parallel;
    // A split model's step that failed with its ranks out of step (a rank stopped or died) ends the job:
    // rank 0 exits with the error, and mpirun ends the other ranks.
    auto s = std::make_shared<server::Scheduler>(model, cp, queue, [&](const std::string& e) {
      fmt::print(stderr, "error: tensor parallelism: {}; the ranks are out of step, ending the job\n", e);
      fatal = true;
      kill(getpid(), SIGTERM);  // the signal thread stops the server
    });
    for (const std::string& w : s->warnings()) fmt::print(stderr, "warning: {}\n", w);
    {
      std::lock_guard lk(sched_m);
      sched = s;
    }
    srv.attach(s);
    fmt::print(stderr, "ultra serve: ready ({} slots of {} tokens; chat template: {})\n", s->n_slots(),
               s->n_ctx(), srv.chat_template_source());
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    rc = 1;
    kill(getpid(), SIGTERM);  // the signal thread stops the server
  }
  http_thread.join();
  sig_thread.join();
  if (sched) sched->shutdown();
  return fatal ? 1 : rc;
}

}  // namespace ultra::cli
