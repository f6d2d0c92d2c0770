// One sequence in one KV slot of a backend: prefill, single-token decode, O(1) rollback.
// gpt-fast's pipeline, by name: prefill() then decode_one() in a loop; see generate.h.
#pragma once

#include <algorithm>
#include <cstdint>

#include "engine/backend.h"

namespace ultra {

class Session {
 public:
  explicit Session(Backend& backend, int slot = 0);

  Backend& backend() { return b_; }
  int slot() const { return slot_; }
  int n_past() const { return b_.kv_len(slot_); }
  int n_ctx() const { return b_.params().n_ctx; }
  void crop(int n) { b_.kv_crop(slot_, n); }

  // Appends n tokens (n >= 1) in chunks of n_batch and returns the logits [n_vocab] of the last one.
  // Throws ultra::Error when they do not fit in the context. The pointer is valid until the next call.
  const float* prefill(const int32_t* tokens, int n);

  // Like prefill, but hands the logits of every position to on_row(index, logits) (perplexity, fixtures).
  // Needs the context's n_outputs >= min(n, n_batch).
  template <class F>
  void prefill_all(const int32_t* tokens, int n, F&& on_row) {
    check_fits(n);
    const int n_batch = b_.params().n_batch;
    for (int done = 0; done < n;) {
      const int m = std::min(n_batch, n - done);
      const int n_out = std::min(m, b_.params().n_outputs);
      if (n_out < m) throw_outputs(m);
      load_chunk(tokens + done, m, /*all_outputs=*/true);
      b_.step(m, m);
      b_.kv_advance(slot_, m);
      for (int r = 0; r < m; ++r) on_row(done + r, b_.logits() + (size_t)r * b_.n_vocab());
      done += m;
    }
  }

  // Appends one token and returns its logits. Allocation-free. Precondition: n_past() < n_ctx().
  const float* decode_one(int32_t token);

 private:
  void check_fits(int n) const;
  [[noreturn]] void throw_outputs(int m) const;
  void load_chunk(const int32_t* tokens, int m, bool all_outputs);

  Backend& b_;
  int slot_;
};

}  // namespace ultra
