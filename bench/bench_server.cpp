// `ultra serve` under load: aggregate tokens/s, time to first token and inter-token latency (p50 / p99) at
// several numbers of concurrent streams. The server runs in this process on a loopback port with one KV
// slot per stream; each client thread sends streaming /v1/completions requests one after another and
// timestamps every SSE event as it arrives.
//
//   bench_server [-m MODEL] [-t THREADS] [-c CTX] [--device cpu|cuda] [--kv-type f32|f16|bf16]
//                [--streams 1,8,32] [-n 64] [--requests 2] [--prompt-ids N] [--json]
//   bench_server --url http://HOST:PORT [--streams 1,8,32] [-n 64] [--requests 2] [--prompt-ids N] [--json]
//
// Prompts are short and different per stream (--prompt-ids N: N token ids instead of text, for models whose
// tokenizer has no real words); sampling is seeded (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, all
// sent explicitly) and ignore_eos keeps every request at exactly -n tokens (checked against the final
// chunk's usage.completion_tokens). A first round at the highest concurrency warms the server up.
//
// --url drives an external OpenAI-compatible server instead (client only: no model is loaded) with exactly
// the same requests, e.g. llama.cpp's llama-server, which takes the same fields (max_tokens is its
// n_predict; ignore_eos, seed, top_k, min_p, stream_options.include_usage); bench/server_compare.py runs
// both. The external server must have at least as many parallel slots as the largest stream count.
// --device / --kv-type pass through to the context as `ultra serve --device cuda` does (bench/server_gpu.py).
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/common.h"
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
  std::string error;  // why not ok
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, (size_t)(p / 100.0 * (double)(v.size() - 1) + 0.5));
  return v[i];
}

const char* kPrompts[] = {"ROMEO:",    "JULIET:",     "First Citizen:", "KING RICHARD III:",
                          "MENENIUS:", "GLOUCESTER:", "HAMLET:",        "LADY CAPULET:"};

struct Target {
  std::string host = "127.0.0.1";
  int port = 0;
};

struct Load {
  int n_tokens = 64;
  int prompt_ids = 0;  // > 0: prompts of this many token ids instead of text
};

// The request body of stream `stream`'s k-th request: the same for every server.
json request_body(const Load& load, int stream, int k) {
  json prompt;
  if (load.prompt_ids > 0) {
    prompt = json::array();
    for (int i = 0; i < load.prompt_ids; ++i)
      prompt.push_back(3 + (i * 7919 + (stream + k) * 131) % 250);  // ids < 256: in any vocabulary
  } else {
    prompt = kPrompts[(stream + k) % 8];
  }
  return {{"prompt", prompt},
          {"max_tokens", load.n_tokens},
          {"temperature", 0.8},
          {"top_k", 40},
          {"top_p", 0.95},
          {"min_p", 0.05},
          {"seed", stream * 1000 + k},
          {"ignore_eos", true},
          {"stream", true},
          {"stream_options", {{"include_usage", true}}}};
}

Sample one_request(const Target& target, const Load& load, int stream, int k) {
  Sample s;
  httplib::Client c(target.host, target.port);
  c.set_read_timeout(600, 0);
  c.set_tcp_nodelay(true);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = request_body(load, stream, k).dump();
  std::string buf, error_body;
  const auto t0 = Clock::now();
  auto last = t0;
  bool first = true;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    if (error_body.size() < 4096) error_body.append(data, std::min<size_t>(n, 4096));
    size_t e;
    while ((e = buf.find("\n\n")) != std::string::npos) {
      const std::string ev = buf.substr(0, e);
      buf.erase(0, e + 2);
      if (ev.rfind("data: ", 0) != 0 || ev == "data: [DONE]") continue;
      const json j = json::parse(ev.substr(6), nullptr, false);
      if (j.is_discarded() || !j.is_object()) continue;
      if (j.contains("usage") && j["usage"].is_object() && j["usage"].contains("completion_tokens") &&
          j["usage"]["completion_tokens"].is_number_integer())
        s.n_tokens = j["usage"]["completion_tokens"].get<int>();
      if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
      const json& ch = j["choices"][0];
      if (!ch.contains("text") || !ch["text"].is_string() || ch["text"].get_ref<const std::string&>().empty())
        continue;
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
  if (!r)
    s.error = "no response: " + httplib::to_string(r.error());
  else if (r->status != 200)
    s.error = "HTTP " + std::to_string(r->status) + ": " + error_body.substr(0, 300);
  else if (s.n_tokens != load.n_tokens)
    s.error = "usage.completion_tokens " + std::to_string(s.n_tokens) + ", expected " +
              std::to_string(load.n_tokens);
  s.ok = s.error.empty();
  return s;
}

// "http://HOST:PORT" (a trailing slash allowed) -> target; false for anything else.
bool parse_url(const std::string& url, Target& t) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) return false;
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || rest.find('/') != std::string::npos) return false;
  t.host = rest.substr(0, colon);
  if (t.host.size() > 2 && t.host.front() == '[' && t.host.back() == ']')
    t.host = t.host.substr(1, t.host.size() - 2);
  const std::string port = rest.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return false;
  t.port = std::atoi(port.c_str());
  return t.port > 0 && t.port < 65536;
}

int usage() {
  std::fprintf(
      stderr,
      "usage: bench_server [-m MODEL] [-t THREADS] [-c CTX] [--device cpu|cuda] [--kv-type f32|f16|bf16]\n"
      "                    [--streams 1,8,32] [-n 64] [--requests 2] [--prompt-ids N] [--json]\n"
      "       bench_server --url http://HOST:PORT [--streams 1,8,32] [-n 64] [--requests 2]\n"
      "                    [--prompt-ids N] [--json]\n");
  return 2;
}

int run(int argc, char** argv) {
  std::string model_path = std::string(ULTRA_SOURCE_DIR) + "/models/target.gguf";
  std::string url, device = "cpu", kv_type;
  std::vector<int> streams = {1, 8, 32};
  Load load;
  int n_requests = 2, n_threads = 0, n_ctx = 0;
  bool as_json = false, server_flags = false;
  auto number = [](const char* v, int lo, int hi, int& out) {
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) return false;
    out = (int)x;
    return true;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    bool ok = true;
    if (a == "--json") {
      as_json = true;
      continue;
    }
    if (!v) return usage();
    ++i;
    if (a == "-m")
      model_path = v, server_flags = true;
    else if (a == "-t")
      ok = number(v, 0, 4096, n_threads), server_flags = true;
    else if (a == "-c")
      ok = number(v, 0, 1 << 24, n_ctx), server_flags = true;
    else if (a == "--device")
      device = v, ok = device == "cpu" || device == "cuda", server_flags = true;
    else if (a == "--kv-type")
      kv_type = v, ok = kv_type == "f32" || kv_type == "f16" || kv_type == "bf16", server_flags = true;
    else if (a == "-n")
      ok = number(v, 1, 1 << 20, load.n_tokens);
    else if (a == "--requests")
      ok = number(v, 1, 1 << 20, n_requests);
    else if (a == "--prompt-ids")
      ok = number(v, 0, 1 << 20, load.prompt_ids);
    else if (a == "--url")
      url = v;
    else if (a == "--streams") {
      streams.clear();
      for (const char* p = v; ok && *p;) {
        const char* q = p;
        while (*q && *q != ',') ++q;
        int x = 0;
        ok = number(std::string(p, q).c_str(), 1, 4096, x);
        streams.push_back(x);
        p = *q ? q + 1 : q;
      }
      ok = ok && !streams.empty();
    } else
      return usage();
    if (!ok) {
      std::fprintf(stderr, "bench_server: bad value for %s: '%s'\n", a.c_str(), v);
      return 2;
    }
  }
  const int max_streams = *std::max_element(streams.begin(), streams.end());

  Target target;
  std::unique_ptr<ultra::Model> model;
  std::shared_ptr<ultra::server::Scheduler> sched;
  std::unique_ptr<ultra::server::Server> srv;
  std::thread th;
  std::string what;
  if (!url.empty()) {
    if (server_flags) {
      std::fprintf(stderr,
                   "bench_server: -m, -t, -c, --device and --kv-type are the in-process server's; "
                   "with --url the external server has its own\n");
      return 2;
    }
    if (!parse_url(url, target)) {
      std::fprintf(stderr, "bench_server: --url '%s': expected http://HOST:PORT\n", url.c_str());
      return 2;
    }
    what = "external server " + url;
  } else {
    model = std::make_unique<ultra::Model>(ultra::Model::load(model_path));
    ultra::ContextParams cp;
    cp.n_slots = max_streams;
    cp.n_threads = n_threads;
    cp.n_ctx = n_ctx;
    ultra::cli::apply_device_flags(device, kv_type, cp);  // as `ultra serve --device/--kv-type`
    sched = std::make_shared<ultra::server::Scheduler>(*model, cp, 4 * max_streams);
    for (const std::string& w : sched->warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
    ultra::server::ServerOptions so;

    srv = std::make_unique<ultra::server::Server>(so);
    target.port = srv->bind("127.0.0.1", 0);
    if (target.port < 0) throw ultra::Error("cannot bind a loopback port");
    srv->attach(sched);
    th = std::thread([&] { srv->listen(); });
    what = "ultra (in process, " + device + "): " + model_path + ", " + std::to_string(sched->n_slots()) +
           " slots of " + std::to_string(sched->n_ctx()) + " tokens";
  }
  const std::string prompts = load.prompt_ids > 0 ? std::to_string(load.prompt_ids) + " prompt token ids"
                                                  : std::string("text prompts");
  if (as_json) {
    std::printf("%s\n", json{{"server", what},
                             {"tokens_per_request", load.n_tokens},
                             {"requests_per_stream", n_requests},
                             {"prompts", prompts}}
                            .dump()
                            .c_str());
  } else {
    std::printf("%s; %s, %d tokens per request, %d request(s) per stream\n", what.c_str(), prompts.c_str(),
                load.n_tokens, n_requests);
    std::printf(
        "| streams | aggregate tok/s | per-stream tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 "
        "ms "
        "|\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  }
  std::fflush(stdout);
  int n_failed = 0;
  std::string first_error;
  for (int round = -1; round < (int)streams.size(); ++round) {
    const int n = round < 0 ? max_streams : streams[(size_t)round];  // round -1: warm-up, not printed
    std::vector<Sample> samples((size_t)n * n_requests);
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int s = 0; s < n; ++s)
      ts.emplace_back([&, s] {
        for (int k = 0; k < n_requests; ++k)
          samples[(size_t)s * n_requests + k] = one_request(target, load, s, k);
      });
    for (auto& t : ts) t.join();
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    std::vector<double> ttft, gaps;
    int64_t total = 0;
    int failed = 0;
    for (const Sample& x : samples) {
      if (!x.ok) {
        ++failed;
        if (first_error.empty()) first_error = x.error;
        continue;
      }
      ttft.push_back(x.ttft_ms);
      gaps.insert(gaps.end(), x.gaps_ms.begin(), x.gaps_ms.end());
      total += x.n_tokens;
    }
    if (round < 0) {
      if (failed == (int)samples.size()) {
        std::fprintf(stderr, "bench_server: every warm-up request failed: %s\n", first_error.c_str());
        n_failed = failed;
        break;
      }
      continue;
    }
    n_failed += failed;
    if (as_json)
      std::printf("%s\n", json{{"streams", n},
                               {"requests", (int)samples.size()},
                               {"failed", failed},
                               {"aggregate_tps", (double)total / wall},
                               {"per_stream_tps", (double)total / wall / n},
                               {"ttft_p50_ms", pct(ttft, 50)},
                               {"ttft_p99_ms", pct(ttft, 99)},
                               {"itl_p50_ms", pct(gaps, 50)},
                               {"itl_p99_ms", pct(gaps, 99)}}
                              .dump()
                              .c_str());
    else
      std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f |\n", n, (double)total / wall,
                  (double)total / wall / n, pct(ttft, 50), pct(ttft, 99), pct(gaps, 50), pct(gaps, 99));
    std::fflush(stdout);
  }
  if (sched) sched->shutdown();
  if (srv) srv->stop();
  if (th.joinable()) th.join();
  if (n_failed)
    std::fprintf(stderr, "bench_server: %d request(s) failed or came back short; the first: %s\n", n_failed,
                 first_error.c_str());
  return n_failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_server: %s\n", e.what());
    return 1;
  }
}
