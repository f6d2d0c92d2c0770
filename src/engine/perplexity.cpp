#include "ultra/perplexity.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace ultra {

void finish_perplexity(PerplexityResult& r) {
  if (r.n_scored <= 0) {
    r.mean_nll = r.ppl = r.ppl_err = 0;
    return;
  }
  const double n = (double)r.n_scored;
  r.mean_nll = r.nll_sum / n;
  r.ppl = std::exp(r.mean_nll);
  const double var = r.nll2_sum / n - r.mean_nll * r.mean_nll;
  r.ppl_err = (r.n_scored > 1 && var > 0) ? r.ppl * std::sqrt(var / (n - 1)) : 0.0;
}

double log_softmax_at(const float* logits, int n_vocab, int32_t token) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int v = 0; v < n_vocab; ++v) mx = std::max(mx, (double)logits[v]);
  double sum = 0;
  for (int v = 0; v < n_vocab; ++v) sum += std::exp((double)logits[v] - mx);
  return ((double)logits[token] - mx) - std::log(sum);
}

PerplexityResult perplexity(Context& ctx, std::span<const int32_t> tokens, const PerplexityParams& p,
                            const PerplexityProgress& progress) {
  using Mode = PerplexityParams::Mode;
  const int64_t n_tok = (int64_t)tokens.size();
  const int n_vocab = ctx.model().info().n_vocab;
  const int seq = p.seq;
  if (n_tok < 2) fail("perplexity needs at least 2 tokens, got {}", n_tok);
  const int min_window = p.mode == Mode::SecondHalf ? 3 : 2;
  if (p.n_window < min_window)
    fail("perplexity window of {} tokens is too small: at least {} are needed{}", p.n_window, min_window,
         p.mode == Mode::SecondHalf ? " (only the second half of a window is scored)" : "");
  if (p.n_window > ctx.params().n_ctx)
    fail("perplexity window of {} tokens is larger than the context of {} tokens", p.n_window,
         ctx.params().n_ctx);
  if (p.bos >= n_vocab || p.bos < -1) fail("BOS id {} is out of range [0, {})", p.bos, n_vocab);
  for (int64_t i = 0; i < n_tok; ++i)
    if (tokens[i] < 0 || tokens[i] >= n_vocab)
      fail("token {} of the input (id {}) is out of range [0, {})", i, tokens[i], n_vocab);

  PerplexityResult r;
  r.n_window = p.n_window;
  if (n_tok < p.n_window) {
    if (!p.allow_short) fail("the input has {} tokens, fewer than one window of {}", n_tok, p.n_window);
    r.short_input = true;
    r.n_window = (int)n_tok;
    if (r.n_window < min_window)
      fail("the input has {} tokens: at least {} are needed to score the second half of a window", n_tok,
           min_window);
  }
  const int W = r.n_window;
  int64_t n_windows = n_tok / W;
  if (p.max_windows > 0) n_windows = std::min<int64_t>(n_windows, p.max_windows);
  r.n_windows = (int)n_windows;
  r.n_dropped = n_tok - n_windows * W;
  const int first = p.mode == Mode::SecondHalf ? W / 2 : 0;  // score positions [first, W-1)
  const int chunk = std::min(W, ctx.params().n_batch);
  if (ctx.params().n_outputs < chunk)
    fail("perplexity: the context was created with n_outputs = {}, a chunk of {} tokens needs one row each",
         ctx.params().n_outputs, chunk);
  Batch batch(chunk);

  std::vector<int32_t> win(W);
  r.running_ppl.reserve(r.n_windows);
  for (int w = 0; w < r.n_windows; ++w) {
    const int32_t* t = tokens.data() + (size_t)w * W;
    std::copy(t, t + W, win.begin());
    if (p.bos >= 0) win[0] = p.bos;
    ctx.clear(seq);
    double nll = 0, nll2 = 0;
    for (int done = 0; done < W; done += chunk) {
      const int m = std::min(chunk, W - done);
      batch.clear();
      for (int r = 0; r < m; ++r) batch.add(win[done + r], done + r, seq, Output::logits);
      ctx.step(batch);
      for (int r = 0; r < m; ++r) {
        const int i = done + r;
        if (i < first || i >= W - 1) continue;
        const double lp = log_softmax_at(ctx.logits(r).data(), n_vocab, t[i + 1]);
        if (!std::isfinite(lp))
          fail("non-finite log-probability at window {} position {} (the logits hold NaN or Inf)", w, i);
        nll -= lp;
        nll2 += lp * lp;
      }
    }
    r.nll_sum += nll;
    r.nll2_sum += nll2;
    r.n_scored += W - 1 - first;
    r.running_ppl.push_back(std::exp(r.nll_sum / (double)r.n_scored));
    if (progress) progress(w, r.n_windows, r.running_ppl.back());
  }
  finish_perplexity(r);
  return r;
}

}  // namespace ultra
