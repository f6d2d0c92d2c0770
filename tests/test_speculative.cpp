// Speculative decoding (include/ultra/speculative.h) against plain decoding:
//  * greedy: token-identical to plain greedy generate() for K in {1, 2, 4, 8}, with a draft model, with
//    prompt lookup, and with both, on the fixtures (a random draft: mostly rejections) and the bundled pair;
//  * sampling: the second generated token (the first one a round decides: an accepted draft or a residual
//    draw after a rejection) has exactly the target's filtered distribution, by chi-square against the
//    exact marginal sum_c p(c) p(x | c) computed from the target's own distributions, with and without
//    repetition penalties, with a draft model and with prompt lookup;
//  * after the rounds the target's cache holds exactly the accepted prefix: a step from it gives the
//    logits of a fresh run over the same tokens; positions past the crop, poisoned with NaN after every
//    round, are never read.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include <cstring>
#include <fstream>
#include <iterator>

#include "engine/testing.h"
#include "greedy_util.h"
#include "sampling/philox.h"
#include "sampling/sampler.h"
#include "sanitized.h"
#include "spec_sampling_check.h"
#include "swa_fixture.h"
#include "tmp_dir.h"
#include "ultra/speculative.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

using testing_util::perturbed_fixture;
using testing_util::speculative;

const fs::path kHf = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf";
const fs::path kModels = fs::path(ULTRA_SOURCE_DIR) / "models";

// Plain greedy decoding: the reference speculation must reproduce.
std::vector<int32_t> plain_greedy(const Model& m, const std::vector<int32_t>& prompt, int n) {
  Context ctx(m, {.n_ctx = 256, .n_threads = 1});
  return testing_util::greedy_tokens(ctx, prompt, n);
}

std::vector<int32_t> random_prompt(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = (int32_t)(rng() % (uint32_t)vocab);
  return p;
}

TEST(Speculative, GreedyEqualsPlainGreedy) {
  struct Pair {
    fs::path target, draft;
  };
  for (const Pair& pr :
       {Pair{kHf / "llama_gqa", kHf / "mistral"}, Pair{kModels / "target.gguf", kModels / "draft.gguf"}}) {
    const Model tm = Model::load(pr.target.string()), dm = Model::load(pr.draft.string());
    const int V = tm.tokenizer() ? tm.tokenizer()->n_vocab() : tm.info().n_vocab;
    Context target(tm, {.n_ctx = 256, .n_batch = 16, .n_outputs = 16, .n_threads = 1});
    Context draft(dm, {.n_ctx = 256, .n_threads = 1});
    Context queued_draft(dm, {.n_ctx = 256, .n_threads = 1});
    ultra::testing::defer_steps(queued_draft);
    Context queued_target(tm, {.n_ctx = 256, .n_batch = 16, .n_outputs = 16, .n_threads = 1});
    ultra::testing::defer_steps(queued_target);
    const SamplingParams g = SamplingParams::greedy();
    int64_t drafted = 0, accepted = 0;
    // Under AddressSanitizer (~20x slower) one prompt per pair: the same paths, every K and mode.
    for (uint32_t s = 0; s < (test::kSanitized ? 1u : 3u); ++s) {
      std::vector<int32_t> prompt = random_prompt(12, V, 100 + s);
      if (pr.target.extension() == ".gguf")
        prompt = tm.tokenizer()->encode(s == 0   ? "ROMEO:"
                                        : s == 1 ? "JULIET:\nO"
                                                 : "First Citizen:\nWe",
                                        true, false);
      const auto want = plain_greedy(tm, prompt, 40);
      // Under AddressSanitizer the shortest and the longest draft (K = 1 and 8): every mode and both queued
      // variants still run; the lengths between them take the same paths.
      for (int K : test::kSanitized ? std::vector<int>{1, 8} : std::vector<int>{1, 2, 4, 8}) {
        for (int mode = 0; mode < 4; ++mode) {  // draft model, prompt lookup, both, adaptive draft
          SpeculativeParams spp;
          spp.n_draft = K;
          spp.lookup_ngram = mode == 1 || mode == 2 ? 2 : 0;
          spp.p_min = mode == 3 ? 0.2f : 0.0f;
          spp.n_draft_min = mode == 3 ? 2 : 0;
          SpeculativeStats st;
          const auto got = speculative(target, mode == 1 ? nullptr : &draft, g, prompt, 40, spp, &st);
          EXPECT_EQ(got, want) << pr.target << " prompt " << s << " K " << K << " mode " << mode;
          drafted += st.drafted;
          accepted += st.accepted;
          // The draft's steps queued behind each other with the token fed by the backend, as on a GPU
          // (testing::defer_steps): the same tokens, with a fixed and an adaptive length.
          if ((mode == 0 || mode == 3) && (K == 2 || K == 8)) {
            EXPECT_EQ(speculative(target, &queued_draft, g, prompt, 40, spp), want)
                << pr.target << " prompt " << s << " K " << K << " mode " << mode << " (queued draft steps)";
          }
          // Both queued: fixed-length rounds run as one queued round, the verification step following the
          // draft's sequence (Batch::follow) with the tokens fed by the backends.
          if (mode != 1) {
            EXPECT_EQ(speculative(queued_target, &queued_draft, g, prompt, 40, spp), want)
                << pr.target << " prompt " << s << " K " << K << " mode " << mode << " (queued round)";
          }
        }
      }
    }
    std::printf("[speculative] %s + %s greedy: %lld drafted, %lld accepted (%.1f%%)\n",
                pr.target.filename().c_str(), pr.draft.filename().c_str(), (long long)drafted,
                (long long)accepted, 100.0 * accepted / std::max<int64_t>(1, drafted));
    EXPECT_GT(drafted, 0);
    EXPECT_GT(accepted, 0);
    EXPECT_LT(accepted, drafted);  // both outcomes were exercised
  }
}

// The draft is the target itself: every proposal is kept and each round adds a bonus token.
TEST(Speculative, IdenticalDraftAcceptsEverything) {
  const Model m = Model::load((kModels / "target.gguf").string());
  Context target(m, {.n_ctx = 256, .n_batch = 16, .n_outputs = 16, .n_threads = 1});
  Context draft(m, {.n_ctx = 256, .n_threads = 1});
  SpeculativeParams spp;
  spp.n_draft = 4;
  SpeculativeStats st;
  const auto prompt = m.tokenizer()->encode("ROMEO:", true, false);
  const auto got = speculative(target, &draft, SamplingParams::greedy(), prompt, 41, spp, &st);
  EXPECT_EQ(got, plain_greedy(m, prompt, 41));
  EXPECT_EQ(st.accepted, st.drafted);
  EXPECT_EQ(st.rounds, 8);  // 1 + 8 rounds x (4 drafts + 1 bonus) = 41 tokens
}

// The second generated token's distribution is the target's, whatever the draft proposes. The target is
// the llama_gqa fixture, the draft the same with every weight perturbed by up to 20%; a low temperature
// and top-k 8 make both distributions peaked and overlapping, so drafts are kept about half the time and
// both branches of the rule are exercised thousands of times. Power: with 20000 runs, a rule that keeps
// drafts when q < 1.3 p instead of q < p, or draws from p instead of max(0, p - q) after a rejection,
// moves the statistic far past the 0.999 quantile (checked by planting each error).
TEST(Speculative, SampledTokensFollowTheTargetDistribution) {
  test::TmpDir tmp("ultra_spec");
  const Model tm = Model::load((kHf / "llama_gqa").string()),
              dm = Model::load(perturbed_fixture(kHf / "llama_gqa", tmp.path() / "draft", 0.2f).string());
  Context target(tm, {.n_ctx = 128, .n_batch = 16, .n_outputs = 16, .n_threads = 1});
  Context draft(dm, {.n_ctx = 128, .n_threads = 1});
  // Under AddressSanitizer 1000 runs: the same rule and assertions with less power (the full 20000 run in
  // the normal build).
  testing_util::check_speculative_sampling(tm, target, draft, test::kSanitized ? 1000 : 20000, "speculative");
}

// The target's cache after speculation holds exactly the accepted prefix: one more step from it equals a
// fresh context over the same tokens (bound 1e-5: f32 reordering between a K+1-row and a fresh run).
TEST(Speculative, CacheHoldsTheAcceptedPrefix) {
  const Model tm = Model::load((kModels / "target.gguf").string()),
              dm = Model::load((kModels / "draft.gguf").string());
  Context target(tm, {.n_ctx = 256, .n_batch = 16, .n_outputs = 16, .n_threads = 1});
  Context draft(dm, {.n_ctx = 256, .n_threads = 1});
  SamplingParams sp;
  sp.seed = 5;
  SpeculativeParams spp;
  spp.n_draft = 6;
  const auto prompt = tm.tokenizer()->encode("KING RICHARD III:", true, false);
  const auto got = speculative(target, &draft, sp, prompt, 30, spp);
  const auto toks = target.seq_tokens(0);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), got.begin(), got.end() - 1);  // the last token is not fed yet
  ASSERT_EQ(std::vector<int32_t>(toks.begin(), toks.end()), all);
  Batch b(256);
  b.add(got.back(), target.seq_len(0), 0, Output::logits);
  target.step(b);
  const std::vector<float> a(target.logits(0).begin(), target.logits(0).end());
  Context fresh(tm, {.n_ctx = 256, .n_batch = 256, .n_threads = 1});
  all.push_back(got.back());
  b.clear();
  b.add_sequence(all, 0, 0, Output::logits);
  fresh.step(b);
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i)
    d = std::max(d, (double)std::fabs(a[i] - fresh.logits(b.size() - 1)[i]));
  std::printf("[speculative] continuing from the cropped cache vs a fresh run: max-abs %.3g\n", d);
  EXPECT_LT(d, 1e-5);
}

// Positions past the crop point are never read: after every round (the callback runs after both caches
// were cropped) everything past each sequence's length is overwritten with NaN, and the output equals
// that of an unpoisoned run, greedy and sampled. (Reading a poisoned position makes the logits NaN, which
// the engine reports as an error.)
TEST(Speculative, PositionsPastTheCropAreNeverRead) {
  test::TmpDir tmp("ultra_spec");
  const Model tm = Model::load((kHf / "llama_gqa").string()),
              dm = Model::load(perturbed_fixture(kHf / "llama_gqa", tmp.path() / "draft", 0.2f).string());
  const std::vector<int32_t> prompt = {1, 17, 42, 99, 5, 17, 42};
  SamplingParams sampled;
  sampled.temperature = 0.5f;
  sampled.top_k = 8;
  sampled.repeat_penalty = 1.2f;
  sampled.seed = 11;
  for (const SamplingParams& sp : {SamplingParams::greedy(), sampled}) {
    for (int lookup : {0, 1}) {
      SpeculativeParams spp;
      spp.n_draft = 4;
      spp.lookup_ngram = lookup;
      std::vector<int32_t> runs[2];
      SpeculativeStats st;
      for (int poison = 0; poison < 2; ++poison) {
        Context target(tm, {.n_ctx = 128, .n_batch = 16, .n_outputs = 16, .n_threads = 1});
        Context draft(dm, {.n_ctx = 128, .n_threads = 1});
        target.set_sampling(0, sp);
        GenerateParams gp;
        gp.n_predict = 80;
        gp.ignore_eos = true;
        generate_speculative(
            target, &draft, prompt, gp, spp,
            [&](int32_t t, Context& c, int) {
              runs[poison].push_back(t);
              if (poison) {
                ultra::testing::poison_kv_past_length(c, 0);
                ultra::testing::poison_kv_past_length(draft, 0);
              }
              return true;
            },
            &st);
      }
      EXPECT_EQ(runs[1], runs[0]) << "temperature " << sp.temperature << ", lookup " << lookup;
      EXPECT_GT(st.drafted - st.accepted, 5);  // rejections happened: there was something to poison
    }
  }
}

// A target whose sliding window (12) is shorter than the context: speculative greedy decoding (the
// unwindowed Mistral fixture as draft, which agrees early and parts later, and prompt lookup) equals plain
// greedy decoding over 60 positions, so rejected rows cropped from the cache and K+1-row verification
// steps see the same window as one-token steps.
TEST(Speculative, TargetWindowShorterThanTheContext) {
  test::TmpDir tmp("ultra_spec_swa");
  const Model tm = Model::load(test::windowed_mistral(tmp, 12)), dm = Model::load((kHf / "mistral").string());
  const std::vector<int32_t> prompt = random_prompt(20, tm.info().n_vocab, 9);
  const auto want = plain_greedy(tm, prompt, 40);
  EXPECT_NE(want, plain_greedy(dm, prompt, 40));  // the window changes the continuation
  Context target(tm, {.n_ctx = 128, .n_batch = 16, .n_outputs = 16, .n_threads = 1});
  Context draft(dm, {.n_ctx = 128, .n_threads = 1});
  int64_t drafted = 0, accepted = 0;
  for (int K : {2, 5})
    for (int lookup : {0, 2}) {
      SpeculativeParams spp;
      spp.n_draft = K;
      spp.lookup_ngram = lookup;
      SpeculativeStats st;
      EXPECT_EQ(speculative(target, &draft, SamplingParams::greedy(), prompt, 40, spp, &st), want)
          << "K " << K << " lookup " << lookup;
      drafted += st.drafted;
      accepted += st.accepted;
    }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
}

// The host's draws (the first token after a sampled prompt, the bonus and residual tokens, the draft's
// proposals) are sample_distribution followed by draw_index: that is the token sample_row draws, over
// random logits, settings and positions. The edge cases pin the comparison (strict '<') and the fallback.
TEST(Speculative, HostDrawIsTheSamplersDraw) {
  constexpr int V = 300;
  std::mt19937 rng(7);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  SamplerScratch scratch(V);
  std::vector<float> logits(V), probs(V);
  std::vector<int32_t> ids(V), window(40);
  int n_multi = 0;  // draws from more than one candidate
  for (int trial = 0; trial < 2000; ++trial) {
    for (float& l : logits) l = logit(rng);
    for (int32_t& t : window) t = (int32_t)(rng() % V);
    SamplingParams sp;
    sp.temperature = 0.3f + 0.2f * (float)(trial % 8);
    sp.top_k = trial % 3 == 0 ? 0 : 1 + trial % 50;
    sp.top_p = trial % 4 == 0 ? 1.0f : 0.9f;
    sp.min_p = trial % 5 == 0 ? 0.0f : 0.02f;
    sp.repeat_penalty = trial % 2 ? 1.3f : 1.0f;
    sp.seed = 1000 + trial;
    const int n_sample = trial % 7 == 0 ? V - 20 : V;
    const int64_t pos = trial * 13 % 97;
    const auto w = penalty_window(sp, window);
    const int n = sample_distribution(sp, logits.data(), n_sample, w, scratch, ids.data(), probs.data());
    n_multi += n > 1;
    const int32_t host = ids[draw_index(probs.data(), n, philox_uniform(sp.seed, pos, DrawStream::token))];
    EXPECT_EQ(host, sample_row(sp, logits.data(), n_sample, w, pos, scratch, nullptr).token)
        << "trial " << trial;
  }
  EXPECT_GT(n_multi, 1000);
  const float a[] = {0.0f, 0.25f, 0.75f}, b[] = {0.25f, 0.75f}, c[] = {0.5f, 0.5f, 0.0f, 0.0f}, z[] = {0, 0};
  EXPECT_EQ(draw_index(a, 3, 0.0), 1);   // a zero-probability candidate is never drawn
  EXPECT_EQ(draw_index(b, 2, 0.25), 1);  // u * total == cumulative: the next one
  EXPECT_EQ(draw_index(b, 2, 0.2499), 0);
  EXPECT_EQ(draw_index(c, 4, std::nextafter(1.0, 0.0)), 1);
  EXPECT_EQ(draw_index(z, 2, 0.5), 0);  // an all-zero residual: the first
}

TEST(Speculative, ClearErrors) {
  const Model tm = Model::load((kModels / "target.gguf").string());
  const Model other = Model::load((kHf / "llama_gqa").string());  // 320 tokens, not 4096
  Context target(tm, {.n_ctx = 64, .n_batch = 16, .n_outputs = 16, .n_threads = 1});
  Context draft(other, {.n_ctx = 64, .n_threads = 1});
  const std::vector<int32_t> prompt = {1, 2, 3};
  GenerateParams gp;
  auto expect = [&](auto f, const char* needle) {
    try {
      f();
      ADD_FAILURE() << "no error: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect([&] { generate_speculative(target, &draft, prompt, gp, {}, {}); }, "its vocabulary has 320 tokens");
  expect([&] { generate_speculative(target, nullptr, prompt, gp, {}, {}); },
         "needs a draft model or prompt lookup");
  Context narrow(tm, {.n_ctx = 64, .n_batch = 1, .n_threads = 1});
  SpeculativeParams lookup;
  lookup.lookup_ngram = 2;
  expect([&] { generate_speculative(narrow, nullptr, prompt, gp, lookup, {}); },
         "n_batch and n_outputs of at least 2");
}

}  // namespace
