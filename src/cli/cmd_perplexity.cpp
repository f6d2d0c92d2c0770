// ultra perplexity -m MODEL -f FILE [-c 512] [-b N] [-t N] [--ids] [--all-positions] [--chunks N] [--json]
// llama.cpp-style perplexity of a text file (or a file of token ids); see include/ultra/perplexity.h and
// --help.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "ultra/perplexity.h"

namespace ultra::cli {

namespace {

constexpr const char* kFooter = R"(Modes:
  default          llama.cpp's llama-perplexity: the tokens are cut into consecutive windows of -c tokens
                   (a shorter tail is dropped; an input shorter than one window is one window of all its
                   tokens), each evaluated from an empty KV cache, and only the second half of each window is
                   scored: -log p(t[i+1] | t[0..i]) for i in [c/2, c-1). When the vocabulary adds BOS, a BOS is
                   put in front of the text and the first token of every window is replaced by BOS (as
                   llama.cpp does). Numbers are comparable with llama.cpp's at the same -c.
  --all-positions  the same windows, scoring every next-token prediction i in [0, c-1): the mean NLL over all
                   positions, the definition of a training/validation loss (PyTorch's cross-entropy over
                   windows of c tokens), so exp(validation loss) of such an evaluation is directly comparable.
Output: "[k]PPL," running perplexity after each window on stderr, then
  "Final estimate: PPL = X +/- Y" with Y = PPL * sqrt((mean(nll^2) - mean(nll)^2) / (N - 1)) (llama.cpp's
  standard error) on stdout, or with --json one object on stdout:
  {"ppl", "ppl_err", "mean_nll", "n_tokens_scored", "n_windows", "n_window", "n_tokens", "mode", ...}.
--ids: FILE holds token ids separated by whitespace, commas or brackets (a JSON list works); they are used
  exactly as given (no BOS is added or substituted).)";

// Token ids separated by whitespace, commas or brackets ("1 2 3", "1,2,3", "[1, 2, 3]").
std::vector<int32_t> parse_ids_file(const std::string& text, const std::string& path) {
  std::vector<int32_t> ids;
  auto is_sep = [](char c) {
    return c == ',' || c == '[' || c == ']' || c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\v' ||
           c == '\f';
  };
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_sep(text[i])) ++i;
    if (i >= text.size()) break;
    size_t j = i;
    while (j < text.size() && !is_sep(text[j])) ++j;
    const std::string item = text.substr(i, j - i);
    int64_t v = -1;
    bool ok = !item.empty() && item.size() <= 10;
    for (char c : item) ok = ok && c >= '0' && c <= '9';
    if (ok) v = std::stoll(item);
    if (!ok || v > INT32_MAX)
      fail(
          "{}: item {} ('{}') is not a token id (expected non-negative integers separated by whitespace or "
          "commas)",
          path, ids.size() + 1, item.substr(0, 32));
    ids.push_back((int32_t)v);
    i = j;
  }
  return ids;
}

struct TextTokens {
  std::vector<int32_t> ids;
  int32_t bos = -1;  // replaces the first token of each window (-1: none)
};

// Text -> tokens the way llama.cpp's perplexity does: common_tokenize(text, add_special = true,
// parse_special = false), i.e. BOS in front when the vocabulary adds BOS (never EOS), control-token text
// kept as plain text; and each window then starts with BOS.
TextTokens tokenize_text(const Model& model, const std::string& text) {
  const Tokenizer* tk = model.tokenizer();
  if (!tk)
    fail(
        "{}: this model has no tokenizer (no tokenizer.ggml.* keys or tokenizer.json); give token ids with "
        "--ids",
        model.info().path);
  TextTokens out;
  if (tk->add_bos() && tk->bos() >= 0) {
    out.bos = tk->bos();
    out.ids.push_back(out.bos);
  }
  const std::vector<int32_t> ids = tk->encode(text, /*add_special=*/false, /*parse_special=*/false);
  out.ids.insert(out.ids.end(), ids.begin(), ids.end());
  return out;
}

}  // namespace

int cmd_perplexity(int argc, char** argv) {
  CLI::App app{"Perplexity of a text file (llama.cpp-style)", "ultra perplexity"};
  std::string model_path, file, kv_type, device = "cpu";
  int window = 512, batch = 512, threads = 0, chunks = -1;
  bool ids_mode = false, all_positions = false, json = false;
  app.add_option("-m,--model", model_path,
                 "model: a GGUF file or an HF model directory (default: the bundled model)");
  app.add_option("-f,--file", file, "the text file (with --ids: a file of token ids)")->required();
  app.add_option("-c,--ctx-size", window, "window (context) size in tokens")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("-b,--batch-size", batch, "most tokens per prefill step (capped at the window)")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_option("-t,--threads", threads, "CPU threads (default: all cores)")->check(CLI::Range(0, 1024));
  add_device_flags(app, device, kv_type);
  app.add_option("--chunks", chunks, "evaluate at most this many windows (-1: all)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 30));
  app.add_flag("--ids", ids_mode, "FILE holds token ids (whitespace or comma separated), not text");
  app.add_flag("--all-positions", all_positions,
               "score every position of each window, not only the second half (see Modes)");
  app.add_flag("--json", json, "print one JSON object with the result on stdout");
  app.footer(kFooter);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  const std::string input = read_text_file(file, "the input file");
  const auto t_load = std::chrono::steady_clock::now();
  if (model_path.empty()) model_path = bundled_model_path();
  if (model_path.empty()) fail("no model given (-m) and the bundled models/target.gguf was not found");
  const Model model = Model::load(model_path);
  const double load_ms = ms_since(t_load);
  const ModelInfo& info = model.info();

  TextTokens tt;
  const auto t_tok = std::chrono::steady_clock::now();
  if (ids_mode) {
    tt.ids = parse_ids_file(input, file);
  } else {
    tt = tokenize_text(model, input);
  }
  const double tok_ms = ms_since(t_tok);
  const int64_t n_tok = (int64_t)tt.ids.size();
  if (n_tok < 2) fail("{}: perplexity needs at least 2 tokens, got {}", file, n_tok);

  PerplexityParams pp;
  pp.mode = all_positions ? PerplexityParams::Mode::AllPositions : PerplexityParams::Mode::SecondHalf;
  pp.bos = tt.bos;
  pp.max_windows = chunks;
  pp.n_window = (int)std::min<int64_t>(window, n_tok);
  if (n_tok < window)
    fmt::print(stderr,
               "perplexity: the input has only {} tokens, fewer than one window of {}: evaluating one window "
               "of {} tokens\n",
               n_tok, window, n_tok);

  ContextParams cp;
  cp.n_ctx = pp.n_window;
  cp.n_batch = std::min(batch, pp.n_window);
  cp.n_outputs = cp.n_batch;
  cp.n_threads = threads;
  apply_device_flags(device, kv_type, cp);
  Context ctx(model, cp);
  print_warnings(ctx);

  const int W = pp.n_window;
  int64_t n_win = n_tok / W;
  if (chunks > 0) n_win = std::min<int64_t>(n_win, chunks);
  const int first = all_positions ? 0 : W / 2;
  fmt::print(stderr, "model: {} ({}, {}, {} layers, dim {}, vocab {}), {} threads {}\n", info.path,
             info.format, info.arch, info.n_layers, info.dim, info.n_vocab, ctx.backend_name(),
             ctx.params().n_threads);
  fmt::print(stderr,
             "perplexity: {} tokens ({:.2f} ms to {}), {} window(s) of {} tokens, batch {}, {} tail "
             "tokens dropped\n",
             n_tok, tok_ms, ids_mode ? "parse" : "tokenize", n_win, W, cp.n_batch, n_tok - n_win * W);
  fmt::print(stderr, "perplexity: scoring positions [{}, {}) of each window ({}){}\n", first, W - 1,
             all_positions ? "all positions" : "llama.cpp: second half",
             tt.bos >= 0 ? fmt::format(", first token of each window replaced by BOS {}", tt.bos) : "");

  const auto t0 = std::chrono::steady_clock::now();
  auto progress = [&](int w, int n, double ppl) {
    if (w == 0) {
      const double s = ms_since(t0) / 1e3;
      fmt::print(stderr, "perplexity: {:.2f} seconds per pass - ETA {:.2f} minutes\n", s, s * n / 60.0);
    }
    fmt::print(stderr, "[{}]{:.4f},", w + 1, ppl);
    std::fflush(stderr);
  };
  const PerplexityResult r = perplexity(ctx, tt.ids, pp, progress);
  const double eval_ms = ms_since(t0);
  fmt::print(stderr, "\n");

  const std::string final_line = fmt::format("Final estimate: PPL = {:.4f} +/- {:.5f}", r.ppl, r.ppl_err);
  fmt::print(stderr,
             "perplexity: {} tokens scored, mean NLL {:.6f}, load {:.2f} ms, eval {:.2f} ms ({:.2f} "
             "tokens/s)\n",
             r.n_scored, r.mean_nll, load_ms, eval_ms,
             eval_ms > 0 ? 1e3 * (double)r.n_windows * W / eval_ms : 0.0);
  if (json) {
    fmt::print(stderr, "{}\n", final_line);
    nlohmann::json j;
    j["ppl"] = r.ppl;
    j["ppl_err"] = r.ppl_err;
    j["mean_nll"] = r.mean_nll;
    j["n_tokens_scored"] = r.n_scored;
    j["n_windows"] = r.n_windows;
    j["n_window"] = r.n_window;
    j["n_tokens"] = n_tok;
    j["n_dropped"] = r.n_dropped;
    j["short_input"] = r.short_input || n_tok < window;
    j["mode"] = all_positions ? "all-positions" : "second-half";
    j["bos"] = tt.bos;
    j["running_ppl"] = r.running_ppl;
    j["eval_ms"] = eval_ms;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("{}\n", final_line);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace ultra::cli
