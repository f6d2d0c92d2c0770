// ultra run: load a model, prefill a prompt, stream generated tokens, print llama.cpp-style timings.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "ultra/generate.h"

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

void print_timings(FILE* f, double load_ms, const GenerateResult& t) {
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
  app.add_flag("--ignore-eos", F.ignore_eos, "keep generating past end-of-generation tokens");
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
  if (F.seed < 0)
    F.sp.seed = std::random_device{}();
  else
    F.sp.seed = (uint64_t)F.seed;
  F.sp.validate();
  if (!F.prompt.empty() && !F.prompt_ids.empty()) fail("give either -p or --prompt-ids, not both");

  const auto t_load = std::chrono::steady_clock::now();
  const Model model = Model::load(F.model.model);
  const Tokenizer* tokenizer = model.tokenizer();
  const ModelInfo& info = model.info();
  std::vector<int32_t> prompt;
  if (!F.prompt_ids.empty()) {
    prompt = parse_id_list(F.prompt_ids);
  } else if (!F.prompt.empty()) {
    if (!tokenizer) fail("{}: this model has no tokenizer; pass the prompt as --prompt-ids 1,2,3", info.path);
    prompt = tokenizer->encode(F.prompt, /*add_special=*/true, /*parse_special=*/true);
  }
  if (prompt.empty()) fail("no prompt: give -p TEXT or --prompt-ids (at least one token)");
  const int32_t n_ids = tokenizer ? tokenizer->n_vocab() : info.n_vocab;
  for (int32_t id : prompt)
    if (id >= n_ids)
      fail("prompt token id {} is out of range (the {} has {} tokens)", id, tokenizer ? "tokenizer" : "model",
           n_ids);

  Context ctx(model, F.model.context_params());
  print_warnings(ctx);
  ctx.set_sampling(0, F.sp);
  const double load_ms = ms_since(t_load);
  const Footprint fp = ctx.footprint();
  if (!F.json) {
    fmt::print(stderr, "model: {} ({}, {}, {} layers, dim {}, {} heads / {} kv, vocab {})\n", info.path,
               info.format, info.arch, info.n_layers, info.dim, info.n_heads, info.n_kv_heads, info.n_vocab);
    fmt::print(stderr, "memory: weights {}, KV cache {} ({} tokens x {} slot(s), {}), scratch {}\n",
               human_bytes(fp.weights), human_bytes(fp.kv), ctx.params().n_ctx, ctx.params().n_slots,
               F.model.kv_type_name(), human_bytes(fp.scratch));
    fmt::print(stderr, "backend: {}, threads: {}\n", ctx.backend_name(), ctx.params().n_threads);
  }

  FILE* dump = nullptr;
  if (!F.dump_logits.empty()) {
    dump = std::fopen(F.dump_logits.c_str(), "wb");
    if (!dump) fail("{}: cannot open for writing", F.dump_logits);
  }
  std::vector<int32_t> generated;
  generated.reserve(F.n_predict);
  bool io_error = false;
  // Text streams through the incremental detokenizer (complete UTF-8 only); without a tokenizer, ids.
  std::optional<TextStream> stream;
  std::string text;
  if (tokenizer) {
    stream.emplace(*tokenizer);
    if (F.json) text.reserve(F.n_predict * 8);
  }
  auto emit = [&](std::string_view s) {
    if (F.json)
      text.append(s);
    else
      std::fwrite(s.data(), 1, s.size(), stdout);
  };
  if (!F.json && stream && F.prompt_ids.empty()) fmt::print("{}", F.prompt);  // echo, as llama.cpp does
  auto on_token = [&](int32_t id, Context& c, int row) {
    generated.push_back(id);
    if (dump) {
      const std::span<const float> l = c.logits(row);
      if (std::fwrite(l.data(), sizeof(float), l.size(), dump) != l.size()) io_error = true;
    }
    if (stream) {
      emit(stream->push(id));
    } else if (!F.json) {
      fmt::print("{} ", id);
    }
    if (!F.json) std::fflush(stdout);
    return true;
  };
  GenerateResult t;
  if (F.n_predict > 0) {
    GenerateParams gp;
    gp.n_predict = F.n_predict;
    gp.ignore_eos = F.ignore_eos;
    t = generate(ctx, prompt, gp, on_token);
  } else {  // prefill only
    const auto t0 = std::chrono::steady_clock::now();
    Batch batch(ctx.params().n_batch);
    prefill(ctx, batch, 0, prompt);
    t.prompt_ms = ms_since(t0);
    t.n_prompt = (int)prompt.size();
  }
  if (stream) emit(stream->flush());
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
    j["stop"] = t.stopped_eog ? "eog" : t.context_full ? "context_full" : "length";
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("\n");
    if (t.context_full) fmt::print(stderr, "\ncontext full ({} tokens): stopped\n", ctx.params().n_ctx);
    print_timings(stderr, load_ms, t);
  }
  return 0;
}

}  // namespace ultra::cli
