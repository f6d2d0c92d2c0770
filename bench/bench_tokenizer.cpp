// Tokenizer encode throughput, one thread: bench_tokenizer [VOCAB] [TEXT] [REPS]
// Defaults (also for an empty argument): the gpt-2 fixture vocabulary and
// ../shared/data/corpus/tinyshakespeare.txt. Prints MB/s (1 MB = 1e6 bytes) for a cold run (empty word cache)
// and the best of REPS warm runs, plus decode throughput and tokens/s. Times are the thread's CPU time.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

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

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const fs::path root = ULTRA_SOURCE_DIR;
  auto arg = [&](int i, const fs::path& dflt) {
    return argc > i && *argv[i] ? std::string(argv[i]) : dflt.string();
  };
  const std::string vocab = arg(1, root / "tests/fixtures/vocab/ggml-vocab-gpt-2.gguf");
  const std::string corpus = arg(2, root / "../shared/data/corpus/tinyshakespeare.txt");
  const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
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
