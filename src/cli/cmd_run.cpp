// ultra run: load a model, prefill a prompt, stream generated tokens, print llama.cpp-style timings.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/generate.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer.h"

namespace ultra::cli {

namespace {

struct RunFlags {
  ModelFlags model;
  std::string prompt;
  std::string prompt_ids;
  int n_predict = 128;
  SamplingParams sp;
  int64_t seed = -1;
  bool json = false;
  bool ignore_eos = false;
  std::string dump_logits;
};

void print_timings(FILE* f, double load_ms, const GenTimings& t) {
  auto line = [&](const char* what, double ms, int n, const char* unit) {
    fmt::print(f, "{:>18} = {:10.2f} ms / {:5} {} ({:8.2f} ms per token, {:8.2f} tokens per second)\n", what,
               ms, n, unit, n ? ms / n : 0.0, ms > 0 ? 1e3 * n / ms : 0.0);
  };
  fmt::print(f, "\n{:>18} = {:10.2f} ms\n", "load time", load_ms);
  line("prompt eval time", t.prompt_ms, t.n_prompt, "tokens");
  line("eval time", t.eval_ms, t.n_eval, "runs  ");
  line("sampling time", t.sample_ms, t.n_sample, "runs  ");
}

}  // namespace

int cmd_run(int argc, char** argv) {
  CLI::App app{"Generate tokens from a prompt", "ultra run"};
  RunFlags F;
  F.model.add(app);
  app.add_option("-p,--prompt", F.prompt, "prompt text");
  app.add_option("--prompt-ids", F.prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3");
  app.add_option("-n,--n-predict", F.n_predict, "tokens to generate")->check(CLI::Range(0, 1 << 24));
  app.add_option("--temp", F.sp.temperature, "temperature (0: greedy)")->capture_default_str();
  app.add_option("--top-k", F.sp.top_k, "top-k (0: off)")->capture_default_str();
  app.add_option("--top-p", F.sp.top_p, "top-p (1.0: off)")->capture_default_str();
  app.add_option("--min-p", F.sp.min_p, "min-p (0: off)")->capture_default_str();
  app.add_option("--repeat-penalty", F.sp.repeat_penalty, "repetition penalty (1.0: off)")
      ->capture_default_str();
  app.add_option("--repeat-last-n", F.sp.repeat_last_n, "tokens the penalties look back at (-1: all)")
      ->capture_default_str();
  app.add_option("--presence-penalty", F.sp.presence_penalty, "presence penalty")->capture_default_str();
  app.add_option("--frequency-penalty", F.sp.frequency_penalty, "frequency penalty")->capture_default_str();
  app.add_option("-s,--seed", F.seed, "RNG seed (-1: random)");
  app.add_flag("--ignore-eos", F.ignore_eos, "keep generating past the end-of-sequence token");
  app.add_flag("--json", F.json,
               "print one JSON object (prompt_ids, generated_ids, timings) instead of text");
  app.add_option("--dump-logits", F.dump_logits,
                 "write the logits each generated token was drawn from (the last prompt position first) as "
                 "raw little-endian float32 rows of n_vocab");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  F.model.resolve_model();
  if (!(F.sp.top_p > 0 && F.sp.top_p <= 1)) fail("--top-p must be in (0, 1]");
  if (!(F.sp.min_p >= 0 && F.sp.min_p <= 1)) fail("--min-p must be in [0, 1]");
  if (!(F.sp.repeat_penalty > 0)) fail("--repeat-penalty must be > 0");

  if (!F.prompt.empty() && !F.prompt_ids.empty()) fail("give either -p or --prompt-ids, not both");

  const auto t_load = std::chrono::steady_clock::now();
  auto model = load_model(F.model.model);
  std::unique_ptr<tok::Tokenizer> tokenizer = load_tokenizer_if_any(*model);
  std::vector<int32_t> prompt;
  if (!F.prompt_ids.empty()) {
    prompt = parse_id_list(F.prompt_ids);
  } else if (!F.prompt.empty()) {
    if (!tokenizer)
      fail("{}: this model has no tokenizer; pass the prompt as --prompt-ids 1,2,3", F.model.model);
    prompt = tokenizer->encode(F.prompt, /*add_special=*/true, /*parse_special=*/true);
  }
  if (prompt.empty()) fail("no prompt: give -p TEXT or --prompt-ids (at least one token)");
  ContextParams cp = F.model.context_params();
  CpuBackend backend(*model, cp);
  const double load_ms = ms_since(t_load);
  const HParams& hp = model->hp;
  const Footprint fp = backend.footprint();
  if (!F.json) {
    fmt::print(stderr, "model: {} ({}, {}, {} layers, dim {}, {} heads / {} kv, vocab {})\n", model->path,
               model->format, arch_name(hp.arch), hp.n_layers, hp.dim, hp.n_heads, hp.n_kv_heads, hp.n_vocab);
    fmt::print(stderr, "memory: weights {}, KV cache {} ({} tokens x {} slot(s), {}), scratch {}\n",
               human_bytes(fp.weights), human_bytes(fp.kv), backend.params().n_ctx, backend.params().n_slots,
               F.model.kv_type, human_bytes(fp.scratch));
    fmt::print(stderr, "threads: {}\n", backend.params().n_threads);
  }
  for (int32_t id : prompt)
    if (id >= hp.n_vocab) fail("prompt token id {} is out of range (vocabulary of {})", id, hp.n_vocab);

  if (F.seed < 0)
    F.sp.seed = std::random_device{}();
  else
    F.sp.seed = (uint64_t)F.seed;
  Sampler sampler(F.sp, hp.n_vocab);
  Session session(backend, 0);

  FILE* dump = nullptr;
  if (!F.dump_logits.empty()) {
    dump = std::fopen(F.dump_logits.c_str(), "wb");
    if (!dump) fail("{}: cannot open for writing", F.dump_logits);
  }
  std::vector<int32_t> generated;
  generated.reserve(F.n_predict);
  const int32_t eos = F.ignore_eos ? -1 : (tokenizer && tokenizer->eos() >= 0 ? tokenizer->eos() : hp.eos_id);
  bool io_error = false;
  // Text streams through the incremental detokenizer (complete UTF-8 only); without a tokenizer, ids.
  std::unique_ptr<tok::Detokenizer> detok;
  std::vector<char> text_buf;
  std::string text;
  if (tokenizer) {
    detok = std::make_unique<tok::Detokenizer>(*tokenizer, tok::Detokenizer::Options{true, true});
    text_buf.resize(detok->max_bytes_per_push() + 16);
    if (F.json) text.reserve(F.n_predict * 8);
  }
  auto emit = [&](const char* p, size_t n) {
    if (F.json)
      text.append(p, n);
    else
      std::fwrite(p, 1, n, stdout);
  };
  if (!F.json && detok && F.prompt_ids.empty()) {
    // echo the prompt, as llama.cpp does
    fmt::print("{}", F.prompt);
  }
  auto on_token = [&](int32_t id, const float* logits) {
    generated.push_back(id);
    if (dump && std::fwrite(logits, sizeof(float), hp.n_vocab, dump) != (size_t)hp.n_vocab) io_error = true;
    if (detok) {
      emit(text_buf.data(), detok->push(id, text_buf.data(), text_buf.size()));
    } else if (!F.json) {
      fmt::print("{} ", id);
    }
    if (!F.json) std::fflush(stdout);
    // other end-of-generation tokens of the vocabulary (eot, eom) stop too
    return F.ignore_eos || !tokenizer || !tokenizer->is_eog(id);
  };
  GenTimings t;
  if (F.n_predict > 0) {
    t = generate(session, sampler, prompt.data(), (int)prompt.size(), F.n_predict, eos, on_token);
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    session.prefill(prompt.data(), (int)prompt.size());
    t.prompt_ms = ms_since(t0);
    t.n_prompt = (int)prompt.size();
  }
  if (detok) emit(text_buf.data(), detok->flush(text_buf.data(), text_buf.size()));
  if (dump && std::fclose(dump) != 0) io_error = true;
  if (io_error) fail("{}: write failed", F.dump_logits);

  if (F.json) {
    nlohmann::json j;
    j["prompt_ids"] = prompt;
    j["generated_ids"] = generated;
    if (tokenizer) j["generated_text"] = text;
    j["timings"] = {{"load_ms", load_ms},
                    {"prompt_ms", t.prompt_ms},
                    {"prompt_tokens", t.n_prompt},
                    {"eval_ms", t.eval_ms},
                    {"eval_tokens", t.n_eval},
                    {"sample_ms", t.sample_ms},
                    {"prompt_tps", t.prompt_ms > 0 ? 1e3 * t.n_prompt / t.prompt_ms : 0.0},
                    {"eval_tps", t.eval_ms > 0 ? 1e3 * t.n_eval / t.eval_ms : 0.0}};
    j["context_full"] = t.context_full;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("\n");
    if (t.context_full) fmt::print(stderr, "\ncontext full ({} tokens): stopped\n", backend.params().n_ctx);
    print_timings(stderr, load_ms, t);
  }
  return 0;
}

}  // namespace ultra::cli
