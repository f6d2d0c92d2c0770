// ultra run: load a model, prefill a prompt, stream generated tokens, print llama.cpp-style timings.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "ultra/generate.h"
#include "ultra/speculative.h"

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
  // Speculative decoding.
  std::string model_draft;
  bool speculative = false;  // the bundled draft
  SpeculativeParams spec;
  GrammarFlags grammar;
  bool speculating() const { return !model_draft.empty() || speculative || spec.lookup_ngram > 0; }
};

void print_speculative(FILE* f, const SpeculativeParams& sp, const SpeculativeStats& s,
                       const GenerateResult& t, bool draft) {
  const std::string how = draft && sp.lookup_ngram > 0
                              ? fmt::format("draft model + lookup {}", sp.lookup_ngram)
                          : draft ? std::string("draft model")
                                  : fmt::format("lookup {}", sp.lookup_ngram);
  fmt::print(f, "{:>18} = K {} ({}{}), {} rounds + {} plain steps\n", "speculative", sp.n_draft, how,
             sp.p_min > 0 ? fmt::format(", p-min {:.2f}", sp.p_min) : "", s.rounds, s.plain_steps);
  fmt::print(f, "{:>18} = {:.1f}% ({} of {} drafted tokens; {} from lookup)\n", "acceptance rate",
             100.0 * s.acceptance(), s.accepted, s.drafted, s.from_lookup);
  fmt::print(f, "{:>18} = {:.2f} accepted per round, {:.2f} tokens per target pass\n", "per round",
             s.rounds ? (double)s.accepted / (double)s.rounds : 0.0,
             t.n_eval ? (double)(t.n_generated - 1) / t.n_eval : 0.0);
  fmt::print(f, "{:>18} = {:10.2f} ms target, {:10.2f} ms draft\n", "round time", s.verify_ms, s.draft_ms);
}

void print_timings(FILE* f, double load_ms, const GenerateResult& t, bool speculative) {
  auto line = [&](const char* what, double ms, int n, const char* unit) {
    fmt::print(f, "{:>18} = {:10.2f} ms / {:5} {} ({:8.2f} ms per token, {:8.2f} tokens per second)\n", what,
               ms, n, unit, n ? ms / n : 0.0, ms > 0 ? 1e3 * n / ms : 0.0);
  };
  fmt::print(f, "\n{:>18} = {:10.2f} ms\n", "load time", load_ms);
  line("prompt eval time", t.prompt_ms, t.n_prompt, "tokens");
  if (speculative)  // tokens after the first, which the prompt's last row gave
    line("eval time", t.eval_ms, std::max(0, t.n_generated - 1), "tokens");
  else
    line("eval time", t.eval_ms, t.n_eval, "runs  ");
  if (!speculative) line("sampling time", t.sample_ms, t.n_sample, "runs  ");
}

}  // namespace

int cmd_run(int argc, char** argv) {
  CLI::App app{"Generate tokens from a prompt", "ultra run"};
  RunFlags F;
  F.model.add(app);
  F.model.add_tp(app);
  app.add_option("-p,--prompt", F.prompt, "prompt text");
  add_grammar_flags(app, F.grammar);
  app.add_option("--prompt-ids", F.prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3");
  app.add_option("-n,--n-predict", F.n_predict, "tokens to generate (0: prefill the prompt only)")
      ->check(CLI::Range(0, 1 << 24));
  add_sampling_flags(app, F.sp, F.seed);
  app.add_flag("--ignore-eos", F.ignore_eos, "keep generating past end-of-generation tokens");
  app.add_flag("--json", F.json,
               "print one JSON object (prompt_ids, generated_ids, timings) instead of text");
  app.add_option("--dump-logits", F.dump_logits,
                 "write the logits each generated token was drawn from (the last prompt position first) as "
                 "raw little-endian float32 rows of n_vocab");
  app.add_option("--model-draft", F.model_draft,
                 "-md: draft model for speculative decoding (the same vocabulary as the target)");
  app.add_flag("--speculative", F.speculative,
               "speculative decoding with the bundled draft model (models/draft.gguf)");
  app.add_option("--draft-max,--draft", F.spec.n_draft, "most tokens drafted per round (K)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--draft-min", F.spec.n_draft_min, "a shorter draft is not verified: one plain step instead")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--draft-p-min", F.spec.p_min,
                 "adaptive draft length: stop drafting when the draft's top probability is below this")
      ->check(finite_range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--lookup", F.spec.lookup_ngram,
                 "prompt-lookup drafts: continue the last N tokens' earlier occurrence (0: off)")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  F.model.resolve_model();
  resolve_sampling(F.sp, F.seed);
  const std::string gbnf = resolve_grammar(F.grammar);
  if (!F.prompt.empty() && !F.prompt_ids.empty()) fail("give either -p or --prompt-ids, not both");
  if (!F.speculating())
    for (const char* flag : {"--draft-max", "--draft-min", "--draft-p-min"})
      if (app.count(flag)) fail("{} needs a draft: -md MODEL, --speculative or --lookup N", flag);
  if (!F.model_draft.empty() && F.speculative) fail("give either -md or --speculative, not both");
  if (F.speculating() && !F.dump_logits.empty())
    fail("--dump-logits is not available with speculative decoding (its tokens come in rounds)");
  if (F.speculative) {
    F.model_draft = bundled_model_path("draft.gguf");
    if (F.model_draft.empty()) fail("--speculative: the bundled models/draft.gguf was not found");
  }

  const auto t_load = std::chrono::steady_clock::now();
  const Model model = Model::load(F.model.model, F.model.load_params());
  if (tp_follower_ran(model)) return 0;
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

  ContextParams cp = F.model.context_params();
  if (F.speculating()) {  // K + 1 rows per verification, every one an output
    cp.n_batch = std::max(cp.n_batch, F.spec.n_draft + 1);
    cp.n_outputs = std::max(cp.n_outputs, F.spec.n_draft + 1);
  }
  Context ctx(model, cp);
  print_warnings(ctx);
  ctx.set_sampling(0, F.sp);
  if (!gbnf.empty()) ctx.set_grammar(0, gbnf);
  std::optional<Model> draft_model;
  std::optional<Context> draft;
  if (!F.model_draft.empty()) {
    LoadParams dlp = F.model.load_params();
    // --tp: the draft runs whole on rank 0. It is small (its point), so splitting it would buy little memory
    // and cost a collective per layer on each of its sequential steps; whole, its steps need no other rank,
    // and the split target keeps its one context (the other ranks follow only the target's steps).
    dlp.tp = 1;
    draft_model.emplace(Model::load(F.model_draft, dlp));
    check_draft_compatible(model, *draft_model);
    ContextParams dp = F.model.context_params();
    dp.n_ctx = ctx.params().n_ctx;
    dp.n_outputs = 1;
    draft.emplace(*draft_model, dp);
    print_warnings(*draft);
  }
  const double load_ms = ms_since(t_load);
  const Footprint fp = ctx.footprint();
  if (!F.json) {
    fmt::print(stderr, "model: {} ({}, {}, {} layers, dim {}, {} heads / {} kv, vocab {})\n", info.path,
               info.format, info.arch, info.n_layers, info.dim, info.n_heads, info.n_kv_heads, info.n_vocab);
    fmt::print(stderr, "memory{}: weights {}, KV cache {} ({} tokens x {} slot(s), {}), scratch {}\n",
               info.tp_size > 1 ? fmt::format(" of rank 0 of {}", info.tp_size) : "", human_bytes(fp.weights),
               human_bytes(fp.kv), ctx.params().n_ctx, ctx.params().n_slots, F.model.kv_type_name(),
               human_bytes(fp.scratch));
    fmt::print(stderr, "backend: {}, threads: {}\n", ctx.backend_description(), ctx.params().n_threads);
    if (draft) {
      const ModelInfo& di = draft_model->info();
      fmt::print(stderr, "draft: {} ({}, {} layers, dim {}), weights {}, KV cache {}\n", di.path, di.arch,
                 di.n_layers, di.dim, human_bytes(draft->footprint().weights),
                 human_bytes(draft->footprint().kv));
    }
  }

  FILE* dump = nullptr;
  if (!F.dump_logits.empty()) {
    dump = std::fopen(F.dump_logits.c_str(), "wb");
    if (!dump) fail("{}: cannot open for writing", F.dump_logits);
  }
  std::vector<int32_t> generated;
  generated.reserve(F.n_predict);
  bool io_error = false;
  bool out_error = false;  // standard output failed: generation stops, the command fails
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
    else if (!out_error && !put_stdout(s, /*flush=*/true))
      out_error = true;
  };
  if (!F.json && stream && F.prompt_ids.empty()) write_stdout(F.prompt, true);  // echo, as llama.cpp does
  auto on_token = [&](int32_t id, Context& c, int row) {
    generated.push_back(id);
    if (dump) {
      const std::span<const float> l = c.logits(row);
      if (std::fwrite(l.data(), sizeof(float), l.size(), dump) != l.size()) io_error = true;
    }
    if (stream)
      emit(stream->push(id));
    else if (!F.json) {
      char buf[16];
      emit(std::string_view(buf, fmt::format_to_n(buf, sizeof buf, "{} ", id).size));
    }
    return !out_error;
  };
  GenerateResult t;
  SpeculativeStats spec_stats;
  if (F.n_predict > 0) {
    GenerateParams gp;
    gp.n_predict = F.n_predict;
    gp.ignore_eos = F.ignore_eos;
    gp.lookahead = dump == nullptr;  // on_token reads the logits of each step
    if (F.speculating())
      t = generate_speculative(ctx, draft ? &*draft : nullptr, prompt, gp, F.spec, on_token, &spec_stats);
    else
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
  if (out_error) fail_stdout();

  if (F.json) {
    // eval_*: the tokens generated after the first (which the prompt's last row gave) and their rate, in
    // both modes; eval_runs: the target's decode passes (speculative: one per round, not per token).
    const int n_eval_tokens = std::max(0, t.n_generated - 1);
    nlohmann::json j;
    j["prompt_ids"] = prompt;
    j["generated_ids"] = generated;
    if (tokenizer) j["generated_text"] = text;
    j["timings"] = {{"load_ms", load_ms},
                    {"prompt_ms", t.prompt_ms},
                    {"prompt_tokens", t.n_prompt},
                    {"eval_ms", t.eval_ms},
                    {"eval_tokens", n_eval_tokens},
                    {"eval_runs", t.n_eval},
                    {"generated_tokens", t.n_generated},
                    {"sample_ms", t.sample_ms},
                    {"prompt_tps", t.prompt_ms > 0 ? 1e3 * t.n_prompt / t.prompt_ms : 0.0},
                    {"eval_tps", t.eval_ms > 0 ? 1e3 * n_eval_tokens / t.eval_ms : 0.0}};
    if (F.speculating())
      j["speculative"] = {{"draft_max", F.spec.n_draft},           {"rounds", spec_stats.rounds},
                          {"drafted", spec_stats.drafted},         {"accepted", spec_stats.accepted},
                          {"from_lookup", spec_stats.from_lookup}, {"plain_steps", spec_stats.plain_steps},
                          {"acceptance", spec_stats.acceptance()}, {"draft_ms", spec_stats.draft_ms},
                          {"verify_ms", spec_stats.verify_ms}};
    j["context_full"] = t.context_full;
    j["stop"] = t.stopped_eog ? "eog" : t.context_full ? "context_full" : "length";
    write_stdout(j.dump() + "\n");
  } else {
    write_stdout("\n");
    if (t.context_full) fmt::print(stderr, "\ncontext full ({} tokens): stopped\n", ctx.params().n_ctx);
    print_timings(stderr, load_ms, t, F.speculating());
    if (F.speculating() && F.n_predict > 0)
      print_speculative(stderr, F.spec, spec_stats, t, draft.has_value());
  }
  return 0;
}

}  // namespace ultra::cli
