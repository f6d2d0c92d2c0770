#include "ultra/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace ultra {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int prefill(Context& ctx, Batch& batch, int seq, std::span<const int32_t> tokens, Output last) {
  if (tokens.empty()) fail("prefill: no tokens");
  const size_t chunk = (size_t)std::min(ctx.params().n_batch, batch.capacity());
  for (size_t done = 0; done < tokens.size();) {
    const size_t m = std::min(chunk, tokens.size() - done);
    const bool is_last = done + m == tokens.size();
    batch.clear();
    batch.add_sequence(tokens.subspan(done, m), ctx.seq_len(seq), seq, is_last ? last : Output::none);
    ctx.step(batch);
    done += m;
  }
  return batch.size() - 1;
}

GenerateResult generate(Context& ctx, std::span<const int32_t> prompt, const GenerateParams& gp,
                        const OnToken& on_token) {
  using clock = std::chrono::steady_clock;
  const int seq = gp.seq;
  const int n_ctx = ctx.params().n_ctx, n_batch = ctx.params().n_batch;
  if (prompt.empty()) fail("generate: the prompt is empty (at least one token is needed)");
  if ((int64_t)prompt.size() > n_ctx)
    fail("generate: the prompt of {} tokens does not fit in the context of {} tokens (raise n_ctx)",
         prompt.size(), n_ctx);
  ctx.clear(seq);
  GenerateResult r;
  Batch batch(std::min<int>(n_batch, (int)prompt.size()));
  const double sample0 = ctx.stats().sample_ms;
  const int64_t sampled0 = ctx.stats().n_sampled;

  auto t0 = clock::now();
  int row = prefill(ctx, batch, seq, prompt, Output::sample);
  r.prompt_ms = ms_since(t0);
  r.n_prompt = (int)prompt.size();

  const bool ahead = gp.lookahead && ctx.asynchronous();
  // Lookahead: eval_ms is the wall time from the first decode submit to the last wait (callbacks included:
  // they overlap the device's work).
  auto t_first = clock::now();
  for (int i = 0; i < gp.n_predict; ++i) {
    const int32_t tok = ctx.sampled(row);
    ++r.n_generated;
    // Lookahead: the next step goes to the device before the host looks at this token.
    const int n = ctx.seq_len(seq);
    const bool more = i + 1 < gp.n_predict && n < n_ctx;
    bool queued = false;
    if (ahead && more) {
      if (i == 0) t_first = clock::now();
      batch.clear();
      batch.add(Batch::kSampled, n, seq, Output::sample);
      ctx.submit(batch);
      queued = true;
    }
    auto drop_queued = [&] {  // a step past the end: finish it and forget its row
      if (!queued) return;
      ctx.wait();
      ctx.crop(seq, ctx.seq_len(seq) - 1);
    };
    bool go_on = true;
    if (on_token) {
      try {
        go_on = on_token(tok, ctx, row);
      } catch (...) {
        drop_queued();
        throw;
      }
    }
    if (!go_on) {
      drop_queued();
      r.stopped_by_caller = true;
      break;
    }
    if (!gp.ignore_eos && ctx.model().is_eog(tok)) {
      drop_queued();
      r.stopped_eog = true;
      break;
    }
    if (i + 1 == gp.n_predict) break;
    if (!more) {
      r.context_full = true;
      break;
    }
    t0 = clock::now();
    if (queued) {
      ctx.wait();
      r.eval_ms = ms_since(t_first);
      row = 0;
    } else {
      batch.clear();
      row = batch.add(tok, n, seq, Output::sample);
      ctx.step(batch);
      r.eval_ms += ms_since(t0);
    }
    ++r.n_eval;
  }
  r.sample_ms = ctx.stats().sample_ms - sample0;
  r.n_sample = (int)(ctx.stats().n_sampled - sampled0);
  return r;
}

}  // namespace ultra
