// Test-only hooks into a Context's internals.
#pragma once

#include "ultra/context.h"

namespace ultra::testing {

// Fills every KV position of sequence seq at or past its length with NaN, in every layer, on any backend:
// a step that reads a position it should not (one left over from a longer, cropped sequence) then gives
// NaN logits, which the engine reports as an error.
void poison_kv_past_length(Context& ctx, int seq);

}  // namespace ultra::testing
