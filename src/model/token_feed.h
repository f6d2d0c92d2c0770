// Where a row of a submitted step takes its token from (StepRows::feed; engine/backend.h, "Queued steps" and
// "Linked contexts"). Its own header so that device code (backend/cuda/backend_kernels.cu) can include it.
#pragma once

#include <cstdint>

namespace ultra {

// token[i] of a row holds, by its feed:
enum class TokenFeed : uint8_t {
  id,             // the token id
  prev_output,    // k: the token sampled for output k of the step submitted just before, still outstanding
  linked_seq,     // s: the token at the row's position of slot s in the linked backend's sequences
  linked_output,  // k: the token sampled for output k of the linked backend's last submitted step
};

}  // namespace ultra
