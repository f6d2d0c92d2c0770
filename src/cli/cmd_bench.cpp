// ultra bench: llama-bench-style table of prompt processing (ppN) and text generation (tgN) speed.
// pp: a fresh sequence prefilled with N tokens in n_batch chunks; tg: N single-token decode steps from an
// empty sequence, each sampling the next token greedily inside the step. One warm-up run of each, then -r
// timed repetitions: mean ± sample standard deviation.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "ultra/generate.h"

namespace ultra::cli {

namespace {

struct Stat {
  double mean = 0, sd = 0;
};

Stat stats(const std::vector<double>& v) {
  Stat s;
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  if (v.size() > 1) {
    for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(s.sd / (v.size() - 1));
  }
  return s;
}

std::string model_type_name(const ModelInfo& i) {
  const double p = i.n_params;
  return fmt::format("{} {}{} {}", i.arch, p >= 1e9 ? p / 1e9 : p / 1e6, p >= 1e9 ? "B" : "M", i.weight_type);
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  CLI::App app{"Measure prompt processing and text generation speed", "ultra bench"};
  ModelFlags mf;
  mf.add(app);
  mf.add_tp(app);
  // llama-bench's list flags take comma-separated values (and may be repeated): one row per value, and
  // per combination of threads and batch size (a context each; the model is loaded once).
  app.remove_option(app.get_option("--threads"));
  app.remove_option(app.get_option("--batch-size"));
  app.remove_option(app.get_option("--n-gpu-layers"));
  std::vector<int> n_prompts = {512}, n_gens = {128}, threads_list = {0}, batches = {512}, ngls;
  std::vector<int> depths = {0}, parallels = {1};
  int reps = 5;
  bool json = false;
  app.add_option("-p,--n-prompt", n_prompts, "prompt tokens, e.g. 512 or 128,512 (0: skip pp)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("-n,--n-gen", n_gens, "generated tokens, e.g. 128 or 32,128 (0: skip tg)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("-t,--threads", threads_list, "CPU threads, e.g. 4 or 1,2,4 (0: all cores)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1024));
  app.add_option("-b,--batch-size", batches, "most tokens per prefill step, e.g. 512 or 128,512")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_option("--n-gpu-layers", ngls,
                 "llama.cpp compatibility (also -ngl), e.g. 0,99: > 0 is --device cuda (all layers), 0 is "
                 "--device cpu")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("-r,--repetitions", reps, "timed repetitions")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("-d,--n-depth", depths,
                 "tokens already in the context when tg starts (as llama-bench), e.g. 0,4096")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--parallel", parallels,
                 "sequences decoding together in tg (aggregate tokens/s), e.g. 1,8,32")
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  app.add_flag("--json", json, "print a JSON object instead of the table");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  mf.resolve_model();
  const Model model = Model::load(mf.model, mf.load_params());
  if (tp_follower_ran(model)) return 0;
  for (std::vector<int>* v : {&n_prompts, &n_gens, &threads_list, &batches, &depths, &parallels})
    if (v->empty()) fail("a list flag of ultra bench was given no value");
  // The devices to run on: --device's, or one per -ngl value.
  std::vector<std::string> devices;
  for (int n : ngls) devices.push_back(n > 0 ? "cuda" : "cpu");
  if (devices.empty()) devices.push_back(mf.device);
  const int max_prompt = *std::max_element(n_prompts.begin(), n_prompts.end());
  const int max_gen = *std::max_element(n_gens.begin(), n_gens.end());
  const int max_depth = *std::max_element(depths.begin(), depths.end());
  const int max_par = *std::max_element(parallels.begin(), parallels.end());
  const int n_vocab = model.info().n_vocab;
  std::vector<int32_t> ids(std::max({max_prompt, max_depth, 1}));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = (int32_t)((i * 7919 + 13) % n_vocab);

  struct Row {
    std::string test, backend;
    int threads = 0, n_batch = 0;
    Stat tps;
    std::vector<double> samples;
  };
  std::vector<Row> rows;
  const std::string name = model_type_name(model.info());
  const double size = (double)model.info().weight_bytes, params = model.info().n_params;
  // The batch-size column only when -b was given (as llama-bench shows the fields that were set).
  const bool show_batch = app.count("--batch-size") > 0;
  // The table is printed a row at a time, as each test ends (as llama-bench does); --json at the end.
  if (!json) {
    write_stdout(fmt::format("| {:<30} | {:>10} | {:>10} | {:<7} | {:>7} |{} {:>10} | {:>20} |\n", "model",
                             "size", "params", "backend", "threads",
                             show_batch ? fmt::format(" {:>7} |", "n_batch") : "", "test", "t/s"));
    write_stdout(fmt::format("| {:-<30} | {:->10}: | {:->9}: | {:-<7} | {:->6}: |{} {:->9}: | {:->19}: |\n",
                             "", "", "", "", "", show_batch ? fmt::format(" {:->6}: |", "") : "", "", ""),
                 /*flush=*/true);
  }
  auto add_row = [&](Row r) {
    if (!json)
      write_stdout(fmt::format("| {:<30} | {:>10} | {:>9.2f} M | {:<7} | {:>7} |{} {:>10} | {:>20} |\n", name,
                               human_bytes(size), params / 1e6, r.backend, r.threads,
                               show_batch ? fmt::format(" {:>7} |", r.n_batch) : "", r.test,
                               fmt::format("{:.2f} ± {:.2f}", r.tps.mean, r.tps.sd)),
                   /*flush=*/true);
    rows.push_back(std::move(r));
  };
  struct {
    int64_t n_graph_launches = 0, n_gpu_gaps = 0;
    double launch_us = 0, gpu_idle_us = 0;
  } st_all;                 // the backend statistics (Context::backend_stats()) summed over the contexts
  double tg_submit_us = 0;  // host time in submit() over the timed decode steps
  int64_t tg_submits = 0;
  std::string backend;  // of the last context (the JSON's top-level field)
  for (const std::string& device : devices) {
    for (const int n_threads : threads_list) {
      for (const int n_batch : batches) {
        ContextParams cp = mf.context_params();
        apply_device_flags(device, mf.kv_type, cp);
        cp.n_threads = n_threads;
        cp.n_batch = n_batch;
        if (cp.n_ctx <= 0) cp.n_ctx = std::max(max_prompt, max_depth + max_gen) + 1;
        if (cp.n_batch > std::max(max_prompt, max_par) && max_prompt > 0)
          cp.n_batch = std::max(max_prompt, max_par);
        cp.n_slots = max_par;
        cp.n_outputs = max_par;
        cp.gpu_timing = true;  // GPU: the idle time between replayed steps (printed below)
        Context ctx(model, cp);
        print_warnings(ctx);
        backend = ctx.backend_name();
        Batch batch(ctx.params().n_batch);

        // pp: one output row (the last), as llama-bench. tg: one row per sequence and step, the next token
        // drawn greedily inside the step and fed back with Batch::kSampled (the decode loop of generate(); on
        // a GPU no logits leave the device), after `depth` tokens of context (prefilled, not timed).
        for (int s = 0; s < max_par; ++s) ctx.set_sampling(s, SamplingParams::greedy());
        auto run_pp = [&](int n_prompt) {
          ctx.clear(0);
          const auto t0 = std::chrono::steady_clock::now();
          prefill(ctx, batch, 0, std::span(ids).first(n_prompt), Output::logits);
          return ms_since(t0);
        };
        bool timed = false;
        auto run_tg = [&](int n_gen, int depth, int parallel) {
          for (int s = 0; s < parallel;
               ++s) {  // every sequence starts with ids[0, depth): crop when it is there
            if (ctx.seq_len(s) >= depth) {
              ctx.crop(s, depth);
            } else {
              ctx.clear(s);
              if (depth > 0) prefill(ctx, batch, s, std::span(ids).first(depth));
            }
          }
          // Queued one step ahead (on a GPU the next step is launched while the current one runs; on the CPU
          // submit() runs the step).
          const StepStats before = ctx.stats();
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < n_gen; ++i) {
            batch.clear();
            for (int s = 0; s < parallel; ++s)
              batch.add(i == 0 ? (1 + s) % n_vocab : Batch::kSampled, depth + i, s, Output::sample);
            ctx.submit(batch);
            if (ctx.n_queued() == 2) ctx.wait();
          }
          while (ctx.n_queued() > 0) ctx.wait();
          const double ms = ms_since(t0);
          if (timed) {  // the untimed first run captures the graphs
            tg_submit_us += ctx.stats().submit_us - before.submit_us;
            tg_submits += ctx.stats().n_submits - before.n_submits;
          }
          return ms;
        };

        const int threads = ctx.params().n_threads, used_batch = ctx.params().n_batch;
        for (const int n_prompt : n_prompts) {
          if (n_prompt == 0) continue;
          run_pp(n_prompt);
          Row r{fmt::format("pp{}", n_prompt), backend, threads, used_batch, {}, {}};
          for (int i = 0; i < reps; ++i) r.samples.push_back(1e3 * n_prompt / run_pp(n_prompt));
          r.tps = stats(r.samples);
          add_row(std::move(r));
        }
        for (const int n_gen : n_gens) {
          if (n_gen == 0) continue;
          for (int depth : depths) {
            for (int parallel : parallels) {
              run_tg(n_gen, depth, parallel);
              std::string test = fmt::format("tg{}", n_gen);
              if (depth > 0) test += fmt::format(" @ d{}", depth);
              if (parallel > 1) test += fmt::format(" x{}", parallel);
              Row r{test, backend, threads, used_batch, {}, {}};
              timed = true;
              for (int i = 0; i < reps; ++i)
                r.samples.push_back(1e3 * n_gen * parallel / run_tg(n_gen, depth, parallel));
              timed = false;
              r.tps = stats(r.samples);
              add_row(std::move(r));
            }
          }
        }
        st_all.n_graph_launches += (int64_t)ctx.backend_stat("graph_launches");
        st_all.launch_us += ctx.backend_stat("launch_us");
        st_all.n_gpu_gaps += (int64_t)ctx.backend_stat("gpu_gaps");
        st_all.gpu_idle_us += ctx.backend_stat("gpu_idle_us");
      }
    }
  }

  if (json) {
    nlohmann::json j;
    j["model"] = mf.model;
    j["model_type"] = name;
    j["size_bytes"] = size;
    // the weight bytes one decoded token reads (a mixture of experts: the selected experts only)
    j["active_bytes"] = (double)model.info().active_weight_bytes;
    j["params"] = params;
    j["threads"] = rows.empty() ? 0 : rows[0].threads;  // the first row's; each result has its own
    j["backend"] = backend;
    j["graph_launches"] = st_all.n_graph_launches;
    j["launch_us_mean"] = st_all.n_graph_launches ? st_all.launch_us / (double)st_all.n_graph_launches : 0.0;
    j["gpu_idle_us_mean"] = st_all.n_gpu_gaps ? st_all.gpu_idle_us / (double)st_all.n_gpu_gaps : 0.0;
    j["decode_submit_us_mean"] = tg_submits ? tg_submit_us / (double)tg_submits : 0.0;
    j["results"] = nlohmann::json::array();
    for (const auto& r : rows)
      j["results"].push_back({{"test", r.test},
                              {"backend", r.backend},
                              {"threads", r.threads},
                              {"n_batch", r.n_batch},
                              {"tps_mean", r.tps.mean},
                              {"tps_sd", r.tps.sd},
                              {"samples", r.samples}});
    write_stdout(j.dump() + "\n");
    return 0;
  }
  if (st_all.n_graph_launches > 0)
    write_stdout(fmt::format(
        "\n{}: {} steps replayed as graphs; host time per decode step {:.2f} us (submit: staging and the "
        "graph launch call, {:.2f} us of it), each step queued one ahead; GPU idle between steps {:.2f} us "
        "(mean of {} gaps)\n",
        backend, st_all.n_graph_launches, tg_submits ? tg_submit_us / (double)tg_submits : 0.0,
        st_all.launch_us / (double)st_all.n_graph_launches,
        st_all.n_gpu_gaps ? st_all.gpu_idle_us / (double)st_all.n_gpu_gaps : 0.0, st_all.n_gpu_gaps));
  return 0;
}

}  // namespace ultra::cli
