// Zero allocation, proven: every host allocation (malloc, calloc, realloc, aligned_alloc, posix_memalign,
// memalign, free, and so operator new/delete, which call them) on every thread is counted
//  * while generate() runs 64 decode steps after warm-up: forward, KV write, in-step sampling (with
//    penalties and logprobs), and delivery of each token to a callback;
//  * across Context::step on mixed batches: a prefill chunk of one sequence beside sampled single-token
//    decodes of three others, fed with Batch::kSampled.
// The count must be exactly 0. Under AddressSanitizer the allocator belongs to ASan, so the test is skipped
// there.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <unistd.h>

#include "backend/cpu/cpu_internal.h"
#include "io/convert.h"
#include "ultra/generate.h"
#include "ultra/speculative.h"

#include "alloc_counter.h"
#include "moe_gguf.h"
#include "tmp_dir.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kFixture = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "llama_gqa";

SamplingParams full_chain() {  // the full sampling chain, not the greedy shortcut
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_k = 40;
  sp.top_p = 0.9f;
  sp.min_p = 0.02f;
  sp.repeat_penalty = 1.1f;
  sp.presence_penalty = 0.1f;
  sp.frequency_penalty = 0.1f;
  sp.n_probs = 5;
  sp.seed = 42;
  return sp;
}

// Runs a warm-up generation, then counts allocations over a second one from its first token to its last:
// the 64 decode steps between them, with sampling and delivery (not generate()'s own set-up and tear-down).
long allocations_during_decode(const std::string& model_path, KvType kv_type, int threads) {
  const Model m = Model::load(model_path);
  Context ctx(m, {.n_ctx = 128, .kv_type = kv_type, .n_threads = threads});
  ctx.set_sampling(0, full_chain());
  const int32_t prompt[] = {1, 17, 42, 99, 7, 123, 5, 64};
  int32_t delivered[128];
  int n_delivered = 0;
  float logprob_sum = 0;
  int last = 0;  // the number of the token at which counting stops
  auto on_token = [&](int32_t tok, Context& c, int row) {
    delivered[n_delivered++ % 128] = tok;
    for (const TokenLogprob& t : c.top_logprobs(row)) logprob_sum += t.logprob;
    g_counting = n_delivered < last;
    return true;
  };
  GenerateParams gp;
  gp.n_predict = 16;
  gp.ignore_eos = true;
  generate(ctx, prompt, gp, on_token);  // warm-up
  g_counting = false;
  n_delivered = 0;

  g_allocs = 0;
  gp.n_predict = last = 65;
  const GenerateResult t = generate(ctx, prompt, gp, on_token);  // 64 decode steps
  g_counting = false;
  EXPECT_EQ(t.n_eval, 64);
  EXPECT_EQ(n_delivered, 65);
  return g_allocs.load();
}

TEST(ZeroAlloc, CounterCounts) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  g_allocs = 0;
  g_counting = true;
  void* volatile p = std::malloc(16);
  int* volatile q = new int(3);
  g_counting = false;
  std::free(p);
  delete q;
  EXPECT_GE(g_allocs.load(), 2);
}

TEST(ZeroAlloc, DecodeLoopHfF32) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  const long n = allocations_during_decode(kFixture.string(), KvType::f32, 2);
  std::printf("[zero-alloc] HF f32 weights, f32 KV, 2 threads: %ld allocations in 64 decode steps\n", n);
  EXPECT_EQ(n, 0);
}

TEST(ZeroAlloc, DecodeLoopGgufQ8F16Kv) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  const fs::path out =
      fs::temp_directory_path() / ("ultra_zero_alloc_q8_" + std::to_string(getpid()) + ".gguf");
  ConvertOptions opt;
  opt.out_type = "q8_0";
  convert_hf_to_gguf(kFixture.string(), out.string(), opt);
  // The f32-exact kernels, and on AVX512-VNNI CPUs the int8-activation ones too (their x is quantised into
  // the matmul scratch).
  for (int int8 : {0, 1}) {
    cpu::detail::set_q8_int8_override(int8);
    if (int8 && !cpu::detail::q8_int8_enabled()) {
      std::printf("[zero-alloc] GGUF q8_0 with int8 activations: skipped (no AVX512-VNNI here)\n");
      continue;
    }
    for (int threads : {1, 3}) {
      const long n = allocations_during_decode(out.string(), KvType::f16, threads);
      std::printf(
          "[zero-alloc] GGUF q8_0 weights (%s activations), f16 KV, %d threads: %ld allocations in 64 "
          "decode steps\n",
          int8 ? "int8" : "f32", threads, n);
      EXPECT_EQ(n, 0);
    }
  }
  cpu::detail::set_q8_int8_override(-1);
  fs::remove(out);
}

// llama.cpp's mixes of the bundled target (ultra quantize): Q4_K_M (Q4_K, Q6_K, Q5_0, Q8_0 matrices) and
// IQ4_XS (IQ4_XS, IQ4_NL), through the exact kernels and, on AVX512-VNNI CPUs, the int8-activation decode
// of Q4_K / Q6_K / IQ4_XS (x quantised and summed into the matmul scratch).
TEST(ZeroAlloc, DecodeLoopGgufKQuantMixes) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  const fs::path target = fs::path(ULTRA_SOURCE_DIR) / "models" / "target.gguf";
  for (const char* mix : {"q4_k_m", "iq4_xs"}) {
    const fs::path out = fs::temp_directory_path() /
                         ("ultra_zero_alloc_" + std::string(mix) + "_" + std::to_string(getpid()) + ".gguf");
    ConvertOptions opt;
    opt.out_type = mix;
    quantize_model(target.string(), out.string(), opt);
    for (int int8 : {0, 1}) {
      cpu::detail::set_q8_int8_override(int8);
      if (int8 && !cpu::detail::q8_int8_enabled()) {
        std::printf("[zero-alloc] %s with int8 activations: skipped (no AVX512-VNNI here)\n", mix);
        continue;
      }
      const long n = allocations_during_decode(out.string(), KvType::f32, 2);
      std::printf(
          "[zero-alloc] GGUF %s (%s activations), f32 KV, 2 threads: %ld allocations in 64 decode steps\n",
          mix, int8 ? "int8" : "f32", n);
      EXPECT_EQ(n, 0);
    }
    cpu::detail::set_q8_int8_override(-1);
    fs::remove(out);
  }
}

// Counts the allocations of 32 mixed steps (after one warm-up): a 20-token prefill chunk of sequence 0 with
// two output rows beside one sampled decode each of sequences 1..3, fed with Batch::kSampled.
long allocations_in_mixed_steps(const Model& m) {
  Context ctx(m, {.n_ctx = 128, .n_slots = 4, .n_batch = 64, .n_outputs = 8, .n_threads = 2});
  for (int s = 1; s < 4; ++s) {
    SamplingParams sp = full_chain();
    sp.seed = 100 + s;
    sp.temperature = s == 3 ? 0.0f : 0.9f;  // one greedy sequence (with logprobs) among sampled ones
    ctx.set_sampling(s, sp);
  }
  Batch b(64);
  int32_t chunk[20];
  for (int i = 0; i < 20; ++i) chunk[i] = (i * 37 + 11) % m.info().n_vocab;
  // Start sequences 1..3 with a sampled token each.
  for (int s = 1; s < 4; ++s) b.add(s * 3, 0, s, Output::sample);
  ctx.step(b);
  auto mixed_step = [&] {
    ctx.clear(0);
    b.clear();
    for (int i = 0; i < 20; ++i) {
      b.add(chunk[i], i, 0, i == 9 || i == 19 ? Output::logits : Output::none);
      if (i % 7 == 3) {
        const int s = 1 + i / 7;
        b.add(Batch::kSampled, ctx.seq_len(s), s, Output::sample);
      }
    }
    ctx.step(b);
    float acc = 0;
    for (int r = 0; r < b.size(); ++r)
      if (b.output(r) == Output::sample) acc += ctx.logprob(r) + (float)ctx.top_logprobs(r).size();
    return acc;
  };
  mixed_step();  // warm-up
  g_allocs = 0;
  g_counting = true;
  float acc = 0;
  for (int i = 0; i < 32; ++i) acc += mixed_step();
  g_counting = false;
  EXPECT_TRUE(std::isfinite(acc));
  EXPECT_EQ(ctx.seq_len(1), 33 + 1);
  return g_allocs.load();
}

TEST(ZeroAlloc, MixedBatchStepsWithSampling) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  const long n = allocations_in_mixed_steps(Model::load(kFixture.string()));
  std::printf(
      "[zero-alloc] mixed batch (20-row prefill chunk + 3 sampled decodes): %ld allocations in 32 steps\n",
      n);
  EXPECT_EQ(n, 0);
}

// Mixture-of-experts models (tests/moe_gguf.h): the routing, the grouping of a chunk's rows by expert,
// Qwen2-MoE's shared expert and gpt-oss's sinks, biases and clamped SwiGLU run in buffers sized at context
// creation, in decode and in mixed steps.
TEST(ZeroAlloc, MoeDecodeAndMixedSteps) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  test::TmpDir dir("ultra_zero_alloc_moe");
  for (const char* arch : {"llama", "qwen2moe", "qwen3moe", "gpt-oss"}) {
    test::MoeSpec s;
    s.arch = arch;
    s.n_expert = 8;
    s.n_expert_used = 2;
    s.type = GgmlType::Q8_0;
    const std::string path = dir.file(std::string(arch) + ".gguf");
    test::write_moe_gguf(path, s);
    const long decode = allocations_during_decode(path, KvType::f16, 2);
    const long mixed = allocations_in_mixed_steps(Model::load(path));
    std::printf("[zero-alloc] MoE %s: %ld allocations in 64 decode steps, %ld in 32 mixed steps\n", arch,
                decode, mixed);
    EXPECT_EQ(decode, 0) << arch;
    EXPECT_EQ(mixed, 0) << arch;
  }
}

// Speculative rounds (a draft model and prompt lookup, sampled, penalties on): nothing is allocated from the
// first delivered token to the last, across rounds with accepted drafts, rejections and bonus tokens.
TEST(ZeroAlloc, SpeculativeRounds) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  const Model m = Model::load(kFixture.string());
  const Model dm = Model::load((kFixture.parent_path() / "mistral").string());  // the same vocabulary
  for (int lookup : {0, 2, -1}) {  // -1: greedy (sampled inside the steps), with the adaptive draft length
    Context target(m, {.n_ctx = 128, .n_batch = 16, .n_outputs = 16, .n_threads = 2});
    Context draft(lookup < 0 ? m : dm, {.n_ctx = 128, .n_threads = 1});  // greedy: the target drafts
    SamplingParams sp = full_chain();
    sp.top_k = 3;  // few candidates, so that some random-weight drafts are kept
    if (lookup < 0) sp.temperature = 0.0f;
    target.set_sampling(0, sp);
    const int32_t prompt[] = {1, 17, 42, 99, 7, 123, 5, 64, 17, 42};
    SpeculativeParams spp;
    spp.n_draft = 4;
    spp.lookup_ngram = std::max(lookup, 0);
    spp.p_min = lookup < 0 ? 0.001f : 0.0f;
    GenerateParams gp;
    gp.ignore_eos = true;
    int n_delivered = 0, last = 0;
    auto on_token = [&](int32_t, Context&, int) {
      ++n_delivered;
      g_counting = n_delivered < last;
      return true;
    };
    gp.n_predict = 16;
    generate_speculative(target, &draft, prompt, gp, spp, on_token);  // warm-up
    g_counting = false;
    n_delivered = 0;
    g_allocs = 0;
    gp.n_predict = last = 80;
    SpeculativeStats st;
    generate_speculative(target, &draft, prompt, gp, spp, on_token, &st);
    g_counting = false;
    EXPECT_EQ(n_delivered, 80);
    std::printf(
        "[zero-alloc] speculative, K=4, lookup %d: %ld allocations over %lld rounds (%lld of %lld drafts "
        "kept)\n",
        lookup, g_allocs.load(), (long long)st.rounds, (long long)st.accepted, (long long)st.drafted);
    EXPECT_GT(st.rounds, 10);
    EXPECT_GT(st.accepted, 0);
    if (lookup >= 0) {
      EXPECT_LT(st.accepted, st.drafted);
    }
    EXPECT_EQ(g_allocs.load(), 0);
  }
}

// A grammar-constrained sequence (JSON) beside an unconstrained one, sampled in the same steps, with
// logit biases: after a warm-up pass over the same states (the mask's per-top tables and the matcher's
// stacks are built on first sight), a second pass from a crop back to the prompt allocates nothing: the
// matcher is fed the tokens again, masks are computed or served from the cache, the rules applied.
TEST(ZeroAlloc, GrammarConstrainedSteps) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  const Model m = Model::load((fs::path(ULTRA_SOURCE_DIR) / "models" / "target.gguf").string());
  Context ctx(m, {.n_ctx = 128, .n_slots = 2, .n_threads = 2});
  SamplingParams sp = full_chain();
  sp.add_logit_bias(17, 2.0f);
  sp.add_logit_bias(42, -100.0f);
  ctx.set_sampling(0, sp);
  ctx.set_sampling(1, sp);
  ctx.set_grammar(0, R"(root ::= "[" item ("," item)* "]"
item ::= "{\"k\": " [0-9]{1,4} ", \"s\": \"" [a-z ]{0,12} "\"}")");
  const int32_t prompt[] = {1, 17, 42, 99, 7, 123, 5, 64};
  Batch b(32);
  int32_t delivered[2] = {0, 0};
  auto pass = [&](int n_steps) {
    ctx.crop(0, 0);
    ctx.crop(1, 0);
    b.clear();
    b.add_sequence(prompt, 0, 0, Output::sample);
    b.add_sequence(prompt, 0, 1, Output::sample);
    ctx.step(b);
    for (int k = 0; k < n_steps; ++k) {
      b.clear();
      b.add(Batch::kSampled, ctx.seq_len(0), 0, Output::sample);
      b.add(Batch::kSampled, ctx.seq_len(1), 1, Output::sample);
      ctx.step(b);
      delivered[0] = ctx.sampled(0);
      delivered[1] = ctx.sampled(1);
    }
  };
  pass(40);  // warm-up: the same seeded tokens as the counted pass
  AllocCount c;
  pass(40);
  c.stop();
  std::printf("[zero-alloc] grammar-constrained + unconstrained steps: %ld allocations in 41 steps\n",
              c.allocs());
  EXPECT_EQ(c.allocs(), 0);
  EXPECT_GE(delivered[0] + delivered[1], 0);
}

}  // namespace
