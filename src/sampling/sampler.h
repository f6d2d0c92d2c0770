// Token sampler on the CPU. Greedy argmax when temperature <= 0; otherwise the chain
//   penalties -> top-k (partial selection, O(V + K log K)) -> temperature -> softmax over the K kept
//   -> min-p -> top-p -> multinomial draw with a seeded RNG.
// All scratch is sized at construction; sample() and accept() allocate nothing.
//
// Semantics (llama.cpp-compatible):
//  * Penalties look at the last repeat_last_n accepted tokens (0: off; negative: the whole history, capped
//    at the last kMaxHistory tokens). For each distinct token t in that window, seen c times:
//      logit = logit > 0 ? logit / repeat_penalty : logit * repeat_penalty;
//      logit -= c * frequency_penalty + presence_penalty;
//    Tokens outside [0, n_vocab) passed to accept() are ignored.
//  * Greedy (temperature <= 0 or NaN): argmax of the penalised logits, ties to the lowest id; top-k, top-p,
//    min-p are ignored and the RNG is not used.
//  * Otherwise: candidates are ordered by (penalised logit desc, id asc); NaN logits count as -inf.
//    top_k <= 0 or >= n_vocab keeps all. The kept logits are divided by temperature and soft-maxed
//    (float, sum in double). min-p keeps p >= min_p * p_max; top-p then keeps the smallest prefix whose
//    cumulative probability (renormalised after min-p) is >= top_p (top_p >= 1: off). Each keeps >= 1.
//    Every sample() on this path draws exactly one uniform double in [0, 1) from xoshiro256** (seeded
//    from params.seed through splitmix64), so the stream depends only on the seed and the call count.
#pragma once

#include <cstdint>
#include <vector>

namespace ultra {

struct SamplingParams {
  float temperature = 0.8f;     // <= 0: greedy
  int top_k = 40;               // <= 0 or >= n_vocab: all tokens
  float top_p = 0.95f;          // 1.0: off
  float min_p = 0.05f;          // 0: off
  float repeat_penalty = 1.0f;  // 1.0: off; divides positive logits, multiplies negative ones
  int repeat_last_n = 64;       // window of past tokens the penalties look at (0: off, -1: whole history)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0xdeadbeef;
  int n_probs = 0;  // when > 0, report the top n_probs log-probabilities of the final distribution
};

struct TokenLogprob {
  int32_t token;
  float logprob;
};

class Sampler {
 public:
  // Penalty window used when repeat_last_n < 0 ("whole history"): the last kMaxHistory accepted tokens.
  static constexpr int kMaxHistory = 32768;

  Sampler(const SamplingParams& params, int n_vocab);

  // Picks the next token from logits [n_vocab] (not modified). No allocation.
  int32_t sample(const float* logits);
  // Records a token (prompt or generated) in the penalty history. No allocation.
  void accept(int32_t token);
  void reset();  // clears history; RNG re-seeded

  // After sample(): top n_probs (token, logprob) of the distribution sampled from (for greedy: of the
  // softmax of the penalised logits at temperature 1), best first.
  const TokenLogprob* logprobs() const { return logprobs_.data(); }
  int n_logprobs() const { return n_logprobs_; }

  const SamplingParams& params() const { return params_; }
  int n_vocab() const { return n_vocab_; }

  // --- Inspection helpers (used by tests; no allocation; they neither draw from the RNG nor touch the
  // history or logprobs()) ---

  // The filtered, renormalised distribution that sample() draws from, computed by the same code path:
  // writes the kept candidates best first (probability desc, ties to the lowest id) to ids/probs and
  // returns how many were kept (>= 1). ids and probs must hold n_vocab entries (min(top_k, n_vocab)
  // suffice when 0 < top_k). For greedy: the argmax with probability 1.
  int distribution(const float* logits, int32_t* ids, float* probs);
  // out[n_vocab] = logits with the penalties of the current window applied (NaN stays NaN).
  void apply_penalties(const float* logits, float* out) const;
  // Number of tokens currently in the penalty window.
  int history_size() const { return history_len_; }

 private:
  struct Candidate {
    float logit;
    int32_t id;
  };

  float penalise(float logit, uint32_t count) const;
  void fill_candidates(const float* logits);  // cand_[i] = {penalised logit (NaN -> -inf), i}
  int32_t greedy(const float* logits);        // sets logprobs
  int32_t argmax(const float* logits) const;  // greedy token, one pass
  int build_distribution();  // on cand_ (filled): sorts/filters, writes probs_; returns kept count
  double next_uniform();     // [0, 1)
  uint64_t next_u64();
  void seed_rng();

  SamplingParams params_;
  int n_vocab_;
  uint64_t rng_state_[4];
  bool penalties_on_ = false;
  int window_ = 0;                // ring capacity (0 when penalties are off)
  std::vector<int32_t> history_;  // [window_] ring buffer of the last window_ accepted tokens
  int history_pos_ = 0, history_len_ = 0;
  std::vector<uint32_t> counts_;       // [n_vocab] occurrences in the window (penalties)
  std::vector<int32_t> distinct_;      // [min(window_, n_vocab)] tokens with counts_ > 0
  std::vector<int32_t> distinct_pos_;  // [n_vocab] index of a token in distinct_ (valid if counted)
  int n_distinct_ = 0;
  std::vector<Candidate> cand_;         // [n_vocab] candidates (penalised logit, id)
  std::vector<float> probs_;            // [n_vocab] kept probabilities (unnormalised, then normalised)
  double kept_sum_ = 0.0;               // sum of the unnormalised kept probabilities (for logprobs)
  std::vector<TokenLogprob> logprobs_;  // [min(n_probs, n_vocab)]
  int n_logprobs_ = 0;
};

}  // namespace ultra
