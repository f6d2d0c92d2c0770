// Token sampling on the CPU: the function of ultra/sampling.h for one row of logits.
//
// It is stateless: the penalty window (the sequence's last tokens) and the draw's counter (the position of
// the token being drawn) are arguments, so a context can sample any number of rows of any sequences in
// parallel and roll a sequence back without undoing anything. All scratch lives in a SamplerScratch sized
// once; nothing here allocates.
//
// Details beyond ultra/sampling.h:
//  * Candidates are the ids below n_sample (<= n_vocab): ids of a padded embedding table that the
//    tokenizer cannot decode are never drawn, nor reported in logprobs.
//  * Any NaN or infinity among the candidates' logits sets SampleResult::nonfinite (a broken model or
//    overflow, never a valid distribution); the row still returns a token (the argmax of the finite ones).
//  * Greedy logprobs are those of the softmax of the penalised logits at temperature 1.
//  * Sampled: softmax over the kept candidates in float with sums in double; min-p is applied first as an
//    O(V) pre-filter on the logits (l >= l_max + T log(min_p), loosened by a margin), then exactly on the
//    probabilities; top-k by partial selection (O(V + K log K)).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ultra/sampling.h"

namespace ultra {

class SamplerScratch {
 public:
  explicit SamplerScratch(int n_vocab);
  int n_vocab() const { return n_vocab_; }

 private:
  friend struct SamplerImpl;
  struct Candidate {
    float logit;
    int32_t id;
  };
  int n_vocab_;
  std::vector<Candidate> cand_;    // [n_vocab]
  std::vector<float> probs_;       // [n_vocab]
  std::vector<uint32_t> counts_;   // [n_vocab] occurrences in the penalty window; all zero between calls
  std::vector<int32_t> distinct_;  // [min(kMaxHistory, n_vocab)] distinct tokens of the window
  int n_distinct_ = 0;
  double kept_sum_ = 0.0;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;  // of token, under the distribution it was drawn from
  int n_top = 0;         // entries written to `top`
  bool nonfinite = false;
};

// The last tokens of a sequence of n that the penalties look at: [n - W, n) clipped at 0 (empty when
// penalties are off).
std::span<const int32_t> penalty_window(const SamplingParams& p, std::span<const int32_t> tokens);

// Logit bias and a grammar's mask, in place on logits[0, n_sample): tokens not in allow (a bitmask,
// [ceil(n_sample / 32)] words; null: all allowed) and banned ones get -infinity, the others their bias.
// Returns whether any of the logits was not finite before (what sample_row would report as nonfinite).
bool apply_logit_rules(const SamplingParams& p, const uint32_t* allow, float* logits, int n_sample);

// Samples one token from logits [n_vocab] (not modified); candidates are ids < n_sample.
//   window: penalty_window() of the sequence's tokens up to and including the row's own token
//   position: the position the drawn token will occupy (the RNG counter)
//   top: [min(p.n_probs, kMaxProbs)] best first
SampleResult sample_row(const SamplingParams& p, const float* logits, int n_sample,
                        std::span<const int32_t> window, int64_t position, SamplerScratch& s,
                        TokenLogprob* top);

// The filtered, renormalised distribution sample_row draws from, by the same code: the kept candidates
// best first (probability desc, ids ascending on ties) into ids/probs ([n_sample] each, or min(top_k,
// n_sample) when top_k > 0); returns how many (>= 1). Greedy: the argmax with probability 1.
int sample_distribution(const SamplingParams& p, const float* logits, int n_sample,
                        std::span<const int32_t> window, SamplerScratch& s, int32_t* ids, float* probs);

// The draw sample_row makes from a distribution (sample_distribution's probs, or any weights >= 0): the
// first j with u * total < probs[0] + ... + probs[j] (sums in double), else, rounding at the very top, the
// last j with probs[j] != 0 (0 when all are zero). n >= 1; u in [0, 1) (philox_uniform).
int draw_index(const float* probs, int n, double u);

// out[n_vocab] = logits with the window's penalties applied (NaN stays NaN).
void apply_penalties(const SamplingParams& p, const float* logits, std::span<const int32_t> window,
                     SamplerScratch& s, float* out);

// A sampler over one stream of tokens with its own history (tests, simple loops). The RNG counter is the
// number of sample() calls since construction or reset().
class Sampler {
 public:
  static constexpr int kMaxHistory = SamplingParams::kMaxHistory;

  Sampler(const SamplingParams& params, int n_vocab);

  int32_t sample(const float* logits);  // no allocation
  void accept(int32_t token);           // appends to the penalty history (ids outside [0, n_vocab) ignored)
  void reset();                         // clears the history and the counter

  const TokenLogprob* logprobs() const { return top_; }
  int n_logprobs() const { return last_.n_top; }
  float last_logprob() const { return last_.logprob; }
  bool last_nonfinite() const { return last_.nonfinite; }

  int distribution(const float* logits, int32_t* ids, float* probs);
  void apply_penalties(const float* logits, float* out);
  int history_size() const { return (int)window().size(); }

  const SamplingParams& params() const { return params_; }
  int n_vocab() const { return scratch_.n_vocab(); }

 private:
  std::span<const int32_t> window() const;

  SamplingParams params_;
  SamplerScratch scratch_;
  int window_ = 0;                // penalty window (0: off)
  std::vector<int32_t> history_;  // [2 * window_]: the window slides back to the front when full
  int hist_len_ = 0;
  int64_t counter_ = 0;
  SampleResult last_;
  TokenLogprob top_[SamplingParams::kMaxProbs];
};

}  // namespace ultra
