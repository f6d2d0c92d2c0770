// Validation of a batch (Context::Impl::validate): every field of every row is checked before a step writes
// anything, and an error names the row and the field.
#include "core/error.h"
#include "engine/context_impl.h"

namespace ultra {

void Context::Impl::validate(const Batch& b) {
  const int n = b.size();
  if (n == 0) fail("step: the batch is empty");
  if (n > p.n_batch) fail("step: the batch has {} rows, more than the context's n_batch of {}", n, p.n_batch);
  for (int s = 0; s < p.n_slots; ++s) next_pos[s] = seqs.len(s);
  int n_out = 0;
  for (int i = 0; i < n; ++i) {
    const int32_t s = b.seq(i), ps = b.pos(i);
    const RowToken t = b.token(i);
    const Output o = b.output(i);
    if (s < 0 || s >= p.n_slots) fail("step: row {}: sequence {} is out of range [0, {})", i, s, p.n_slots);
    if (t.from == TokenFrom::sampled) {
      if (!sampled.any(s))
        fail("step: row {}: token kSampled, but the last step sampled no token for sequence {}", i, s);
    } else if (t.from == TokenFrom::followed) {
      check_follow(i, t.value, ps);
    } else if (t.from != TokenFrom::id) {
      fail("step: row {}: invalid token source {}", i, (int)t.from);
    } else if (t.value < 0 || t.value >= m.hp.n_vocab) {
      fail("step: row {}: token id {} is out of range [0, {})", i, t.value, m.hp.n_vocab);
    }
    if (ps >= p.n_ctx)
      fail("step: row {}: position {} does not fit: the context holds {} tokens per sequence (raise n_ctx)",
           i, ps, p.n_ctx);
    if (ps != next_pos[s])
      fail(
          "step: row {}: position {} of sequence {} does not continue it: expected {} (the sequence holds "
          "{} tokens)",
          i, ps, s, next_pos[s], seqs.len(s));
    ++next_pos[s];
    if ((uint8_t)o > (uint8_t)Output::verify) fail("step: row {}: invalid output kind {}", i, (int)o);
    if (o == Output::propose || o == Output::verify) check_speculative(b, i);
    if (o != Output::none && ++n_out > p.n_outputs)
      fail("step: the batch asks for more than the context's {} output rows (raise n_outputs)", p.n_outputs);
  }
}

void Context::Impl::check_speculative(const Batch& b, int i) const {
  const char* what = b.output(i) == Output::propose ? "Output::propose" : "Output::verify";
  if (!be->speculative_outputs()) fail("step: row {}: {} needs the GPU backend", i, what);
  const SamplingParams& sp = seqs.sampling(b.seq(i));
  if (sp.temperature > 0.0f &&
      !(sp.top_k >= 1 && sp.top_k <= SamplingParams::kMaxSpeculativeTopK && sp.top_k < n_sample))
    fail("step: row {}: {} needs a greedy sampler or one with top_k in [1, {}] (below {}); it has top_k {}",
         i, what, SamplingParams::kMaxSpeculativeTopK, n_sample, sp.top_k);
  if (b.output(i) == Output::propose) return;
  if (i + 1 >= b.size() || b.seq(i + 1) != b.seq(i))
    fail(
        "step: row {}: Output::verify needs the next row of the batch to continue its sequence (the "
        "proposal)",
        i);
  const RowToken t = b.token(i + 1);
  if (t.from == TokenFrom::sampled)
    fail("step: row {}: Output::verify: the next row's token is kSampled, not a proposal", i);
  if (t.from == TokenFrom::followed) check_followed_proposal(i, t.value, b.pos(i) + 1);
  // A given token: q is the point mass on it (an invalid source is the next row's error).
}

}  // namespace ultra
