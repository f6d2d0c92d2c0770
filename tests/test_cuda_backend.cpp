// The CUDA backend against independent references: HF transformers' logits and greedy tokens of the
// fixture models (tests/fixtures/hf), PyTorch's perplexity and greedy continuation of the bundled model
// (models/train_report.json), and the CPU backend on the same batches. Runs on a machine with a CUDA
// device (tools/gpu_run_all.sh); elsewhere it exits 77, which ctest reports as skipped.
//
// Tolerances. Steps of up to 32 rows use the f32-accurate GEMV (weights exact in TF32, activations split
// hi + lo): the same 1e-4 max-abs bound on logits as the CPU fixture test, with an f32 KV cache. Larger
// steps (prefill chunks) multiply BF16-rounded activations on the tensor cores through cuBLASLt: their
// logits are held to a relative L2 error of 1e-2 (BF16 operands carry 8 bits), the perplexity to 0.5%.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "alloc_counter.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/tuning.h"
#include "chi2_util.h"
#include "copy_seq_check.h"
#include "engine/testing.h"
#include "greedy_util.h"
#include "io/convert.h"
#include "kv/layout.h"
#include "model/model.h"
#include "sampling/philox.h"
#include "sampling/sampler.h"
#include "spec_sampling_check.h"
#include "ultra/generate.h"
#include "ultra/grammar.h"
#include "ultra/perplexity.h"
#include "ultra/speculative.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kRoot = ULTRA_SOURCE_DIR;
const fs::path kHf = kRoot / "tests" / "fixtures" / "hf";
const fs::path kBundled = kRoot / "models" / "target.gguf";
const fs::path kBundledDraft = kRoot / "models" / "draft.gguf";

std::vector<float> load_floats(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  f.seekg(0, std::ios::end);
  std::vector<float> v((size_t)f.tellg() / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), v.size() * 4);
  return v;
}

double max_abs(std::span<const float> a, std::span<const float> b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (double)std::fabs(a[i] - b[i]));
  return d;
}

double rel_l2(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i)
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
  return std::sqrt(num / den);
}

ContextParams gpu(int n_ctx, int n_batch = 64, int n_outputs = 64, KvType kv = KvType::f32, int n_slots = 1) {
  ContextParams p;
  p.backend = BackendKind::cuda;
  p.n_ctx = n_ctx;
  p.n_batch = n_batch;
  p.n_outputs = n_outputs;
  p.kv_type = kv;
  p.n_slots = n_slots;
  return p;
}

using testing_util::greedy_tokens;

// The first n tokens as one step of sequence 0 (every row's logits) on each context, from an empty cache.
void step_prefix(std::initializer_list<Context*> ctxs, const std::vector<int32_t>& tokens, int n, Batch& b) {
  for (Context* ctx : ctxs) {
    ctx->clear(0);
    b.clear();
    for (int i = 0; i < n; ++i) b.add(tokens[i], i, 0, Output::logits);
    ctx->step(b);
  }
}

// Each HF fixture, from safetensors (F32) and converted to GGUF BF16 and F16: every prompt position in one
// step (a 16-row graph; mistral_swa's 40 in steps of 32 and 8), then token by token (the 1-row graph), then
// 32 greedy tokens. gpt_oss (YaRN, sinks, sliding layers, attention and expert biases, swiglu_oai) alike;
// gpt_oss_mxfp4 (MXFP4 experts, decoded exactly by the expert kernels) from safetensors and converted to
// GGUF F32 (its experts stay MXFP4), against transformers' logits of the dequantised weights.
TEST(CudaBackend, FixturesMatchHfTransformers) {
  for (const char* name :
       {"llama_gqa", "llama_tied_rope3", "qwen2_bias", "mistral", "qwen3", "gemma2", "gemma3", "phi3_short",
        "phi3_long", "mistral_swa", "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "gpt_oss_mxfp4"}) {
    if (!fs::exists(kHf / name / "reference.json")) {  // mistral_swa: see test_model_fixtures.cpp
      std::printf("[cuda fixture] %s: no fixture, skipped\n", name);
      continue;
    }
    const nlohmann::json ref = nlohmann::json::parse(std::ifstream(kHf / name / "reference.json"));
    const auto prompt = ref["prompt"].get<std::vector<int32_t>>();
    struct Case {
      const char* type;
      const char* logits;
      const char* greedy;
      const char* convert;  // the GGUF type converted to, or null: the HF checkpoint itself
    };
    std::vector<Case> cases = {Case{"f32", "logits_f32.bin", "greedy", nullptr},
                               Case{"bf16", "logits_bf16w.bin", "greedy_bf16w", "bf16"},
                               Case{"f16", "logits_f16w.bin", "greedy_f16w", "f16"}};
    if (std::string(name) == "gpt_oss_mxfp4")
      cases = {Case{"f32", "logits_f32.bin", "greedy", nullptr},
               Case{"gguf", "logits_f32.bin", "greedy", "f32"}};
    for (const Case& c : cases) {
      std::string path = (kHf / name).string();
      if (c.convert) {
        path = (fs::temp_directory_path() / fmt::format("ultra_cuda_{}_{}_{}.gguf", name, c.type, getpid()))
                   .string();
        ConvertOptions opt;
        opt.out_type = c.convert;
        convert_hf_to_gguf((kHf / name).string(), path, opt);
      }
      const Model m = Model::load(path);
      const int V = m.info().n_vocab, n = (int)prompt.size();
      const auto want = load_floats(kHf / name / c.logits);
      // Phi-3's LongRoPE picks its factors by the context length, as HF by the sequence length: phi3_short
      // (original 64) in 64 tokens, phi3_long (original 8) in 128 (as test_model_fixtures.cpp).
      Context ctx(m, gpu(std::string(name) == "phi3_short" ? 64 : 128));
      Batch b(64);
      double prefill = 0, decode = 0;
      for (int rep = 0; rep < 2;
           ++rep) {  // the first step of a bucket runs directly, the second replays its graph
        ctx.clear(0);
        // Steps of at most 32 rows: above that the matmuls are cuBLASLt GEMMs on activations rounded to
        // BF16/F16 (docs/CUDA.md), not f32-accurate. mistral_swa's 40-token prompt takes two steps, the
        // second's rows attending through the window into the first's.
        for (int i0 = 0; i0 < n; i0 += 32) {
          const int i1 = std::min(n, i0 + 32);
          b.clear();
          for (int i = i0; i < i1; ++i) b.add(prompt[i], i, 0, Output::logits);
          ctx.step(b);
          for (int i = i0; i < i1; ++i)
            prefill =
                std::max(prefill, max_abs(ctx.logits(i - i0), std::span(want).subspan((size_t)i * V, V)));
        }
      }
      ctx.clear(0);
      for (int i = 0; i < n; ++i) {
        b.clear();
        b.add(prompt[i], i, 0, Output::logits);
        ctx.step(b);
        decode = std::max(decode, max_abs(ctx.logits(0), std::span(want).subspan((size_t)i * V, V)));
      }
      std::printf(
          "[cuda fixture] %-17s %-4s  16-row step max-abs %.3g  1-row steps max-abs %.3g  graphs %lld\n",
          name, c.type, prefill, decode, (long long)ctx.backend_stat("graph_launches"));
      EXPECT_LT(prefill, 1e-4) << name << " " << c.type;
      EXPECT_LT(decode, 1e-4) << name << " " << c.type;
      EXPECT_GT((int64_t)ctx.backend_stat("graph_launches"), 0);
      EXPECT_EQ(greedy_tokens(ctx, prompt, 32), ref[c.greedy].get<std::vector<int32_t>>())
          << name << " " << c.type;
      if (c.convert) fs::remove(path);
    }
  }
}

// gpt-oss on the CUDA backend against the CPU backend on the same weights (the HF fixtures: dense F32
// experts, MXFP4 experts): 32 greedy tokens alike (and as HF's); 1-, 16- and 32-row steps (f32-accurate
// kernels on both sides) within 2e-4 max-abs, twice the bound each backend keeps to HF's logits. A 48-row
// step (cuBLASLt on BF16-rounded activations, the MoE's BF16 tensor cores, the per-row attention kernel with
// sinks) is printed, not bounded: the rounding flips near ties of the router on these tiny random models
// (as MoeQ8_0MatchesHfAndCpu says); test_cuda_kernels and test_cuda_moe check those kernels at 40 rows.
// Then 176 positions in 32-row and 1-row steps (split attention with its merge) against the CPU.
TEST(CudaBackend, GptOssMatchesCpu) {
  for (const char* name : {"gpt_oss", "gpt_oss_mxfp4"}) {
    if (!fs::exists(kHf / name / "reference.json")) {
      std::printf("[cuda gpt-oss] %s: no fixture, skipped\n", name);
      continue;
    }
    const nlohmann::json ref = nlohmann::json::parse(std::ifstream(kHf / name / "reference.json"));
    const auto prompt = ref["prompt"].get<std::vector<int32_t>>();
    const Model m = Model::load((kHf / name).string());
    Context cu(m, gpu(128)), cpu(m, {.n_ctx = 128, .n_batch = 64, .n_outputs = 64});
    std::vector<int32_t> long_prompt;
    for (int i = 0; i < 48; ++i) long_prompt.push_back(prompt[(size_t)i % prompt.size()]);
    Batch b(64);
    double err[4] = {0, 0, 0, 0};
    const int sizes[4] = {1, 16, 32, 48};
    for (int s = 0; s < 4; ++s) {
      step_prefix({&cpu, &cu}, long_prompt, sizes[s], b);
      for (int i = 0; i < sizes[s]; ++i)
        err[s] = std::max(err[s], sizes[s] > 32 ? rel_l2(cu.logits(i), cpu.logits(i))
                                                : max_abs(cu.logits(i), cpu.logits(i)));
    }
    const auto want = greedy_tokens(cpu, prompt, 32);
    const auto got = greedy_tokens(cu, prompt, 32);
    std::printf(
        "[cuda gpt-oss] %-14s vs CPU max-abs: 1 row %.3g, 16 rows %.3g, 32 rows %.3g; 48 rows rel L2 %.3g; "
        "greedy %s\n",
        name, err[0], err[1], err[2], err[3], got == want ? "as CPU" : "DIFFERENT");
    EXPECT_LT(err[0], 2e-4) << name;
    EXPECT_LT(err[1], 2e-4) << name;
    EXPECT_LT(err[2], 2e-4) << name;
    EXPECT_EQ(got, want) << name;
    EXPECT_EQ(got, ref["greedy"].get<std::vector<int32_t>>()) << name;

    // Past 64 positions: the attention splits a row's positions and merges them (the sink's term added in
    // the merge), and the sliding layers' windows (8) start far from 0. 160 tokens in 32-row steps, then 16
    // one-row steps, every row's logits against the CPU's. The bound is 1e-3 (accumulated f32 rounding over
    // 176 positions; a wrong sink or merge moves logits by O(1)).
    Context cu_long(m, gpu(256)), cpu_long(m, {.n_ctx = 256, .n_batch = 64, .n_outputs = 64});
    std::vector<int32_t> toks;
    for (int i = 0; i < 176; ++i) toks.push_back(prompt[(size_t)(7 * i) % prompt.size()]);
    double long_err = 0;
    for (int i0 = 0, rows = 32; i0 < 176; i0 += rows) {
      rows = i0 < 160 ? 32 : 1;
      b.clear();
      for (int i = i0; i < i0 + rows; ++i) b.add(toks[i], i, 0, Output::logits);
      cpu_long.step(b);
      cu_long.step(b);
      for (int r = 0; r < rows; ++r)
        long_err = std::max(long_err, max_abs(cu_long.logits(r), cpu_long.logits(r)));
    }
    std::printf("[cuda gpt-oss] %-14s 176 positions (32-row steps, then 1-row) vs CPU max-abs %.3g\n", name,
                long_err);
    EXPECT_LT(long_err, 1e-3) << name;
  }
}

// The mixture-of-experts fixtures with Q8_0 weights (experts included). One-row steps (the low-bit gemv and
// the expert kernels, which decode Q8_0 exactly; the router in f32 at every step size) within 1e-4 of HF on
// the same dequantised weights, 4-row steps as the CPU backend, greedy tokens (prefill in 4-row chunks) as
// HF's. 20- and 48-row steps (attention's matmuls on a BF16 copy of the weights, and on cuBLASLt) differ from
// the CPU by the BF16 rounding, which flips near ties of the router on these tiny random models (mixtral:
// 0.42 relative L2 at 20 rows, qwen2_moe 0.017, qwen3_moe 0.012 on an H100): printed, not bounded.
TEST(CudaBackend, MoeQ8_0MatchesHfAndCpu) {
  for (const char* name : {"mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss"}) {
    const nlohmann::json ref = nlohmann::json::parse(std::ifstream(kHf / name / "reference.json"));
    const auto prompt = ref["prompt"].get<std::vector<int32_t>>();
    const fs::path path =
        fs::temp_directory_path() / fmt::format("ultra_cuda_moe_{}_{}.gguf", name, getpid());
    ConvertOptions opt;
    opt.out_type = "q8_0";
    convert_hf_to_gguf((kHf / name).string(), path.string(), opt);
    const Model m = Model::load(path.string());
    const int V = m.info().n_vocab, n = (int)prompt.size();
    const auto want = load_floats(kHf / name / "logits_q8_0w.bin");
    Context cu(m, gpu(128)), cpu(m, {.n_ctx = 128, .n_batch = 64, .n_outputs = 64});
    Batch b(64);
    double decode = 0;
    for (int i = 0; i < n; ++i) {
      b.clear();
      b.add(prompt[i], i, 0, Output::logits);
      cu.step(b);
      decode = std::max(decode, max_abs(cu.logits(0), std::span(want).subspan((size_t)i * V, V)));
    }
    std::vector<int32_t> long_prompt;
    for (int i = 0; i < 48; ++i) long_prompt.push_back(prompt[i % n]);
    double rel[3] = {0, 0, 0};
    const int sizes[3] = {cuda::kLowbitGemvMaxRows, 20, 48};
    for (int s = 0; s < 3; ++s) {
      step_prefix({&cpu, &cu}, long_prompt, sizes[s], b);
      for (int i = 0; i < sizes[s]; ++i) rel[s] = std::max(rel[s], rel_l2(cu.logits(i), cpu.logits(i)));
    }
    Context cu4(m, gpu(128, cuda::kLowbitGemvMaxRows, cuda::kLowbitGemvMaxRows));
    const auto got = greedy_tokens(cu4, prompt, 32);
    std::printf(
        "[cuda moe q8_0] %-10s 1-row steps max-abs vs HF %.3g; rel L2 vs CPU: 4 rows %.3g, 20 rows %.3g, "
        "48 rows %.3g; greedy %s\n",
        name, decode, rel[0], rel[1], rel[2],
        got == ref["greedy_q8_0w"].get<std::vector<int32_t>>() ? "as HF" : "DIFFERENT");
    EXPECT_LT(decode, 1e-4) << name;
    EXPECT_LT(rel[0], 1e-4) << name;
    EXPECT_EQ(got, ref["greedy_q8_0w"].get<std::vector<int32_t>>()) << name;
    fs::remove(path);
  }
}

TEST(CudaBackend, BundledModelMatchesPyTorch) {
  const nlohmann::json rep =
      nlohmann::json::parse(std::ifstream(kRoot / "models" / "train_report.json"))["target"];
  const Model m = Model::load(kBundled.string());
  // Greedy continuation: single-row graph steps, f32 KV cache.
  {
    Context ctx(m, gpu(256));
    const auto prompt = rep["greedy"]["prompt_ids"].get<std::vector<int32_t>>();
    const auto got = greedy_tokens(ctx, prompt, 64);
    EXPECT_EQ(got, rep["f16w"]["greedy_ids"].get<std::vector<int32_t>>());
    EXPECT_GE((int64_t)ctx.backend_stat("graph_launches"), 60);
    // Host dispatch: the time of the graph launch call of each decode step (median of 64).
    Batch b(1);
    std::vector<double> us;
    for (int i = 0; i < 64; ++i) {
      const double before = ctx.backend_stat("launch_us");
      b.clear();
      b.add(Batch::kSampled, ctx.seq_len(0), 0, Output::sample);
      ctx.step(b);
      us.push_back(ctx.backend_stat("launch_us") - before);
    }
    std::sort(us.begin(), us.end());
    std::printf("[cuda bundled] host graph launch per decode step: median %.2f us, min %.2f, max %.2f\n",
                us[32], us[0], us.back());
    // The target is < 5 us; measured 4.6-8.2 us over six runs on H200 machines (2026-11-30), so this
    // guards against regressions (graph nodes added, host work in the launch path) rather than the target.
    EXPECT_LT(us[32], 15.0) << "host dispatch per token";
    // The host's whole time per decode step when steps are queued one ahead (Context::submit: validation,
    // staging and the launch; median of 64), as generate() runs them on a GPU.
    us.clear();
    for (int i = 0; i < 66; ++i) {
      b.clear();
      b.add(Batch::kSampled, ctx.seq_len(0), 0, Output::sample);
      const double before = ctx.stats().submit_us;
      ctx.submit(b);
      if (i >= 2) us.push_back(ctx.stats().submit_us - before);
      if (ctx.n_queued() == 2) ctx.wait();
    }
    while (ctx.n_queued() > 0) ctx.wait();
    std::sort(us.begin(), us.end());
    std::printf(
        "[cuda bundled] host time per queued decode step (submit): median %.2f us, min %.2f, max %.2f\n",
        us[32], us[0], us.back());
  }
  // Perplexity: 256-token windows in one step each (cuBLASLt, BF16 activations), F16 KV cache.
  {
    std::ifstream f(kRoot / "tests" / "fixtures" / "bundled" / "val_ids.txt");
    std::vector<int32_t> ids;
    for (int32_t x; f >> x;) ids.push_back(x);
    Context ctx(m, gpu(256, 256, 256, KvType::f16));
    PerplexityParams pp;
    pp.n_window = 256;
    pp.mode = PerplexityParams::Mode::AllPositions;
    const PerplexityResult r = perplexity(ctx, ids, pp);
    const double want = rep["f16w"]["ppl"].get<double>();
    std::printf("[cuda bundled] perplexity %.4f, PyTorch %.4f (rel %.2e)\n", r.ppl, want, r.ppl / want - 1);
    EXPECT_LT(std::fabs(r.ppl / want - 1), 0.005);
  }
}

// A 4096-token greedy decode on the GPU (one-row graph steps queued one ahead, f32 KV cache, attention
// split over up to 4096 positions) against the CPU backend scoring the same tokens: the logits at every 16th
// position within a relative L2 error of 1e-3 (f32 arithmetic in both; the bound leaves room for the
// accumulation over 4096 positions), and each GPU token the CPU's argmax unless the CPU's two best logits
// are within 1e-3 of each other (a near tie that rounding may flip). The bundled model was trained on 256
// positions: past them its output degrades (a warning), but both backends compute the same function.
TEST(CudaBackend, LongDecodeMatchesCpu) {
  const Model m = Model::load(kBundled.string());
  const int n_ctx = 4096, every = 16;
  const std::vector<int32_t> prompt = {100, 200, 300};
  Context cu(m, gpu(n_ctx, 64, 1, KvType::f32));
  cu.set_sampling(0, SamplingParams::greedy());
  std::vector<int32_t> toks(prompt);
  std::vector<std::vector<float>> logits;  // GPU logits after toks[p] for p = prompt.size() - 1 + k * every
  GenerateParams gp;
  gp.n_predict = n_ctx - (int)prompt.size();
  gp.ignore_eos = true;
  gp.lookahead = false;  // the callback reads logits
  int i = 0;
  generate(cu, prompt, gp, [&](int32_t t, Context& c, int row) {
    if (i++ % every == 0) {
      const auto l = c.logits(row);
      logits.emplace_back(l.begin(), l.end());
    }
    toks.push_back(t);
    return true;
  });
  ASSERT_EQ((int)toks.size(), n_ctx);
  Context cpu(m, {.n_ctx = n_ctx, .n_batch = 512, .n_outputs = 512});
  Batch b(512);
  double worst = 0;
  int mismatches = 0, near_ties = 0;
  for (int p0 = 0; p0 < n_ctx - 1; p0 += 512) {
    b.clear();
    const int n = std::min(512, n_ctx - 1 - p0);
    for (int p = p0; p < p0 + n; ++p) b.add(toks[p], p, 0, Output::logits);
    cpu.step(b);
    for (int r = 0; r < n; ++r) {
      const int p = p0 + r;
      if (p < (int)prompt.size() - 1) continue;
      const auto l = cpu.logits(r);
      const int best = (int)(std::max_element(l.begin(), l.end()) - l.begin());
      if (best != toks[p + 1]) {
        if (l[best] - l[toks[p + 1]] < 1e-3f)
          ++near_ties;
        else
          ++mismatches;
      }
      const int k = p - ((int)prompt.size() - 1);
      if (k % every == 0) worst = std::max(worst, rel_l2(logits[k / every], l));
    }
  }
  std::printf(
      "[cuda long decode] %d tokens: logits rel L2 vs CPU at most %.2e (%zu positions); tokens not the "
      "CPU's argmax: %d (near ties %d)\n",
      n_ctx, worst, logits.size(), mismatches, near_ties);
  EXPECT_LT(worst, 1e-3);
  EXPECT_EQ(mismatches, 0);
}

// One step mixing a 100-row prefill chunk (cuBLASLt) of one sequence with sampled single-token decodes of
// three others, against the CPU backend running each sequence alone; then 12 shared decode steps (graph
// replays) give each sequence the CPU's greedy tokens.
TEST(CudaBackend, MixedBatchMatchesCpu) {
  const Model m = Model::load(kBundled.string());
  std::mt19937 rng(7);
  auto toks = [&](int n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = (int32_t)(rng() % (uint32_t)m.tokenizer()->n_vocab());
    return t;
  };
  const std::vector<std::vector<int32_t>> seqs = {toks(150), toks(38), toks(6), toks(81)};
  Context cu(m, gpu(256, 128, 16, KvType::f32, 4));
  for (int s = 0; s < 4; ++s) cu.set_sampling(s, SamplingParams::greedy());
  Batch b(128);
  const int hist[4] = {50, 37, 5, 80};
  for (int s = 0; s < 4; ++s) prefill(cu, b, s, std::span(seqs[s]).first(hist[s]));
  b.clear();
  std::vector<std::array<int, 3>> outs;  // row, seq, pos
  for (int i = 50; i < 150; ++i) {
    const bool o = i == 63 || i == 149;
    const int r = b.add(seqs[0][i], i, 0, o ? Output::logits : Output::none);
    if (o) outs.push_back({r, 0, i});
    for (int s = 1; s < 4; ++s)
      if (i == 50 + 20 * s) outs.push_back({b.add(seqs[s][hist[s]], hist[s], s, Output::sample), s, hist[s]});
  }
  cu.step(b);
  for (const auto& [row, s, pos] : outs) {
    Context cpu(m, {.n_ctx = 256, .n_batch = 256, .n_outputs = 1});
    Batch cb(256);
    const int r = prefill(cpu, cb, 0, std::span(seqs[s]).first(pos + 1), Output::logits);
    const std::vector<float> want(cpu.logits(r).begin(), cpu.logits(r).end());
    const double e = rel_l2(cu.logits(row), want);
    std::printf("[cuda mixed] seq %d pos %3d: rel L2 vs CPU %.2e, max-abs %.3g\n", s, pos, e,
                max_abs(cu.logits(row), want));
    EXPECT_LT(e, 1e-2);
  }
  // Shared greedy decode steps vs the CPU's greedy continuation of each full sequence.
  std::vector<int32_t> got[4];
  for (const auto& [row, s, pos] : outs)
    if (s > 0) got[s].push_back(cu.sampled(row));
  cu.crop(0, 149);
  b.clear();
  b.add(seqs[0][149], 149, 0, Output::sample);
  cu.step(b);
  got[0].push_back(cu.sampled(0));
  for (int step = 0; step < 12; ++step) {
    b.clear();
    int rows[4];
    for (int s = 3; s >= 0; --s) rows[s] = b.add(Batch::kSampled, cu.seq_len(s), s, Output::sample);
    cu.step(b);
    for (int s = 0; s < 4; ++s) got[s].push_back(cu.sampled(rows[s]));
  }
  for (int s = 0; s < 4; ++s) {
    Context cpu(m, {.n_ctx = 256});
    const std::vector<int32_t> full(seqs[s].begin(), seqs[s].begin() + (s == 0 ? 150 : hist[s] + 1));
    EXPECT_EQ(got[s], greedy_tokens(cpu, full, 13)) << "sequence " << s;
  }
}

// The CUDA backend's one reader of the environment (tuning.h): each ULTRA_CUDA_* variable lands in its
// field, and with none set every field keeps its default (the process-wide switches untouched).
TEST(CudaTuning, ReadsTheEnvironment) {
  const char* vars[][2] = {{"ULTRA_CUDA_ATTENTION", "rows"},      {"ULTRA_CUDA_PDL", "1"},
                           {"ULTRA_CUDA_ATTENTION_PDL", "0"},     {"ULTRA_CUDA_FUSE", "5"},
                           {"ULTRA_CUDA_GEMV_SMEM", "49152"},     {"ULTRA_CUDA_GEMV_L1", "1"},
                           {"ULTRA_CUDA_ATTN_CHUNK", "256"},      {"ULTRA_CUDA_ATTN_TRIGGER", "0"},
                           {"ULTRA_CUDA_SKIP", "rope,lm_head"},   {"ULTRA_CUDA_PROFILE", "1"},
                           {"ULTRA_CUDA_FP8_GEMM", "1"},          {"ULTRA_CUDA_LB_TILE", "24"},
                           {"ULTRA_CUDA_LOWBIT_TC", "0"},         {"ULTRA_CUDA_LOWBIT_BULK", "2"},
                           {"ULTRA_CUDA_LOWBIT_TC_BLOCKS", "264"}};
  for (auto& v : vars) unsetenv(v[0]);
  const cuda::CudaTuning d = cuda::read_cuda_tuning();
  EXPECT_FALSE(d.attention_rows);
  EXPECT_EQ(d.pdl, -1);
  EXPECT_EQ(d.attention_pdl, -1);
  EXPECT_EQ(d.fuse, 29);
  EXPECT_FALSE(d.gemv_set);
  EXPECT_EQ(d.gemv_l1, -1);
  EXPECT_EQ(d.attn_min_chunk, -1);
  EXPECT_EQ(d.attn_trigger, -1);
  EXPECT_EQ(d.skip, 0u);
  EXPECT_FALSE(d.profile);
  EXPECT_FALSE(d.fp8_gemm);
  EXPECT_EQ(d.lb_tile, 0);
  EXPECT_TRUE(d.lowbit_tc);
  EXPECT_EQ(d.lowbit_bulk, -1);
  EXPECT_EQ(d.lowbit_tc_blocks, 132);
  for (auto& v : vars) setenv(v[0], v[1], 1);
  const cuda::CudaTuning t = cuda::read_cuda_tuning();
  for (auto& v : vars) unsetenv(v[0]);
  EXPECT_TRUE(t.attention_rows);
  EXPECT_EQ(t.pdl, 1);
  EXPECT_EQ(t.attention_pdl, 0);
  EXPECT_EQ(t.fuse, 5);
  EXPECT_TRUE(t.gemv_set);
  EXPECT_EQ(t.gemv.smem_budget, 49152);
  EXPECT_EQ(t.gemv.kernel, 0);
  EXPECT_EQ(t.gemv_l1, 1);
  EXPECT_EQ(t.attn_min_chunk, 256);
  EXPECT_EQ(t.attn_trigger, 0);
  EXPECT_EQ(t.skip, cuda::CudaTuning::kSkipRope | cuda::CudaTuning::kSkipLmHead);
  EXPECT_EQ(t.skip_list, "rope,lm_head");
  EXPECT_TRUE(t.profile);
  EXPECT_TRUE(t.fp8_gemm);
  EXPECT_EQ(t.lb_tile, 24);
  EXPECT_FALSE(t.lowbit_tc);
  EXPECT_EQ(t.lowbit_bulk, 2);
  EXPECT_EQ(t.lowbit_tc_blocks, 264);
}

// The environment's attention settings go into that backend's attention plans only: a backend made under
// ULTRA_CUDA_ATTENTION_PDL=0 / ULTRA_CUDA_ATTN_CHUNK / ULTRA_CUDA_ATTENTION=rows leaves the process-wide
// values (those plan_attention takes without a tuning) as they were.
TEST(CudaTuning, AttentionSettingsStayInTheBackend) {
  const Model m = Model::load(kBundled.string());
  const cuda::AttentionTuning before = cuda::process_attention_tuning();
  setenv("ULTRA_CUDA_ATTENTION_PDL", "0", 1);
  setenv("ULTRA_CUDA_ATTN_CHUNK", "256", 1);
  setenv("ULTRA_CUDA_ATTENTION", "rows", 1);
  {
    Context cu(m, gpu(128));
    Batch b(8);
    for (int i = 0; i < 8; ++i) b.add(1 + i, i, 0, i == 7 ? Output::logits : Output::none);
    cu.step(b);
    EXPECT_TRUE(std::isfinite(cu.logits(7)[0]));
  }
  unsetenv("ULTRA_CUDA_ATTENTION_PDL");
  unsetenv("ULTRA_CUDA_ATTN_CHUNK");
  unsetenv("ULTRA_CUDA_ATTENTION");
  const cuda::AttentionTuning after = cuda::process_attention_tuning();
  EXPECT_EQ(after.pdl, before.pdl);
  EXPECT_EQ(after.min_chunk, before.min_chunk);
  EXPECT_EQ(after.tiled, before.tiled);
}

// The decode step's launch modes and fusions compute the same function: every kernel launched the ordinary
// way with RoPE and the KV write as separate kernels, against programmatic launch of every kernel (attention
// included) with them fused, and against the default fusions (29: the one-row rmsnorms, silu_mul and the LM
// head's gather into the weight-streaming gemv's x). The kernels are deterministic and the fused ones do the
// same arithmetic, so the logits of 1-, 2- and 4-row graph steps are bit-identical; a kernel that read an
// activation before the previous kernel finished would show as a difference.
TEST(CudaBackend, LaunchModesAndFusionsAgree) {
  const Model m = Model::load(kBundled.string());
  std::mt19937 rng(11);
  std::vector<int32_t> prompt(40);
  for (int32_t& x : prompt) x = (int32_t)(rng() % (uint32_t)m.tokenizer()->n_vocab());
  auto run = [&](const char* pdl, const char* attn_pdl, const char* fuse) {
    setenv("ULTRA_CUDA_PDL", pdl, 1);
    setenv("ULTRA_CUDA_ATTENTION_PDL", attn_pdl, 1);
    setenv("ULTRA_CUDA_FUSE", fuse, 1);
    Context cu(m, gpu(256, 64, 8, KvType::f16, 4));
    Batch b(64);
    std::vector<float> all;
    int32_t next[4];
    for (int s = 0; s < 4; ++s) {
      cu.set_sampling(s, SamplingParams::greedy());
      prefill(cu, b, s, std::span(prompt).first(10 + 7 * s));
      next[s] = prompt[30 + s];
    }
    for (int step = 0; step < 24; ++step) {
      const int n_rows = step < 8 ? 1 : step < 16 ? 2 : 4;  // the 1-, 2- and 4-row graphs
      b.clear();
      for (int s = 0; s < n_rows; ++s) b.add(next[s], cu.seq_len(s), s, Output::sample);
      cu.step(b);
      for (int r = 0; r < n_rows; ++r) {
        next[r] = cu.sampled(r);
        all.insert(all.end(), cu.logits(r).begin(), cu.logits(r).end());
      }
    }
    return all;
  };
  const std::vector<float> plain = run("0", "0", "0");
  const std::vector<float> fused_default = run("2", "1", "29");
  const std::vector<float> fused = run("2", "1", "1");
  unsetenv("ULTRA_CUDA_PDL");
  unsetenv("ULTRA_CUDA_ATTENTION_PDL");
  unsetenv("ULTRA_CUDA_FUSE");
  // the process-wide switches the runs set, back to their defaults
  cuda::set_programmatic_launch(true);
  cuda::set_programmatic_launch_level(2);
  cuda::tuning::set_attention_pdl(true);
  ASSERT_EQ(plain.size(), fused.size());
  ASSERT_EQ(plain.size(), fused_default.size());
  size_t diff = 0, diff2 = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    diff += std::memcmp(&plain[i], &fused[i], 4) != 0;
    diff2 += std::memcmp(&plain[i], &fused_default[i], 4) != 0;
  }
  std::printf("[cuda launch modes] %zu logits: %zu / %zu differ (all PDL + fused RoPE / default)\n",
              plain.size(), diff, diff2);
  EXPECT_EQ(diff, 0u);
  EXPECT_EQ(diff2, 0u);
}

// Seeded sampling with the full chain gives the CPU backend's tokens (same Philox draws, logits equal to
// ~1e-6 relative: a token can differ only when a draw falls within ~1e-6 of a boundary).
TEST(CudaBackend, SeededSamplingMatchesCpu) {
  const Model m = Model::load(kBundled.string());
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.repeat_penalty = 1.1f;
  sp.n_probs = 5;
  sp.seed = 99;
  auto run = [&](ContextParams cp, std::vector<float>* lp) {
    Context ctx(m, cp);
    ctx.set_sampling(0, sp);
    std::vector<int32_t> got;
    GenerateParams gp;
    gp.n_predict = 48;
    gp.ignore_eos = true;
    generate(ctx, m.tokenizer()->encode("ROMEO:", true, false), gp, [&](int32_t t, Context& c, int row) {
      got.push_back(t);
      lp->push_back(c.logprob(row));
      return true;
    });
    return got;
  };
  std::vector<float> lp_cpu, lp_gpu;
  const auto cpu = run({.n_ctx = 128}, &lp_cpu);
  const auto cu = run(gpu(128), &lp_gpu);
  EXPECT_EQ(cu, cpu);
  for (size_t i = 0; i < std::min(lp_cpu.size(), lp_gpu.size()); ++i)
    EXPECT_NEAR(lp_gpu[i], lp_cpu[i], 1e-3) << i;
}

// Context::copy_seq on the device (CudaBackend::copy_kv: the KV of every layer by cudaMemcpy2DAsync and the
// token log that the device sampler's penalties read), through tests/copy_seq_check.h: a prompt prefilled
// once in sequence 0 is copied into sequences 1 and 2, which held other tokens (their token log too) and
// whose cache past them is poisoned (NaN); all three then sample 24 tokens with a repeat penalty over the
// whole window (so a log not copied changes the draws). Sequence 1, with sequence 0's seed, draws sequence
// 0's tokens; each equals a fresh CUDA context given the same prefill and seed.
TEST(CudaBackend, CopiedSequenceContinuesLikeAFreshPrefill) {
  const Model m = Model::load(kBundled.string());
  const std::vector<int32_t> prompt = m.tokenizer()->encode(
      "ROMEO:\nBut, soft! what light through yonder window breaks? It is the east", true, false);
  ASSERT_GT(prompt.size(), 12u);
  ASSERT_LE(prompt.size(), 32u);  // the prefill takes the f32 GEMV path, in both contexts
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.repeat_penalty = 1.5f;
  sp.repeat_last_n = 64;
  sp.seed = 1234;
  SamplingParams other = sp;
  other.seed = 99;
  const test::CopiedSequences r = test::run_copied_sequences(m, gpu(128), prompt, sp, other, 24);
  EXPECT_TRUE(r.tokens_copied);
  EXPECT_EQ(r.got[1], r.got[0]);
  EXPECT_EQ(r.got[0], r.fresh_a);
  EXPECT_EQ(r.got[2], r.fresh_b);
  EXPECT_NE(r.got[2], r.got[0]);
}

// The device sampler's distribution: 32 sequences per step, each with its own seed, all at the same prompt,
// sampled inside the step (the full chain: penalties, top-k, temperature, softmax, min-p, top-p); the
// counts of 32768 draws against the exact filtered distribution that the CPU sampling function computes
// from the same logits (chi-square, categories with expected count >= 5, the rest pooled). Power: a
// sampler that drops min-p, or applies the temperature after top-p, moves several categories by far more
// than their standard deviation (e.g. a 1% mass shift over 32768 draws is ~330 draws).
TEST(CudaBackend, DeviceSamplerFollowsTheExactDistribution) {
  const Model m = Model::load(kBundled.string());
  const int S = 32, V = m.info().n_vocab;
  Context ctx(m, gpu(64, 256, 32, KvType::f32, S));
  const std::vector<int32_t> prompt = m.tokenizer()->encode("ROMEO:\nWhat say", true, false);
  const int n = (int)prompt.size();
  struct Config {
    const char* name;
    SamplingParams sp;
  };
  SamplingParams full;
  full.temperature = 1.5f;
  full.top_k = 40;
  full.top_p = 0.95f;
  full.min_p = 0.01f;
  full.repeat_penalty = 1.3f;  // the prompt's tokens are penalised
  SamplingParams wide;         // no top-k: the whole vocabulary goes through top-p
  wide.temperature = 1.2f;
  wide.top_k = 0;
  wide.top_p = 0.98f;
  wide.min_p = 0.0f;
  for (const Config& c : {Config{"full chain", full}, Config{"top-p 0.98 over all", wide}}) {
    const long N = 32768;
    std::vector<long> count(V, 0);
    std::vector<double> exact;
    Batch b(256);
    for (long done = 0; done < N; done += S) {
      b.clear();
      for (int s = 0; s < S; ++s) {
        SamplingParams sp = c.sp;
        sp.seed = 12345 + (uint64_t)(done + s);
        ctx.set_sampling(s, sp);
        ctx.clear(s);
        b.add_sequence(prompt, 0, s, Output::sample);
      }
      ctx.step(b);
      for (int s = 0; s < S; ++s) ++count[ctx.sampled(s * n + n - 1)];
      if (exact.empty()) {  // every sequence has the same logits: the exact distribution from the first
        SamplerScratch scratch(V);
        std::vector<int32_t> ids(V);
        std::vector<float> probs(V);
        const int k = sample_distribution(c.sp, ctx.logits(n - 1).data(), ctx.n_sample_vocab(),
                                          penalty_window(c.sp, prompt), scratch, ids.data(), probs.data());
        exact.assign(V, 0.0);
        for (int j = 0; j < k; ++j) exact[ids[j]] = probs[j];
      }
    }
    long outside = 0;
    for (int x = 0; x < V; ++x)
      if (exact[x] == 0) outside += count[x];
    const testing_util::Chi2Fit fit = testing_util::chi2_fit(count, exact, N);
    std::printf(
        "[cuda sampler] %-22s %ld draws, %zu categories: chi2 %.1f (0.999 quantile %.1f); %ld draws "
        "outside the support\n",
        c.name, N, fit.categories, fit.chi2, fit.crit, outside);
    EXPECT_EQ(outside, 0) << c.name;
    EXPECT_LT(fit.chi2, fit.crit) << c.name;
    EXPECT_GT(fit.categories, 10u) << c.name;  // a distribution with some spread, not a near point mass
  }
}

// Zero allocation on the GPU: after warm-up (every graph slot used once and captured), 64 steps of three
// sequences decoding with in-step sampling, every 16th of them beside a prefill chunk that fills the batch
// (the n_batch-row graph), make no host allocation, no device allocation, and leave the device's free
// memory unchanged (cuBLAS(Lt) allocating behind our back would show there). A prefill chunk shorter than
// n_batch runs directly, and cuBLASLt allocates host memory in it: that count is printed.
TEST(CudaBackend, ZeroAllocationPerStep) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  // The bundled model, and a mixture-of-experts one (the expert kernels inside the graphs).
  for (const fs::path& path : {kBundled, kHf / "qwen3_moe"}) {
    const Model m = Model::load(path.string());
    const int V = std::min(4000, m.info().n_vocab);
    Context ctx(m, gpu(256, 64, 8, KvType::f16, 4));
    SamplingParams sp;
    sp.repeat_penalty = 1.1f;
    sp.n_probs = 5;
    for (int s = 0; s < 4; ++s) ctx.set_sampling(s, sp);
    Batch b(64);
    std::vector<int32_t> chunk(61);  // + 3 decode rows = n_batch
    for (int i = 0; i < 61; ++i) chunk[i] = (i * 37 + 11) % V;
    auto steps = [&](int n) {
      float acc = 0;
      for (int i = 0; i < n; ++i) {
        b.clear();
        if (i % 16 == 0) {  // a prefill chunk of sequence 0 beside the decodes, 64 rows in all
          ctx.clear(0);
          for (int t = 0; t < 61; ++t) b.add(chunk[t], t, 0, t == 60 ? Output::sample : Output::none);
        }
        for (int s = 1; s < 4; ++s)
          b.add(ctx.seq_len(s) == 0 ? 1 : Batch::kSampled, ctx.seq_len(s), s, Output::sample);
        ctx.step(b);
        for (int r = 0; r < b.size(); ++r)
          if (b.output(r) == Output::sample) acc += (float)ctx.top_logprobs(r).size();
        for (int s = 1; s < 4; ++s)
          if (ctx.seq_len(s) > 200) ctx.clear(s);
      }
      return acc;
    };
    steps(20);  // warm-up: the 4-row bucket's graph is captured
    size_t free0 = 0, free1 = 0, total = 0;
    cudaMemGetInfo(&free0, &total);
    const long dev0 = DeviceAllocator::total_calls();
    count_this_thread();  // the thread that runs the steps (the CUDA backend runs no threads of its own)
    g_allocs = g_allocs_mine = 0;
    g_counting = true;
    const float acc = steps(64);
    g_counting = false;
    cudaMemGetInfo(&free1, &total);
    std::printf(
        "[cuda zero-alloc] %s: 64 steps (3 sampled decodes, a 61-row chunk every 16): host %ld on the "
        "stepping "
        "thread, %ld on all threads (the CUDA driver's own included), device %ld, free memory change %lld "
        "bytes\n",
        path.filename().c_str(), g_allocs_mine.load(), g_allocs.load(), DeviceAllocator::total_calls() - dev0,
        (long long)free1 - (long long)free0);
    EXPECT_GT(acc, 0);
    EXPECT_EQ(g_allocs_mine.load(), 0);
    EXPECT_EQ(DeviceAllocator::total_calls(), dev0);
    EXPECT_EQ(free1, free0);
    // For the record: a direct step (a 40-row chunk: cuBLASLt outside a graph).
    ctx.clear(0);
    b.clear();
    for (int t = 0; t < 40; ++t) b.add(chunk[t], t, 0, t == 39 ? Output::sample : Output::none);
    ctx.step(b);
    ctx.clear(0);
    g_allocs = 0;
    g_counting = true;
    ctx.step(b);
    g_counting = false;
    std::printf("[cuda zero-alloc] a direct 40-row step (not captured): %ld host allocations\n",
                g_allocs.load());
  }
}

// One decode step of sequences [0, n_seqs), each fed the token its last step sampled: queued one ahead
// (submit, then wait for the older step once two are queued) or a plain step.
void decode_step(Context& ctx, Batch& b, int n_seqs, bool queued) {
  b.clear();
  for (int s = 0; s < n_seqs; ++s) b.add(Batch::kSampled, ctx.seq_len(s), s, Output::sample);
  if (queued) {
    ctx.submit(b);
    if (ctx.n_queued() == 2) ctx.wait();
  } else {
    ctx.step(b);
  }
}

// Queued steps (Context::submit one step ahead, each kSampled token fed on the device from the step still
// running): the same tokens as plain steps, with penalties on (the device's copy of each sequence's tokens
// must hold the fed tokens) and three sequences sampled in different ways; and no host (stepping thread) or
// device allocation across queued steps once both sets of graphs (one per in-flight step) are captured.
TEST(CudaBackend, QueuedStepsFeedTokensOnTheDevice) {
  const Model m = Model::load(kBundled.string());
  SamplingParams pen;
  pen.temperature = 0.8f;
  pen.top_k = 40;
  pen.repeat_penalty = 1.3f;
  pen.presence_penalty = 0.2f;
  pen.seed = 5;
  SamplingParams pen2 = pen;
  pen2.top_k = 0;
  pen2.top_p = 0.9f;
  pen2.seed = 6;
  auto run = [&](bool queued, long* host_allocs, long* dev_allocs) {
    Context ctx(m, gpu(256, 64, 8, KvType::f16, 3));
    ctx.set_sampling(0, SamplingParams::greedy());
    ctx.set_sampling(1, pen);
    ctx.set_sampling(2, pen2);
    Batch b(64);
    for (int s = 0; s < 3; ++s) {
      std::vector<int32_t> prompt(5 + 3 * s);
      for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = (int32_t)((i * 131 + 17 * s + 3) % 4000);
      b.clear();
      b.add_sequence(prompt, 0, s, Output::sample);
      ctx.step(b);
    }
    long dev0 = 0;
    for (int i = 0; i < 96; ++i) {
      if (i == 32) {  // warm: every graph of both parities captured
        dev0 = DeviceAllocator::total_calls();
        count_this_thread();
        g_allocs = g_allocs_mine = 0;
        g_counting = true;
      }
      decode_step(ctx, b, 3, queued);
    }
    while (ctx.n_queued() > 0) ctx.wait();
    g_counting = false;
    if (host_allocs) *host_allocs = g_allocs_mine.load();
    if (dev_allocs) *dev_allocs = DeviceAllocator::total_calls() - dev0;
    std::vector<std::vector<int32_t>> seqs;
    for (int s = 0; s < 3; ++s) seqs.emplace_back(ctx.seq_tokens(s).begin(), ctx.seq_tokens(s).end());
    const StepStats& st = ctx.stats();
    std::printf(
        "[cuda queued] %s: %lld graph launches, host submit %.2f us per step (mean; the graph "
        "captures of the first steps included)\n",
        queued ? "queued one ahead" : "plain steps", (long long)ctx.backend_stat("graph_launches"),
        st.submit_us / (double)st.n_submits);
    return seqs;
  };
  long host = -1, dev = -1;
  const auto plain = run(false, nullptr, nullptr);
  const auto queued = run(true, &host, &dev);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(queued[s], plain[s]) << "sequence " << s;
  std::printf(
      "[cuda queued] 64 queued steps after warm-up: host allocations %ld (stepping thread), device %ld\n",
      host, dev);
#if ULTRA_COUNT_ALLOCS
  EXPECT_EQ(host, 0);
#endif
  EXPECT_EQ(dev, 0);
}

// ---- Grammar-constrained sampling and logit bias on the GPU: the masks are computed on the host (as on the
// CPU), copied into the step's pinned rules block and applied with the biases by logit_rules() inside the
// step, before the sampler; a constrained sequence's next step waits for its last token on the host.

// A JSON schema's grammar (whitespace: at most one space or newline between tokens) and a check of a text
// against it.
const char* kPersonSchema = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    "ok": {"type": "boolean"}},
  "required": ["name", "age", "tags", "ok"], "additionalProperties": false})";

void expect_person(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_TRUE(j.is_object()) << text;
  EXPECT_TRUE(j["name"].is_string()) << text;
  EXPECT_TRUE(j["age"].is_number_integer() && j["age"] >= 0 && j["age"] <= 120) << text;
  EXPECT_TRUE(j["tags"].is_array() && j["tags"].size() <= 3) << text;
  EXPECT_TRUE(j["ok"].is_boolean()) << text;
  EXPECT_EQ(j.size(), 4u) << text;
}

// generate() of sequence 0 under grammar g (none: "") and sampler sp; the tokens up to an end-of-generation
// one (ended: one was drawn).
struct Generated {
  std::vector<int32_t> tokens;
  bool ended = false;
  GenerateResult res;
};
Generated generate_with(Context& ctx, const std::string& g, const SamplingParams& sp,
                        const std::vector<int32_t>& prompt, int n_predict, bool ignore_eos = false) {
  ctx.set_sampling(0, sp);
  if (g.empty())
    ctx.clear_grammar(0);
  else
    ctx.set_grammar(0, g);
  Generated out;
  GenerateParams gp;
  gp.n_predict = n_predict;
  gp.ignore_eos = ignore_eos;
  const Tokenizer& tk = *ctx.model().tokenizer();
  out.res = generate(ctx, prompt, gp, [&](int32_t t, Context&, int) {
    if (tk.is_eog(t) && !ignore_eos) {
      out.ended = true;
    } else {
      out.tokens.push_back(t);
    }
    return true;
  });
  return out;
}

// A JSON schema's grammar on the bundled model: greedy, a seeded top-k sampler (the sampler's one-pass
// path) and a seeded all-tokens sampler, from three prompts, through generate() (which queues the next step
// ahead; a constrained one waits for the token): the CPU's tokens, and each output is an object of the
// schema. Then a constrained, a biased and a plain sequence in the same steps, each submitted one ahead of
// the last wait: the CPU's plain steps' tokens.
TEST(CudaBackend, GrammarConstrainedDecodingMatchesCpu) {
  const Model m = Model::load(kBundled.string());
  const Tokenizer& tk = *m.tokenizer();
  const std::string g = json_schema_to_gbnf(kPersonSchema, 0);
  std::vector<SamplingParams> samplers(3, SamplingParams::greedy());
  samplers[1].temperature = 0.8f;
  samplers[1].top_k = 40;
  samplers[1].seed = 11;
  samplers[2].temperature = samplers[2].top_p = 1.0f;
  samplers[2].top_k = 0;
  samplers[2].min_p = 0.0f;
  samplers[2].seed = 12;
  Context cu(m, gpu(512));
  Context cpu(m, {.n_ctx = 512, .n_threads = 4});
  for (size_t k = 0; k < samplers.size(); ++k)
    for (const char* p : {"The weather today is", "Once upon a time", "ROMEO:"}) {
      SCOPED_TRACE(fmt::format("sampler {}, prompt '{}'", k, p));
      const std::vector<int32_t> prompt = tk.encode(p, true, false);
      const Generated want = generate_with(cpu, g, samplers[k], prompt, 200);
      const Generated got = generate_with(cu, g, samplers[k], prompt, 200);
      EXPECT_EQ(got.tokens, want.tokens);
      ASSERT_TRUE(got.ended) << tk.decode(got.tokens);
      expect_person(tk.decode(got.tokens));
    }

  // Three sequences stepped together, queued one ahead on the GPU.
  const int32_t banned = tk.encode(" the", false, false)[0];
  auto run = [&](ContextParams cp, bool queued) {
    Context ctx(m, cp);
    ctx.set_sampling(0, samplers[1]);
    ctx.set_grammar(0, g);
    SamplingParams biased = samplers[1];
    biased.seed = 13;
    biased.add_logit_bias(banned, -100.0f);
    ctx.set_sampling(1, biased);
    ctx.set_sampling(2, samplers[1]);
    Batch b(64);
    for (int s = 0; s < 3; ++s)
      b.add_sequence(tk.encode("Once upon a time", true, false), 0, s, Output::sample);
    ctx.step(b);
    for (int i = 0; i < 80; ++i) {
      decode_step(ctx, b, 3, queued);
    }
    while (ctx.n_queued() > 0) ctx.wait();
    std::vector<std::vector<int32_t>> out;
    for (int s = 0; s < 3; ++s) out.emplace_back(ctx.seq_tokens(s).begin(), ctx.seq_tokens(s).end());
    return out;
  };
  const auto want = run({.n_ctx = 256, .n_slots = 3, .n_threads = 4}, false);
  const auto got = run(gpu(256, 64, 8, KvType::f32, 3), true);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(got[s], want[s]) << "sequence " << s;
  EXPECT_EQ(std::count(got[1].begin(), got[1].end(), banned), 0);
  const auto from = got[0].begin() + (std::ptrdiff_t)tk.encode("Once upon a time", true, false).size();
  const auto text_end = std::find_if(from, got[0].end(), [&](int32_t t) { return tk.is_eog(t); });
  ASSERT_NE(text_end, got[0].end());
  const std::vector<int32_t> text(from, text_end);
  expect_person(tk.decode(text));
}

// logit_bias on the GPU (logit_rules, before the sampler): a seeded sampler with a banned token and a
// token listed twice (the biases add up) draws the CPU's tokens, never the banned one; a +1000 bias makes a
// greedy sequence repeat its token; an Output::logits row of a sequence with a grammar and a bias shows
// the CPU's logits with the rules applied (-infinity at the same tokens).
TEST(CudaBackend, LogitBiasMatchesCpu) {
  const Model m = Model::load(kBundled.string());
  const Tokenizer& tk = *m.tokenizer();
  const std::vector<int32_t> prompt = tk.encode("Once upon a time", true, false);
  Context cu(m, gpu(256));
  Context cpu(m, {.n_ctx = 256, .n_threads = 4});
  // The token the plain sampler draws most: banned below.
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_k = 40;
  sp.seed = 21;
  const Generated plain = generate_with(cu, "", sp, prompt, 64, true);
  std::map<int32_t, int> count;
  for (int32_t t : plain.tokens) ++count[t];
  const int32_t banned = std::max_element(count.begin(), count.end(), [](auto& a, auto& b) {
                           return a.second < b.second;
                         })->first;
  const int32_t boosted = tk.encode(" king", false, false)[0];
  ASSERT_NE(banned, boosted);
  sp.add_logit_bias(banned, -100.0f);
  sp.add_logit_bias(boosted, 2.0f);
  sp.add_logit_bias(boosted, 1.5f);
  const Generated want = generate_with(cpu, "", sp, prompt, 64, true);
  const Generated got = generate_with(cu, "", sp, prompt, 64, true);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(std::count(got.tokens.begin(), got.tokens.end(), banned), 0);
  EXPECT_GT(std::count(got.tokens.begin(), got.tokens.end(), boosted), count[boosted]);
  std::printf(
      "[cuda logit bias] 64 sampled tokens: banned %d (%d times unbiased) 0 times, boosted %d %ld times "
      "(%d unbiased)\n",
      banned, count[banned], boosted, (long)std::count(got.tokens.begin(), got.tokens.end(), boosted),
      count[boosted]);
  SamplingParams dom = SamplingParams::greedy();
  dom.add_logit_bias(boosted, 1000.0f);
  const Generated all = generate_with(cu, "", dom, prompt, 32, true);
  EXPECT_EQ(std::count(all.tokens.begin(), all.tokens.end(), boosted), 32);

  // Output::logits rows (speculative decoding's sampled rounds read them): the rules are in the logits. The
  // grammar allows only '{' first, then a quote or whitespace: the quote is boosted, a newline banned.
  SamplingParams ruled = SamplingParams::greedy();
  ruled.add_logit_bias(tk.encode("\"", false, false)[0], 3.0f);
  ruled.add_logit_bias(tk.encode("\n", false, false)[0], -100.0f);
  const std::string g = json_schema_to_gbnf(kPersonSchema, 0);
  auto logits_of = [&](Context& ctx) {
    ctx.clear(0);
    ctx.set_sampling(0, ruled);
    ctx.set_grammar(0, g);
    Batch b(64);
    b.add_sequence(prompt, 0, 0, Output::logits);
    ctx.step(b);
    std::vector<std::vector<float>> rows;
    rows.emplace_back(ctx.logits(b.size() - 1).begin(), ctx.logits(b.size() - 1).end());
    b.clear();  // "{" fed as input (the grammar's only start), then the next row's logits
    b.add(tk.encode("{", false, false)[0], (int)prompt.size(), 0, Output::logits);
    ctx.step(b);
    rows.emplace_back(ctx.logits(0).begin(), ctx.logits(0).end());
    return rows;
  };
  const auto lw = logits_of(cpu), lg = logits_of(cu);
  const int n_sample = cu.n_sample_vocab();
  for (size_t r = 0; r < lw.size(); ++r) {
    int n_inf = 0, n_diff = 0;
    double worst = 0;
    for (int t = 0; t < n_sample; ++t) {
      const bool inf_w = std::isinf(lw[r][t]), inf_g = std::isinf(lg[r][t]);
      n_inf += inf_w;
      if (inf_w != inf_g) ++n_diff;
      if (!inf_w && !inf_g) worst = std::max(worst, (double)std::fabs(lw[r][t] - lg[r][t]));
    }
    std::printf(
        "[cuda logit rules] logits row %zu: %d of %d tokens -inf on the CPU, %d differ on the GPU, "
        "max-abs %.3g\n",
        r, n_inf, n_sample, n_diff, worst);
    EXPECT_GT(n_inf, 0);
    EXPECT_EQ(n_diff, 0) << "row " << r;
    EXPECT_LT(worst, 1e-3) << "row " << r;
  }
}

// Steps with a grammar, a logit bias and neither, queued one ahead (a constrained sequence's step waits
// for the token on the host): no host allocation on the stepping thread and no device allocation once the
// graphs are captured and the grammar's states were met.
TEST(CudaBackend, ZeroAllocationPerStepWithRules) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  const Model m = Model::load(kBundled.string());
  const Tokenizer& tk = *m.tokenizer();
  Context ctx(m, gpu(256, 64, 8, KvType::f16, 4));
  SamplingParams sp;
  sp.repeat_penalty = 1.1f;
  sp.n_probs = 5;
  sp.seed = 3;
  for (int s = 0; s < 4; ++s) ctx.set_sampling(s, sp);
  ctx.set_grammar(1, "root ::= [a-z ,.]*");  // one matcher state: its mask is computed once, then reused
  SamplingParams biased = sp;
  biased.add_logit_bias(tk.encode(" the", false, false)[0], -100.0f);
  biased.add_logit_bias(tk.encode(" and", false, false)[0], 2.0f);
  ctx.set_sampling(2, biased);
  Batch b(64);
  auto steps = [&](int n) {
    for (int i = 0; i < n; ++i) {
      bool full = false;
      for (int s = 1; s < 4; ++s) full |= ctx.seq_len(s) > 200;
      if (full) {
        while (ctx.n_queued() > 0) ctx.wait();
        for (int s = 1; s < 4; ++s) ctx.clear(s);
      }
      b.clear();
      for (int s = 1; s < 4; ++s)
        b.add(ctx.seq_len(s) == 0 ? 1 : Batch::kSampled, ctx.seq_len(s), s, Output::sample);
      ctx.submit(b);
      if (ctx.n_queued() == 2) ctx.wait();
    }
    while (ctx.n_queued() > 0) ctx.wait();
  };
  steps(40);  // warm-up: the graphs of both parities captured, the grammar's state seen
  size_t free0 = 0, free1 = 0, total = 0;
  cudaMemGetInfo(&free0, &total);
  const long dev0 = DeviceAllocator::total_calls();
  count_this_thread();
  g_allocs = g_allocs_mine = 0;
  g_counting = true;
  steps(256);  // crosses a clear of the sequences (their constraint starts again)
  g_counting = false;
  cudaMemGetInfo(&free1, &total);
  std::printf(
      "[cuda zero-alloc rules] 256 queued steps (a grammar, a bias, a plain sequence): host %ld on the "
      "stepping thread, device %ld, free memory change %lld bytes\n",
      g_allocs_mine.load(), DeviceAllocator::total_calls() - dev0, (long long)free1 - (long long)free0);
  EXPECT_EQ(g_allocs_mine.load(), 0);
  EXPECT_EQ(DeviceAllocator::total_calls(), dev0);
  EXPECT_EQ(free1, free0);
}

// What a grammar costs on the GPU (issue 35): decode tokens/s of the bundled model, greedy, from the same
// prompts, with the JSON schema's grammar and without (the same number of tokens: ignore_eos). A
// constrained step waits for the previous one's token on the host, computes the mask (vocabulary / 32
// words) and copies it into the step's pinned block; the unconstrained steps are queued one ahead.
TEST(CudaBackend, GrammarCostOnDecode) {
  const Model m = Model::load(kBundled.string());
  const Tokenizer& tk = *m.tokenizer();
  const std::string g = json_schema_to_gbnf(kPersonSchema, 0);
  Context cu(m, gpu(512));
  const SamplingParams greedy = SamplingParams::greedy();
  const char* prompts[] = {"The weather today is", "Once upon a time", "ROMEO:", "JULIET:", "First Citizen:"};
  auto run = [&](bool constrained) {
    int n = 0;
    double ms = 0;
    for (const char* p : prompts) {
      const std::vector<int32_t> prompt = tk.encode(p, true, false);
      // Constrained: up to the end of the object; unconstrained: as many tokens (measured in pass 0).
      const Generated r = generate_with(cu, constrained ? g : "", greedy, prompt, 48, !constrained);
      n += r.res.n_eval;
      ms += r.res.eval_ms;
    }
    return std::pair{n, ms};
  };
  run(true);  // warm-up: graphs captured, the grammar's states met
  run(false);
  const auto [nc, msc] = run(true);
  const auto [nu, msu] = run(false);
  const double tc = 1e3 * nc / msc, tu = 1e3 * nu / msu;
  std::printf(
      "[cuda grammar cost] bundled model (vocabulary %d), greedy decode: JSON-schema grammar %.0f tokens/s "
      "(%d steps), unconstrained %.0f tokens/s (%d steps): constrained at %.0f%% of unconstrained, %.1f "
      "us more per token\n",
      cu.n_sample_vocab(), tc, nc, tu, nu, 100.0 * tc / tu, 1e3 * (msc / nc - msu / nu));
  EXPECT_GT(nc, 0);
  EXPECT_GT(nu, 0);
}

// Context::follow on the GPU: rows of one context take tokens from another context's queued steps, read
// from that backend's device memory (its token log, and the results of its last step) after a device-side
// wait; the host learns them when both have been waited for. Tokens as the source sampled them.
TEST(CudaBackend, FollowedTokensComeFromTheOtherDevice) {
  const Model m = Model::load(kBundled.string()), dm = Model::load(kBundledDraft.string());
  Context src(dm, gpu(256, 64, 1)), dst(m, gpu(256, 64, 16)), ref(m, gpu(256, 64, 16));
  dst.follow(&src);
  ref.set_sampling(0, SamplingParams::greedy());
  src.set_sampling(0, SamplingParams::greedy());
  dst.set_sampling(0, SamplingParams::greedy());
  const std::vector<int32_t> prompt = m.tokenizer()->encode("ROMEO:", true, false);
  const int n0 = (int)prompt.size();
  Batch b(64), f(64);
  for (int round = 0; round < 8; ++round) {  // the graphs are captured in the first rounds
    src.clear(0);
    dst.clear(0);
    b.clear();
    b.add_sequence(prompt, 0, 0, Output::sample);
    src.step(b);
    b.clear();
    b.add_sequence(prompt, 0, 0);
    dst.step(b);
    for (int i = 0; i < 6; ++i) {  // 6 more draft steps, each fed the token the one before sampled
      if (src.n_queued() == 2) src.wait();
      b.clear();
      b.add(Batch::kSampled, n0 + i, 0, Output::sample);
      src.submit(b);
    }
    f.clear();
    for (int i = 0; i < 7; ++i) f.add(Batch::follow(0), n0 + i, 0, Output::sample);
    dst.submit(f);  // 5 of its tokens only in src's device memory, the last one in its last results
    while (src.n_queued() > 0) src.wait();
    dst.wait();
    const auto s_toks = src.seq_tokens(0), d_toks = dst.seq_tokens(0);
    ASSERT_EQ((int)s_toks.size(), n0 + 6);
    ASSERT_EQ((int)d_toks.size(), n0 + 7);
    for (int i = 0; i < n0 + 6; ++i) EXPECT_EQ(d_toks[i], s_toks[i]) << "position " << i;
    EXPECT_EQ(d_toks[n0 + 6], src.sampled(0));
    // The host's copy is resolved from src's host state; what the device fed shows in dst's outputs: the
    // same step with the tokens given by the host samples the same tokens (same graph, same logits).
    ref.clear(0);
    b.clear();
    b.add_sequence(prompt, 0, 0);
    ref.step(b);
    b.clear();
    for (int i = 0; i < 7; ++i) b.add(d_toks[n0 + i], n0 + i, 0, Output::sample);
    ref.step(b);
    for (int i = 0; i < 7; ++i)
      EXPECT_EQ(dst.sampled(i), ref.sampled(i)) << "round " << round << " row " << i;
  }
  dst.follow(nullptr);
}

// Output::propose and Output::verify, row by row against the host's rule. Each trial: the draft proposes
// two tokens (propose rows, sampled on the device), then one target step holds the prompt, whose last row
// verifies the first proposal, a verify row (a followed token) for the second and a sample row; each verify
// row's token must be what speculative.cpp's host test gives from the rows' logits: x when
// u_accept q(x) < p(x), else the draw of u_residual from max(0, p - q) over p's kept set. A second step
// verifies a token the host gives (q a point mass). Then the rules, with their errors.
TEST(CudaBackend, VerifyRowsRunTheRejectionTest) {
  const Model m = Model::load(kBundled.string()), dm = Model::load(kBundledDraft.string());
  Context draft(dm, gpu(256, 64, 1)), target(m, gpu(256, 64, 16));
  target.follow(&draft);
  const int V = m.info().n_vocab, n_sample = target.n_sample_vocab();
  SamplerScratch scratch(V);
  struct Dist {
    std::vector<int32_t> ids;
    std::vector<float> p;
    float at(int32_t id) const {
      for (size_t j = 0; j < ids.size(); ++j)
        if (ids[j] == id) return p[j];
      return 0.0f;
    }
  };
  auto dist_of = [&](const SamplingParams& sp, std::span<const float> logits, std::span<const int32_t> toks) {
    Dist d;
    d.ids.resize(V);
    d.p.resize(V);
    const int n = sample_distribution(sp, logits.data(), n_sample, penalty_window(sp, toks), scratch,
                                      d.ids.data(), d.p.data());
    d.ids.resize(n);
    d.p.resize(n);
    return d;
  };
  // The host's rule (engine/speculative.cpp); q empty: a point mass on x.
  auto expected = [&](const Dist& p, const Dist* q, int32_t x, uint64_t seed, int64_t pos, bool* kept) {
    const double qx = q ? q->at(x) : 1.0, px = p.at(x);
    *kept = qx > 0 && philox_uniform(seed, pos, DrawStream::accept) * qx < px;
    if (*kept) return x;
    std::vector<float> r(p.p.size());
    double total = 0;
    for (size_t j = 0; j < r.size(); ++j) {
      const double qv = q ? q->at(p.ids[j]) : (p.ids[j] == x ? 1.0 : 0.0);
      r[j] = (float)std::max(0.0, (double)p.p[j] - qv);
      total += r[j];
    }
    const double t = philox_uniform(seed, pos, DrawStream::residual) * total;
    double cum = 0;
    for (size_t j = 0; j < r.size(); ++j)
      if (t < (cum += r[j])) return p.ids[j];
    size_t j = r.size() - 1;
    while (j > 0 && r[j] == 0.0f) --j;
    return p.ids[j];
  };
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 40;
  sp.repeat_penalty = 1.1f;
  const std::vector<int32_t> prompt = m.tokenizer()->encode("ROMEO:\nWhat say", true, false);
  const int n0 = (int)prompt.size();
  Batch b(64);
  int checks = 0, kept_n = 0, replaced_n = 0;
  for (int trial = 0; trial < 40; ++trial) {
    sp.seed = 100 + trial;
    SamplingParams dp = sp;
    dp.seed ^= 0x5555;
    draft.set_sampling(0, dp);
    target.set_sampling(0, sp);
    draft.clear(0);
    target.clear(0);
    b.clear();
    b.add_sequence(prompt, 0, 0, Output::propose);
    draft.step(b);
    Dist q[2];
    q[0] = dist_of(dp, draft.logits(n0 - 1), prompt);
    b.clear();
    b.add(Batch::kSampled, n0, 0, Output::propose);
    draft.submit(b);  // queued: the target reads its token and its q on the device
    b.clear();
    b.add_sequence(std::span(prompt).first(n0 - 1), 0, 0);
    b.add(prompt[n0 - 1], n0 - 1, 0, Output::verify);
    b.add(Batch::follow(0), n0, 0, Output::verify);
    b.add(Batch::follow(0), n0 + 1, 0, Output::sample);
    target.submit(b);
    draft.wait();
    target.wait();
    const std::vector<int32_t> d_toks(draft.seq_tokens(0).begin(), draft.seq_tokens(0).end());
    ASSERT_EQ((int)d_toks.size(), n0 + 1);
    const int32_t x[2] = {d_toks[n0], draft.sampled(0)};
    q[1] = dist_of(dp, draft.logits(0), d_toks);
    std::vector<int32_t> toks(prompt);
    toks.push_back(x[0]);
    for (int a = 0; a < 2; ++a) {
      const int row = n0 - 1 + a;
      const Dist p = dist_of(sp, target.logits(row), std::span(toks).first(n0 + a));
      bool kept = false;
      EXPECT_EQ(target.sampled(row), expected(p, &q[a], x[a], sp.seed, n0 + a, &kept))
          << "trial " << trial << " row " << row;
      ++checks;
      kept_n += kept;
      replaced_n += !kept;
    }
    // A given proposal (prompt lookup): q is the point mass on it; here the target's second-best token.
    const Dist p0 = dist_of(sp, target.logits(n0 - 1), prompt);
    const int32_t given = p0.ids.size() > 1 ? p0.ids[1] : p0.ids[0];
    target.crop(0, n0 - 1);
    b.clear();
    b.add(prompt[n0 - 1], n0 - 1, 0, Output::verify);
    b.add(given, n0, 0, Output::sample);
    target.step(b);
    const Dist p = dist_of(sp, target.logits(0), prompt);
    bool kept = false;
    EXPECT_EQ(target.sampled(0), expected(p, nullptr, given, sp.seed, n0, &kept)) << "trial " << trial;
    ++checks;
    kept_n += kept;
    replaced_n += !kept;
  }
  std::printf("[cuda verify rows] %d verify rows as the host's rule: %d proposals kept, %d replaced\n",
              checks, kept_n, replaced_n);
  EXPECT_GT(kept_n, 10);
  EXPECT_GT(replaced_n, 10);

  // The rules.
  auto expect_error = [](auto&& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "no error; expected: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  target.clear(0);
  draft.clear(0);
  b.clear();
  b.add_sequence(prompt, 0, 0, Output::verify);  // the last row: nothing follows it
  expect_error([&] { target.step(b); }, "needs the next row of the batch to continue its sequence");
  b.clear();
  b.add_sequence(prompt, 0, 0, Output::sample);
  draft.step(b);  // a sample row, not a propose row
  b.clear();
  b.add_sequence(std::span(prompt).first(n0 - 1), 0, 0);
  b.add(prompt[n0 - 1], n0 - 1, 0, Output::verify);
  b.add(Batch::follow(0), n0, 0, Output::sample);
  expect_error([&] { target.step(b); }, "was not drawn by an Output::propose row");
  SamplingParams all = sp;
  all.top_k = 0;
  draft.set_sampling(0, all);
  b.clear();
  b.add(Batch::kSampled, n0, 0, Output::propose);
  expect_error([&] { draft.step(b); }, "needs a greedy sampler or one with top_k in [1, 1024]");
  target.follow(nullptr);
}

// Speculative decoding with both models on the GPU (the verification is a K+1-row graph bucket): greedy
// output identical to plain greedy decoding on the same backend for K in {1, 2, 4, 8}, with the draft
// model, prompt lookup and both, on the bundled pair and on the fixture pair; positions past the crop,
// poisoned with NaN after every round, are never read (sampled, penalties on); and no host (stepping thread)
// or device allocation across the rounds.
TEST(CudaBackend, Speculative) {
  const Model tm = Model::load(kBundled.string()), dm = Model::load(kBundledDraft.string());
  Context target(tm, gpu(512, 64, 16)), draft(dm, gpu(512, 64, 1));
  const char* prompts[] = {"ROMEO:", "KING RICHARD III:\nNow is the winter", "First Citizen:\nWe are"};
  auto run = [&](const std::vector<int32_t>& prompt, const SamplingParams& sp, int n, int K, bool use_draft,
                 int lookup, bool poison, SpeculativeStats* st) {
    target.set_sampling(0, sp);
    SpeculativeParams spp;
    spp.n_draft = K;
    spp.lookup_ngram = lookup;
    GenerateParams gp;
    gp.n_predict = n;
    gp.ignore_eos = true;
    std::vector<int32_t> got;
    got.reserve(n);
    generate_speculative(
        target, use_draft ? &draft : nullptr, prompt, gp, spp,
        [&](int32_t t, Context& c, int) {
          got.push_back(t);
          if (poison) {
            ultra::testing::poison_kv_past_length(c, 0);
            ultra::testing::poison_kv_past_length(draft, 0);
          }
          return true;
        },
        st);
    return got;
  };
  int n_cases = 0, n_same = 0;
  int64_t drafted = 0, accepted = 0;  // greedy draft-model rounds: queued whole on the device
  for (const char* text : prompts) {
    const auto prompt = tm.tokenizer()->encode(text, true, false);
    target.set_sampling(0, SamplingParams::greedy());
    const auto want = greedy_tokens(target, prompt, 96);
    for (int K : {1, 2, 4, 8})
      for (int mode = 0; mode < 3; ++mode) {  // draft, lookup, both
        SpeculativeStats st;
        const auto got =
            run(prompt, SamplingParams::greedy(), 96, K, mode != 1, mode == 0 ? 0 : 2, false, &st);
        ++n_cases;
        n_same += got == want;
        EXPECT_EQ(got, want) << text << " K=" << K << " mode " << mode;
        if (mode == 0) {
          drafted += st.drafted;
          accepted += st.accepted;
        }
      }
  }
  {  // the fixture pair (HF llama_gqa target, mistral draft: random weights, mostly rejections)
    const Model ft = Model::load((kHf / "llama_gqa").string()), fd = Model::load((kHf / "mistral").string());
    Context ftarget(ft, gpu(256, 16, 16)), fdraft(fd, gpu(256, 16, 1));
    std::mt19937 rng(5);
    for (int pi = 0; pi < 2; ++pi) {
      std::vector<int32_t> prompt(12);
      for (int32_t& t : prompt) t = (int32_t)(rng() % (uint32_t)ft.info().n_vocab);
      ftarget.set_sampling(0, SamplingParams::greedy());
      const auto want = greedy_tokens(ftarget, prompt, 40);
      for (int K : {1, 2, 4, 8})
        for (int mode = 0; mode < 3; ++mode) {
          ftarget.set_sampling(0, SamplingParams::greedy());
          SpeculativeParams spp;
          spp.n_draft = K;
          spp.lookup_ngram = mode == 0 ? 0 : 2;
          GenerateParams gp;
          gp.n_predict = 40;
          gp.ignore_eos = true;
          std::vector<int32_t> got;
          generate_speculative(ftarget, mode == 1 ? nullptr : &fdraft, prompt, gp, spp,
                               [&](int32_t t, Context&, int) {
                                 got.push_back(t);
                                 return true;
                               });
          ++n_cases;
          n_same += got == want;
          EXPECT_EQ(got, want) << "fixture pair, prompt " << pi << " K=" << K << " mode " << mode;
        }
    }
  }
  std::printf(
      "[cuda speculative] greedy: %d of %d (model pair, prompt, K, draft kind) cases identical to plain "
      "greedy\n",
      n_same, n_cases);
  // The verification steps read the draft's tokens from its device memory (Batch::follow): a wrong feed
  // keeps the output (the target checks whatever it was fed) but not the acceptance, ~55% on the CPU.
  std::printf("[cuda speculative] greedy device rounds: %lld of %lld drafts kept (%.1f%%)\n",
              (long long)accepted, (long long)drafted, 100.0 * accepted / std::max<int64_t>(1, drafted));
  EXPECT_GT(accepted * 3, drafted);
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_k = 40;
  sp.repeat_penalty = 1.1f;
  sp.seed = 7;
  const auto prompt = tm.tokenizer()->encode(prompts[0], true, false);
  SpeculativeStats st;
  const auto clean = run(prompt, sp, 128, 4, true, 2, false, &st);
  const auto poisoned = run(prompt, sp, 128, 4, true, 2, true, &st);
  EXPECT_EQ(poisoned, clean);
  EXPECT_GT(st.drafted - st.accepted, 5);
  // Allocations across the rounds of a second run (the first one captured the graphs it needed).
  const long dev0 = DeviceAllocator::total_calls();
  count_this_thread();
  // A 128-token run counted from its first token on: sampled rounds, then greedy rounds queued whole (the
  // graphs of K = 4 were captured by the greedy runs above).
  auto counted_run = [&](const SamplingParams& sampling, const char* what) {
    int delivered = 0;
    target.set_sampling(0, sampling);
    SpeculativeParams spp;
    spp.n_draft = 4;
    GenerateParams gp;
    gp.n_predict = 128;
    gp.ignore_eos = true;
    g_allocs = g_allocs_mine = 0;
    generate_speculative(
        target, &draft, prompt, gp, spp,
        [&](int32_t, Context&, int) {
          g_counting = ++delivered < 128;
          return true;
        },
        &st);
    g_counting = false;
    std::printf(
        "[cuda speculative] %s: %lld rounds (%lld of %lld drafts kept): host allocations %ld on the stepping "
        "thread, device %ld\n",
        what, (long long)st.rounds, (long long)st.accepted, (long long)st.drafted, g_allocs_mine.load(),
        DeviceAllocator::total_calls() - dev0);
#if ULTRA_COUNT_ALLOCS
    EXPECT_EQ(g_allocs_mine.load(), 0) << what;
#endif
  };
  counted_run(sp, "sampled");
  counted_run(SamplingParams::greedy(), "greedy device rounds");
  EXPECT_EQ(DeviceAllocator::total_calls(), dev0);
}

// Sampled speculative rounds on the device (Output::propose draft steps, Output::verify target rows: the
// rejection test and the residual draw run in the target's sampler): the second generated token follows
// the target's exact filtered distribution, the chi-square check of test_speculative (its power stated
// there) on the same fixture pair with both contexts on the GPU: draft model (K = 1, and K = 4 with
// penalties and top-p) and prompt lookup (point-mass proposals in verify rows).
TEST(CudaBackend, SampledSpeculativeRoundsFollowTheTargetDistribution) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("ultra_cuda_spec_{}", getpid());
  const Model tm = Model::load((kHf / "llama_gqa").string()),
              dm = Model::load(
                  testing_util::perturbed_fixture(kHf / "llama_gqa", dir / "draft", 0.2f).string());
  Context target(tm, gpu(128, 16, 16)), draft(dm, gpu(128, 16, 1));
  ASSERT_TRUE(target.speculative_outputs());
  testing_util::check_speculative_sampling(tm, target, draft, 20000, "cuda speculative");
  fs::remove_all(dir);
}

// Low-bit weights: the bundled model (tied embeddings: the quantised token_embd is the LM head too) through
// quantize_model into Q8_0, F8_E4M3 (a scale per row), TERNARY (per tensor and per row) and TQ2_0 (loaded as
// TERNARY with a scale per 256 columns; its 384-column matrices fall back to Q8_0) and llama.cpp's mixes
// q4_0, q4_1, q5_0, q5_1, q4_k_m, q5_k_m and q6_k (io/quant_mix.h: the 384-column matrices fall back to
// Q5_0 / Q5_1 / Q8_0, the 1024-column ffn_down is Q4_K / Q5_K / Q6_K; gemv_kquant.h), on the CUDA backend
// against the CPU backend (f32-exact numerics: tests/pin_exact_numerics.cpp) on the same file:
//  * a 4-row step (the low-bit GEMV: f32 products and sums on both backends, in different orders): logits
//    within a relative L2 error of 1e-4 per row (measured ~5e-7; the bound leaves room for the 8 layers'
//    amplification);
//  * a 20-row step (weights dequantised to BF16, then the BF16 tensor-core gemv with f32 activations) and
//    a 48-row step (the BF16 copy through cuBLASLt, activations rounded to BF16 as for BF16 models): 1e-2,
//    as the other prefill checks; 5e-2 for TERNARY with one scale per tensor, whose BF16 rounding of the
//    scale is the same for every weight of a matrix (measured 2.6e-2 at 48 rows, against 4.6e-3 per row);
//  * 32 greedy tokens after a 4-token prompt (every step on the low-bit GEMV), identical.
TEST(CudaBackend, LowbitWeightsMatchCpu) {
  struct Case {
    const char* type;
    bool per_row;
  };
  std::vector<int32_t> prompt;
  for (int i = 0; i < 48; ++i) prompt.push_back((int32_t)((i * 577 + 11) % 4000 + 5));
  for (const Case& c :
       {Case{"q8_0", false}, Case{"fp8", false}, Case{"ternary", false}, Case{"ternary", true},
        Case{"tq2_0", false}, Case{"q4_0", false}, Case{"q4_1", false}, Case{"q5_0", false},
        Case{"q5_1", false}, Case{"q4_k_m", false}, Case{"q5_k_m", false}, Case{"q6_k", false}}) {
    const fs::path path = fs::temp_directory_path() / fmt::format("ultra_cuda_lowbit_{}{}_{}.gguf", c.type,
                                                                  c.per_row ? "_row" : "", getpid());
    ConvertOptions opt;
    opt.out_type = c.type;
    opt.ternary_per_row = c.per_row;
    quantize_model(kBundled.string(), path.string(), opt);
    const Model m = Model::load(path.string());
    const int V = m.info().n_vocab;
    Context cpu(m, {.n_ctx = 256, .n_batch = 64, .n_outputs = 64});
    Context cu(m, gpu(256, 64, 64));
    Batch b(64);
    double err[3] = {0, 0, 0};  // worst row of the 4-, 20- and 48-row steps
    const int sizes[3] = {cuda::kLowbitGemvMaxRows, 20, 48};
    for (int k = 0; k < 3; ++k) {
      const int n = sizes[k];
      for (Context* ctx : {&cpu, &cu}) {
        ctx->clear(0);
        b.clear();
        for (int i = 0; i < n; ++i) b.add(prompt[i], i, 0, Output::logits);
        ctx->step(b);
      }
      for (int i = 0; i < n; ++i) err[k] = std::max(err[k], rel_l2(cu.logits(i), cpu.logits(i)));
      ASSERT_EQ((int)cu.logits(0).size(), V);
    }
    cpu.clear(0);
    cu.clear(0);
    const std::vector<int32_t> head(prompt.begin(), prompt.begin() + cuda::kLowbitGemvMaxRows);
    const auto want = greedy_tokens(cpu, head, 32), got = greedy_tokens(cu, head, 32);
    std::printf(
        "[cuda lowbit] %-8s%s  rel L2 vs CPU: 4-row step (low-bit gemv) %.3g, 20-row (BF16 copy, gemv) %.3g, "
        "48-row (BF16 copy, cuBLASLt) %.3g; greedy %s\n",
        c.type, c.per_row ? " per-row" : "        ", err[0], err[1], err[2],
        got == want ? "identical" : "DIFFERENT");
    const double bf16_bound = std::string(c.type) == "ternary" && !c.per_row ? 5e-2 : 1e-2;
    EXPECT_LT(err[0], 1e-4) << c.type;
    EXPECT_LT(err[1], bf16_bound) << c.type;
    EXPECT_LT(err[2], bf16_bound) << c.type;
    EXPECT_EQ(got, want) << c.type;
    fs::remove(path);
  }
}

// ULTRA_CUDA_PROFILE=1: every step runs directly, op by op through the profiling decorator (ProfiledOps) with
// events around each op, and gives the same logits, bit for bit, as the captured steps; the table printed
// when the backend goes names the matmuls by their MatmulOp and counts the single-row steps.
TEST(CudaBackend, ProfiledStepsMatchGraphs) {
  const Model m = Model::load(kBundled.string());
  const int V = m.tokenizer()->n_vocab();
  auto run = [&](bool profile, std::string* table) {
    if (profile) setenv("ULTRA_CUDA_PROFILE", "1", 1);
    if (profile) ::testing::internal::CaptureStderr();
    std::vector<float> all;
    {
      Context cu(m, gpu(64, 16, 1));
      cu.set_sampling(0, SamplingParams::greedy());
      Batch b(16);
      for (int i = 0; i < 12; ++i) b.add((i * 37 + 11) % V, i, 0, i == 11 ? Output::sample : Output::none);
      cu.step(b);  // a 12-row step: the 16-row bucket
      int32_t next = cu.sampled(11);
      for (int step = 0; step < 8; ++step) {  // single-row steps
        b.clear();
        b.add(next, cu.seq_len(0), 0, Output::sample);
        cu.step(b);
        next = cu.sampled(0);
        all.insert(all.end(), cu.logits(0).begin(), cu.logits(0).end());
      }
    }  // the profiled backend prints its table here
    if (profile) *table = ::testing::internal::GetCapturedStderr();
    unsetenv("ULTRA_CUDA_PROFILE");
    return all;
  };
  std::string table;
  const std::vector<float> graphs = run(false, nullptr);
  const std::vector<float> profiled = run(true, &table);
  ASSERT_EQ(graphs.size(), profiled.size());
  size_t diff = 0;
  for (size_t i = 0; i < graphs.size(); ++i) diff += std::memcmp(&graphs[i], &profiled[i], 4) != 0;
  EXPECT_EQ(diff, 0u);
  EXPECT_NE(table.find("CUDA profile: 8 single-row steps"), std::string::npos) << table;
  for (const char* op : {"input upload", "token log", "attention", "matmul o (+ residual)"})
    EXPECT_NE(table.find(op), std::string::npos) << op << " missing from\n" << table;
}

// The size plan (backend/cuda/size_plan.h) is what is allocated: the device allocator's bytes and calls after
// construction equal the plan's sums (a buffer allocated outside the plan, or planned and not allocated,
// breaks both), and the footprint is the device bytes plus the pinned host blocks; for a dense model, for
// mixture-of-experts models without and with a shared expert, and for low-bit weights, with one and with
// several outputs and slots.
TEST(CudaBackend, SizePlanIsWhatIsAllocated) {
  const fs::path q4 = fs::temp_directory_path() / fmt::format("ultra_cuda_plan_q4_k_m_{}.gguf", getpid());
  ConvertOptions opt;
  opt.out_type = "q4_k_m";
  quantize_model(kBundled.string(), q4.string(), opt);
  for (const fs::path& path : {kBundled, kHf / "qwen3_moe", kHf / "qwen2_moe", kHf / "gemma2", q4}) {
    const std::unique_ptr<ModelData> md = load_model(path.string());
    for (const ContextParams& p : {gpu(256, 64, 8, KvType::f16, 4), gpu(100, 3, 1), gpu(64, 40, 40)}) {
      const long calls0 = DeviceAllocator::total_calls();
      CudaBackend be(*md, p, md->hp.n_vocab);
      const cuda::CudaSizePlan& plan = be.size_plan();
      SCOPED_TRACE(
          fmt::format("{} n_batch {} n_outputs {}", path.filename().string(), p.n_batch, p.n_outputs));
      EXPECT_EQ(be.allocator().bytes(), plan.device_bytes());
      EXPECT_EQ(be.allocator().n_allocs(), plan.device_allocs());
      EXPECT_EQ(DeviceAllocator::total_calls() - calls0, plan.device_allocs());
      const Footprint fp = be.footprint();
      EXPECT_EQ(fp.weights + fp.kv + fp.scratch, be.allocator().bytes() + plan.pinned_bytes());
      EXPECT_EQ(fp.kv, kv_cache_bytes(md->hp, p.n_slots, p.n_ctx, p.kv_type, KvMemory::device));
    }
  }
  fs::remove(q4);
}

TEST(CudaBackend, ClearErrors) {
  // A context larger than the device: refused before allocating, naming the sizes.
  const Model big = Model::load(kBundled.string());
  try {
    Context ctx(big, gpu(1 << 24, 64, 64, KvType::f32, 4096));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("free of"), std::string::npos) << e.what();
  }
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
