// Tokenizer encode throughput: bench_tokenizer [--threads N] [VOCAB] [TEXT] [REPS]
// Defaults (also for an empty argument): the gpt-2 fixture vocabulary and
// ../shared/data/corpus/tinyshakespeare.txt. Prints MB/s (1 MB = 1e6 bytes) for a cold run (empty word cache)
// and the best of REPS warm runs, plus decode throughput and tokens/s. Times are the thread's CPU time.
//
// --threads N: aggregate encode throughput of N threads on one Tokenizer, next to 1 thread in the same
// process. The text is cut at line ends into 64 requests; each thread encodes all of them, starting at its
// own offset (thread t at request t*64/N), one encode call per request, as a server's HTTP threads would.
// Times are wall clock, from the first thread's start to the last thread's end; MB/s counts the bytes of all
// threads. 1 and N threads alternate REPS times (cold = word cache cleared first; warm = filled); the best
// of each is printed. Every thread's ids are checked against one thread's.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <latch>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {

// This thread's CPU time: unlike wall time it does not count time spent waiting for a core, so the numbers
// hold on a loaded machine.
double now_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double wall_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

using Ids = std::vector<std::vector<int32_t>>;  // per request

// N threads each encode every request (thread t starting at request t*R/N); returns the wall time. ids[t]
// gets thread t's ids per request.
double run_threads(const ultra::tok::Tokenizer& tok, const std::vector<std::string_view>& reqs, int n,
                   std::vector<Ids>& ids) {
  const size_t r = reqs.size();
  ids.resize(n);
  std::vector<double> t0(n), t1(n);
  std::latch go(n);
  std::vector<std::thread> th;
  for (int t = 0; t < n; ++t) {
    th.emplace_back([&, t] {
      Ids& out = ids[t];
      out.resize(r);
      for (auto& v : out) v.clear();
      go.arrive_and_wait();
      t0[t] = wall_s();
      for (size_t k = 0; k < r; ++k) {
        const size_t i = (k + t * r / n) % r;
        tok.encode(reqs[i], out[i], false, false);
      }
      t1[t] = wall_s();
    });
  }
  for (auto& x : th) x.join();
  return *std::max_element(t1.begin(), t1.end()) - *std::min_element(t0.begin(), t0.end());
}

int bench_threads(const ultra::tok::Tokenizer& tok, const std::string& text, int n, int reps) {
  // Requests: the text cut at line ends into 64 pieces of about the same size.
  const size_t kReqs = 64;
  std::vector<std::string_view> reqs;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = std::min(text.size(), pos + text.size() / kReqs + 1);
    while (end < text.size() && text[end - 1] != '\n') ++end;
    reqs.emplace_back(text.data() + pos, end - pos);
    pos = end;
  }
  std::vector<Ids> ref, ids[2];
  tok.clear_cache();
  run_threads(tok, reqs, 1, ref);
  size_t n_tok = 0;
  for (const auto& v : ref[0]) n_tok += v.size();

  const double mb = text.size() / 1e6;
  double cold[2] = {1e30, 1e30}, warm[2] = {1e30, 1e30};
  bool ok = true;
  const int conf[2] = {1, n};
  // Each configuration keeps its own output vectors, sized by an untimed run, so the timed runs do not
  // allocate them.
  for (int c = 0; c < 2; ++c) run_threads(tok, reqs, conf[c], ids[c]);
  for (int rep = 0; rep < reps; ++rep) {
    for (int c = 0; c < 2; ++c) {
      tok.clear_cache();
      cold[c] = std::min(cold[c], run_threads(tok, reqs, conf[c], ids[c]));
      for (const Ids& x : ids[c]) ok = ok && x == ref[0];
      warm[c] = std::min(warm[c], run_threads(tok, reqs, conf[c], ids[c]));
      for (const Ids& x : ids[c]) ok = ok && x == ref[0];
    }
  }
  fmt::print("requests: {} ({:.1f} KB each, {} tokens in all)\n", reqs.size(),
             text.size() / 1e3 / reqs.size(), n_tok);
  fmt::print("aggregate encode, wall clock, best of {} (MB/s over all threads' bytes):\n", reps);
  fmt::print("threads     cold MB/s   warm MB/s\n");
  for (int c = 0; c < 2; ++c)
    fmt::print("{:7d}  {:10.2f}  {:10.2f}\n", conf[c], conf[c] * mb / cold[c], conf[c] * mb / warm[c]);
  fmt::print("speedup  {:9.2f}x  {:9.2f}x   ({} vs 1 thread)\n", n * cold[0] / cold[1], n * warm[0] / warm[1],
             n);
  fmt::print("ids: {}\n", ok ? "identical in every thread" : "MISMATCH");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const fs::path root = ULTRA_SOURCE_DIR;
  int threads = 0;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
      threads = std::max(1, std::atoi(argv[++i]));
    else
      pos.emplace_back(argv[i]);
  }
  auto arg = [&](size_t i, const fs::path& dflt) {
    return pos.size() > i && !pos[i].empty() ? pos[i] : dflt.string();
  };
  const std::string vocab = arg(0, root / "tests/fixtures/vocab/ggml-vocab-gpt-2.gguf");
  const std::string corpus = arg(1, root / "../shared/data/corpus/tinyshakespeare.txt");
  const int reps = pos.size() > 2 ? std::max(1, std::atoi(pos[2].c_str())) : 5;
  try {
    std::ifstream f(corpus, std::ios::binary);
    if (!f) ultra::fail("{}: cannot open", corpus);
    std::ostringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    const double mb = text.size() / 1e6;

    double t0 = now_s();
    ultra::tok::Tokenizer tok = ultra::tok::Tokenizer::from_file(vocab);
    const double t_load = now_s() - t0;

    if (threads > 0) {
      fmt::print("vocab:   {} (load {:.1f} ms)\n", vocab, t_load * 1e3);
      fmt::print("corpus:  {} ({:.2f} MB)\n", corpus, mb);
      return bench_threads(tok, text, threads, reps);
    }

    std::vector<int32_t> ids;
    ids.assign(text.size(), 0);  // touch the output pages up front: the cold run should time the tokenizer
    ids.clear();
    tok.clear_cache();
    t0 = now_s();
    tok.encode(text, ids, false, false);
    const double t_cold = now_s() - t0;

    double t_warm = 1e30;
    for (int r = 0; r < reps; ++r) {
      ids.clear();
      t0 = now_s();
      tok.encode(text, ids, false, false);
      t_warm = std::min(t_warm, now_s() - t0);
    }

    t0 = now_s();
    const std::string back = tok.decode(ids);
    const double t_dec = now_s() - t0;

    fmt::print("vocab:   {} (load {:.1f} ms)\n", vocab, t_load * 1e3);
    fmt::print("corpus:  {} ({:.2f} MB, {} tokens, {:.2f} bytes/token)\n", corpus, mb, ids.size(),
               (double)text.size() / ids.size());
    fmt::print("encode cold (empty word cache): {:8.2f} MB/s  {:10.0f} tokens/s\n", mb / t_cold,
               ids.size() / t_cold);
    fmt::print("encode warm (best of {}):        {:8.2f} MB/s  {:10.0f} tokens/s\n", reps, mb / t_warm,
               ids.size() / t_warm);
    fmt::print("decode:                          {:8.2f} MB/s  (round trip {})\n", mb / t_dec,
               back == text ? "exact" : "MISMATCH");
    return back == text ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
