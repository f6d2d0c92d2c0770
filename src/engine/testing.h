// Test-only hooks into a Context's internals.
#pragma once

#include "ultra/context.h"

namespace ultra::testing {

// Fills every KV position of sequence seq at or past its length with NaN, in every layer, on any backend:
// a step that reads a position it should not (one left over from a longer, cropped sequence) then gives
// NaN logits, which the engine reports as an error.
void poison_kv_past_length(Context& ctx, int seq);

// Makes the context's backend asynchronous in the way a GPU backend is, on any backend: submit() only
// records a step, which runs when the engine completes it, with each token fed "on the device" (TokenFeed,
// model/token_feed.h) resolved on the host: output k of the step before, or the followed context's state. It
// exercises the engine's queue and token feed without a GPU. The host's penalty windows of such a step still
// hold -1 where a fed token goes (a GPU backend reads its own copy), so penalties differ from a synchronous
// run: test with penalties off.
void defer_steps(Context& ctx);

}  // namespace ultra::testing
