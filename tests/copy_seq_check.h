// Test helper for Context::copy_seq on any backend: a prompt prefilled once in sequence 0 (all but its last
// token) and copied into sequences 1 and 2, which held other tokens (and, on the GPU, token log entries)
// and whose cache past them is poisoned (NaN); then the three feed the prompt's last token and sample
// n_tokens in shared steps. The same is run in fresh one-slot contexts, for comparison.
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include "engine/testing.h"
#include "ultra/context.h"
#include "ultra/generate.h"

namespace ultra::test {

struct CopiedSequences {
  std::vector<int32_t> got[3];   // [sequence] the tokens sampled after the copy (seeds: a, a, b)
  std::vector<int32_t> fresh_a;  // a fresh context's tokens with seed a, from the same prefill
  std::vector<int32_t> fresh_b;  // ... with seed b
  bool tokens_copied = false;    // sequences 1 and 2 held the prompt but its last token after the copy
};

// cp: the context's parameters (n_slots is set: 3, and 1 for the fresh ones).
inline CopiedSequences run_copied_sequences(const Model& m, ContextParams cp,
                                            const std::vector<int32_t>& prompt, const SamplingParams& a,
                                            const SamplingParams& b, int n_tokens) {
  const int L = (int)prompt.size();
  Batch batch(64);
  const auto run = [&](Context& c, const std::vector<int>& seqs) {
    std::vector<std::vector<int32_t>> out(seqs.size());
    std::vector<int> rows;
    batch.clear();
    for (int s : seqs) rows.push_back(batch.add(prompt.back(), L - 1, s, Output::sample));
    for (int k = 0; k < n_tokens; ++k) {
      if (k > 0) {
        batch.clear();
        for (size_t i = 0; i < seqs.size(); ++i)
          rows[i] = batch.add(Batch::kSampled, c.seq_len(seqs[i]), seqs[i], Output::sample);
      }
      c.step(batch);
      for (size_t i = 0; i < seqs.size(); ++i) out[i].push_back(c.sampled(rows[i]));
    }
    return out;
  };
  const auto fresh = [&](const SamplingParams& p) {
    ContextParams one = cp;
    one.n_slots = 1;
    Context c(m, one);
    c.set_sampling(0, p);
    prefill(c, batch, 0, std::span(prompt).first((size_t)L - 1));
    return run(c, {0})[0];
  };
  CopiedSequences r;
  cp.n_slots = 3;
  Context ctx(m, cp);
  ctx.set_sampling(0, a);
  ctx.set_sampling(1, a);
  ctx.set_sampling(2, b);
  const std::vector<int32_t> junk((size_t)L + 4, prompt[2]);
  prefill(ctx, batch, 1, junk);
  prefill(ctx, batch, 2, std::span(junk).first(5));
  ultra::testing::poison_kv_past_length(ctx, 1);
  ultra::testing::poison_kv_past_length(ctx, 2);
  prefill(ctx, batch, 0, std::span(prompt).first((size_t)L - 1));
  ctx.copy_seq(0, 1, L - 1);
  ctx.copy_seq(0, 2, L - 1);
  r.tokens_copied = true;
  for (int s = 1; s < 3; ++s) {
    const auto t = ctx.seq_tokens(s);
    r.tokens_copied =
        r.tokens_copied && (int)t.size() == L - 1 && std::equal(t.begin(), t.end(), prompt.begin());
  }
  const auto got = run(ctx, {0, 1, 2});
  for (int s = 0; s < 3; ++s) r.got[s] = got[(size_t)s];
  r.fresh_a = fresh(a);
  r.fresh_b = fresh(b);
  return r;
}

}  // namespace ultra::test
