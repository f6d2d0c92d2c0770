// `ultra serve` against hostile and careless clients (issue classes of a public endpoint): deep nesting in
// any field, numbers out of range, content encodings and chunked bodies over the limit, header floods,
// slowloris connections and a thousand idle ones (other requests are still served at once), pipelined
// requests, a non-streamed request whose client leaves (its generation stops), ranges, unknown and
// unimplemented fields, and a shutdown in the middle of a stream. In process on a loopback port with the
// bundled model, short deadlines, raw sockets.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "raw_conn.h"
#include "server/server.h"

using json = nlohmann::json;
using namespace ultra;
using Clock = std::chrono::steady_clock;

namespace {

std::string model_path() {
  return std::string(ULTRA_SOURCE_DIR) + "/models/target.gguf";
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A server with one model, short deadlines and a small body limit; stopped (after its scheduler) at the end.
struct Served {
  Model model;
  std::shared_ptr<server::Scheduler> sched;
  std::unique_ptr<server::Server> srv;
  std::thread th;
  int port = 0;

  explicit Served(server::ServerOptions so = {}, int n_slots = 2) : model(Model::load(model_path())) {
    ContextParams cp;
    cp.n_ctx = 256;
    cp.n_slots = n_slots;
    cp.n_threads = 1;
    sched = std::make_shared<server::Scheduler>(model, cp, 8);
    srv = std::make_unique<server::Server>(so);
    port = srv->bind("127.0.0.1", 0);
    srv->attach(sched);
    th = std::thread([this] { srv->listen(); });
  }
  ~Served() {
    sched->shutdown();
    srv->stop();
    th.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    return c;
  }
  // GET /health's latency in ms (-1 when it failed).
  double health_ms() const {
    const auto t0 = Clock::now();
    auto r = client().Get("/health");
    return r && r->status == 200 ? ms_since(t0) : -1;
  }
  double metric(const std::string& name) const {
    auto r = client().Get("/metrics");
    if (!r) return -1;
    const size_t at = r->body.find("\n" + name + " ");
    return at == std::string::npos ? -1 : std::stod(r->body.substr(at + name.size() + 2));
  }
};

server::ServerOptions short_deadlines() {
  server::ServerOptions so;
  so.limits.max_body = 64 * 1024;
  so.limits.head_timeout = 1;
  so.limits.body_timeout = 1;
  so.limits.idle_timeout = 1;
  return so;
}

std::string post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

int status_of(const std::string& response) {
  return response.size() > 12 && response.starts_with("HTTP/1.1 ") ? std::stoi(response.substr(9, 3)) : -1;
}

class Hostile : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(model_path())) GTEST_SKIP() << "bundled model missing";
  }
};

// A body nested 300000 levels deep inside chat_template_kwargs (copied before any check used to overflow the
// stack) or any other field is refused while it is parsed; the server goes on.
TEST_F(Hostile, DeepNestingInAnyFieldIs400) {
  Served s;
  const std::string deep = std::string(300000, '[') + std::string(300000, ']');
  for (const std::string field : {"chat_template_kwargs", "metadata", "stop", "messages"}) {
    const std::string body = R"({"messages": [{"role": "user", "content": "hi"}], ")" + field +
                             "\": {\"a\": " + deep + "}, \"max_tokens\": 1}";
    httplib::Client c = s.client();
    auto r = c.Post("/v1/chat/completions", body, "application/json");
    ASSERT_TRUE(r) << field;
    EXPECT_EQ(r->status, 400) << field;
    EXPECT_NE(r->body.find("nested deeper than 128 levels"), std::string::npos) << r->body;
  }
  EXPECT_GE(s.health_ms(), 0);
}

// 1e400 is not a double: 400 naming the field (it was a 500 with the JSON library's message).
TEST_F(Hostile, NumberOutOfRangeIs400NamingTheField) {
  Served s;
  auto r = s.client().Post("/v1/completions", R"({"prompt": "x", "top_p": 1e400})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "top_p") << r->body;
}

// Compressed bodies are not inflated (a small gzip body once became gigabytes): 415. A chunked body is
// counted after decoding: over the limit it is 413.
TEST_F(Hostile, EncodedAndChunkedBodiesAreBounded) {
  Served s(short_deadlines());
  {
    RawConn k(s.port);
    k.send_all(post("/v1/completions", "\x1f\x8b\x08\x00", "Content-Encoding: gzip\r\n"));
    EXPECT_EQ(status_of(k.read_all(true)), 415);
  }
  {
    RawConn k(s.port);
    std::string req =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n";
    const std::string chunk(4096, ' ');
    for (int i = 0; i < 32; ++i) req += "1000\r\n" + chunk + "\r\n";  // 128 KiB > 64 KiB
    req += "0\r\n\r\n";
    k.send_all(req);
    EXPECT_EQ(status_of(k.read_all(true)), 413);
  }
  {  // under the limit, chunked bodies work
    RawConn k(s.port);
    const std::string body = R"({"prompt": "ROMEO:", "max_tokens": 2})";
    char len[16];
    snprintf(len, sizeof len, "%zx", body.size());
    k.send_all(std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n") +
               "Transfer-Encoding: chunked\r\n\r\n" + len + "\r\n" + body + "\r\n0\r\n\r\n");
    EXPECT_EQ(status_of(k.read_all()), 200);
  }
}

// A megabyte of short header lines ends at the head limit with 431 (it was kept in memory before the 401).
TEST_F(Hostile, HeaderFloodIs431) {
  server::ServerOptions so = short_deadlines();
  so.api_key = "k";
  Served s(so);
  RawConn k(s.port);
  std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 100000; ++i) req += "X-A: b\r\n";
  const auto t0 = Clock::now();
  k.send_all(req.substr(0, 64 * 1024));  // the rest would not be read
  EXPECT_EQ(status_of(k.read_all(true)), 431);
  EXPECT_LT(ms_since(t0), 900);
  // Without the key the body is never waited for: 401 from the head alone.
  RawConn k2(s.port);
  k2.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n");
  EXPECT_EQ(status_of(k2.read_all(true)), 401);
  EXPECT_LT(ms_since(t0), 900);
}

// 64 connections that send a header line every 200 ms (slowloris) are closed at the head deadline, and
// /health answers at once all the while (with a thread per connection they stopped every route).
TEST_F(Hostile, SlowlorisIsCutAndHealthStaysFast) {
  Served s(short_deadlines());
  std::vector<std::unique_ptr<RawConn>> slow;
  for (int i = 0; i < 64; ++i) {
    slow.push_back(std::make_unique<RawConn>(s.port, 3));
    slow.back()->send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
  }
  std::vector<double> lat;
  const auto t0 = Clock::now();
  while (ms_since(t0) < 1600) {
    for (auto& k : slow) k->send_all("X-Slow: 1\r\n");
    for (int i = 0; i < 4; ++i) lat.push_back(s.health_ms());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::sort(lat.begin(), lat.end());
  EXPECT_GE(lat.front(), 0) << "a /health request failed";
  EXPECT_LT(lat[lat.size() * 99 / 100], 50) << "p99 of /health during the attack, ms";
  int closed = 0;
  for (auto& k : slow) closed += k->read_all().empty() ? 1 : 0;  // closed without an answer
  EXPECT_EQ(closed, 64) << "slow heads must be cut at the head deadline";
}

// A thousand idle connections do not delay a completion; beyond the connection cap the longest-waiting
// idle connection is closed to make room.
TEST_F(Hostile, IdleConnectionsDoNotDelayRequests) {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  server::ServerOptions so = short_deadlines();
  so.limits.head_timeout = so.limits.idle_timeout = 30;
  so.limits.max_connections = 1000;
  Served s(so);  // raises this process's descriptor limit
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < 1100) GTEST_SKIP() << "descriptor limit " << rl.rlim_cur << " < 1100";
  std::vector<std::unique_ptr<RawConn>> idle;
  for (int i = 0; i < 1000; ++i) idle.push_back(std::make_unique<RawConn>(s.port, 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = Clock::now();
  auto r = s.client().Post("/v1/completions", R"({"prompt": "ROMEO:", "max_tokens": 4})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(ms_since(t0), 1000);
  EXPECT_GE(s.health_ms(), 0);
  EXPECT_LE(s.srv ? s.metric("ultra_http_connections") : 0, 1001);
  // The cap made room by closing the oldest idle connections.
  EXPECT_TRUE(idle.front()->read_all().empty());
}

// Several requests in one write are all answered, in order, on the one connection.
TEST_F(Hostile, PipelinedRequestsAreAllAnswered) {
  Served s;
  RawConn k(s.port);
  std::string reqs = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  reqs += post("/v1/completions", R"({"prompt": "ROMEO:", "max_tokens": 2, "temperature": 0})");
  reqs += post("/tokenize", R"({"content": "ROMEO"})");
  reqs += "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  k.send_all(reqs);
  const std::string out = k.read_all();
  size_t n = 0;
  for (size_t at = 0; (at = out.find("HTTP/1.1 200 OK\r\n", at)) != std::string::npos; ++at) ++n;
  EXPECT_EQ(n, 4u) << out;
  const size_t a = out.find("\"status\":\"ok\""), b = out.find("text_completion"), c = out.find("\"tokens\""),
               d = out.find("\"object\":\"list\"");
  EXPECT_TRUE(a < b && b < c && c < d) << out;
}

// A non-streamed request whose client leaves stops generating and frees its slot before the next step (it
// used to run to max_tokens).
TEST_F(Hostile, NonStreamedDisconnectCancelsTheGeneration) {
  Served s;
  {
    RawConn k(s.port);
    k.send_all(post("/v1/completions", R"({"prompt": "ROMEO:", "max_tokens": 250, "ignore_eos": true})"));
    for (int i = 0; i < 500 && s.metric("ultra_busy_slots") != 1; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }  // closed
  const auto t0 = Clock::now();
  while (s.metric("ultra_busy_slots") != 0 && ms_since(t0) < 5000)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(s.metric("ultra_busy_slots"), 0);
  EXPECT_LT(s.metric("ultra_generated_tokens_total"), 200) << "the generation ran on after the client left";
}

// Range headers are ignored (a 1000-range request was answered as 1000 parts); unknown fields are ignored,
// fields ultra parses but does not implement are refused when they ask for something.
TEST_F(Hostile, RangesUnknownAndUnimplementedFields) {
  Served s;
  std::string ranges = "bytes=0-0";
  for (int i = 1; i < 1000; ++i) ranges += "," + std::to_string(i) + "-" + std::to_string(i);
  httplib::Client c = s.client();
  auto r = c.Get("/v1/models", {{"Range", ranges}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(json::parse(r->body)["data"].is_array());
  r = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 1, "no_such_field": 1})",
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt": "x", "logit_bias": {"1": "five"}})", "logit_bias"},
           {R"({"prompt": "x", "logit_bias": {"1": 5, "x1": 2}})", "logit_bias"},
           {R"({"prompt": "x", "logit_bias": [[1]]})", "logit_bias"},
           {R"({"prompt": "x", "echo": true})", "echo"},
           {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", "tools"},
           {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}})",
            "response_format"},
           {R"({"messages": [{"role": "user", "content": "x"}], "response_format": "json"})",
            "response_format"},
           {R"({"prompt": "x", "grammar": 5})", "grammar"},
           {R"({"prompt": "x", "grammar": "root ::= [z-a]"})", "grammar"}}) {
    r = c.Post(body.starts_with(R"({"prompt")") ? "/v1/completions" : "/v1/chat/completions", body,
               "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << body;
    EXPECT_EQ(json::parse(r->body)["error"]["param"], param) << r->body;
  }
  r = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 1, "logit_bias": {}})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << "an empty logit_bias asks for nothing";
}

// A stream cut by shutdown ends with an error event and [DONE], not finish_reason "length".
TEST_F(Hostile, ShutdownEndsStreamsWithAnError) {
  auto s = std::make_unique<Served>();
  std::string got;
  std::thread t([&] {
    RawConn k(s->port);
    k.send_all(post("/v1/completions",
                    R"({"prompt": "ROMEO:", "max_tokens": 250, "ignore_eos": true, "stream": true})"));
    got = k.read_all();
  });
  for (int i = 0; i < 2000 && s->metric("ultra_generated_tokens_total") < 4; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const auto t0 = Clock::now();
  s.reset();  // scheduler shutdown, then the server's
  EXPECT_LT(ms_since(t0), 1000);
  t.join();
  EXPECT_NE(got.find("\"code\":\"shutdown\""), std::string::npos)
      << got.substr(got.size() > 600 ? got.size() - 600 : 0);
  EXPECT_EQ(got.find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos);
}

// A request's own chat template that would run for hours (string concatenation in a loop) or take
// gigabytes is stopped by its render budget: 400 naming the budget, within a second; the server goes on.
TEST_F(Hostile, TemplateRenderIsBounded) {
  Served s;
  for (const std::string tmpl :
       {"{% set ns = namespace(s='x') %}{% for i in range(10000) %}{% for j in range(10000) %}"
        "{% set ns.s = ns.s ~ 'abcdefgh' %}{% endfor %}{% endfor %}{{ ns.s | length }}",
        "{{ ('x' * 1000000) * 100000 }}",
        "{% set ns = namespace(l=[]) %}{% for i in range(10000) %}{% for j in range(10000) %}"
        "{% set ns.l = ns.l + [messages[0].content ~ i] %}{% endfor %}{% endfor %}{{ ns.l | sort | length }}",
        "{% for i in range(10000) %}{% for j in range(10000) %}{{ messages[0].content }}{% endfor %}{% "
        "endfor %}"}) {
    const json body = {{"messages", {{{"role", "user"}, {"content", std::string(1000, 'y')}}}},
                       {"chat_template", tmpl},
                       {"max_tokens", 1}};
    const auto t0 = Clock::now();
    auto r = s.client().Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_NE(r->body.find("the chat template refused the conversation"), std::string::npos) << r->body;
    EXPECT_LT(ms_since(t0), 1500) << tmpl;
  }
  EXPECT_GE(s.health_ms(), 0);
}

// `ultra serve` ends within a second of SIGTERM, exit status 0, while four renders of a template that would
// run for hours and two streams are under way (renders are cancelled through their budget's flag).
TEST_F(Hostile, SigtermEndsTheServerMidRender) {
  int err_pipe[2];
  ASSERT_EQ(pipe(err_pipe), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(err_pipe[1], 2);
    const int null = ::open("/dev/null", O_WRONLY);
    dup2(null, 1);
    alarm(120);  // a hang ends the child (SIGALRM), which fails the test
    execl(ULTRA_ULTRA_BIN, "ultra", "serve", "--port", "0", "-c", "256", (char*)nullptr);
    _exit(127);
  }
  close(err_pipe[1]);
  // Its stderr says where it listens, then that it is ready.
  std::string err;
  char buf[512];
  while (err.find("ready") == std::string::npos) {
    const ssize_t n = read(err_pipe[0], buf, sizeof buf);
    if (n <= 0) break;
    err.append(buf, (size_t)n);
  }
  const size_t at = err.find("http://127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << err;
  const int port = std::stoi(err.substr(at + 17));
  const std::string tmpl =
      "{% set ns = namespace(s='x') %}{% for i in range(10000) %}{% for j in range(10000) %}"
      "{% set ns.s = ns.s ~ ns.s[:8] %}{% endfor %}{% endfor %}{{ ns.s | length }}";
  std::vector<std::unique_ptr<RawConn>> busy;
  for (int i = 0; i < 6; ++i) {
    busy.push_back(std::make_unique<RawConn>(port));
    const json body =
        i < 4 ? json{{"messages", {{{"role", "user"}, {"content", "x"}}}},
                     {"chat_template", tmpl},
                     {"max_tokens", 1}}
              : json{{"prompt", "ROMEO:"}, {"max_tokens", 200}, {"ignore_eos", true}, {"stream", true}};
    busy.back()->send_all(post(i < 4 ? "/v1/chat/completions" : "/v1/completions", body.dump()));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  const double ms = ms_since(t0);
  close(err_pipe[0]);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  EXPECT_LT(ms, 1000) << "ms from SIGTERM to exit";
}

// Special-token text inside a message is plain text unless the request allows it: a message cannot forge a
// turn (the bundled vocabulary's end-of-sequence text, written in a message, was its control token).
TEST_F(Hostile, SpecialTokenTextInMessagesIsText) {
  Served s;
  const std::string eos(s.model.tokenizer()->token_to_piece(s.model.tokenizer()->eos()));
  const auto prompt_tokens = [&](bool allow) {
    const json body = {{"messages", {{{"role", "user"}, {"content", "a" + eos + "b"}}}},
                       {"max_tokens", 1},
                       {"allow_special_in_content", allow}};
    auto r = s.client().Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
    return r ? json::parse(r->body)["usage"]["prompt_tokens"].get<int>() : -1;
  };
  EXPECT_GT(prompt_tokens(false), prompt_tokens(true)) << "the EOS text became the control token";
}

// HTTP/1.0 and Expect: 100-continue clients are served; the /v1/models id is the model's file name.
TEST_F(Hostile, OldAndCarefulClients) {
  Served s;
  {
    RawConn k(s.port);
    k.send_all("GET /health HTTP/1.0\r\n\r\n");
    const std::string out = k.read_all();  // closed after the reply
    EXPECT_EQ(status_of(out), 200) << out;
  }
  {
    RawConn k(s.port);
    const std::string body = R"({"content": "ROMEO"})";
    k.send_all(
        "POST /tokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nConnection: close\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n");
    const std::string cont = k.read_all(true);
    EXPECT_EQ(status_of(cont), 100) << cont;
    k.send_all(body);
    EXPECT_EQ(status_of(k.read_all()), 200);
  }
  EXPECT_EQ(server::model_id("/a/b/target.gguf"), "target.gguf");
  EXPECT_EQ(server::model_id("/models/Qwen3-0.6B/"), "Qwen3-0.6B");
}

}  // namespace
