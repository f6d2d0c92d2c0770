// The seam between the generation loop and the hardware. A backend owns its weights' device copies (if
// any), its KV cache, its scratch and the input buffers of a step. The step reads everything it needs
// (token ids, positions, slot ids, output rows) from those buffers, so the same step can be replayed (as a
// captured CUDA graph) for every position, and a batch can mix tokens of many slots.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace ultra {

struct ContextParams {
  int n_ctx = 0;      // KV capacity per slot in tokens (0: the model's training context, at most 4096)
  int n_batch = 512;  // most tokens in one step (prefill chunk)
  int n_slots = 1;    // sequences held at once
  int n_threads = 0;  // CPU threads (0: all cores)
  int n_outputs = 0;  // most logits rows one step returns (0: n_slots; n_batch for perplexity/fixtures)
  GgmlType kv_type = GgmlType::F32;
};

// Input buffers of one step, owned by the backend; valid for its lifetime.
struct StepInputs {
  int32_t* token = nullptr;    // [n_batch] token ids
  int32_t* pos = nullptr;      // [n_batch] position of each token in its sequence
  int32_t* slot = nullptr;     // [n_batch] KV slot of each token
  int32_t* out_row = nullptr;  // [n_outputs] batch rows whose logits are wanted
};

struct Footprint {
  size_t weights = 0;  // bytes of weights read by the step
  size_t kv = 0;       // KV cache bytes
  size_t scratch = 0;  // activations, logits, kernel workspaces
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual StepInputs inputs() = 0;
  // Runs n_tokens tokens from inputs(); writes logits of the n_outputs rows named in out_row to logits()
  // [n_outputs, n_vocab]. Precondition (checked by the caller): every pos < n_ctx, slot < n_slots,
  // n_tokens <= n_batch, n_outputs <= the n_outputs limit. Allocates nothing.
  virtual void step(int n_tokens, int n_outputs) = 0;
  virtual const float* logits() const = 0;

  // Sequence length held by a slot's KV cache; crop is O(1) (a counter, the data stays in place).
  virtual int kv_len(int slot) const = 0;
  virtual void kv_crop(int slot, int n) = 0;
  virtual void kv_advance(int slot, int n) = 0;

  virtual const ContextParams& params() const = 0;  // with defaults resolved
  virtual int n_vocab() const = 0;
  virtual Footprint footprint() const = 0;
};

}  // namespace ultra
