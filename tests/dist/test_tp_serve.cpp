// ctest test_tp_serve: `ultra serve --tp 2` under `mpirun -np 2` against `ultra serve` alone, over HTTP:
//   - a greedy chat completion, the same request streamed, and n = 2 seeded sampled choices (their prompt's
//     KV copied between slots on every rank) give the same text as one process;
//   - a rank killed (SIGKILL) mid-stream ends the job through mpirun within seconds, naming the rank;
//   - a request whose step fails with the ranks in step (a prompt token whose embedding row is NaN: every
//     rank runs the step, rank 0 finds its logits not finite) gets the error, and the job serves the next
//     request as one process does;
//   - a rank that stops answering (SIGSTOP) mid-stream: the stream ends with the collective's error within
//     seconds (--tp-timeout 2), and rank 0 ends the job with that error instead of serving on with a broken
//     communicator.
// The program itself is not an MPI job: it starts the jobs (mpirun, ULTRA_MPIEXEC) and the servers as child
// processes in process groups of their own, and ends them by group.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "io/gguf.h"
#include "raw_conn.h"
#include "tmp_dir.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A server (or an MPI job of servers) started with args, its standard output and error in one file.
class Served {
 public:
  Served(const std::vector<std::string>& args, const std::string& log) : log_(log) {
    std::vector<std::string> a = args;
    std::vector<char*> argv;
    for (std::string& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);  // a group of its own: mpirun's ranks are ended with it
      dup2(fd, 1);
      dup2(fd, 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fd);
    if (pid_ > 0) setpgid(pid_, pid_);
    const auto t0 = Clock::now();
    const std::regex listening("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    while (seconds_since(t0) < 60 && exit_status(0) < 0) {
      const std::string out = output();
      std::smatch m;
      if (out.find("ultra serve: ready") != std::string::npos && std::regex_search(out, m, listening)) {
        port_ = std::stoi(m[1].str());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~Served() {
    if (exit_status(0) >= 0) return;
    kill(-pid_, SIGTERM);
    if (exit_status(10) < 0) {
      kill(-pid_, SIGKILL);
      exit_status(10);
    }
  }
  Served(const Served&) = delete;
  Served& operator=(const Served&) = delete;

  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  std::string output() const {
    std::ifstream f(log_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  // The exit status once the process has ended (waiting up to s seconds; 128 + the signal's number when a
  // signal ended it), else -1.
  int exit_status(double s) {
    const auto t0 = Clock::now();
    while (status_ < 0) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
      if (seconds_since(t0) >= s) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status_;
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  int port_ = -1;
  int status_ = -1;
};

const std::string kModel = (fs::path(ULTRA_SOURCE_DIR) / "models" / "target.gguf").string();

std::vector<std::string> alone_args() {
  return {ULTRA_ULTRA_BIN, "serve", "-m", kModel, "--port", "0", "-t", "1"};
}
std::vector<std::string> split_args(const std::vector<std::string>& more = {},
                                    const std::string& model = kModel) {
  std::vector<std::string> a = {ULTRA_MPIEXEC,
                                "-np",
                                "2",
                                "--oversubscribe",
                                ULTRA_ULTRA_BIN,
                                "serve",
                                "--tp",
                                "2",
                                "-m",
                                model,
                                "--port",
                                "0",
                                "-t",
                                "1"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

json chat(int max_tokens, double temperature, bool stream = false) {
  json b = {{"messages", {{{"role", "user"}, {"content", "Good morrow, fair Juliet."}}}},
            {"max_tokens", max_tokens},
            {"temperature", temperature}};
  if (stream) b["stream"] = true;
  return b;
}

// The response body of POST path body (empty when none came).
std::string post(int port, const std::string& path, const json& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  auto r = c.Post(path, body.dump(), "application/json");
  if (!r) return "";
  EXPECT_EQ(r->status, 200) << r->body;
  return r->body;
}

// Each choice's message text of a chat completion.
std::vector<std::string> contents(const std::string& body) {
  std::vector<std::string> out;
  const json j = json::parse(body, nullptr, false);
  if (!j.contains("choices")) return out;
  for (const json& c : j["choices"]) out.push_back(c["message"]["content"].get<std::string>());
  return out;
}

// A streamed chat completion's text (the deltas' content in order), "[DONE]" appended when it ended so.
std::string streamed(const std::string& body) {
  std::string text;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const std::string ev = body.substr(at + 6, end == std::string::npos ? std::string::npos : end - at - 6);
    at = end == std::string::npos ? body.size() : end;
    if (ev == "[DONE]") {
      text += "[DONE]";
      continue;
    }
    const json j = json::parse(ev, nullptr, false);
    if (j.contains("choices") && !j["choices"].empty() && j["choices"][0]["delta"].contains("content"))
      text += j["choices"][0]["delta"]["content"].get<std::string>();
  }
  return text;
}

// The process of rank `rank` of the MPI job started by mpirun (a descendant of it carrying Open MPI's
// OMPI_COMM_WORLD_RANK), or -1.
pid_t rank_pid(pid_t mpirun, int rank) {
  const std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  auto parent = [](pid_t p) -> pid_t {
    std::ifstream f("/proc/" + std::to_string(p) + "/stat");
    std::string s((std::istreambuf_iterator<char>(f)), {});
    const size_t close = s.rfind(')');
    if (close == std::string::npos) return -1;
    char state = 0;
    int ppid = -1;
    return std::sscanf(s.c_str() + close + 1, " %c %d", &state, &ppid) == 2 ? ppid : -1;
  };
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t p = std::stoi(name);
    bool below = false;
    for (pid_t q = parent(p), i = 0; q > 1 && i < 4 && !below; q = parent(q), ++i) below = q == mpirun;
    if (!below) continue;
    std::ifstream f("/proc/" + name + "/environ", std::ios::binary);
    const std::string env((std::istreambuf_iterator<char>(f)), {});
    size_t at = 0;
    for (size_t z; (z = env.find('\0', at)) != std::string::npos; at = z + 1)
      if (env.compare(at, z - at, want) == 0) return p;
  }
  return -1;
}

// A streamed chat request on a raw connection, read until its first token's event has arrived.
std::unique_ptr<RawConn> stream_started(int port) {
  auto c = std::make_unique<RawConn>(port, 30);
  json b = chat(200, 0, true);
  b["ignore_eos"] = true;
  const std::string body = b.dump();
  EXPECT_TRUE(
      c->send_all("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Connection: close\r\nContent-Length: " +
                  std::to_string(body.size()) + "\r\n\r\n" + body));
  std::string got;
  char buf[4096];
  ssize_t n;
  while (got.find("\"content\"") == std::string::npos && (n = read(c->fd, buf, sizeof buf)) > 0)
    got.append(buf, (size_t)n);
  EXPECT_NE(got.find("\"content\""), std::string::npos) << got;
  return c;
}

class TpServe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir = new ultra::test::TmpDir("ultra_tp_serve");
    alone = new Served(alone_args(), dir->file("alone.log"));
    split = new Served(split_args(), dir->file("split.log"));
  }
  static void TearDownTestSuite() {
    delete split;
    delete alone;
    delete dir;
  }
  void SetUp() override {
    ASSERT_GT(alone->port(), 0) << alone->output();
    ASSERT_GT(split->port(), 0) << split->output();
  }
  static inline ultra::test::TmpDir* dir = nullptr;
  static inline Served* alone = nullptr;
  static inline Served* split = nullptr;
};

TEST_F(TpServe, ChatCompletionAsOneProcess) {
  const auto a = contents(post(alone->port(), "/v1/chat/completions", chat(24, 0)));
  const auto b = contents(post(split->port(), "/v1/chat/completions", chat(24, 0)));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_FALSE(a[0].empty());
  EXPECT_EQ(a, b);
}

TEST_F(TpServe, StreamedChatCompletionAsOneProcess) {
  const std::string a = streamed(post(alone->port(), "/v1/chat/completions", chat(24, 0, true)));
  const std::string b = streamed(post(split->port(), "/v1/chat/completions", chat(24, 0, true)));
  EXPECT_GT(a.size(), 6u);
  EXPECT_EQ(a.substr(a.size() - 6), "[DONE]");
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.substr(0, a.size() - 6), contents(post(split->port(), "/v1/chat/completions", chat(24, 0)))[0]);
}

// n = 2: the prompt is prefilled once and its KV copied to the second choice's slot (Context::copy_seq),
// on every rank.
TEST_F(TpServe, SampledChoicesAsOneProcess) {
  json body = chat(24, 0.8);
  body["n"] = 2;
  body["seed"] = 5;
  const auto a = contents(post(alone->port(), "/v1/chat/completions", body));
  const auto b = contents(post(split->port(), "/v1/chat/completions", body));
  ASSERT_EQ(a.size(), 2u);
  EXPECT_NE(a[0], a[1]);
  EXPECT_EQ(a, b);
}

// models/target.gguf with the embedding row of token `bad` all NaN (F16), its output projection untied (a
// copy of the original embeddings): a prompt holding that token gives logits that are not finite, the others
// the original model's.
void write_nan_token_model(const std::string& path, int bad) {
  const ultra::gguf::Reader r = ultra::gguf::Reader::open(kModel);
  ultra::gguf::Writer w;
  for (const auto& [k, v] : r.metadata()) w.set_value(k, v);
  const ultra::gguf::TensorInfo* e = r.find_tensor("token_embd.weight");
  ASSERT_TRUE(e && e->type == ultra::GgmlType::F16 && !r.find_tensor("output.weight"));
  std::vector<uint8_t> embd(e->data, e->data + e->n_bytes);
  const size_t row = e->ne[0] * 2;
  std::vector<uint16_t> nan(e->ne[0], 0x7E00);
  std::memcpy(embd.data() + (size_t)bad * row, nan.data(), row);
  for (const auto& t : r.tensors())
    w.add_tensor(t.name, t.type, t.ne, t.name == e->name ? embd.data() : t.data, t.n_bytes);
  w.add_tensor("output.weight", e->type, e->ne, e->data, e->n_bytes);
  w.write(path);
}

// A request whose step fails with the ranks in step: every rank runs the forward of a prompt token with a NaN
// embedding, and rank 0 finds the logits not finite after the step. The request gets the error (as from one
// process); the job goes on, and the next request's text is one process's.
TEST_F(TpServe, StepFailedInStepFailsOnlyItsRequest) {
  constexpr int kBad = 4095;  // the vocabulary's last merge: not in the prompt or the reply of chat(24, 0)
  const ultra::test::TmpDir d("ultra_tp_serve");
  ASSERT_NO_FATAL_FAILURE(write_nan_token_model(d.file("nan_token.gguf"), kBad));
  Served job(split_args({}, d.file("nan_token.gguf")), d.file("job.log"));
  ASSERT_GT(job.port(), 0) << job.output();
  httplib::Client c("127.0.0.1", job.port());
  c.set_read_timeout(60, 0);
  const json bad = {{"prompt", {1, 50, kBad, 7}}, {"max_tokens", 4}, {"temperature", 0}};
  const auto r = c.Post("/v1/completions", bad.dump(), "application/json");
  ASSERT_TRUE(r) << job.output();
  EXPECT_EQ(r->status, 500) << r->body;
  EXPECT_NE(r->body.find("NaN or infinity"), std::string::npos) << r->body;
  const auto want = contents(post(alone->port(), "/v1/chat/completions", chat(24, 0)));
  EXPECT_EQ(contents(post(job.port(), "/v1/chat/completions", chat(24, 0))), want) << job.output();
  EXPECT_EQ(job.exit_status(0), -1) << "the job ended: " << job.output();
}

// A job of `ultra serve --tp 2` (more: further flags) with a streamed request running, then `sig` sent to
// rank 1: what the stream received after the signal and the seconds it took to end, and the job's exit
// status (-1: still running 20 s later) and output.
struct Interrupted {
  std::string rest;
  double stream_s = 0;
  int status = -1;
  std::string output;
};
Interrupted interrupt_rank1(int sig, const std::vector<std::string>& more = {}) {
  const ultra::test::TmpDir dir("ultra_tp_serve");
  Served job(split_args(more), dir.file("job.log"));
  Interrupted r;
  EXPECT_GT(job.port(), 0) << job.output();
  if (job.port() <= 0) return r;
  const auto conn = stream_started(job.port());
  const pid_t r1 = rank_pid(job.pid(), 1);
  EXPECT_GT(r1, 0);
  if (r1 <= 0) return r;
  const auto t0 = Clock::now();
  kill(r1, sig);
  r.rest = conn->read_all();
  r.stream_s = seconds_since(t0);
  r.status = job.exit_status(20);
  r.output = job.output();
  return r;
}

// A rank killed mid-stream: mpirun ends the job at once (rank 0 too: the connection closes) and says which
// rank died.
TEST(TpServeFailure, RankKilledEndsTheJob) {
  const Interrupted r = interrupt_rank1(SIGKILL);
  EXPECT_LT(r.stream_s, 10);
  EXPECT_EQ(streamed(r.rest).find("[DONE]"), std::string::npos) << "the stream went on: " << r.rest;
  EXPECT_GT(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
}

// A rank that stops answering mid-stream (SIGSTOP): rank 0's step ends with the collective's error after
// --tp-timeout 2 s, the stream ends with that error, and rank 0 ends the job (its error line, a non-zero
// exit) rather than serve the next requests on a communicator that stopped.
TEST(TpServeFailure, RankHungEndsTheJobWithItsError) {
  const Interrupted r = interrupt_rank1(SIGSTOP, {"--tp-timeout", "2"});
  EXPECT_NE(r.rest.find("no answer within 2 s"), std::string::npos) << r.rest;
  EXPECT_LT(r.stream_s, 10);
  EXPECT_GT(r.status, 0) << "the job went on serving after its communicator stopped (-1) or exited 0: "
                         << r.output;
  EXPECT_NE(r.output.find("error: tensor parallelism"), std::string::npos) << r.output;
}

}  // namespace
