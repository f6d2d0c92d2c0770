// Sampling settings of one sequence (the defaults are llama.cpp's), and the log-probabilities reported with a
// sampled token.
//
// The chain, identical on every backend (llama.cpp's semantics):
//   penalties -> greedy argmax (temperature <= 0) | top-k -> temperature -> softmax -> min-p -> top-p -> draw
//  * Penalties look at the last repeat_last_n tokens of the sequence (0: off; -1: the whole sequence, at
//    most the last 32768 tokens). For each distinct token t there, seen c times:
//      logit = logit > 0 ? logit / repeat_penalty : logit * repeat_penalty;
//      logit -= c * frequency_penalty + presence_penalty;
//  * Greedy: argmax of the penalised logits, ties to the lowest id; top-k/top-p/min-p are ignored.
//  * Otherwise candidates are ordered by (penalised logit desc, id asc); top_k <= 0 keeps all. The kept
//    logits are divided by the temperature and soft-maxed; min-p keeps p >= min_p * p_max; top-p keeps the
//    smallest prefix whose cumulative probability is >= top_p. Each filter keeps at least one token.
//  * Logit bias (OpenAI's logit_bias) is added to the logits first, before the penalties; a bias <= -100
//    bans the token (its logit becomes -infinity), as OpenAI documents -100. A grammar constraint
//    (Context::set_grammar) likewise sets the logits of the tokens it refuses to -infinity first.
//  * The draw is u * total < cumulative probability with u a uniform double from Philox4x32-10 keyed by
//    `seed` and counted by the position of the token being drawn: the output depends only on the seed and
//    the sequence's tokens, so rolling a sequence back and sampling again repeats the same tokens.
#pragma once

#include <cstdint>

namespace ultra {

struct LogitBias {
  int32_t token = 0;
  float bias = 0.0f;  // added to the token's logit; <= -100: banned
};

struct SamplingParams {
  float temperature = 0.8f;     // <= 0: greedy
  int top_k = 40;               // <= 0: all tokens
  float top_p = 0.95f;          // 1: off
  float min_p = 0.05f;          // 0: off
  float repeat_penalty = 1.0f;  // 1: off; divides positive logits, multiplies negative ones
  int repeat_last_n = 64;       // tokens the penalties look back at (0: off, -1: the whole sequence)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0xdeadbeef;
  int n_probs = 0;  // > 0: also report the top n_probs log-probabilities (at most kMaxProbs)
  // Per-token additive biases (logit_bias[0, n_logit_bias)); held inline so that setting and snapshotting
  // a sampler allocates nothing. A token listed twice: the biases add up.
  static constexpr int kMaxLogitBias = 300;  // entries of logit_bias
  int n_logit_bias = 0;
  LogitBias logit_bias[kMaxLogitBias] = {};

  static constexpr int kMaxProbs = 20;
  static constexpr int kMaxSpeculativeTopK = 1024;  // Output::propose / verify rows (context.h)
  static constexpr int kMaxHistory = 32768;         // the window of repeat_last_n = -1

  // Appends a bias; throws ultra::Error when kMaxLogitBias are set already.
  void add_logit_bias(int32_t token, float bias);

  static SamplingParams greedy() {
    SamplingParams p;
    p.temperature = 0.0f;
    return p;
  }

  // Throws ultra::Error naming the first field out of range (NaN, negative temperature or penalty, ...).
  // n_vocab > 0: logit_bias tokens must be below it (Context::set_sampling passes its n_sample_vocab()).
  void validate(int n_vocab = 0) const;
};

struct TokenLogprob {
  int32_t token;
  float logprob;
};

}  // namespace ultra
