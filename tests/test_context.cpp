// The public engine API: one batched step for any mix of rows, per-sequence samplers, O(1) rollback, and
// validation of every batch field before anything is touched.
//
// References: each sequence run alone in a fresh context (itself checked against HF transformers in
// test_model_fixtures.cpp); the tolerance 1e-5 is f32 reordering noise on logits of magnitude ~1 (the rows
// of a batch go through blocked kernels in different groupings than rows run alone).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <set>

#include <fstream>
#include <nlohmann/json.hpp>

#include "copy_seq_check.h"
#include "engine/model_impl.h"
#include "engine/testing.h"
#include "greedy_util.h"
#include "sampling/sampler.h"
#include "swa_fixture.h"
#include "tmp_dir.h"
#include "ultra/convert.h"
#include "ultra/generate.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kFixture = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "llama_gqa";
const fs::path kBundled = fs::path(ULTRA_SOURCE_DIR) / "models" / "target.gguf";

double max_diff(std::span<const float> a, std::span<const float> b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (double)std::fabs(a[i] - b[i]));
  return d;
}

std::vector<int32_t> random_tokens(int n, int n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = (int32_t)(rng() % (uint32_t)n_vocab);
  return t;
}

// Logits after each of tokens[from..], the sequence alone in a fresh context, one prefill step.
std::vector<std::vector<float>> alone_logits(const Model& m, const std::vector<int32_t>& tokens) {
  Context ctx(m, {.n_ctx = 256, .n_batch = 256, .n_outputs = 256, .n_threads = 2});
  Batch b(256);
  for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], (int32_t)i, 0, Output::logits);
  ctx.step(b);
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto l = ctx.logits((int)i);
    out.emplace_back(l.begin(), l.end());
  }
  return out;
}

std::vector<int32_t> greedy_alone(const Model& m, const std::vector<int32_t>& prompt, int n) {
  Context ctx(m, {.n_ctx = 256, .n_threads = 2});
  return testing_util::greedy_tokens(ctx, prompt, n);
}

// Four sequences in one step: A is in the middle of its prefill (50 tokens already in, a chunk of 100
// rows now), B, C and D decode one token each at positions 37, 5 and 80, their rows placed among A's,
// with output rows scattered over the batch. Each output equals that sequence run alone; then all four
// decode greedily in shared steps (fed with Batch::kSampled) and give the tokens of greedy runs alone.
TEST(Context, MixedStepEqualsEachSequenceAlone) {
  for (const fs::path& path : {kFixture, kBundled}) {
    const Model m = Model::load(path.string());
    const int V = m.info().n_vocab;
    const std::vector<int32_t> A = random_tokens(150, V, 1), B = random_tokens(38, V, 2),
                               C = random_tokens(6, V, 3), D = random_tokens(81, V, 4);
    Context ctx(m, {.n_ctx = 256, .n_slots = 4, .n_batch = 128, .n_outputs = 16, .n_threads = 2});
    for (int s = 0; s < 4; ++s) ctx.set_sampling(s, SamplingParams::greedy());
    Batch b(128);
    // History: A's first 50 tokens, and all but the last token of B, C, D.
    prefill(ctx, b, 0, std::span(A).first(50));
    prefill(ctx, b, 1, std::span(B).first(37));
    prefill(ctx, b, 2, std::span(C).first(5));
    prefill(ctx, b, 3, std::span(D).first(80));

    b.clear();
    struct Want {
      int row, seq, pos;
    };
    std::vector<Want> want;
    for (int i = 50; i < 150; ++i) {
      const bool out = i == 63 || i == 99 || i == 149;
      const int row = b.add(A[i], i, 0, out ? Output::logits : Output::none);
      if (out) want.push_back({row, 0, i});
      if (i == 70) want.push_back({b.add(B[37], 37, 1, Output::sample), 1, 37});
      if (i == 51) want.push_back({b.add(C[5], 5, 2, Output::sample), 2, 5});
      if (i == 120) want.push_back({b.add(D[80], 80, 3, Output::sample), 3, 80});
    }
    ctx.step(b);
    const std::vector<int32_t>* seqs[4] = {&A, &B, &C, &D};
    std::vector<std::vector<float>> ref[4];
    for (int s = 0; s < 4; ++s) ref[s] = alone_logits(m, *seqs[s]);
    for (const Want& w : want) {
      const double d = max_diff(ctx.logits(w.row), ref[w.seq][w.pos]);
      std::printf("[mixed] %s seq %d pos %3d row %3d: max |batched - alone| = %.3g\n",
                  path.filename().c_str(), w.seq, w.pos, w.row, d);
      EXPECT_LT(d, 1e-5) << "seq " << w.seq << " pos " << w.pos;
    }
    for (int s = 0; s < 4; ++s) EXPECT_EQ(ctx.seq_len(s), (int)seqs[s]->size());

    // Greedy continuation of all four in shared steps. B, C and D sampled their first token in the mixed
    // step; A (logits only there) re-runs its last position with a sample.
    std::vector<int32_t> got[4];
    for (const Want& w : want)
      if (w.seq > 0) got[w.seq].push_back(ctx.sampled(w.row));
    ctx.crop(0, 149);
    b.clear();
    b.add(A.back(), 149, 0, Output::sample);
    ctx.step(b);
    got[0].push_back(ctx.sampled(0));
    const int kSteps = 12;
    for (int step = 0; step < kSteps; ++step) {
      b.clear();
      int rows[4];
      for (int s = 3; s >= 0; --s)  // rows in another order than the sequences
        rows[s] = b.add(Batch::kSampled, ctx.seq_len(s), s, Output::sample);
      ctx.step(b);
      for (int s = 0; s < 4; ++s) got[s].push_back(ctx.sampled(rows[s]));
    }
    for (int s = 0; s < 4; ++s) {
      const std::vector<int32_t> want_greedy = greedy_alone(m, *seqs[s], kSteps + 1);
      EXPECT_EQ(got[s], want_greedy) << "sequence " << s << " of " << path.filename();
    }
  }
}

// Snapshot -> sample 8 -> restore -> sample 8 again gives the same tokens; a fresh context with the same
// seed and prompt gives them too; another seed gives others.
TEST(Context, SnapshotRestoreRepeatsSampledTokens) {
  const Model m = Model::load(kBundled.string());
  Context ctx(m, {.n_ctx = 128, .n_slots = 2, .n_threads = 2});
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 0;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  sp.repeat_penalty = 1.3f;
  sp.frequency_penalty = 0.2f;
  sp.seed = 1234;
  ctx.set_sampling(0, sp);
  const std::vector<int32_t> prompt = m.tokenizer()->encode("ROMEO:\nWhat light", true, false);
  Batch b(64);
  // Feeds the last sampled token 8 times, sampling the next each time; returns the tokens fed.
  auto run8 = [&](Context& c, int seq) {
    std::vector<int32_t> out;
    for (int i = 0; i < 8; ++i) {
      b.clear();
      b.add(Batch::kSampled, c.seq_len(seq), seq, Output::sample);
      c.step(b);
      out.push_back(c.seq_tokens(seq).back());
    }
    return out;
  };
  int row = prefill(ctx, b, 0, prompt, Output::sample);
  const int32_t first = ctx.sampled(row);
  const SeqSnapshot snap = ctx.snapshot(0);
  const std::vector<int32_t> a = run8(ctx, 0);
  EXPECT_EQ(a[0], first);
  EXPECT_EQ(ctx.seq_len(0), (int)prompt.size() + 8);
  ctx.restore(0, snap);
  EXPECT_EQ(ctx.seq_len(0), (int)prompt.size());
  // After a restore the last sampled token is forgotten: feed it explicitly, then continue.
  b.clear();
  b.add(first, ctx.seq_len(0), 0, Output::sample);
  ctx.step(b);
  std::vector<int32_t> again = {first};
  for (int i = 0; i < 7; ++i) {
    b.clear();
    b.add(Batch::kSampled, ctx.seq_len(0), 0, Output::sample);
    ctx.step(b);
    again.push_back(ctx.seq_tokens(0).back());
  }
  EXPECT_EQ(again, a);
  std::set<int32_t> distinct(a.begin(), a.end());
  EXPECT_GT(distinct.size(), 3u) << "the sampled tokens should vary";

  // A fresh context, same seed and prompt, in another slot.
  Context fresh(m, {.n_ctx = 128, .n_slots = 2, .n_threads = 1});
  fresh.set_sampling(1, sp);
  row = prefill(fresh, b, 1, prompt, Output::sample);
  EXPECT_EQ(fresh.sampled(row), first);
  EXPECT_EQ(run8(fresh, 1), a);

  // Another seed: another continuation.
  SamplingParams other = sp;
  other.seed = 4321;
  ctx.clear(1);
  ctx.set_sampling(1, other);
  row = prefill(ctx, b, 1, prompt, Output::sample);
  std::vector<int32_t> c = run8(ctx, 1);
  EXPECT_NE(c, a);
}

// copy_seq (tests/copy_seq_check.h): a prompt prefilled once in sequence 0 (all but its last token) is copied
// into sequences 1 and 2, which held other tokens and whose cache past them is poisoned (NaN): each then
// feeds the prompt's last token and samples (penalties on). Sequence 1, with sequence 0's seed, draws
// sequence 0's tokens; sequence 2 draws what a fresh context with its seed draws. Bad copies throw and
// change nothing.
TEST(Context, CopiedSequenceContinuesLikeAFreshPrefill) {
  const Model m = Model::load(kBundled.string());
  const std::vector<int32_t> prompt = m.tokenizer()->encode(
      "ROMEO:\nBut, soft! what light through yonder window breaks? It is the east, and", true, false);
  ASSERT_GT(prompt.size(), 21u);
  SamplingParams sp = SamplingParams::greedy();
  sp.temperature = 1.0f;
  sp.repeat_penalty = 1.3f;
  sp.seed = 1234;
  SamplingParams other = sp;
  other.seed = 99;
  const test::CopiedSequences r =
      test::run_copied_sequences(m, {.n_ctx = 128, .n_threads = 2}, prompt, sp, other, 8);
  EXPECT_TRUE(r.tokens_copied);
  EXPECT_EQ(r.got[1], r.got[0]);
  EXPECT_EQ(r.got[0], r.fresh_a);
  EXPECT_EQ(r.got[2], r.fresh_b);
  EXPECT_NE(r.got[2], r.got[0]);

  // Bad copies: onto itself, longer than the source, a slot out of range, while a step is queued.
  Context ctx(m, {.n_ctx = 64, .n_slots = 2, .n_threads = 2});
  Batch b(64);
  prefill(ctx, b, 0, std::span(prompt).first(10));
  ctx.copy_seq(0, 1, 4);
  EXPECT_THROW(ctx.copy_seq(1, 1, 3), Error);
  EXPECT_THROW(ctx.copy_seq(0, 1, ctx.seq_len(0) + 1), Error);
  EXPECT_THROW(ctx.copy_seq(0, 2, 1), Error);
  EXPECT_THROW(ctx.copy_seq(-1, 1, 1), Error);
  EXPECT_THROW(ctx.copy_seq(0, 1, -1), Error);
  b.clear();
  b.add(prompt[10], ctx.seq_len(0), 0, Output::sample);
  ctx.submit(b);
  EXPECT_THROW(ctx.copy_seq(0, 1, 1), Error);
  ctx.wait();
  EXPECT_EQ(ctx.seq_len(1), 4);
}

// Every malformed field gives an error naming it, and the context is unchanged: lengths, tokens, and the
// KV cache (the next step's logits equal those of a context that never saw the bad batch).
TEST(Context, MalformedBatchesAreRejectedAndWriteNothing) {
  const Model m = Model::load(kFixture.string());
  const int V = m.info().n_vocab;
  const ContextParams cp{.n_ctx = 32, .n_slots = 2, .n_batch = 8, .n_outputs = 2, .n_threads = 1};
  Context ctx(m, cp), clean(m, cp);
  const std::vector<int32_t> hist = {3, 1, 4, 1, 5};
  Batch b(16);
  for (Context* c : {&ctx, &clean}) prefill(*c, b, 0, hist);

  struct Row {
    RowToken token;
    int32_t pos, seq, out;
  };
  struct Case {
    const char* name;
    std::vector<Row> rows;
    const char* needle;
  };
  const RowToken kS = Batch::kSampled;
  const std::vector<Case> cases = {
      {"empty", {}, "empty"},
      {"Batch::follow(5) without a source", {{Batch::follow(5), 5, 0, 0}}, "follows no other"},
      {"token negative", {{-7, 5, 0, 0}}, "token id -7 is out of range"},
      {"token source", {{RowToken((TokenFrom)9, 1), 5, 0, 0}}, "invalid token source 9"},
      {"token too large", {{V, 5, 0, 0}}, "token id 320 is out of range"},
      {"kSampled without a sample", {{kS, 5, 0, 0}}, "kSampled"},
      {"seq negative", {{1, 5, -1, 0}}, "sequence -1 is out of range"},
      {"seq too large", {{1, 0, 2, 0}}, "sequence 2 is out of range"},
      {"pos past n_ctx", {{1, 32, 1, 0}}, "position 32 does not fit"},
      {"pos gap", {{1, 6, 0, 0}}, "expected 5"},
      {"pos rewrites history", {{1, 2, 0, 0}}, "expected 5"},
      {"pos repeated", {{1, 5, 0, 0}, {2, 5, 0, 0}}, "expected 6"},
      {"pos out of order", {{1, 6, 0, 0}, {2, 5, 0, 0}}, "row 0: position 6"},
      {"too many outputs",
       {{1, 5, 0, 1}, {2, 6, 0, 1}, {3, 0, 1, 2}},
       "more than the context's 2 output rows"},
      {"output kind", {{1, 5, 0, 7}}, "invalid output kind 7"},
      {"too many rows", std::vector<Row>(9, Row{1, 0, 1, 0}), "more than the context's n_batch"},
      {"bad row after good rows", {{1, 5, 0, 1}, {2, 0, 1, 2}, {3, 6, 0, 0}, {V + 5, 1, 1, 0}}, "row 3"},
  };
  for (const Case& c : cases) {
    b.clear();
    for (const Row& r : c.rows) b.add(r.token, r.pos, r.seq, (Output)r.out);
    try {
      ctx.step(b);
      ADD_FAILURE() << c.name << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << c.name << ": " << e.what();
    }
    EXPECT_EQ(ctx.seq_len(0), 5) << c.name;
    EXPECT_EQ(ctx.seq_len(1), 0) << c.name;
    EXPECT_TRUE(std::equal(hist.begin(), hist.end(), ctx.seq_tokens(0).begin())) << c.name;
  }
  EXPECT_THROW(Batch(0), Error);
  Batch small(2);
  small.add(1, 0, 0);
  EXPECT_THROW(small.add_sequence(hist, 1, 0), Error);  // does not fit: nothing appended
  EXPECT_EQ(small.size(), 1);

  // The KV cache was not touched: both contexts continue identically, in both slots.
  b.clear();
  b.add(9, 5, 0, Output::logits);
  b.add(9, 0, 1, Output::logits);
  ctx.step(b);
  clean.step(b);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(max_diff(ctx.logits(r), clean.logits(r)), 0.0) << r;
  // Results are only for rows that asked for them.
  EXPECT_THROW(ctx.sampled(0), Error);
  EXPECT_THROW(ctx.logits(2), Error);
  // Bad sampling settings and sequence ids of the sequence calls.
  SamplingParams sp;
  sp.temperature = -1;
  EXPECT_THROW(ctx.set_sampling(0, sp), Error);
  sp = {};
  sp.top_p = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(ctx.set_sampling(0, sp), Error);
  EXPECT_THROW(ctx.set_sampling(2, {}), Error);
  EXPECT_THROW(ctx.seq_len(-1), Error);
  EXPECT_THROW(ctx.restore(0, {7, {}}), Error);  // longer than the sequence
}

// A logit that is NaN stops the step with an error naming the sequence and position.
TEST(Context, NonFiniteLogitsAreAnError) {
  const Model m = Model::load(kFixture.string());
  Context ctx(m, {.n_ctx = 16, .n_threads = 1});
  // Poison the final norm of this loaded model (test-only access to its weights).
  float* norm = const_cast<float*>(detail::impl(m).data->output_norm);
  const float saved = norm[0];
  norm[0] = std::numeric_limits<float>::quiet_NaN();
  Batch b(4);
  b.add(1, 0, 0);
  b.add(2, 1, 0, Output::sample);
  try {
    ctx.step(b);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 0 at position 1 hold NaN"), std::string::npos) << e.what();
  }
  norm[0] = saved;
  b.clear();
  b.add(3, 2, 0, Output::sample);
  ctx.step(b);  // the sequence continues once the weights are sane
  EXPECT_EQ(ctx.seq_len(0), 3);
}

// generate() stops on every end-of-generation id the model declares (an HF eos_token_id list here), not
// only the first.
TEST(Context, GenerateStopsOnEveryEndOfGenerationId) {
  const ultra::test::TmpDir tmp;
  const fs::path d = tmp.path() / "eog";
  fs::create_directories(d);
  fs::copy_file(kFixture / "model.safetensors", d / "model.safetensors");
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(kFixture / "reference.json"));
  const auto prompt = ref["prompt"].get<std::vector<int32_t>>();
  const auto greedy = ref["greedy"].get<std::vector<int32_t>>();  // HF's greedy continuation
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(kFixture / "config.json"));
  // The third greedy token is the second id of the list (the first id never comes up).
  int32_t other = 0;
  while (std::find(greedy.begin(), greedy.end(), other) != greedy.end()) ++other;
  cfg["eos_token_id"] = {other, greedy[2]};
  std::ofstream(d / "config.json") << cfg.dump();
  const Model m = Model::load(d.string());
  EXPECT_TRUE(m.is_eog(other));
  EXPECT_TRUE(m.is_eog(greedy[2]));
  Context ctx(m, {.n_ctx = 64, .n_threads = 1});
  ctx.set_sampling(0, SamplingParams::greedy());
  std::vector<int32_t> got;
  GenerateParams gp;
  gp.n_predict = 10;
  const GenerateResult r = generate(ctx, prompt, gp, [&](int32_t t, Context&, int) {
    got.push_back(t);
    return true;
  });
  EXPECT_TRUE(r.stopped_eog);
  EXPECT_EQ(got, std::vector<int32_t>(greedy.begin(), greedy.begin() + 3));
  gp.ignore_eos = true;
  got.clear();
  generate(ctx, prompt, gp, [&](int32_t t, Context&, int) {
    got.push_back(t);
    return true;
  });
  EXPECT_EQ(got.size(), 10u);
}

// Queued steps (submit / wait, one step ahead) give the tokens of plain steps, on the CPU (submit runs the
// step) and with the steps deferred as a GPU backend runs them (testing::defer_steps: a kSampled token from
// the step still queued is fed by the backend, and the host learns it only when that step is waited for).
// Three sequences: greedy, sampled (temperature, top-k: no penalties, see defer_steps) and a greedy one that
// joins every other step only, so that its kSampled comes from an older, finished step.
TEST(Context, QueuedStepsGiveTheTokensOfPlainSteps) {
  const Model m = Model::load(kFixture.string());
  const int n_vocab = m.info().n_vocab;
  const std::array<std::vector<int32_t>, 3> prompts = {
      random_tokens(7, n_vocab, 1), random_tokens(12, n_vocab, 2), random_tokens(4, n_vocab, 3)};
  SamplingParams sampled;
  sampled.temperature = 0.9f;
  sampled.top_k = 20;
  sampled.seed = 77;
  // mode 0: plain steps; 1: queued, synchronous backend; 2: queued, deferred backend.
  auto run = [&](int mode) {
    Context ctx(m, {.n_ctx = 64, .n_slots = 3, .n_threads = 1});
    if (mode == 2) ultra::testing::defer_steps(ctx);
    EXPECT_EQ(ctx.asynchronous(), mode == 2);
    for (int s = 0; s < 3; ++s) ctx.set_sampling(s, s == 1 ? sampled : SamplingParams::greedy());
    Batch b(16);
    for (int s = 0; s < 3; ++s) {
      b.clear();
      b.add_sequence(prompts[s], 0, s, Output::sample);
      ctx.step(b);
    }
    std::array<std::vector<int32_t>, 3> got;
    for (int i = 0; i < 20; ++i) {
      b.clear();
      for (int s = 0; s < 3; ++s)
        if (s != 2 || i % 2 == 0) b.add(Batch::kSampled, ctx.seq_len(s), s, Output::sample);
      auto record = [&] {  // the rows of the step just waited for
        for (int r = 0; r < 3; ++r)
          if (r < 2 || i % 2 == (mode == 0 ? 0 : 1)) got[r].push_back(ctx.sampled(r));
      };
      if (mode == 0) {
        ctx.step(b);
        record();
      } else {
        ctx.submit(b);
        if (ctx.n_queued() == 2) {
          ctx.wait();  // step i - 1: three rows when i - 1 was even
          record();
        }
      }
    }
    if (mode != 0) {
      ctx.wait();  // step 19: two rows
      for (int r = 0; r < 2; ++r) got[r].push_back(ctx.sampled(r));
    }
    std::array<std::vector<int32_t>, 3> seqs;
    for (int s = 0; s < 3; ++s) seqs[s].assign(ctx.seq_tokens(s).begin(), ctx.seq_tokens(s).end());
    return std::make_pair(got, seqs);
  };
  const auto plain = run(0);
  for (int mode : {1, 2}) {
    const auto q = run(mode);
    for (int s = 0; s < 3; ++s) {
      EXPECT_EQ(q.first[s], plain.first[s]) << "mode " << mode << " sequence " << s;
      EXPECT_EQ(q.second[s], plain.second[s]) << "mode " << mode << " sequence " << s;
    }
  }
  EXPECT_EQ(plain.first[2].size(), 10u);
  EXPECT_EQ(plain.second[0].size(), 7u + 20u);
}

// The queue's rules: at most two steps queued; wait() with none queued, and crop(), logits() and step()
// while steps are queued, are errors that change nothing; a kSampled row whose source step sampled nothing
// is refused at submit(). generate() with lookahead stops where plain steps stop (a step queued past an
// end-of-generation token or a stop from the caller is dropped).
TEST(Context, QueueRulesAndLookahead) {
  const Model m = Model::load(kFixture.string());
  const auto prompt = random_tokens(5, m.info().n_vocab, 9);
  Context ctx(m, {.n_ctx = 64, .n_threads = 1});
  ultra::testing::defer_steps(ctx);
  ctx.set_sampling(0, SamplingParams::greedy());
  Batch b(8);
  b.add_sequence(prompt, 0, 0, Output::sample);
  ctx.submit(b);
  b.clear();
  b.add(Batch::kSampled, 5, 0, Output::logits);  // fed from the queued step; samples nothing itself
  ctx.submit(b);
  EXPECT_EQ(ctx.n_queued(), 2);
  EXPECT_EQ(ctx.seq_len(0), 6);
  EXPECT_EQ(ctx.seq_tokens(0)[5], -1);  // only the backend knows it yet
  b.clear();
  b.add(1, 6, 0);
  EXPECT_THROW(ctx.submit(b), Error);
  EXPECT_THROW(ctx.crop(0, 2), Error);
  EXPECT_THROW(ctx.step(b), Error);
  EXPECT_THROW(ctx.logits(0), Error);
  EXPECT_EQ(ctx.seq_len(0), 6);
  ctx.wait();
  const int32_t first = ctx.sampled(4);  // the prompt's last row
  ctx.wait();
  EXPECT_EQ(ctx.seq_tokens(0)[5], first);
  EXPECT_EQ(ctx.logits(0).size(), (size_t)m.info().n_vocab);
  EXPECT_THROW(ctx.wait(), Error);
  b.clear();
  b.add(Batch::kSampled, 6, 0, Output::sample);  // the last step sampled nothing for sequence 0
  EXPECT_THROW(ctx.submit(b), Error);
  EXPECT_EQ(ctx.n_queued(), 0);

  // generate(): lookahead on the deferred backend against plain steps, stopped by the caller at 5 tokens.
  Context plain(m, {.n_ctx = 64, .n_threads = 1});
  plain.set_sampling(0, SamplingParams::greedy());
  for (Context* c : {&ctx, &plain}) {
    std::vector<int32_t> got;
    GenerateParams gp;
    gp.n_predict = 20;
    gp.ignore_eos = true;
    const GenerateResult r = generate(*c, prompt, gp, [&](int32_t t, Context&, int) {
      got.push_back(t);
      return got.size() < 5;
    });
    EXPECT_TRUE(r.stopped_by_caller);
    EXPECT_EQ(got.size(), 5u);
    EXPECT_EQ(c->seq_len(0), 5 + 4);  // the prompt and the 4 tokens fed back
    EXPECT_EQ(c->n_queued(), 0);
  }
  EXPECT_TRUE(std::equal(ctx.seq_tokens(0).begin(), ctx.seq_tokens(0).end(), plain.seq_tokens(0).begin()));
}

// Context::follow: a context's rows take tokens from another context's sequence (Batch::follow), fed by the
// backends while both are queued, known on the host at once when the source's step has run; and the rules
// that keep the source's state alive until the follower has read it.
TEST(Context, FollowedTokensAndTheirRules) {
  const Model m = Model::load(kFixture.string());
  const auto prompt = random_tokens(5, m.info().n_vocab, 21);
  // Reference: the greedy continuation of the prompt, 3 tokens, then the logits of the 4 rows that score
  // the prompt's last token and the 3 continuations.
  Context plain(m, {.n_ctx = 64, .n_threads = 1});
  plain.set_sampling(0, SamplingParams::greedy());
  Batch b(8);
  b.add_sequence(prompt, 0, 0, Output::sample);
  plain.step(b);
  std::vector<int32_t> cont = {plain.sampled(4)};
  for (int i = 0; i < 2; ++i) {
    b.clear();
    b.add(cont.back(), 5 + i, 0, Output::sample);
    plain.step(b);
    cont.push_back(plain.sampled(0));
  }

  for (const bool queued : {false, true}) {
    Context src(m, {.n_ctx = 64, .n_threads = 1}),
        dst(m, {.n_ctx = 64, .n_slots = 2, .n_outputs = 4, .n_threads = 1});
    if (queued) {
      ultra::testing::defer_steps(src);
      ultra::testing::defer_steps(dst);
    }
    b.clear();
    b.add(Batch::follow(0), 0, 1);
    EXPECT_THROW(dst.submit(b), Error);  // follows nothing yet
    EXPECT_THROW(dst.follow(&dst), Error);
    dst.follow(&src);
    src.set_sampling(0, SamplingParams::greedy());
    dst.set_sampling(1, SamplingParams::greedy());
    b.clear();
    b.add_sequence(prompt, 0, 0, Output::sample);
    src.submit(b);
    b.clear();
    b.add(Batch::kSampled, 5, 0, Output::sample);
    src.submit(b);  // src holds prompt + cont[0] (fed), and has sampled cont[1] for position 6
    // dst's sequence 1: the prompt from src's tokens, then cont[0] (in src's sequence) and cont[1] (one past
    // its end), every row of the last three an output.
    Batch f(8);
    for (int i = 0; i < 7; ++i) f.add(Batch::follow(0), i, 1, i >= 4 ? Output::sample : Output::none);
    if (!queued) {
      dst.step(f);
    } else {
      dst.submit(f);
      EXPECT_EQ(dst.seq_tokens(1)[5], -1);
      b.clear();
      b.add(Batch::kSampled, 6, 0);
      EXPECT_THROW(src.submit(b), Error);  // dst's queued step reads src's state
      EXPECT_THROW(dst.wait(), Error);     // src's steps have not been waited for
      src.wait();
      src.wait();
      dst.wait();
    }
    const auto toks = dst.seq_tokens(1);
    ASSERT_EQ(toks.size(), 7u);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(toks[i], prompt[i]);
    EXPECT_EQ(toks[5], cont[0]);
    EXPECT_EQ(toks[6], cont[1]);
    EXPECT_EQ(dst.sampled(4), cont[0]);
    EXPECT_EQ(dst.sampled(5), cont[1]);
    EXPECT_EQ(dst.sampled(6), cont[2]);
    b.clear();
    b.add(Batch::follow(0), 8, 1);
    EXPECT_THROW(dst.submit(b), Error);  // position 8: past src's end + 1 (and not dst's next position)
    b.clear();
    b.add(Batch::follow(3), 7, 1);
    EXPECT_THROW(dst.submit(b), Error);  // src has one sequence
    b.clear();
    b.add(Batch::follow(-1), 7, 1);
    EXPECT_THROW(dst.submit(b), Error);  // no sequence -1 (not the token last sampled for sequence 1)
    dst.follow(nullptr);
    b.clear();
    b.add(Batch::follow(0), 7, 1);
    EXPECT_THROW(dst.submit(b), Error);  // unlinked
  }
}

// The footprint is checked before anything is allocated: a context that does not fit in the memory
// available (or the given limit) is one clear error; threads past the CPUs available are capped, and a
// context longer than the training context is a warning.
TEST(Context, MemoryThreadsAndContextLengthAreChecked) {
  const Model m = Model::load(kFixture.string());
  try {
    Context ctx(m, {.n_ctx = 1 << 24, .n_slots = 64});  // 2 * 2 layers * 64 slots * 2^24 * 32 floats: 1 TiB
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("of memory is available"), std::string::npos) << e.what();
  }
  try {
    Context ctx(m, {.n_ctx = 64, .mem_limit = 1024});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the limit (--mem-limit) is"), std::string::npos) << e.what();
  }
  Context ok(m, {.n_ctx = 64, .mem_limit = (size_t)1 << 30});
  EXPECT_LE(ok.footprint().kv + ok.footprint().scratch, (size_t)1 << 30);
  Context many(m, {.n_ctx = 64, .n_threads = 1000});
  EXPECT_LT(many.params().n_threads, 1000);
  ASSERT_FALSE(many.warnings().empty());
  EXPECT_NE(many.warnings()[0].find("CPUs"), std::string::npos) << many.warnings()[0];
  Context longer(m, {.n_ctx = m.info().train_ctx * 2});
  ASSERT_FALSE(longer.warnings().empty());
  EXPECT_NE(longer.warnings().back().find("trained with"), std::string::npos);
}

// Mistral's whole-model sliding window (12) shorter than a 40-token prompt runs, on the safetensors path and
// on the GGUF that convert writes. Reference: with 2 layers of window W the last position sees the tokens
// [39 - 2 (W - 1), 39] only, and RoPE is relative, so its logits equal those of the last position of those
// 23 tokens run alone from position 0 (full attention over 40 tokens gives other logits). Positions before
// the window fills equal the unwindowed model's. Decoding token by token after a crop gives the prefill's
// logits (the cache keeps every position; the window is a mask).
TEST(Context, SlidingWindowShorterThanThePrompt) {
  const int W = 12, n = 40, reach = 2 * (W - 1);
  const ultra::test::TmpDir tmp;
  const std::string dir = ultra::test::windowed_mistral(tmp, W);
  const std::string gguf = tmp.file("swa.gguf");
  ConvertOptions f32;
  f32.out_type = "f32";
  convert_hf_to_gguf(dir, gguf, f32);
  const Model full =
      Model::load((fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "mistral").string());
  const auto tokens = random_tokens(n, full.info().n_vocab, 7);
  const auto full_logits = alone_logits(full, tokens);
  const std::vector<int32_t> tail(tokens.end() - (reach + 1), tokens.end());
  for (const std::string& path : {dir, gguf}) {
    SCOPED_TRACE(path);
    const Model m = Model::load(path);
    const auto got = alone_logits(m, tokens);
    for (int i = 0; i < W; ++i) EXPECT_LT(max_diff(got[i], full_logits[i]), 1e-5) << "position " << i;
    EXPECT_GT(max_diff(got[n - 1], full_logits[n - 1]), 1e-2);  // the window changes the later positions
    EXPECT_LT(max_diff(got[n - 1], alone_logits(m, tail).back()), 1e-4);
    // Prefill 40, crop to 25, then one token per step: the same logits.
    Context ctx(m, {.n_ctx = 64, .n_threads = 2});
    EXPECT_TRUE(ctx.warnings().empty());
    Batch b(n);
    for (int i = 0; i < n; ++i) b.add(tokens[i], i, 0, i == n - 1 ? Output::logits : Output::none);
    ctx.step(b);
    EXPECT_LT(max_diff(ctx.logits(n - 1), got[n - 1]), 1e-5);
    ctx.crop(0, 25);
    for (int i = 25; i < n; ++i) {
      b.clear();
      b.add(tokens[i], i, 0, Output::logits);
      ctx.step(b);
      EXPECT_LT(max_diff(ctx.logits(0), got[i]), 1e-5) << "position " << i;
    }
  }
}

// Ids of a padded embedding table that the tokenizer cannot decode are never sampled.
TEST(Context, NeverSamplesPastTheTokenizer) {
  const Model m = Model::load(kBundled.string());
  Context ctx(m, {.n_ctx = 16, .n_threads = 1});
  EXPECT_EQ(ctx.n_sample_vocab(), m.tokenizer()->n_vocab());
  // With a sampler over fewer ids than the logits, the best id past the bound is never chosen.
  const int V = 100;
  std::vector<float> logits(V, 0.0f);
  logits[95] = 50.0f;  // would win, but is past n_sample
  logits[7] = 1.0f;
  SamplerScratch s(V);
  TokenLogprob top[SamplingParams::kMaxProbs];
  SamplingParams g = SamplingParams::greedy();
  g.n_probs = 3;
  EXPECT_EQ(sample_row(g, logits.data(), 90, {}, 0, s, top).token, 7);
  for (int i = 0; i < 3; ++i) EXPECT_LT(top[i].token, 90);
  SamplingParams p;
  p.temperature = 2.0f;
  p.top_k = 0;
  p.min_p = 0;
  p.top_p = 1;
  for (int pos = 0; pos < 200; ++pos) EXPECT_LT(sample_row(p, logits.data(), 90, {}, pos, s, top).token, 90);
}

}  // namespace
