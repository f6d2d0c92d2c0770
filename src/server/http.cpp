#include "server/http.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <list>
#include <unordered_map>

namespace ultra::server::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

std::string_view Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return {};
}

namespace {

// Bytes of a pipelined next request kept while one is handled (the read that notices a disconnect stops
// there; the rest stays in the kernel's buffer).
constexpr size_t kWatchBytes = 64 << 10;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = (char)std::tolower((unsigned char)c);
  return out;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && lower(a) == lower(b);
}

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

// The status line and headers; `length` absent for a streamed body (chunked, or ended by closing).
std::string head_text(const Reply& r, std::optional<size_t> length, bool keep_alive, bool chunked) {
  const std::string_view reason = bhttp::obsolete_reason(bhttp::int_to_status((unsigned)r.status));
  std::string h = fmt::format("HTTP/1.1 {} {}\r\nServer: ultra\r\nContent-Type: {}\r\n", r.status,
                              reason.empty() ? "Unknown" : reason, r.content_type);
  for (const auto& [k, v] : r.headers) h += fmt::format("{}: {}\r\n", k, v);
  if (length) h += fmt::format("Content-Length: {}\r\n", *length);
  if (chunked) h += "Transfer-Encoding: chunked\r\n";
  h += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return h;
}

}  // namespace

struct Conn;

struct Server::Impl {
  Limits lim;
  Handlers h;
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  asio::steady_timer accept_retry{ioc}, stop_timer{ioc};
  asio::thread_pool workers;
  // Every open connection (the owner: a connection lives until it is closed) and, longest-waiting first,
  // those waiting for a request (idle or reading a head): the ones closed to make room.
  std::unordered_map<Conn*, std::shared_ptr<Conn>> conns;
  std::list<Conn*> waiting;
  std::atomic<size_t> n_conns{0};
  size_t max_conns = 0;
  bool bound = false, stopping = false;

  Impl(Limits l, Handlers hs) : lim(l), h(std::move(hs)), workers((size_t)std::max(1, l.n_workers)) {
    // Each connection is a descriptor: raise the soft limit to the hard one and keep some for the rest.
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
      if (rl.rlim_cur < rl.rlim_max) {
        rlimit up = rl;
        up.rlim_cur = std::min<rlim_t>(rl.rlim_max, 1 << 20);
        if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
      }
      max_conns = std::min<size_t>(lim.max_connections, rl.rlim_cur > 128 ? (size_t)rl.rlim_cur - 64 : 64);
    } else {
      max_conns = std::min<size_t>(lim.max_connections, 960);
    }
    if (!h.error)
      h.error = [](int status, const std::string& msg) {
        Reply r;
        r.status = status;
        r.content_type = "text/plain";
        r.body = msg + "\n";
        return r;
      };
  }

  void accept();
  void add(tcp::socket s, bool reject);
  void removed();  // after a connection is closed
};

// One client connection, driven by the I/O thread only.
struct Conn : std::enable_shared_from_this<Conn> {
  Server::Impl& srv;
  tcp::socket sock;
  asio::steady_timer timer;
  uint64_t timer_gen = 0;
  beast::flat_buffer buf;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser;
  Request req;                              // the request being read
  std::shared_ptr<std::atomic<bool>> gone;  // of the request being handled
  std::shared_ptr<Producer> later;          // its reply, when produced later
  std::string out;                          // the bytes being written
  bool first = true, keep_alive = true, streaming = false, chunked = false;
  bool closed = false, writing = false, watching = false, resume_after_watch = false, lingering = false;
  bool is_waiting = false;
  std::list<Conn*>::iterator waiting_it;

  Conn(Server::Impl& s, tcp::socket so)
      : srv(s), sock(std::move(so)), timer(s.ioc), buf(s.lim.max_header_bytes + kWatchBytes + 4096) {}

  // ---- deadlines ----
  void arm(double secs) {
    const uint64_t g = ++timer_gen;
    timer.expires_after(seconds(secs));
    timer.async_wait([self = shared_from_this(), g](error_code ec) {
      if (ec || g != self->timer_gen || self->closed) return;
      self->close();  // a deadline passed: the client is too slow (or gone)
    });
  }
  void disarm() {
    ++timer_gen;
    timer.cancel();
  }

  void set_waiting(bool on) {
    if (on == is_waiting) return;
    if (on)
      waiting_it = srv.waiting.insert(srv.waiting.end(), this);
    else
      srv.waiting.erase(waiting_it);
    is_waiting = on;
  }

  void close() {
    if (closed) return;
    closed = true;
    set_waiting(false);
    disarm();
    if (gone) gone->store(true);
    if (later) {
      later->cancel();
      later.reset();
    }
    error_code ec;
    sock.shutdown(tcp::socket::shutdown_both, ec);
    sock.close(ec);
    auto keep = srv.conns.find(this);
    if (keep != srv.conns.end()) {
      std::shared_ptr<Conn> self = std::move(keep->second);  // alive until this returns
      srv.conns.erase(keep);
      srv.removed();
    }
  }

  // ---- reading a request ----
  void await_request() {
    if (closed) return;
    if (srv.stopping) return close();
    if (buf.size() > 0) return read_head();  // pipelined: the next request is here already
    set_waiting(true);
    arm(first ? srv.lim.head_timeout : srv.lim.idle_timeout);
    sock.async_read_some(buf.prepare(4096), [self = shared_from_this()](error_code ec, size_t n) {
      self->buf.commit(n);
      if (self->closed) return;
      if (ec) return self->close();
      self->read_head();
    });
  }

  void read_head() {
    first = false;
    set_waiting(true);  // a slow head is as evictable as an idle connection
    parser.emplace();
    parser->header_limit((uint32_t)std::min<size_t>(srv.lim.max_header_bytes, UINT32_MAX));
    parser->body_limit(srv.lim.max_body);
    arm(srv.lim.head_timeout);
    bhttp::async_read_header(sock, buf, *parser,
                             [self = shared_from_this()](error_code ec, size_t) { self->on_head(ec); });
  }

  // An error the layer answers itself; the connection closes after it.
  void fail(int status, const std::string& msg) {
    keep_alive = false;
    send(srv.h.error(status, msg));
  }

  // A failed read of a head or body: the layer's own error reply, or a quiet close when the client left.
  void read_error(error_code ec) {
    if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow)
      return fail(431, fmt::format("the request head is larger than {} bytes", srv.lim.max_header_bytes));
    if (ec == bhttp::error::body_limit)
      return fail(413, fmt::format("the request body is larger than {} bytes", srv.lim.max_body));
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
        ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message)
      return fail(400, fmt::format("malformed HTTP request: {}", ec.message()));
    close();  // the client went away (deadlines close the connection from the timer)
  }

  void on_head(error_code ec) {
    if (closed) return;
    set_waiting(false);
    disarm();
    if (ec) return read_error(ec);
    const auto& m = parser->get();
    req = Request{};
    req.method = std::string(m.method_string());
    req.target = std::string(m.target());
    req.path = req.target.substr(0, req.target.find('?'));
    for (const auto& f : m) req.headers.emplace_back(lower(f.name_string()), std::string(f.value()));
    keep_alive = m.keep_alive();
    if (const std::string_view ce = req.header("content-encoding"); !ce.empty() && !iequals(ce, "identity"))
      return fail(415, fmt::format("unsupported Content-Encoding '{}': send the body uncompressed", ce));
    if (const std::string_view te = req.header("transfer-encoding"); !te.empty() && !iequals(te, "chunked"))
      return fail(501, fmt::format("unsupported Transfer-Encoding '{}' (only chunked)", te));
    if (srv.h.check_head) {
      if (std::optional<Reply> r = srv.h.check_head(req)) {
        keep_alive = false;
        return send(std::move(*r));
      }
    }
    if (parser->is_done()) return dispatch();
    if (iequals(req.header("expect"), "100-continue")) {
      out = "HTTP/1.1 100 Continue\r\n\r\n";
      return write([self = shared_from_this()] { self->read_body(); });
    }
    read_body();
  }

  void read_body() {
    arm(srv.lim.body_timeout);
    bhttp::async_read(sock, buf, *parser, [self = shared_from_this()](error_code ec, size_t) {
      if (self->closed) return;
      self->disarm();
      if (ec) return self->read_error(ec);
      self->dispatch();
    });
  }

  // ---- handling ----
  void dispatch() {
    req.body = std::move(parser->get().body());
    parser.reset();
    gone = req.gone;
    Reply r;
    if (srv.h.quick && srv.h.quick(req, r)) return send(std::move(r));
    watch();
    asio::post(srv.workers, [self = shared_from_this(), rq = std::move(req)]() mutable {
      Reply r;
      try {
        r = self->srv.h.handle(rq);
      } catch (const std::exception& e) {
        r = self->srv.h.error(500, e.what());
      } catch (...) {
        r = self->srv.h.error(500, "internal error");
      }
      Server::Impl& s = self->srv;
      asio::post(s.ioc, [self = std::move(self), r = std::move(r)]() mutable { self->send(std::move(r)); });
    });
  }

  // Reads while the request is handled: a disconnect is noticed at once; bytes of a pipelined next request
  // are kept for after this one.
  void watch() {
    if (watching || closed || buf.size() >= kWatchBytes) return;
    watching = true;
    sock.async_read_some(
        buf.prepare(kWatchBytes - buf.size()), [self = shared_from_this()](error_code ec, size_t n) {
          self->watching = false;
          self->buf.commit(n);
          if (self->closed) return;
          if (self->lingering) {
            self->buf.consume(self->buf.size());
            if (ec) return self->close();
            return self->watch();
          }
          if (self->resume_after_watch) {
            self->resume_after_watch = false;
            if (ec && ec != asio::error::operation_aborted) return self->close();
            return self->await_request();
          }
          if (ec) return self->close();  // the client is gone: close() sets `gone` and cancels the producer
          self->watch();
        });
  }

  // ---- writing ----
  template <class Then>
  void write(Then then) {
    writing = true;
    arm(srv.lim.write_timeout);
    asio::async_write(sock, asio::buffer(out),
                      [self = shared_from_this(), then = std::move(then)](error_code ec, size_t) mutable {
                        self->writing = false;
                        if (self->closed) return;
                        self->disarm();
                        if (ec) return self->close();
                        then();
                      });
  }

  void send(Reply r) {
    if (closed) {  // the client left while a worker handled its request
      if (r.later) r.later->cancel();
      return;
    }
    if (srv.stopping) keep_alive = false;
    if (!r.later) {
      out = head_text(r, r.body.size(), keep_alive, false);
      out += r.body;
      return write([self = shared_from_this()] { self->after_reply(); });
    }
    later = std::move(r.later);
    streaming = later->streamed();
    // The producer's thread posts a wake-up (at most one pending); the connection is looked up here.
    auto posted = std::make_shared<std::atomic<bool>>(false);
    std::weak_ptr<Conn> w = weak_from_this();
    asio::io_context& ioc = srv.ioc;
    later->subscribe([w, posted, &ioc] {
      if (!posted->exchange(true))
        asio::post(ioc, [w, posted] {
          posted->store(false);
          if (auto c = w.lock()) c->pump();
        });
    });
    if (!streaming) return pump();
    chunked = keep_alive;  // HTTP/1.0 clients read a stream to the connection's end
    out = head_text(r, std::nullopt, keep_alive, chunked);
    write([self = shared_from_this()] { self->pump(); });
  }

  // Takes what the producer has; at most one write in flight (its completion pumps again).
  void pump() {
    if (closed || !later || writing) return;
    Reply r;
    const bool done = later->poll(r);
    if (!streaming) {
      if (!done) return;
      later.reset();
      return send(std::move(r));
    }
    out.clear();
    if (!r.body.empty()) out += chunked ? fmt::format("{:x}\r\n{}\r\n", r.body.size(), r.body) : r.body;
    if (done) {
      later.reset();
      if (chunked) out += "0\r\n\r\n";
    }
    if (out.empty()) return;
    write([self = shared_from_this(), done] {
      if (done)
        self->after_reply();
      else
        self->pump();
    });
  }

  void after_reply() {
    gone.reset();
    streaming = chunked = false;
    if (srv.stopping) return close();
    if (!keep_alive) return linger();
    if (watching) {  // the watch read ends first (its handler goes on with the next request)
      resume_after_watch = true;
      error_code ec;
      sock.cancel(ec);
      return;
    }
    await_request();
  }

  // Closes after the reply: our side first, then what the client still sends is read and dropped for up
  // to a second, so that unread request bytes do not turn the close into a reset that loses the reply.
  void linger() {
    lingering = true;
    error_code ec;
    sock.shutdown(tcp::socket::shutdown_send, ec);
    arm(1.0);
    watch();
  }
};

void Server::Impl::removed() {
  n_conns = conns.size();
  if (stopping && conns.empty()) {
    stop_timer.cancel();
    ioc.stop();
  }
}

void Server::Impl::add(tcp::socket s, bool reject) {
  error_code ec;
  s.set_option(tcp::no_delay(true), ec);  // replies go out as several writes (head, SSE events)
  auto c = std::make_shared<Conn>(*this, std::move(s));
  conns.emplace(c.get(), c);
  n_conns = conns.size();
  if (!reject) return c->await_request();
  Reply r = h.error(503, "the server has too many open connections; retry later");
  r.headers.emplace_back("Retry-After", "1");
  c->keep_alive = false;
  c->send(std::move(r));
}

void Server::Impl::accept() {
  acceptor.async_accept([this](error_code ec, tcp::socket s) {
    if (stopping || !acceptor.is_open()) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      // Out of descriptors, or a transient error: try again shortly.
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](error_code e) {
        if (!e) accept();
      });
      return;
    }
    if (conns.size() < max_conns) {
      add(std::move(s), false);
    } else if (!waiting.empty()) {
      waiting.front()->close();  // the longest-waiting connection makes room
      add(std::move(s), false);
    } else if (conns.size() < max_conns + 64) {
      add(std::move(s), true);  // 503
    }                           // else: dropped (s closes)
    accept();
  });
}

Server::Server(Limits limits, Handlers handlers)
    : impl_(std::make_unique<Impl>(limits, std::move(handlers))) {}

Server::~Server() {
  impl_->workers.stop();
  impl_->workers.join();
}

int Server::bind(const std::string& host, int port) {
  Impl& s = *impl_;
  error_code ec;
  tcp::endpoint ep;
  const auto addr = asio::ip::make_address(host, ec);
  if (!ec) {
    ep = tcp::endpoint(addr, (unsigned short)port);
  } else {
    tcp::resolver res(s.ioc);
    const auto found = res.resolve(host, std::to_string(port), ec);
    if (ec || found.empty()) return -1;
    ep = found.begin()->endpoint();
  }
  s.acceptor.open(ep.protocol(), ec);
  if (ec) return -1;
  s.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  s.acceptor.bind(ep, ec);
  if (!ec) s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    error_code ignored;
    s.acceptor.close(ignored);
    return -1;
  }
  s.bound = true;
  return s.acceptor.local_endpoint().port();
}

bool Server::run() {
  Impl& s = *impl_;
  if (!s.bound) return false;
  s.accept();
  s.ioc.run();
  // Stopped: whatever is still open closes (producers are cancelled), then handlers under way finish.
  std::vector<std::shared_ptr<Conn>> left;
  for (auto& [p, c] : s.conns) left.push_back(c);
  for (auto& c : left) c->close();
  s.workers.stop();
  s.workers.join();
  return true;
}

void Server::stop(double grace) {
  Impl* s = impl_.get();
  asio::post(s->ioc, [s, grace] {
    if (s->stopping) return;
    s->stopping = true;
    error_code ec;
    s->acceptor.close(ec);
    s->accept_retry.cancel();
    std::vector<std::shared_ptr<Conn>> all;
    for (auto& [p, c] : s->conns) all.push_back(c);
    for (auto& c : all) {
      if (c->gone) c->gone->store(true);  // handlers under way (a template render) end early
      if (c->is_waiting)
        c->close();
      else
        c->keep_alive = false;  // closes after the reply under way
    }
    if (s->conns.empty()) return s->ioc.stop();
    s->stop_timer.expires_after(seconds(grace));
    s->stop_timer.async_wait([s](error_code e) {
      if (!e) s->ioc.stop();
    });
  });
}

size_t Server::connections() const {
  return impl_->n_conns.load();
}

}  // namespace ultra::server::http
