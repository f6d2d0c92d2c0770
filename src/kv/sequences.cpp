#include "kv/sequences.h"

#include "core/error.h"

namespace ultra {

Sequences::Sequences(int n_slots, int n_ctx) : n_slots_(n_slots), n_ctx_(n_ctx) {
  if (n_slots <= 0 || n_ctx <= 0) fail("sequences: {} slots of {} tokens is not a shape", n_slots, n_ctx);
  len_.assign(n_slots, 0);
  tokens_ = Buffer<int32_t>((size_t)n_slots * n_ctx);
  sampling_.assign(n_slots, SamplingParams{});
}

void Sequences::check(int s, const char* what) const {
  if (s < 0 || s >= n_slots_) fail("{}: sequence {} is out of range [0, {})", what, s, n_slots_);
}

void Sequences::set_sampling(int s, const SamplingParams& p) {
  check(s, "set_sampling");
  p.validate();
  sampling_[s] = p;
}

void Sequences::check_crop(int s, int n, const char* what) const {
  check(s, what);
  if (n < 0 || n > len_[s]) fail("{}: sequence {} holds {} tokens, cannot keep {}", what, s, len_[s], n);
}

void Sequences::crop(int s, int n) {
  check_crop(s, n, "crop");
  len_[s] = n;
}

SeqSnapshot Sequences::snapshot(int s) const {
  check(s, "snapshot");
  return {len_[s], sampling_[s]};
}

void Sequences::check_restore(int s, const SeqSnapshot& snap) const {
  check(s, "restore");
  if (snap.n_tokens < 0 || snap.n_tokens > len_[s])
    fail("restore: sequence {} holds {} tokens, the snapshot {}", s, len_[s], snap.n_tokens);
  snap.sampling.validate();
}

void Sequences::restore(int s, const SeqSnapshot& snap) {
  check_restore(s, snap);
  len_[s] = snap.n_tokens;
  sampling_[s] = snap.sampling;
}

}  // namespace ultra
