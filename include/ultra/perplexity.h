// Perplexity of a token sequence, as llama.cpp's `llama-perplexity` computes it, or over every position.
//
// The tokens are split into consecutive non-overlapping windows of n_window tokens (a tail shorter than a
// window is dropped, as llama.cpp does; an input shorter than one window is evaluated as one window of all
// its tokens when allow_short). Each window is evaluated from an empty sequence and the negative
// log-likelihoods -log p(t_{i+1} | t_0..t_i) are summed for i in
//   Mode::SecondHalf:    [n/2, n-1)  (llama.cpp: the model always has at least n/2 tokens of context)
//   Mode::AllPositions:  [0, n-1)    (the plain definition used at training time)
// where n is the window length. With bos >= 0 the first token of each window is replaced by it before
// the window is evaluated (llama.cpp does this when the vocabulary adds BOS); that token is never scored.
//
// log p is computed in double by log-sum-exp over the float logits. The result:
//   mean_nll = sum(nll) / N,  ppl = exp(mean_nll),
//   ppl_err  = ppl * sqrt((mean(nll^2) - mean(nll)^2) / (N - 1))   (llama.cpp's delta-method standard error;
//                                                                  0 when N < 2 or the variance is not > 0)
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "ultra/context.h"

namespace ultra {

struct PerplexityParams {
  enum class Mode { SecondHalf, AllPositions };

  int n_window = 512;            // tokens per window (<= the context's n_ctx)
  Mode mode = Mode::SecondHalf;  // which positions of each window are scored
  int32_t bos = -1;              // >= 0: replaces the first token of each window
  int max_windows = -1;          // > 0: evaluate at most this many windows (llama.cpp's --chunks)
  bool allow_short = true;       // fewer tokens than one window: one window of all of them (else an error)
  int seq = 0;                   // the sequence (KV slot) used; it is cleared before each window
};

struct PerplexityResult {
  double ppl = 0;
  double ppl_err = 0;
  double mean_nll = 0;
  double nll_sum = 0;   // sum of -log p over the scored tokens
  double nll2_sum = 0;  // sum of (-log p)^2
  int64_t n_scored = 0;
  int n_windows = 0;
  int n_window = 0;                 // window length used (the requested one, or all tokens when short)
  bool short_input = false;         // the input was shorter than one requested window
  int64_t n_dropped = 0;            // tail tokens not evaluated
  std::vector<double> running_ppl;  // exp(mean nll) after each window
};

// Called after each window with its index (0-based), the number of windows and the running perplexity.
using PerplexityProgress = std::function<void(int window, int n_windows, double running_ppl)>;

// Evaluates `tokens` in sequence p.seq of the context, which needs n_ctx >= the window and
// n_outputs >= min(window, n_batch). Throws ultra::Error on: fewer than 2 tokens, a window < 2 (< 3 for
// SecondHalf, which scores nothing below that), a window larger than the context, an input shorter than
// the window without allow_short, token ids or bos outside [0, n_vocab), non-finite logits.
PerplexityResult perplexity(Context& ctx, std::span<const int32_t> tokens, const PerplexityParams& p,
                            const PerplexityProgress& progress = {});

// Fills ppl, ppl_err and mean_nll from nll_sum, nll2_sum and n_scored (to combine several runs).
void finish_perplexity(PerplexityResult& r);

// log p(token) under softmax(logits[0..n_vocab)), in double (log-sum-exp).
double log_softmax_at(const float* logits, int n_vocab, int32_t token);

}  // namespace ultra
