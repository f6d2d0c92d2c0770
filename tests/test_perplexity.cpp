// Perplexity (include/ultra/perplexity.h, `ultra perplexity`) against an independent float64 reference: the
// per-token negative log-likelihoods computed here, in double, from HF transformers' float32 logits of the
// llama_gqa fixture (tests/fixtures/hf/llama_gqa/logits_f32.bin, [16, 320], prompt in reference.json).
//
// Tolerance: the engine's logits match HF's to ~1e-5 relative (test_model_fixtures.cpp); a log-softmax moves
// by at most twice the largest logit error, so the mean NLL (~5.8 for a random 320-token model) agrees to
// ~1e-5 relative in the worst case and far better on average: 1e-5 relative is the bound asked for.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "run_ultra.h"
#include "swa_fixture.h"
#include "ultra/perplexity.h"

using namespace ultra;
namespace fs = std::filesystem;
using Mode = PerplexityParams::Mode;

namespace {

const fs::path kDir = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "llama_gqa";

struct Ref {
  std::vector<int32_t> prompt;
  int n_vocab = 0;
  std::vector<float> logits;  // [n_prompt, n_vocab]
};

const Ref& ref() {
  static const Ref r = [] {
    Ref r;
    std::ifstream f(kDir / "reference.json");
    const auto j = nlohmann::json::parse(f);
    r.prompt = j["prompt"].get<std::vector<int32_t>>();
    r.n_vocab = j["n_vocab"].get<int>();
    std::ifstream lf(kDir / "logits_f32.bin", std::ios::binary);
    r.logits.resize(r.prompt.size() * (size_t)r.n_vocab);
    lf.read(reinterpret_cast<char*>(r.logits.data()), (std::streamsize)(r.logits.size() * 4));
    EXPECT_TRUE(lf.good());
    return r;
  }();
  return r;
}

// -log softmax(HF logits of position i)[prompt[i+1]], written independently of perplexity.cpp.
double hf_nll(int i) {
  const Ref& r = ref();
  const float* row = r.logits.data() + (size_t)i * r.n_vocab;
  double mx = row[0];
  for (int v = 1; v < r.n_vocab; ++v) mx = row[v] > mx ? row[v] : mx;
  long double sum = 0;
  for (int v = 0; v < r.n_vocab; ++v) sum += std::exp((long double)row[v] - mx);
  return -(((double)row[r.prompt[i + 1]] - mx) - (double)std::log(sum));
}

struct Expected {
  double mean = 0, ppl = 0, err = 0;
  int n = 0;
};

// Mean NLL over positions [first, last) and llama.cpp's error estimate, by hand.
Expected expected(int first, int last) {
  Expected e;
  double s = 0, s2 = 0;
  for (int i = first; i < last; ++i) {
    const double x = hf_nll(i);
    s += x;
    s2 += x * x;
    ++e.n;
  }
  e.mean = s / e.n;
  e.ppl = std::exp(e.mean);
  // Sample variance with the (N-1) divisor, written the textbook way: sum((x - mean)^2) / (N - 1) / N ...
  double ss = 0;
  for (int i = first; i < last; ++i) ss += (hf_nll(i) - e.mean) * (hf_nll(i) - e.mean);
  // ... and llama.cpp's: (mean(x^2) - mean(x)^2) / (N - 1), which is the same as ss / N / (N - 1).
  const double var_llama = (s2 / e.n - e.mean * e.mean) / (e.n - 1);
  EXPECT_NEAR(var_llama, ss / e.n / (e.n - 1), 1e-12);
  e.err = e.ppl * std::sqrt(ss / e.n / (e.n - 1));
  return e;
}

struct Engine {
  Model model;
  std::unique_ptr<Context> s;
  Engine(int n_ctx, int n_batch, int threads = 1) : model(Model::load(kDir.string())) {
    s = std::make_unique<Context>(
        model, ContextParams{.n_ctx = n_ctx, .n_batch = n_batch, .n_outputs = n_batch, .n_threads = threads});
  }
};

PerplexityResult run(Context& s, const std::vector<int32_t>& toks, int window, Mode mode, int32_t bos = -1) {
  PerplexityParams p;
  p.n_window = window;
  p.mode = mode;
  p.bos = bos;
  return perplexity(s, toks, p);
}

void expect_rel(double got, double want, double tol, const char* what) {
  EXPECT_LE(std::fabs(got - want), tol * std::fabs(want)) << what << ": got " << got << " want " << want;
}

TEST(Perplexity, AllPositionsMatchesHfFloat64) {
  const Ref& r = ref();
  ASSERT_EQ(r.prompt.size(), 16u);
  const Expected e = expected(0, 15);
  for (int threads : {1, 2}) {
    Engine en(16, 16, threads);
    const PerplexityResult got = run(*en.s, r.prompt, 16, Mode::AllPositions);
    std::printf("[ppl] all-positions threads %d: mean NLL %.9f (HF %.9f), ppl %.6f +/- %.6f\n", threads,
                got.mean_nll, e.mean, got.ppl, got.ppl_err);
    EXPECT_EQ(got.n_scored, 15);
    EXPECT_EQ(got.n_windows, 1);
    EXPECT_EQ(got.n_window, 16);
    EXPECT_FALSE(got.short_input);
    EXPECT_EQ(got.n_dropped, 0);
    expect_rel(got.mean_nll, e.mean, 1e-5, "mean_nll");
    expect_rel(got.ppl, e.ppl, 1e-5, "ppl");
    expect_rel(got.ppl_err, e.err, 1e-3, "ppl_err");
  }
}

TEST(Perplexity, SecondHalfMatchesHfFloat64) {
  const Ref& r = ref();
  const Expected e = expected(8, 15);  // llama.cpp: i in [n/2, n-1)
  Engine en(16, 16);
  const PerplexityResult got = run(*en.s, r.prompt, 16, Mode::SecondHalf);
  std::printf("[ppl] second-half: mean NLL %.9f (HF %.9f), ppl %.6f +/- %.6f\n", got.mean_nll, e.mean,
              got.ppl, got.ppl_err);
  EXPECT_EQ(got.n_scored, 7);
  expect_rel(got.mean_nll, e.mean, 1e-5, "mean_nll");
  expect_rel(got.ppl, e.ppl, 1e-5, "ppl");
  expect_rel(got.ppl_err, e.err, 1e-3, "ppl_err");

  // An odd window: 15 tokens, first = 7, i in [7, 14).
  std::vector<int32_t> t15(r.prompt.begin(), r.prompt.begin() + 15);
  const Expected e15 = expected(7, 14);
  const PerplexityResult g15 = run(*en.s, t15, 15, Mode::SecondHalf);
  EXPECT_EQ(g15.n_scored, 7);
  expect_rel(g15.mean_nll, e15.mean, 1e-5, "mean_nll (window 15)");
}

TEST(Perplexity, ChunkedPrefillGivesTheSameResult) {
  const Ref& r = ref();
  const Expected e = expected(0, 15);
  Engine en(16, 5, 2);  // windows of 16 prefilled in chunks of 5, 5, 5, 1
  const PerplexityResult got = run(*en.s, r.prompt, 16, Mode::AllPositions);
  EXPECT_EQ(got.n_scored, 15);
  expect_rel(got.mean_nll, e.mean, 1e-5, "mean_nll");
}

TEST(Perplexity, WindowsStartFromAnEmptyCacheAndDropTheTail) {
  const Ref& r = ref();
  // Two copies of the prompt plus a 5-token tail: two identical windows of 16, the tail is dropped.
  std::vector<int32_t> toks = r.prompt;
  toks.insert(toks.end(), r.prompt.begin(), r.prompt.end());
  toks.insert(toks.end(), r.prompt.begin(), r.prompt.begin() + 5);
  const Expected e = expected(0, 15);
  Engine en(16, 16);
  std::vector<double> seen;
  PerplexityParams p;
  p.n_window = 16;
  p.mode = Mode::AllPositions;
  const PerplexityResult got = perplexity(*en.s, toks, p, [&](int w, int n, double ppl) {
    EXPECT_EQ(w, (int)seen.size());
    EXPECT_EQ(n, 2);
    seen.push_back(ppl);
  });
  EXPECT_EQ(got.n_windows, 2);
  EXPECT_EQ(got.n_scored, 30);
  EXPECT_EQ(got.n_dropped, 5);
  ASSERT_EQ(got.running_ppl.size(), 2u);
  EXPECT_EQ(seen, got.running_ppl);
  expect_rel(got.running_ppl[0], e.ppl, 1e-5, "window 1");
  expect_rel(got.running_ppl[1], e.ppl, 1e-5, "window 2");
  expect_rel(got.mean_nll, e.mean, 1e-5, "mean_nll");

  // --chunks 1
  p.max_windows = 1;
  const PerplexityResult one = perplexity(*en.s, toks, p);
  EXPECT_EQ(one.n_windows, 1);
  EXPECT_EQ(one.n_scored, 15);
  EXPECT_EQ(one.n_dropped, 21);
}

TEST(Perplexity, BosReplacesTheFirstTokenOfEachWindow) {
  const Ref& r = ref();
  const int32_t bos = 1;
  Engine en(16, 16);
  const PerplexityResult got = run(*en.s, r.prompt, 16, Mode::AllPositions, bos);
  // By hand: evaluate [bos, t1..t15] and score the original t1..t15.
  std::vector<int32_t> w = r.prompt;
  w[0] = bos;
  en.s->clear(0);
  double s = 0;
  Batch b(16);
  for (int i = 0; i < 16; ++i) b.add(w[i], i, 0, Output::logits);
  en.s->step(b);
  for (int i = 0; i < 15; ++i) s -= log_softmax_at(en.s->logits(i).data(), r.n_vocab, r.prompt[i + 1]);
  EXPECT_EQ(got.n_scored, 15);
  expect_rel(got.mean_nll, s / 15, 1e-12, "mean_nll with BOS");
  // It does change the result (the fixture's first token is not 1).
  ASSERT_NE(r.prompt[0], bos);
  EXPECT_GT(std::fabs(got.mean_nll - expected(0, 15).mean), 1e-6);
}

TEST(Perplexity, ShortInputIsOneWindow) {
  const Ref& r = ref();
  std::vector<int32_t> toks(r.prompt.begin(), r.prompt.begin() + 10);
  Engine en(16, 16);
  const PerplexityResult got = run(*en.s, toks, 16, Mode::SecondHalf);
  EXPECT_TRUE(got.short_input);
  EXPECT_EQ(got.n_window, 10);
  EXPECT_EQ(got.n_windows, 1);
  EXPECT_EQ(got.n_scored, 4);  // i in [5, 9)
  expect_rel(got.mean_nll, expected(5, 9).mean, 1e-5, "mean_nll");
  PerplexityParams p;
  p.n_window = 16;
  p.allow_short = false;
  EXPECT_THROW(perplexity(*en.s, toks, p), Error);
}

TEST(Perplexity, ErrorFormulaAndLogSoftmax) {
  // nll = 1, 2, 3, 4: mean 2.5, mean of squares 7.5, variance 1.25, N - 1 = 3.
  PerplexityResult r;
  for (double x : {1.0, 2.0, 3.0, 4.0}) r.nll_sum += x, r.nll2_sum += x * x, ++r.n_scored;
  finish_perplexity(r);
  EXPECT_DOUBLE_EQ(r.mean_nll, 2.5);
  EXPECT_DOUBLE_EQ(r.ppl, std::exp(2.5));
  EXPECT_NEAR(r.ppl_err, std::exp(2.5) * std::sqrt(1.25 / 3.0), 1e-12);
  // One token, or no spread: no error estimate.
  PerplexityResult one;
  one.nll_sum = 2, one.nll2_sum = 4, one.n_scored = 1;
  finish_perplexity(one);
  EXPECT_EQ(one.ppl_err, 0);
  PerplexityResult flat;
  flat.nll_sum = 6, flat.nll2_sum = 12, flat.n_scored = 3;
  finish_perplexity(flat);
  EXPECT_EQ(flat.ppl_err, 0);

  // Large logits do not overflow; uniform logits give -log(n).
  const float big[3] = {1000.f, 0.f, -1000.f};
  EXPECT_NEAR(log_softmax_at(big, 3, 0), 0.0, 1e-12);
  EXPECT_NEAR(log_softmax_at(big, 3, 1), -1000.0, 1e-9);
  const float flat4[4] = {7.f, 7.f, 7.f, 7.f};
  EXPECT_NEAR(log_softmax_at(flat4, 4, 2), -std::log(4.0), 1e-15);
}

TEST(Perplexity, BadInputThrows) {
  const Ref& r = ref();
  Engine en(16, 16);
  auto expect_error = [&](const std::vector<int32_t>& t, int window, Mode m, const char* needle,
                          int32_t bos = -1) {
    try {
      run(*en.s, t, window, m, bos);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(r.prompt, 32, Mode::AllPositions, "larger than the context");
  expect_error({5}, 16, Mode::AllPositions, "at least 2 tokens");
  expect_error({}, 16, Mode::AllPositions, "at least 2 tokens");
  expect_error(r.prompt, 1, Mode::AllPositions, "too small");
  expect_error(r.prompt, 2, Mode::SecondHalf, "too small");
  expect_error({5, 6}, 16, Mode::SecondHalf, "at least 3");
  std::vector<int32_t> bad = r.prompt;
  bad[7] = r.n_vocab;
  expect_error(bad, 16, Mode::AllPositions, "token 7 of the input (id 320) is out of range");
  bad[7] = -3;
  expect_error(bad, 16, Mode::AllPositions, "out of range");
  expect_error(r.prompt, 16, Mode::AllPositions, "BOS id 320", r.n_vocab);
  // A window that needs more output rows than the context has.
  Context s1(en.model, {.n_ctx = 16, .n_batch = 8, .n_outputs = 1, .n_threads = 1});
  PerplexityParams p;
  p.n_window = 16;
  EXPECT_THROW(perplexity(s1, r.prompt, p), Error);
}

// ---- the subcommand ----

// Temporary files are named after the process, so that concurrent runs do not collide.
fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / (std::to_string(getpid()) + "_" + name);
}

fs::path temp_file(const std::string& name, const std::string& content) {
  const fs::path p = temp_path(name);
  std::ofstream(p, std::ios::binary) << content;
  return p;
}

// Runs `ultra perplexity args...`; its standard output. main()'s error line arrives through error_of.
std::string cli(std::vector<std::string> args) {
  args.insert(args.begin(), "perplexity");
  const test::UltraRun r = test::run_ultra(args);
  EXPECT_EQ(r.status, 0) << r.err;
  return r.out;
}

// The error `ultra perplexity args...` ends with ("error: ..." on standard error, exit status 1).
std::string error_of(std::vector<std::string> args) {
  args.insert(args.begin(), "perplexity");
  const test::UltraRun r = test::run_ultra(args);
  if (r.status == 0) return "(no error)";
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  return r.err;
}

TEST(PerplexityCli, IdsFileJson) {
  const Ref& r = ref();
  std::string content;  // commas, spaces and newlines mixed
  for (size_t i = 0; i < r.prompt.size(); ++i)
    content += std::to_string(r.prompt[i]) + (i % 3 == 0 ? ",\n" : i % 3 == 1 ? " " : ", ");
  const fs::path f = temp_file("ultra_ppl_ids.txt", content);
  const Expected all = expected(0, 15), half = expected(8, 15);

  auto j = nlohmann::json::parse(cli(
      {"-m", kDir.string(), "-f", f.string(), "--ids", "-c", "16", "-t", "1", "--all-positions", "--json"}));
  EXPECT_EQ(j["n_tokens_scored"].get<int>(), 15);
  EXPECT_EQ(j["n_windows"].get<int>(), 1);
  EXPECT_EQ(j["mode"], "all-positions");
  expect_rel(j["mean_nll"].get<double>(), all.mean, 1e-5, "cli mean_nll");
  expect_rel(j["ppl"].get<double>(), all.ppl, 1e-5, "cli ppl");
  expect_rel(j["ppl_err"].get<double>(), all.err, 1e-3, "cli ppl_err");

  j = nlohmann::json::parse(
      cli({"-m", kDir.string(), "-f", f.string(), "--ids", "-c", "16", "-b", "3", "--json"}));
  EXPECT_EQ(j["n_tokens_scored"].get<int>(), 7);
  EXPECT_EQ(j["mode"], "second-half");
  expect_rel(j["ppl"].get<double>(), half.ppl, 1e-5, "cli ppl (second half)");

  // Default -c 512 on 16 tokens: one short window of 16.
  j = nlohmann::json::parse(cli({"-m", kDir.string(), "-f", f.string(), "--ids", "--json"}));
  EXPECT_TRUE(j["short_input"].get<bool>());
  EXPECT_EQ(j["n_window"].get<int>(), 16);
  expect_rel(j["ppl"].get<double>(), half.ppl, 1e-5, "cli ppl (short)");

  // Text output: the llama.cpp final line.
  const std::string text = cli({"-m", kDir.string(), "-f", f.string(), "--ids", "-c", "16"});
  EXPECT_EQ(text.rfind("Final estimate: PPL = ", 0), 0u) << text;
  double ppl = 0, err = 0;
  ASSERT_EQ(std::sscanf(text.c_str(), "Final estimate: PPL = %lf +/- %lf", &ppl, &err), 2) << text;
  expect_rel(ppl, half.ppl, 1e-5, "cli text ppl");
  expect_rel(err, half.err, 1e-3, "cli text ppl_err");

  // A JSON list works too.
  const fs::path fj = temp_file("ultra_ppl_ids.json", nlohmann::json(r.prompt).dump());
  j = nlohmann::json::parse(cli({"-m", kDir.string(), "-f", fj.string(), "--ids", "-c", "16", "--json"}));
  expect_rel(j["ppl"].get<double>(), half.ppl, 1e-5, "cli ppl (json list)");
  fs::remove(f);
  fs::remove(fj);
}

TEST(PerplexityCli, ClearErrors) {
  const fs::path missing = fs::temp_directory_path() / "ultra_ppl_no_such_file.txt";
  fs::remove(missing);
  std::string e = error_of({"-m", kDir.string(), "-f", missing.string(), "--ids"});
  EXPECT_NE(e.find(missing.string()), std::string::npos) << e;
  EXPECT_NE(e.find("cannot open"), std::string::npos) << e;

  const fs::path garbage = temp_file("ultra_ppl_bad_ids.txt", "1 2 x3 4");
  e = error_of({"-m", kDir.string(), "-f", garbage.string(), "--ids"});
  EXPECT_NE(e.find("item 3 ('x3') is not a token id"), std::string::npos) << e;

  const fs::path range = temp_file("ultra_ppl_range_ids.txt", "1 2 3 99999");
  e = error_of({"-m", kDir.string(), "-f", range.string(), "--ids"});
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;

  const fs::path one = temp_file("ultra_ppl_one_id.txt", "7\n");
  e = error_of({"-m", kDir.string(), "-f", one.string(), "--ids"});
  EXPECT_NE(e.find("at least 2"), std::string::npos) << e;

  // The fixture has no tokenizer.json: text mode says so.
  const fs::path txt = temp_file("ultra_ppl_text.txt", "To be, or not to be");
  e = error_of({"-m", kDir.string(), "-f", txt.string()});
  EXPECT_NE(e.find("this model has no tokenizer"), std::string::npos) << e;

  for (const auto& p : {garbage, range, one, txt}) fs::remove(p);
}

// A tiny GPT-2-style byte-level BPE tokenizer: ids 0..255 are the bytes (byte-to-unicode mapped), 256 is
// "<s>" (BOS, added per tokenizer_config.json), 257 is the merge "T o".
std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += (char)cp;
  } else if (cp < 0x800) {
    s += (char)(0xC0 | (cp >> 6)), s += (char)(0x80 | (cp & 0x3F));
  } else {
    s += (char)(0xE0 | (cp >> 12)), s += (char)(0x80 | ((cp >> 6) & 0x3F)), s += (char)(0x80 | (cp & 0x3F));
  }
  return s;
}

fs::path make_model_with_tokenizer() {
  const fs::path dir = temp_path("ultra_ppl_tok_model");
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::create_symlink(fs::absolute(kDir / "config.json"), dir / "config.json");
  fs::create_symlink(fs::absolute(kDir / "model.safetensors"), dir / "model.safetensors");
  uint32_t byte_cp[256];
  for (int b = 0, n = 0; b < 256; ++b) {
    const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    byte_cp[b] = direct ? (uint32_t)b : 256u + (uint32_t)n++;
  }
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[utf8(byte_cp[b])] = b;
  vocab["To"] = 257;
  nlohmann::json tj = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 256},
         {"content", "<s>"},
         {"special", true},
         {"single_word", false},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"T o"}}}}};
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": "<s>", "add_bos_token": true})";
  return dir;
}

TEST(PerplexityCli, TextModeUsesTheTokenizerAndBos) {
  const fs::path dir = make_model_with_tokenizer();
  const std::string text = "To be, or not to be: that is the question.";
  const fs::path f = temp_file("ultra_ppl_text_in.txt", text);
  // llama.cpp: BOS + the text's tokens (no special-token parsing); each window starts with BOS.
  std::vector<int32_t> ids = {256, 257};
  for (size_t i = 2; i < text.size(); ++i) ids.push_back((unsigned char)text[i]);
  const auto j =
      nlohmann::json::parse(cli({"-m", dir.string(), "-f", f.string(), "-c", "8", "-t", "1", "--json"}));
  EXPECT_EQ(j["n_tokens"].get<int>(), (int)ids.size());
  EXPECT_EQ(j["bos"].get<int>(), 256);
  EXPECT_EQ(j["n_windows"].get<int>(), (int)ids.size() / 8);
  Engine en(8, 8);
  PerplexityParams p;
  p.n_window = 8;
  p.bos = 256;
  const PerplexityResult want = perplexity(*en.s, ids, p);
  EXPECT_EQ(j["n_tokens_scored"].get<int64_t>(), want.n_scored);
  expect_rel(j["ppl"].get<double>(), want.ppl, 1e-12, "text-mode ppl");
  fs::remove(f);
  fs::remove_all(dir);
}

// The built executable.
TEST(PerplexityCli, Executable) {
  const Ref& r = ref();
  const fs::path f = temp_file("ultra_ppl_exe_ids.txt", nlohmann::json(r.prompt).dump());
  const fs::path err = temp_path("ultra_ppl_exe_stderr.txt");
  auto run_exe = [&](const std::string& args, std::string& out, std::string& errs) {
    const std::string cmd = std::string(ULTRA_ULTRA_BIN) + " perplexity " + args + " 2>" + err.string();
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return -1;
    std::array<char, 4096> buf;
    size_t n;
    out.clear();
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    const int st = pclose(p);
    std::ifstream e(err);
    errs.assign(std::istreambuf_iterator<char>(e), {});
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  };
  std::string out, errs;
  int code = run_exe("-m " + kDir.string() + " -f " + f.string() + " --ids -c 16 --json", out, errs);
  ASSERT_EQ(code, 0) << errs;
  const auto j = nlohmann::json::parse(out);
  expect_rel(j["ppl"].get<double>(), expected(8, 15).ppl, 1e-5, "exe ppl");
  EXPECT_NE(errs.find("[1]"), std::string::npos) << errs;
  EXPECT_NE(errs.find("Final estimate: PPL = "), std::string::npos) << errs;

  code = run_exe("-m " + kDir.string() + " -f /nonexistent/ultra_ppl.txt --ids", out, errs);
  EXPECT_EQ(code, 1);
  EXPECT_NE(errs.find("error: /nonexistent/ultra_ppl.txt: cannot open"), std::string::npos) << errs;
  fs::remove(f);
  fs::remove(err);
}

// Mistral's whole-model sliding window against llama.cpp. llama.cpp's llama graph ignores
// llama.attention.sliding_window, but its granite_swa graph is a Llama with a per-layer window
// (LLAMA_SWA_TYPE_STANDARD: key j masked when i - j >= window) once its extras are neutral: logit_scale 1,
// no residual or embedding scale, attention sinks of -1e30 (exp() of them is 0). The bundled draft model
// is written both ways with a window of 16, the llama form read by ultra and
// the granite_swa form by llama.cpp (DISABLED_WriteGraniteSwaForm below writes it):
//   ./build/test_perplexity --gtest_also_run_disabled_tests \
//       --gtest_filter='PerplexityLlamaCpp.DISABLED_WriteGraniteSwaForm'   (writes
//       /tmp/ultra_swa16_granite.gguf)
//   llama-perplexity -m /tmp/ultra_swa16_granite.gguf -f tests/fixtures/bundled/val.txt -c 128 --chunks 8
// with the native build of llama.cpp in the bundle (it gives the no-window figure on the llama form, which it
// reads without the window). `ultra perplexity` on the llama form must print llama.cpp's figure within 0.2%
// (0.5% asked; ultra printed 49.3021 and 45.8750 when recorded): a window of 15 or 17 instead of 16 (an
// off-by-one in i - j < window) gives 49.6455 / 48.5472 (+0.70% / -1.53%), no window 45.87 (-7%).
constexpr int kSwaWindow = 16;
constexpr double kLlamaCppSwaPpl = 49.3015;   // llama-perplexity, granite_swa form, window 16
constexpr double kLlamaCppFullPpl = 45.8744;  // llama-perplexity on models/draft.gguf (no window)

const std::string kDraft = (fs::path(ULTRA_SOURCE_DIR) / "models" / "draft.gguf").string();

// models/draft.gguf in llama.cpp's granite_swa form, every layer sliding over kSwaWindow positions, at out.
void write_granite_swa_draft(const std::string& out) {
  const gguf::Reader r = gguf::Reader::open(kDraft);
  gguf::Writer w;
  const std::string arch = "granite_swa";
  for (const auto& [k, v] : r.metadata()) w.set_value(k.rfind("llama.", 0) == 0 ? arch + k.substr(5) : k, v);
  w.set_string("general.architecture", arch);
  w.set_u32(arch + ".attention.sliding_window", kSwaWindow);
  const gguf::Value* nl = r.find("llama.block_count");
  const gguf::Value* nh = r.find("llama.attention.head_count");
  ASSERT_TRUE(nl && nh);
  const int n_layers = (int)nl->as_uint(), n_heads = (int)nh->as_uint();
  std::vector<float> sinks(n_heads, -1e30f);
  w.set_f32(arch + ".logit_scale", 1.0f);
  std::vector<gguf::Value> flags(n_layers, gguf::Value::of_bool(true));
  w.set_value(arch + ".attention.sliding_window_pattern",
              gguf::Value::of_array(gguf::ValueType::BOOL, flags));
  for (int il = 0; il < n_layers; ++il)
    w.add_tensor("blk." + std::to_string(il) + ".attn_sinks.weight", GgmlType::F32, {(uint64_t)n_heads},
                 sinks.data(), sinks.size() * sizeof(float));
  for (const auto& t : r.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  w.write(out);
}

double ultra_ppl(const std::string& model) {
  const auto run =
      test::run_ultra({"perplexity", "-m", model, "-f",
                       (fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "bundled" / "val.txt").string(),
                       "-c", "128", "--chunks", "8", "-t", "2", "--json"});
  EXPECT_EQ(run.status, 0) << run.err;
  return run.status == 0 ? nlohmann::json::parse(run.out).at("ppl").get<double>() : NAN;
}

TEST(PerplexityLlamaCpp, SlidingWindowGivesLlamaCppsPerplexity) {
  const test::TmpDir dir("ultra_swa_ppl");
  const std::string swa = dir.file("draft-swa16.gguf");
  test::windowed_gguf(kDraft, swa, kSwaWindow);
  const double p = ultra_ppl(swa);
  const double full = ultra_ppl(kDraft);
  std::printf(
      "[ swa ] window %d: ultra %.4f, llama.cpp %.4f (%+.3f%%); no window: ultra %.4f, llama.cpp %.4f\n",
      kSwaWindow, p, kLlamaCppSwaPpl, 100 * (p / kLlamaCppSwaPpl - 1), full, kLlamaCppFullPpl);
  EXPECT_LE(std::fabs(p / kLlamaCppSwaPpl - 1), 0.002);
  EXPECT_LE(std::fabs(full / kLlamaCppFullPpl - 1), 0.002);
  EXPECT_GT(std::fabs(kLlamaCppSwaPpl / kLlamaCppFullPpl - 1), 0.02);  // the window matters on this text
}

TEST(PerplexityLlamaCpp, DISABLED_WriteGraniteSwaForm) {
  write_granite_swa_draft("/tmp/ultra_swa16_granite.gguf");
}

}  // namespace
