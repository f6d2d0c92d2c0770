// Grammar-constrained sampling and logit bias in the engine (Context::set_grammar, SamplingParams::
// logit_bias) on the bundled model: constrained output is a sentence of the grammar (it parses as JSON),
// a constrained and an unconstrained sequence share a step without affecting each other, crop / restore
// roll the constraint back with the sequence, a dead end ends the sequence, bad grammars and biases are
// refused with clear errors, and a -100 bias bans a token.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/testing.h"
#include "sanitized.h"
#include "ultra/context.h"
#include "ultra/generate.h"
#include "ultra/model.h"
#include "ultra/speculative.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

// The bundled model (loaded once) and its tokenizer.
const Model& bundled() {
  static const Model m = Model::load((fs::path(ULTRA_SOURCE_DIR) / "models" / "target.gguf").string());
  return m;
}
const Tokenizer& bundled_tok() {
  return *bundled().tokenizer();
}

// A small JSON object grammar whose sentences are short, so that a model of random taste ends it soon.
const char* kObject =
    R"(root ::= "{\"name\": \"" [a-z]{1,8} "\", \"n\": " [0-9]{1,3} ", \"ok\": " ("true" | "false") "}")";

struct Gen {
  std::vector<int32_t> tokens;
  bool ended = false;  // an end-of-generation token was drawn
};

// Decodes sequences seqs (each after `prompt`) in the same steps, one sample row each, up to n tokens
// each or an end-of-generation token.
std::vector<Gen> generate_together(Context& ctx, const Tokenizer& tk, const std::vector<int>& seqs,
                                   const std::vector<int32_t>& prompt, int n) {
  std::vector<Gen> out(seqs.size());
  std::vector<int> row(seqs.size(), -1);
  Batch b(ctx.params().n_batch);
  for (size_t j = 0; j < seqs.size(); ++j) {
    b.add_sequence(prompt, 0, seqs[j], Output::sample);
    row[j] = b.size() - 1;
  }
  ctx.step(b);
  for (int k = 0; k < n; ++k) {
    b.clear();
    for (size_t j = 0; j < seqs.size(); ++j) {
      if (out[j].ended) continue;
      const int32_t t = ctx.sampled(row[j]);
      if (tk.is_eog(t)) {
        out[j].ended = true;
        continue;
      }
      out[j].tokens.push_back(t);
      row[j] = b.add(t, ctx.seq_len(seqs[j]), seqs[j], Output::sample);
    }
    if (b.empty()) break;
    ctx.step(b);
  }
  return out;
}

// The model's own distribution, seeded.
SamplingParams warm(uint64_t seed) {
  SamplingParams sp;
  sp.temperature = sp.top_p = 1.0f;
  sp.top_k = 0;
  sp.min_p = 0.0f;
  sp.seed = seed;
  return sp;
}

// A context on the bundled model whose sequence 0 samples with warm(seed) under the grammar g.
Context constrained(const char* g, uint64_t seed, int n_ctx) {
  Context ctx(bundled(), {.n_ctx = n_ctx, .n_threads = 2});
  ctx.set_sampling(0, warm(seed));
  ctx.set_grammar(0, g);
  return ctx;
}

// Steps b (one sample row of sequence 0), then feeds each drawn token back, up to n tokens or an
// end-of-generation token; returns the tokens drawn.
std::vector<int32_t> continue_from(Context& ctx, const Tokenizer& tk, Batch& b, int n) {
  std::vector<int32_t> out;
  for (int k = 0; k < n; ++k) {
    ctx.step(b);
    const int32_t t = ctx.sampled(0);
    if (tk.is_eog(t)) break;
    out.push_back(t);
    b.clear();
    b.add(t, ctx.seq_len(0), 0, Output::sample);
  }
  return out;
}

}  // namespace

TEST(GrammarSampling, ConstrainedBesideUnconstrainedInOneStep) {
  const Model& m = bundled();
  const Tokenizer& tk = bundled_tok();
  const std::vector<int32_t> prompt = tk.encode("The weather today is", true, false);
  // Sequence 1 alone, unconstrained: the reference.
  Context solo(m, {.n_ctx = 256, .n_slots = 2, .n_threads = 2});
  solo.set_sampling(1, warm(7));
  const std::vector<Gen> ref = generate_together(solo, tk, {1}, prompt, 60);
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(seed);
    Context ctx(m, {.n_ctx = 256, .n_slots = 2, .n_threads = 2});
    ctx.set_sampling(0, warm(seed));
    ctx.set_sampling(1, warm(7));
    ctx.set_grammar(0, kObject);
    EXPECT_TRUE(ctx.has_grammar(0));
    EXPECT_FALSE(ctx.has_grammar(1));
    const std::vector<Gen> g = generate_together(ctx, tk, {0, 1}, prompt, 60);
    ASSERT_TRUE(g[0].ended) << tk.decode(g[0].tokens);
    const std::string text = tk.decode(g[0].tokens);
    const nlohmann::json j = nlohmann::json::parse(text);  // throws if it is not JSON
    EXPECT_TRUE(j["ok"].is_boolean()) << text;
    EXPECT_TRUE(j["n"].is_number_integer()) << text;
    // The unconstrained sequence drew exactly what it draws alone.
    EXPECT_EQ(g[1].tokens, ref[0].tokens);
  }
}

TEST(GrammarSampling, CropAndRestoreRollTheConstraintBack) {
  const Tokenizer& tk = bundled_tok();
  const std::vector<int32_t> prompt = tk.encode("Data:", true, false);
  Context ctx = constrained(kObject, 11, 256);
  const Gen first = generate_together(ctx, tk, {0}, prompt, 60)[0];
  ASSERT_TRUE(first.ended);
  // Back to the middle of the object, and on again: the same seeded tokens, a valid object again.
  const int keep = (int)prompt.size() + (int)first.tokens.size() / 2;
  ctx.crop(0, keep);
  Batch b(8);
  b.add(first.tokens[keep - prompt.size() - 1], keep - 1, 0, Output::sample);
  ctx.crop(0, keep - 1);
  std::vector<int32_t> again(first.tokens.begin(), first.tokens.begin() + (keep - (int)prompt.size()));
  const std::vector<int32_t> rest = continue_from(ctx, tk, b, 60);
  again.insert(again.end(), rest.begin(), rest.end());
  EXPECT_EQ(again, first.tokens);
  // Below the constraint's start: it starts afresh at the next sample row.
  SeqSnapshot snap = ctx.snapshot(0);
  snap.n_tokens = (int)prompt.size();
  ctx.restore(0, snap);
  b.clear();
  b.add(prompt.back(), (int)prompt.size() - 1, 0, Output::sample);
  ctx.crop(0, (int)prompt.size() - 1);
  EXPECT_EQ(continue_from(ctx, tk, b, 60), first.tokens);
}

TEST(GrammarSampling, DeadEndAndRefusedInputEndTheSequence) {
  const Tokenizer& tk = bundled_tok();
  const std::vector<int32_t> prompt = tk.encode("Say yes:", true, false);
  Context ctx = constrained(R"(root ::= "yes")", 3, 128);
  const Gen g = generate_together(ctx, tk, {0}, prompt, 20)[0];
  EXPECT_TRUE(g.ended);
  EXPECT_EQ(tk.decode(g.tokens), "yes");
  // A token given as input that the grammar refuses: only end-of-generation tokens after it.
  ctx.clear(0);
  ctx.set_grammar(0, R"(root ::= [a-z]+)");
  Batch b(64);
  b.add_sequence(prompt, 0, 0, Output::sample);
  ctx.step(b);
  b.clear();
  const std::vector<int32_t> digits = tk.encode("123", false, false);
  b.add_sequence(digits, ctx.seq_len(0), 0, Output::sample);
  ctx.step(b);
  EXPECT_TRUE(tk.is_eog(ctx.sampled(b.size() - 1)));
}

TEST(GrammarSampling, BadGrammarsAndBiasesAreRefused) {
  const Model& m = bundled();
  Context ctx(m, {.n_ctx = 64, .n_threads = 1});
  try {
    ctx.set_grammar(0, "root ::= \"a\" | (");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 1"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(ctx.has_grammar(0));
  EXPECT_THROW(ctx.set_grammar(1, "root ::= \"a\""), Error);  // no sequence 1
  SamplingParams sp;
  sp.add_logit_bias(ctx.n_sample_vocab(), 1.0f);
  EXPECT_THROW(ctx.set_sampling(0, sp), Error);
  sp.n_logit_bias = 0;
  sp.add_logit_bias(-1, 1.0f);
  EXPECT_THROW(ctx.set_sampling(0, sp), Error);
  sp.n_logit_bias = 0;
  sp.add_logit_bias(0, std::numeric_limits<float>::quiet_NaN());
  EXPECT_THROW(ctx.set_sampling(0, sp), Error);
  sp.n_logit_bias = 0;
  for (int i = 0; i < SamplingParams::kMaxLogitBias; ++i) sp.add_logit_bias(i, 0.5f);
  EXPECT_THROW(sp.add_logit_bias(0, 1.0f), Error);
  EXPECT_NO_THROW(ctx.set_sampling(0, sp));
}

TEST(GrammarSampling, LogitBiasBansAndFavours) {
  const Model& m = bundled();
  const Tokenizer& tk = bundled_tok();
  const std::vector<int32_t> prompt = tk.encode("Once upon a time", true, false);
  Context ctx(m, {.n_ctx = 64, .n_threads = 2});
  ctx.set_sampling(0, SamplingParams::greedy());
  Batch b(64);
  b.add_sequence(prompt, 0, 0, Output::sample);
  ctx.step(b);
  const int32_t best = ctx.sampled(b.size() - 1);
  SamplingParams sp = SamplingParams::greedy();
  sp.add_logit_bias(best, -100.0f);
  ctx.set_sampling(0, sp);
  ctx.crop(0, 0);
  ctx.step(b);
  const int32_t second = ctx.sampled(b.size() - 1);
  EXPECT_NE(second, best);
  sp.n_logit_bias = 0;
  sp.add_logit_bias(42, 1000.0f);
  ctx.set_sampling(0, sp);
  ctx.crop(0, 0);
  ctx.step(b);
  EXPECT_EQ(ctx.sampled(b.size() - 1), 42);
}

// Speculative decoding composes with a constraint: drafts (from an unconstrained draft model, or prompt
// lookup) are fed to the constrained target as input, a draft token the grammar refuses is rejected in
// verification and the crop rolls the constraint back; greedy output equals plain constrained generate().
TEST(GrammarSampling, SpeculativeDecodingKeepsTheConstraint) {
  const Model& m = bundled();
  const Tokenizer& tk = bundled_tok();
  const Model dm = Model::load((fs::path(ULTRA_SOURCE_DIR) / "models" / "draft.gguf").string());
  const char* g = R"(root ::= "[" item ("," item){2,6} "]"
item ::= "{\"k\": " [0-9] ", \"who\": \"" [a-z ]{1,6} "\"}")";
  const std::vector<int32_t> prompt = tk.encode("Once upon a time, the king", true, false);
  GenerateParams gp;
  gp.n_predict = 400;
  auto run = [&](int mode) {  // 0: plain, 1: draft model, 2: prompt lookup
    Context target(m, {.n_ctx = 512, .n_batch = 16, .n_outputs = 16, .n_threads = 2});
    Context draft(dm, {.n_ctx = 512, .n_threads = 1});
    target.set_sampling(0, SamplingParams::greedy());
    target.set_grammar(0, g);
    std::vector<int32_t> out;
    const OnToken keep = [&](int32_t t, Context&, int) {
      if (!tk.is_eog(t)) out.push_back(t);
      return true;
    };
    SpeculativeParams sp;
    sp.n_draft = 4;
    SpeculativeStats st;
    if (mode == 0) {
      generate(target, prompt, gp, keep);
    } else {
      sp.lookup_ngram = mode == 2 ? 2 : 0;
      generate_speculative(target, mode == 1 ? &draft : nullptr, prompt, gp, sp, keep, &st);
      EXPECT_GT(st.rounds, 0);
      EXPECT_LT(st.accepted, st.drafted) << "some drafts are refused";
    }
    return out;
  };
  const std::vector<int32_t> plain = run(0);
  const nlohmann::json j = nlohmann::json::parse(tk.decode(plain), nullptr, false);
  ASSERT_TRUE(j.is_array()) << tk.decode(plain);
  EXPECT_EQ(run(1), plain);
  EXPECT_EQ(run(2), plain);
}

// Sampled speculative rounds on the CPU draw from the target's logits on the host (Output::logits rows):
// those carry the sequence's grammar and logit bias too, so the output stays a sentence of the grammar and
// a banned token never appears.
TEST(GrammarSampling, SampledSpeculativeRoundsKeepTheRules) {
  const Model& m = bundled();
  const Tokenizer& tk = bundled_tok();
  const Model dm = Model::load((fs::path(ULTRA_SOURCE_DIR) / "models" / "draft.gguf").string());
  const std::vector<int32_t> prompt = tk.encode("Once upon a time", true, false);
  const int32_t banned = tk.encode(" the", false, false)[0];
  for (uint64_t seed : {1, 2, 3}) {
    if (test::kSanitized && seed > 1) break;  // one seed under the sanitizers (tests/sanitized.h)
    SCOPED_TRACE(seed);
    Context target(m, {.n_ctx = 256, .n_batch = 16, .n_outputs = 16, .n_threads = 2});
    Context draft(dm, {.n_ctx = 256, .n_threads = 1});
    SamplingParams sp = warm(seed);
    sp.add_logit_bias(banned, -100.0f);
    target.set_sampling(0, sp);
    target.set_grammar(0, kObject);
    std::vector<int32_t> out;
    SpeculativeParams spp;
    spp.n_draft = 4;
    SpeculativeStats st;
    generate_speculative(
        target, &draft, prompt, {.n_predict = 80}, spp,
        [&](int32_t t, Context&, int) {
          if (!tk.is_eog(t)) out.push_back(t);
          return true;
        },
        &st);
    EXPECT_GT(st.drafted, 0);
    const std::string text = tk.decode(out);
    EXPECT_TRUE(nlohmann::json::parse(text, nullptr, false).is_object()) << text;
    EXPECT_EQ(std::count(out.begin(), out.end(), banned), 0);
  }
  // Unconstrained and sampled, the bias alone: the banned token never appears in a long text.
  Context target(m, {.n_ctx = 256, .n_batch = 16, .n_outputs = 16, .n_threads = 2});
  Context draft(dm, {.n_ctx = 256, .n_threads = 1});
  SamplingParams sp = warm(9);
  sp.add_logit_bias(banned, -100.0f);
  target.set_sampling(0, sp);
  std::vector<int32_t> out;
  SpeculativeParams spp;
  spp.n_draft = 4;
  generate_speculative(target, &draft, prompt, {.n_predict = 150}, spp, [&](int32_t t, Context&, int) {
    out.push_back(t);
    return true;
  });
  EXPECT_EQ(std::count(out.begin(), out.end(), banned), 0);
}

// A crop back past the kept states (more than 64 positions) feeds the tokens since the constraint's start
// again; one among them restores a kept state: both regenerate the same seeded tokens.
TEST(GrammarSampling, CropFarBackFeedsTheTokensAgain) {
  const Tokenizer& tk = bundled_tok();
  const std::vector<int32_t> prompt = tk.encode("Letters:", true, false);
  Context ctx = constrained(R"(root ::= ([a-z] [a-z]? " "){100,120})", 5, 512);
  const Gen first = generate_together(ctx, tk, {0}, prompt, 300)[0];
  ASSERT_TRUE(first.ended);
  ASSERT_GT(first.tokens.size(), 100u);
  const int p = (int)prompt.size();
  for (int back : {5, 90}) {  // positions before the end: within the kept states, and past them
    SCOPED_TRACE(back);
    const int keep = p + (int)first.tokens.size() - back;
    ctx.crop(0, keep - 1);
    Batch b(8);
    b.add(first.tokens[keep - 1 - p], keep - 1, 0, Output::sample);
    std::vector<int32_t> again(first.tokens.begin(), first.tokens.begin() + (keep - p));
    const std::vector<int32_t> rest = continue_from(ctx, tk, b, 300);
    again.insert(again.end(), rest.begin(), rest.end());
    EXPECT_EQ(again, first.tokens);
  }
}

// Queued steps on an asynchronous backend (testing::defer_steps runs each step when it is completed, as the
// GPU does), the pattern of a GPU decode loop: each step is submitted before the last one is waited for,
// its rows kSampled. A constrained sequence's mask needs the token the queued step samples, so the context
// completes that step first; masks and biases are the step's own (the backend copies them at submit).
// Sequence 0 (grammar) and 1 (a banned token) draw what plain steps draw; sequence 2's Output::logits rows
// show the grammar's mask (greedy on the host from them gives the plain run's tokens).
TEST(GrammarSampling, QueuedStepsOnAnAsynchronousBackend) {
  const Model& m = bundled();
  const Tokenizer& tk = bundled_tok();
  const std::vector<int32_t> prompt = tk.encode("The weather today is", true, false);
  const int32_t banned = tk.encode(" the", false, false)[0];
  auto run = [&](bool queued) {
    Context ctx(m, {.n_ctx = 256, .n_slots = 3, .n_batch = 32, .n_outputs = 4, .n_threads = 2});
    if (queued) ultra::testing::defer_steps(ctx);
    ctx.set_sampling(0, warm(3));
    SamplingParams sp = warm(4);
    sp.add_logit_bias(banned, -100.0f);
    ctx.set_sampling(1, sp);
    ctx.set_grammar(0, kObject);
    ctx.set_grammar(2, kObject);
    Batch b(32);
    for (int s = 0; s < 3; ++s) b.add_sequence(prompt, 0, s, s == 2 ? Output::logits : Output::sample);
    ctx.step(b);
    int32_t next2 = -1;  // sequence 2's next token, the argmax of its last logits row
    auto argmax2 = [&](int row) {
      const auto l = ctx.logits(row).first(ctx.n_sample_vocab());
      next2 = (int32_t)(std::max_element(l.begin(), l.end()) - l.begin());
    };
    argmax2(b.size() - 1);
    for (int k = 0; k < 80; ++k) {
      b.clear();
      b.add(Batch::kSampled, ctx.seq_len(0), 0, Output::sample);
      b.add(Batch::kSampled, ctx.seq_len(1), 1, Output::sample);
      if (queued) {
        ctx.submit(b);
        if (ctx.n_queued() == 2) ctx.wait();
      } else {
        ctx.step(b);
      }
      if (k % 2 == 1) {  // sequence 2 alone, one logits row, in a plain step (logits() needs no queued step)
        while (ctx.n_queued() > 0) ctx.wait();
        b.clear();
        b.add(next2, ctx.seq_len(2), 2, Output::logits);
        ctx.step(b);
        argmax2(0);
      }
    }
    while (ctx.n_queued() > 0) ctx.wait();
    std::vector<std::vector<int32_t>> out;
    for (int s = 0; s < 3; ++s)
      out.emplace_back(ctx.seq_tokens(s).begin() + (std::ptrdiff_t)prompt.size(), ctx.seq_tokens(s).end());
    out[2].push_back(next2);
    return out;
  };
  const auto plain = run(false), queued = run(true);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(queued[s], plain[s]) << "sequence " << s;
  for (int s : {0, 2}) {  // constrained: a JSON object, then end-of-generation tokens only
    const auto& t = queued[s];
    const auto end = std::find_if(t.begin(), t.end(), [&](int32_t x) { return tk.is_eog(x); });
    ASSERT_NE(end, t.end()) << "sequence " << s << ": " << tk.decode(t);
    const std::string text = tk.decode({t.begin(), end});
    EXPECT_TRUE(nlohmann::json::parse(text, nullptr, false).is_object()) << s << ": " << text;
  }
  EXPECT_EQ(std::count(queued[1].begin(), queued[1].end(), banned), 0);
}
