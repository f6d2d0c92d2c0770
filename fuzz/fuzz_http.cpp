// libFuzzer target for `ultra serve`'s request path: the bytes of one connection, sent to an in-process
// server (the HTTP layer, the routes, JSON parsing, chat templates, tokenizing, a generation with the
// bundled model) on a loopback port, then the client's half of the connection is closed. The server must
// answer and close within the deadline (a hang is a finding: abort()), and keep answering /health.
//
// Input: raw bytes of one or more (pipelined) HTTP/1.1 requests. Deadlines are short (1 s for a head or a
// body), the body limit small (64 KiB), the context 64 tokens, so no input holds the server for long.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "server/server.h"

namespace {

struct Env {
  ultra::Model model;
  std::shared_ptr<ultra::server::Scheduler> sched;
  std::unique_ptr<ultra::server::Server> srv;
  std::thread th;
  int port = -1;
};

Env* start() {
  auto* e =
      new Env{ultra::Model::load(std::string(ULTRA_SOURCE_DIR) + "/models/target.gguf"), {}, {}, {}, -1};
  ultra::ContextParams cp;
  cp.n_ctx = 64;
  cp.n_slots = 2;
  cp.n_threads = 1;
  e->sched = std::make_shared<ultra::server::Scheduler>(e->model, cp, 4);
  ultra::server::ServerOptions so;
  so.limits.max_body = 64 * 1024;
  so.limits.head_timeout = so.limits.body_timeout = so.limits.idle_timeout = 1;
  so.limits.write_timeout = 2;
  so.limits.n_workers = 2;
  e->srv = std::make_unique<ultra::server::Server>(so);
  e->port = e->srv->bind("127.0.0.1", 0);
  if (e->port < 0) std::abort();
  e->srv->attach(e->sched);
  e->th = std::thread([e] { e->srv->listen(); });
  return e;
}

int dial(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = connect(fd, (sockaddr*)&a, sizeof a);
  if (rc != 0 && errno == EINTR) {  // libFuzzer's timer signal: the connection goes on; wait for it
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    while (poll(&p, 1, 5000) < 0 && errno == EINTR) {
    }
    rc = getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0 ? 0 : -1;
    if (err) errno = err;
  }
  if (rc != 0) {
    std::fprintf(stderr, "fuzz_http: cannot connect to the server: %s\n", std::strerror(errno));
    std::abort();
  }
  timeval tv{5, 0};  // far beyond every deadline of the server
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Sends the bytes, closes our sending half, and reads until the server closes; returns what it answered.
std::string exchange(int port, const uint8_t* data, size_t size) {
  const int fd = dial(port);
  for (size_t off = 0; off < size;) {
    const ssize_t n = send(fd, data + off, size - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server closed first (an error reply): fine
    off += (size_t)n;
  }
  shutdown(fd, SHUT_WR);
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        std::fprintf(stderr, "fuzz_http: the server kept a half-closed connection open for 5 s\n");
        std::abort();
      }
      break;  // reset: fine
    }
    out.append(buf, (size_t)n);
  }
  // Closed with a reset: our side closed first (the half-close), and hundreds of connections a second in
  // TIME_WAIT would use up the loopback's ephemeral ports within minutes.
  const linger reset{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  close(fd);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Env* env = start();
  static unsigned n = 0;
  exchange(env->port, data, size);
  if (++n % 128 == 0) {  // still serving
    const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    const std::string out = exchange(env->port, (const uint8_t*)health.data(), health.size());
    if (out.rfind("HTTP/1.1 200", 0) != 0) {
      std::fprintf(stderr, "fuzz_http: /health answered '%.60s'\n", out.c_str());
      std::abort();
    }
  }
  return 0;
}
