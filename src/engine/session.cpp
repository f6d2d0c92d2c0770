#include "engine/session.h"

#include <algorithm>

#include "core/error.h"

namespace ultra {

Session::Session(Backend& backend, int slot) : b_(backend), slot_(slot) {
  if (slot < 0 || slot >= backend.params().n_slots)
    fail("session: slot {} out of range [0, {})", slot, backend.params().n_slots);
}

void Session::check_fits(int n) const {
  if (n <= 0) fail("empty input: at least one token is needed");
  if ((int64_t)n_past() + n > n_ctx())
    fail("the input of {} tokens does not fit: the context holds {} tokens and {} are in use (raise -c)", n,
         n_ctx(), n_past());
}

void Session::throw_outputs(int m) const {
  fail("context was created with n_outputs = {}, a chunk of {} tokens needs one row each",
       b_.params().n_outputs, m);
}

void Session::load_chunk(const int32_t* tokens, int m, bool all_outputs) {
  StepInputs in = b_.inputs();
  const int base = n_past();
  const int n_vocab = b_.n_vocab();
  for (int i = 0; i < m; ++i) {
    if (tokens[i] < 0 || tokens[i] >= n_vocab)
      fail("token id {} is out of range [0, {})", tokens[i], n_vocab);
    in.token[i] = tokens[i];
    in.pos[i] = base + i;
    in.slot[i] = slot_;
  }
  if (all_outputs) {
    for (int i = 0; i < m; ++i) in.out_row[i] = i;
  } else {
    in.out_row[0] = m - 1;
  }
}

const float* Session::prefill(const int32_t* tokens, int n) {
  check_fits(n);
  const int n_batch = b_.params().n_batch;
  for (int done = 0; done < n;) {
    const int m = std::min(n_batch, n - done);
    load_chunk(tokens + done, m, false);
    b_.step(m, 1);
    b_.kv_advance(slot_, m);
    done += m;
  }
  return b_.logits();
}

const float* Session::decode_one(int32_t token) {
  StepInputs in = b_.inputs();
  in.token[0] = token;
  in.pos[0] = n_past();
  in.slot[0] = slot_;
  in.out_row[0] = 0;
  b_.step(1, 1);
  b_.kv_advance(slot_, 1);
  return b_.logits();
}

}  // namespace ultra
