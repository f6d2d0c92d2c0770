// `ultra serve` under load: aggregate tokens/s, time to first token and inter-token latency (p50 / p99) at
// several numbers of concurrent streams. The server runs in this process on a loopback port with one KV
// slot per stream; each client thread sends streaming /v1/completions requests one after another and
// timestamps every SSE event as it arrives.
//
//   bench_server [-m MODEL] [-t THREADS] [--streams 1,8,32] [-n 64] [--requests 2] [-c CTX]
//
// Prompts are short and different per stream; sampling is seeded (temperature 0.8) and ignore_eos keeps
// every request at exactly -n tokens. A first round at the highest concurrency warms the server up.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "server/server.h"
#include "ultra/model.h"

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Sample {
  double ttft_ms = 0;
  std::vector<double> gaps_ms;  // between consecutive text events
  int n_tokens = 0;
  bool ok = false;
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, (size_t)(p / 100.0 * (double)(v.size() - 1) + 0.5));
  return v[i];
}

const char* kPrompts[] = {"ROMEO:",    "JULIET:",     "First Citizen:", "KING RICHARD III:",
                          "MENENIUS:", "GLOUCESTER:", "HAMLET:",        "LADY CAPULET:"};

Sample one_request(int port, int stream, int k, int n_tokens) {
  Sample s;
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(600, 0);
  c.set_tcp_nodelay(true);
  const json body = {{"prompt", kPrompts[(stream + k) % 8]},
                     {"max_tokens", n_tokens},
                     {"temperature", 0.8},
                     {"seed", stream * 1000 + k},
                     {"ignore_eos", true},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  std::string buf;
  const auto t0 = Clock::now();
  auto last = t0;
  bool first = true;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t e;
    while ((e = buf.find("\n\n")) != std::string::npos) {
      const std::string ev = buf.substr(0, e);
      buf.erase(0, e + 2);
      if (ev.rfind("data: ", 0) != 0 || ev == "data: [DONE]") continue;
      const json j = json::parse(ev.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage") && j["usage"].is_object()) s.n_tokens = j["usage"]["completion_tokens"];
      if (!j.contains("choices") || j["choices"].empty()) continue;
      if (j["choices"][0].value("text", "").empty()) continue;
      const auto now = Clock::now();
      if (first)
        s.ttft_ms = std::chrono::duration<double, std::milli>(now - t0).count();
      else
        s.gaps_ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
      first = false;
      last = now;
    }
    return true;
  };
  auto r = c.send(req);
  s.ok = r && r->status == 200 && s.n_tokens == n_tokens;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = std::string(ULTRA_SOURCE_DIR) + "/models/target.gguf";
  std::vector<int> streams = {1, 8, 32};
  int n_tokens = 64, n_requests = 2, n_threads = 0, n_ctx = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "-m" && v)
      model_path = argv[++i];
    else if (a == "-t" && v)
      n_threads = std::atoi(argv[++i]);
    else if (a == "-n" && v)
      n_tokens = std::atoi(argv[++i]);
    else if (a == "-c" && v)
      n_ctx = std::atoi(argv[++i]);
    else if (a == "--requests" && v)
      n_requests = std::atoi(argv[++i]);
    else if (a == "--streams" && v) {
      streams.clear();
      for (const char* p = argv[++i]; *p;) {
        streams.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p) ++p;
      }
    } else {
      std::fprintf(stderr,
                   "usage: bench_server [-m MODEL] [-t THREADS] [--streams 1,8,32] [-n 64] "
                   "[--requests 2] [-c CTX]\n");
      return 2;
    }
  }
  const int max_streams = *std::max_element(streams.begin(), streams.end());
  const ultra::Model model = ultra::Model::load(model_path);
  ultra::ContextParams cp;
  cp.n_slots = max_streams;
  cp.n_threads = n_threads;
  cp.n_ctx = n_ctx;
  auto sched = std::make_shared<ultra::server::Scheduler>(model, cp, 4 * max_streams);
  ultra::server::ServerOptions so;
  so.n_http_threads = max_streams + 8;
  ultra::server::Server srv(so);
  const int port = srv.bind("127.0.0.1", 0);
  srv.attach(sched);
  std::thread th([&] { srv.listen(); });
  std::printf("model %s, %d slots of %d tokens, %d tokens per request, %d request(s) per stream\n",
              model_path.c_str(), sched->n_slots(), sched->n_ctx(), n_tokens, n_requests);
  std::printf(
      "| streams | aggregate tok/s | per-stream tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms "
      "|\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  bool all_ok = true;
  for (int round = -1; round < (int)streams.size(); ++round) {
    const int n = round < 0 ? max_streams : streams[(size_t)round];  // round -1: warm-up, not printed
    std::vector<Sample> samples((size_t)n * n_requests);
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int s = 0; s < n; ++s)
      ts.emplace_back([&, s] {
        for (int k = 0; k < n_requests; ++k)
          samples[(size_t)s * n_requests + k] = one_request(port, s, k, n_tokens);
      });
    for (auto& t : ts) t.join();
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    if (round < 0) continue;
    std::vector<double> ttft, gaps;
    int64_t total = 0;
    for (const Sample& x : samples) {
      all_ok = all_ok && x.ok;
      ttft.push_back(x.ttft_ms);
      gaps.insert(gaps.end(), x.gaps_ms.begin(), x.gaps_ms.end());
      total += x.n_tokens;
    }
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f |\n", n, (double)total / wall,
                (double)total / wall / n, pct(ttft, 50), pct(ttft, 99), pct(gaps, 50), pct(gaps, 99));
    std::fflush(stdout);
  }
  sched->shutdown();
  srv.stop();
  th.join();
  if (!all_ok) std::fprintf(stderr, "some requests failed or came back short\n");
  return all_ok ? 0 : 1;
}
