// The generation loop on top of Context::step: prefill the prompt in chunks of n_batch (sampling after its
// last token), then feed each sampled token back one step at a time until n_predict tokens, an
// end-of-generation token (every id the model declares, unless ignore_eos), a full context, or the
// callback says stop. The loop allocates nothing per token.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "ultra/context.h"

namespace ultra {

struct GenerateParams {
  int seq = 0;          // the sequence (KV slot) to use; it is cleared first
  int n_predict = 128;  // most tokens to generate
  bool ignore_eos = false;
  // On an asynchronous backend (Context::asynchronous(): the GPU), queue the next decode step, fed with the
  // token on the device, before handing the current token to on_token, so that the device never waits for
  // the host. A step queued past the end (an end-of-generation token, or on_token saying stop) is waited
  // for and cropped away. ctx.logits(row) refuses to run inside on_token while a step is queued: turn this
  // off to read logits there.
  bool lookahead = true;
};

struct GenerateResult {
  double prompt_ms = 0;  // prefill steps (their sampling included)
  int n_prompt = 0;
  double eval_ms = 0;  // single-token decode steps (their sampling included)
  int n_eval = 0;
  double sample_ms = 0;  // the sampling part of all the steps above
  int n_sample = 0;
  int n_generated = 0;
  bool stopped_eog = false;   // the last token is an end-of-generation id
  bool context_full = false;  // stopped because the sequence filled the context
  bool stopped_by_caller = false;
};

// Appends tokens to sequence seq at its end, in steps of at most min(n_batch, batch.capacity()) rows
// (batch is scratch: cleared and refilled); the last row gets output `last`. Returns that row's index in
// the last step (for ctx.sampled(row) / ctx.logits(row)). Allocates nothing.
int prefill(Context& ctx, Batch& batch, int seq, std::span<const int32_t> tokens, Output last = Output::none);

// Called once per generated token, with the step that produced it: ctx.logprob(row),
// ctx.top_logprobs(row) and (without lookahead) ctx.logits(row) are valid during the call. Return false to
// stop.
using OnToken = std::function<bool(int32_t token, Context& ctx, int row)>;

GenerateResult generate(Context& ctx, std::span<const int32_t> prompt, const GenerateParams& params,
                        const OnToken& on_token);

}  // namespace ultra
