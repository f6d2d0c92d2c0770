// The HTTP/1.1 layer of `ultra serve`: event-driven on Boost.Asio, requests parsed by Boost.Beast.
//
// One I/O thread owns every connection and never blocks on a client: reads and writes are asynchronous,
// each with a deadline (the whole request head, the body, a keep-alive wait, each write), so a slow or idle
// client costs a file descriptor and a small buffer, not a thread. Handlers that do real work (JSON,
// chat templates, tokenizing) run on a small worker pool; a reply that is produced later (a generation)
// is a Producer, woken by whoever produces it (the scheduler's thread) and written as it comes, so a slow
// reader holds back only its own stream. Requests on a keep-alive connection are answered in order,
// pipelined ones included. While a request is handled the connection keeps reading (up to a bound), so a
// client that goes away is noticed at once and its Request::gone flag set.
//
// Limits: open connections (beyond: the longest-idle connection that is waiting for a request is closed,
// else the new one gets 503), head bytes (431), body bytes after transfer decoding (413), content
// encodings (415: none is decoded).
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ultra::server::http {

struct Limits {
  size_t max_connections = 4096;       // open connections (also capped by the descriptor limit)
  size_t max_header_bytes = 16 << 10;  // request line and headers
  size_t max_body = 1 << 20;           // body bytes after chunked decoding
  double head_timeout = 10;            // seconds from a request's first byte to the end of its head
  double body_timeout = 30;            // seconds for its body
  double idle_timeout = 30;            // seconds a keep-alive connection may wait for its next request
  double write_timeout = 60;           // seconds one write may take (a reader that stopped reading)
  int n_workers = 4;                   // threads that run Handlers::handle
};

struct Request {
  std::string method;                                        // "GET", "POST", ...
  std::string target;                                        // as sent: "/v1/models?x=1"
  std::string path;                                          // the target without its query
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  // Set when the client disconnects or the server stops: long work for this request should end.
  std::shared_ptr<std::atomic<bool>> gone = std::make_shared<std::atomic<bool>>(false);
  // The value of a header (name lower-cased), "" when absent.
  std::string_view header(std::string_view name) const;
};

class Producer;

struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // A reply produced later: for a streamed one the status and headers above go out at once and the body
  // follows as `later` produces it (chunked); otherwise `later` fills the whole reply when it is done.
  std::shared_ptr<Producer> later;
};

class Producer {
 public:
  virtual ~Producer() = default;
  virtual bool streamed() const = 0;
  // `wake` may be called from any thread, any number of times, whenever poll() may have something new.
  // Called once on the I/O thread before the first poll().
  virtual void subscribe(std::function<void()> wake) = 0;
  // On the I/O thread. Streamed: appends the next body bytes to out.body; returns true when the body is
  // complete. Not streamed: returns true once `out` holds the whole reply.
  virtual bool poll(Reply& out) = 0;
  // On the I/O thread: the client went away or the server is stopping; no poll() follows.
  virtual void cancel() = 0;
};

struct Handlers {
  // Runs on the I/O thread once a request's head is read, before its body: a reply ends the request
  // there (authentication: the body of an unauthorised request is never read) and closes the connection.
  std::function<std::optional<Reply>(const Request&)> check_head;
  // Runs on the I/O thread with the whole request: true when it answered (cheap routes only: /health).
  std::function<bool(const Request&, Reply&)> quick;
  // Runs on a worker thread; may throw (answered 500 with the exception's message).
  std::function<Reply(Request&)> handle;
  // A whole reply for an error the layer itself finds (status, message): the server's error shape.
  std::function<Reply(int, const std::string&)> error;
};

class Server {
 public:
  Server(Limits limits, Handlers handlers);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (port 0: any free port); returns the port, or -1 when it cannot bind.
  int bind(const std::string& host, int port);
  // Serves on the calling thread until stop(); false when it was never bound.
  bool run();
  // From any thread: stops accepting, closes idle connections, lets replies under way finish for up to
  // `grace` seconds, then ends run().
  void stop(double grace = 0.5);
  // Open connections (for tests and metrics; read from any thread).
  size_t connections() const;

  struct Impl;  // opaque (http.cpp)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ultra::server::http
