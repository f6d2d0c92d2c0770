// Grammar mask time per token: bench_grammar_mask [VOCAB] [GRAMMAR_DIR]
// Defaults: Llama 3's 128k vocabulary (ggml-vocab-llama-bpe.gguf in ../shared/data/vocab, else llama.cpp's
// models/ folder in ~/.cache/ultra) and tests/fixtures/grammars. For each grammar, a set of documents is
// tokenized with the vocabulary and a matcher is driven through each document token by token; before every
// token the allowed-token mask (grammar/token_mask.h) is computed and timed (thread CPU time), and the
// token is checked to be allowed. Prints per grammar the median and p99 mask time of the first pass over
// the documents (cold: the grammar's tables built on first use) and of a second pass with a fresh matcher
// and mask per document sharing the tables (a new request with the same grammar: mask cache empty), and
// the cache hit rate. BENCH_DEPTH: the tables' context depth (default 3); BENCH_VERBOSE: the slow steps.
//
// bench_grammar_mask --schemas [VOCAB] [SCHEMA_DIR]: the JSON-Schema grammars (grammar/json_schema.h) of the
// JSONSchemaBench sample (tests/fixtures/jsonschemabench, one folder per category): per schema, a seeded
// random walk of up to 192 tokens (each step a token drawn uniformly from those the mask allows, the end
// taken with probability 1/2 when allowed) is driven twice, cold (the schema's tables built as met) then warm
// (a fresh matcher and mask sharing the tables); the mask time of every step, median and p99 per category.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>

#include "core/error.h"
#include "grammar/gbnf_parser.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"
#include "grammar/mask_tables.h"
#include "grammar/mask_vocab.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace ultra;
using namespace ultra::grammar;

namespace {

double now_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("cannot read {}", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Case {
  const char* grammar;
  std::vector<std::string> docs;
};

std::vector<Case> cases() {
  return {
      {"json",
       {R"({"id": "chatcmpl-9f8a7b", "object": "chat.completion", "created": 1718000000, "model": "llama-3.1-8b-instruct", "choices": [{"index": 0, "message": {"role": "assistant", "content": "The capital of France is Paris.\nIt is known for the Eiffel Tower."}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 25, "completion_tokens": 17, "total_tokens": 42}})",
        R"({"name": "get_weather", "arguments": {"location": "San Francisco, CA", "unit": "celsius", "days": 5, "include_hourly": false, "coords": [37.7749, -122.4194]}})",
        "{\n  \"apiVersion\": \"apps/v1\",\n  \"kind\": \"Deployment\",\n  \"metadata\": {\n    \"name\": "
        "\"nginx\",\n    \"labels\": {\"app\": \"nginx\"}\n  },\n  \"spec\": {\n    \"replicas\": 3,\n    "
        "\"template\": {\n      \"spec\": {\n        \"containers\": [{\"name\": \"nginx\", \"image\": "
        "\"nginx:1.25\", \"ports\": [{\"containerPort\": 80}]}]\n      }\n    }\n  }\n}",
        R"({"user": {"login": "octocat", "id": 583231, "site_admin": false, "bio": "caf\u00e9 \"quoted\" text, emoji \ud83d\ude00", "score": 1.5e3}, "repos": [], "tags": ["a", "b", "c"]})"}},
      {"json_arr",
       {"[\n{\"sku\": \"A-1\", \"qty\": 2, \"price\": 9.99},\n{\"sku\": \"B-22\", \"qty\": 1},\n\"done\"]"}},
      {"arithmetic", {"(12+34)*5-6/(7+8*9)-100=total\n", "((1+2)*(3+4))/5=x\ny*2=z\n"}},
      {"list", {"- buy milk\n- call the bank about the mortgage\n- write the quarterly report\n"}},
  };
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, (size_t)(p * (double)(v.size() - 1) + 0.5))];
}

std::string default_vocab() {
  const fs::path a =
      fs::path(ULTRA_SOURCE_DIR) / ".." / "shared" / "data" / "vocab" / "ggml-vocab-llama-bpe.gguf";
  const fs::path b = fs::path(std::getenv("HOME") ? std::getenv("HOME") : "/root") / ".cache" / "ultra" /
                     "llama.cpp-native" / "src" / "models" / "ggml-vocab-llama-bpe.gguf";
  return fs::exists(a) ? a.string() : b.string();
}

// The schema mode (see the top of the file).
int schemas(const std::string& vocab_path, const fs::path& dir) {
  const auto tk = tok::Tokenizer::from_file(vocab_path);
  const auto v = MaskVocab::from_tokenizer(tk);
  fmt::print("vocabulary {}: {} tokens; JSON-Schema grammars of {}\n", vocab_path, v->n_vocab, dir.string());
  std::vector<fs::path> cats;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory()) cats.push_back(e.path());
  std::sort(cats.begin(), cats.end());
  std::vector<uint32_t> mask(v->n_words());
  std::vector<int32_t> allowed;
  std::vector<double> all_warm;
  for (const fs::path& cat : cats) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(cat))
      if (e.path().extension() == ".json") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    std::vector<double> cold, warm;
    int compiled = 0, ended = 0;
    for (const fs::path& f : files) {
      std::shared_ptr<const Grammar> g;
      try {
        g = std::make_shared<const Grammar>(json_schema_to_grammar(nlohmann::ordered_json::parse(slurp(f))));
      } catch (const std::exception&) {
        continue;  // refused (the server answers 400): not timed
      }
      ++compiled;
      const auto tables = std::make_shared<MaskTables>(g, v, 3);
      for (int pass = 0; pass < 2; ++pass) {
        std::mt19937 rng((uint32_t)std::hash<std::string>{}(f.filename().string()));
        Matcher m(g);
        TokenMask tm(tables, m);
        for (int step = 0; step < 192; ++step) {
          const double t0 = now_us();
          tm.compute(mask.data());
          (pass == 0 ? cold : warm).push_back(now_us() - t0);
          if (mask_allows(mask.data(), tk.eos()) && rng() % 2) {
            ended += pass == 1;
            break;
          }
          allowed.clear();
          for (int32_t t = 0; t < v->n_vocab; ++t)
            if (!tk.is_eog(t) && mask_allows(mask.data(), t)) allowed.push_back(t);
          if (allowed.empty()) break;
          const std::string_view piece = tk.token_to_piece(allowed[rng() % allowed.size()]);
          if (m.accept_bytes(piece) != piece.size()) {
            std::string hex;
            for (unsigned char ch : piece) hex += fmt::format("{:02x} ", ch);
            fail("{}: step {}: an allowed token refused by the matcher: '{}' ({}), {} allowed", f.string(),
                 step, piece, hex, allowed.size());
          }
        }
      }
    }
    all_warm.insert(all_warm.end(), warm.begin(), warm.end());
    fmt::print(
        "{:<14} {:2} of {:2} schemas, {:5} steps ({} walks ended): cold median {:6.1f} us p99 {:8.1f} us; "
        "warm median {:6.1f} us p99 {:8.1f} us\n",
        cat.filename().string(), compiled, files.size(), warm.size(), ended, pct(cold, 0.5), pct(cold, 0.99),
        pct(warm, 0.5), pct(warm, 0.99));
  }
  fmt::print("all categories, warm: {} steps, median {:.1f} us, p99 {:.1f} us\n", all_warm.size(),
             pct(all_warm, 0.5), pct(all_warm, 0.99));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "--schemas")
      return schemas(argc > 2 ? argv[2] : default_vocab(),
                     argc > 3 ? fs::path(argv[3])
                              : fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "jsonschemabench");
    const std::string vocab_path = argc > 1 ? argv[1] : default_vocab();
    const fs::path gdir =
        argc > 2 ? fs::path(argv[2]) : fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "grammars";
    const auto tk = tok::Tokenizer::from_file(vocab_path);
    double t0 = now_us();
    const auto v = MaskVocab::from_tokenizer(tk);
    fmt::print("vocabulary {}: {} tokens ({} as text), trie order built in {:.1f} ms\n", vocab_path,
               v->n_vocab, v->sorted.size(), (now_us() - t0) / 1e3);
    std::vector<double> all_warm;
    for (const Case& c : cases()) {
      const auto g =
          std::make_shared<const Grammar>(parse_gbnf(slurp(gdir / (std::string(c.grammar) + ".gbnf"))));
      std::vector<std::vector<int32_t>> docs;
      for (const std::string& d : c.docs) docs.push_back(tk.encode(d));
      // Pass 1: cold (one matcher and mask for all the documents, as one sequence would see them, the
      // grammar's tables built as met). Pass 2: a fresh matcher and mask per document sharing those tables
      // (a new request with the same grammar), its mask cache empty.
      int depth = 3;
      if (const char* d = std::getenv("BENCH_DEPTH")) depth = std::atoi(d);
      const auto tables = std::make_shared<MaskTables>(g, v, depth);
      std::vector<uint32_t> mask(v->n_words());
      for (int pass = 0; pass < 2; ++pass) {
        std::vector<double> times;
        int64_t hits = 0, calls = 0;
        const int64_t built = tables->tables_built();
        auto m = std::make_unique<Matcher>(g);
        auto tm = std::make_unique<TokenMask>(tables, *m);
        for (const auto& ids : docs) {
          m->reset();
          if (pass == 1) {
            hits += tm->stats().cache_hits, calls += tm->stats().calls;
            m = std::make_unique<Matcher>(g);
            tm = std::make_unique<TokenMask>(tables, *m);
          }
          for (size_t i = 0; i <= ids.size(); ++i) {
            t0 = now_us();
            const int64_t walked = tm->stats().dependent_walked;
            tm->compute(mask.data());
            times.push_back(now_us() - t0);
            if (std::getenv("BENCH_VERBOSE") && times.back() > 500)
              fmt::print("  slow: {:.0f} us, {} heads, {} dependent tokens walked, before '{}'\n",
                         times.back(), m->heads().size(), tm->stats().dependent_walked - walked,
                         i < ids.size() ? tk.token_to_piece(ids[i]) : "<end>");
            if (i == ids.size()) {
              if (!mask_allows(mask.data(), tk.eos())) fail("{}: end of document not allowed", c.grammar);
              break;
            }
            if (!mask_allows(mask.data(), ids[i]))
              fail("{}: token {} '{}' refused by the mask", c.grammar, ids[i], tk.token_to_piece(ids[i]));
            const std::string_view piece = tk.token_to_piece(ids[i]);
            if (m->accept_bytes(piece) != piece.size()) fail("{}: token refused by the matcher", c.grammar);
          }
        }
        hits += tm->stats().cache_hits, calls += tm->stats().calls;
        if (pass == 1) all_warm.insert(all_warm.end(), times.begin(), times.end());
        fmt::print(
            "{:<11} {} {:4} tokens: mask median {:7.1f} us  p99 {:8.1f} us  max {:8.1f} us  total {:7.1f} ms "
            " "
            "cache hits {:3.0f}%  ({} tables built)\n",
            c.grammar, pass == 0 ? "cold" : "warm", times.size(), pct(times, 0.5), pct(times, 0.99),
            pct(times, 1.0), std::accumulate(times.begin(), times.end(), 0.0) / 1e3,
            100.0 * (double)hits / (double)std::max<int64_t>(calls, 1), tables->tables_built() - built);
      }
    }
    fmt::print("all grammars, warm: {} tokens, median {:.1f} us, p99 {:.1f} us\n", all_warm.size(),
               pct(all_warm, 0.5), pct(all_warm, 0.99));
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_grammar_mask: {}\n", e.what());
    return 1;
  }
}
