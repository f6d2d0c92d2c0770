// The sequences of a context (its KV cache's slots): per sequence its length (tokens in the cache, a queued
// step's rows included), its tokens by position and its sampler settings. The cache holds data past a
// length too (left by a longer sequence); attention never reads it, so crop is O(1) and touches no data.
// Sized once at construction; nothing here allocates after it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/buffer.h"
#include "ultra/context.h"

namespace ultra {

class Sequences {
 public:
  Sequences() = default;
  Sequences(int n_slots, int n_ctx);  // throws ultra::Error on a bad shape

  int n_slots() const { return n_slots_; }
  int n_ctx() const { return n_ctx_; }

  // Throws "<what>: sequence s is out of range [0, n_slots)" unless 0 <= s < n_slots.
  void check(int s, const char* what) const;

  // Unchecked accessors (the caller checked s; a step's positions were validated).
  int len(int s) const { return len_[s]; }
  void set_len(int s, int n) { len_[s] = n; }
  int32_t* tokens(int s) { return tokens_.data() + (size_t)s * n_ctx_; }  // [n_ctx] by position
  const int32_t* tokens(int s) const { return tokens_.data() + (size_t)s * n_ctx_; }
  std::span<const int32_t> held(int s) const { return {tokens(s), (size_t)len_[s]}; }  // [len(s)]
  const int32_t* token_log() const { return tokens_.data(); }  // [n_slots, n_ctx] every sequence's tokens
  const SamplingParams& sampling(int s) const { return sampling_[s]; }

  // Checked: each throws ultra::Error (naming `what`) before changing anything.
  void set_sampling(int s, const SamplingParams& p);  // validates p
  // Keeps the first n tokens of sequence s: n in [0, len(s)] (a crop never extends).
  void check_crop(int s, int n, const char* what) const;
  void crop(int s, int n);
  SeqSnapshot snapshot(int s) const;
  // A snapshot restores a sequence no longer than now (the positions past it are forgotten) and its
  // sampler settings.
  void check_restore(int s, const SeqSnapshot& snap) const;
  void restore(int s, const SeqSnapshot& snap);

  // The bytes of the token log: [n_slots, n_ctx] int32.
  static size_t token_bytes(int n_slots, int n_ctx) { return (size_t)n_slots * n_ctx * sizeof(int32_t); }

 private:
  int n_slots_ = 0, n_ctx_ = 0;
  std::vector<int> len_;                  // [n_slots]
  Buffer<int32_t> tokens_;                // [n_slots, n_ctx] the tokens, by position (-1: on the device only)
  std::vector<SamplingParams> sampling_;  // [n_slots]
};

}  // namespace ultra
