// Token sampler on the CPU. Greedy argmax when temperature <= 0; otherwise the chain
//   penalties -> top-k (partial selection, O(V + K log K)) -> temperature -> softmax over the K kept
//   -> min-p -> top-p -> multinomial draw with a seeded RNG.
// All scratch is sized at construction; sample() and accept() allocate nothing.
#pragma once

#include <cstdint>
#include <vector>

namespace ultra {

struct SamplingParams {
  float temperature = 0.8f;  // <= 0: greedy
  int top_k = 40;            // <= 0 or >= n_vocab: all tokens
  float top_p = 0.95f;       // 1.0: off
  float min_p = 0.05f;       // 0: off
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
  Sampler(const SamplingParams& params, int n_vocab);

  // Picks the next token from logits [n_vocab] (not modified). No allocation.
  int32_t sample(const float* logits);
  // Records a token (prompt or generated) in the penalty history.
  void accept(int32_t token);
  void reset();  // clears history; RNG re-seeded

  // After sample(): top n_probs (token, logprob) of the distribution sampled from (for greedy: of the
  // softmax of the penalised logits at temperature 1), best first.
  const TokenLogprob* logprobs() const { return logprobs_.data(); }
  int n_logprobs() const { return n_logprobs_; }

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  int n_vocab_;
  uint64_t rng_state_[4];
  std::vector<int32_t> history_;  // ring buffer of the last repeat_last_n tokens
  int history_pos_ = 0, history_len_ = 0;
  std::vector<float> work_;         // [n_vocab] penalised logits
  std::vector<int32_t> idx_;        // [n_vocab] candidate ids
  std::vector<float> probs_;        // [n_vocab] kept probabilities
  std::vector<uint32_t> counts_;    // [n_vocab] occurrences in the window (penalties)
  std::vector<TokenLogprob> logprobs_;
  int n_logprobs_ = 0;
};

}  // namespace ultra
