// The generation loop: prefill the prompt, then sample -> deliver -> decode_one until n_predict tokens, an
// end-of-generation token, a full context, or the caller says stop. The loop itself allocates nothing
// (the caller's on_token must not either, for the zero-allocation guarantee).
#pragma once

#include <chrono>
#include <cstdint>

#include "engine/session.h"
#include "sampling/sampler.h"

namespace ultra {

struct GenTimings {
  double prompt_ms = 0;  // prefill
  int n_prompt = 0;
  double eval_ms = 0;  // single-token decode steps
  int n_eval = 0;
  double sample_ms = 0;
  int n_sample = 0;
  bool context_full = false;
};

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// on_token(int32_t token, const float* logits) -> bool: logits [n_vocab] are the ones the token was drawn
// from; return false to stop. Stops after a token equal to eos_id (that token is delivered).
template <class OnToken>
GenTimings generate(Session& s, Sampler& sampler, const int32_t* prompt, int n_prompt, int n_predict,
                    int32_t eos_id, OnToken&& on_token) {
  using clock = std::chrono::steady_clock;
  GenTimings t;
  auto t0 = clock::now();
  for (int i = 0; i < n_prompt; ++i) sampler.accept(prompt[i]);
  const float* logits = s.prefill(prompt, n_prompt);
  t.prompt_ms = ms_since(t0);
  t.n_prompt = n_prompt;
  for (int i = 0; i < n_predict; ++i) {
    t0 = clock::now();
    const int32_t tok = sampler.sample(logits);
    sampler.accept(tok);
    t.sample_ms += ms_since(t0);
    ++t.n_sample;
    if (!on_token(tok, logits)) break;
    if (tok == eos_id || i + 1 == n_predict) break;
    if (s.n_past() >= s.n_ctx()) {
      t.context_full = true;
      break;
    }
    t0 = clock::now();
    logits = s.decode_one(tok);
    t.eval_ms += ms_since(t0);
    ++t.n_eval;
  }
  return t;
}

}  // namespace ultra
