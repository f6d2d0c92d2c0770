// The CUDA backend's step inputs and results: per step in flight one pinned host block of inputs and one of
// results, and their device mirrors (one each, same layout), which the step's first kernel reads and its
// last kernel writes (backend_kernels.h copy_kernel), so a captured step carries its own upload and
// download. The host stages a step's rows and sampler rows into the block of its parity and reads the
// results back from it; logits are downloaded on demand into a pinned block of their own.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/step_graphs.h"
#include "engine/backend.h"

namespace ultra::cuda {

// Byte offsets of the step's inputs and results in their blocks (each array 256-byte aligned).
struct StepIoLayout {
  size_t tok, feed, pos, seq, out_row, srow, in_bytes;                          // inputs
  size_t token, logprob, top_token, top_logprob, error, rule_error, out_bytes;  // results
  // The logit rules' block (pinned host memory only, read by logit_rules() over the bus): per output row
  // its mask ([mask_words] u32, 16-byte aligned: ceil(n_vocab / 32) rounded up to 4) at k * mask_words * 4,
  // and from bias_at its biases ([SamplingParams::kMaxLogitBias] RuleBias) at k * kMaxLogitBias.
  size_t mask_words, bias_at, rules_bytes;
  // For steps of up to n_rows rows and n_out output rows, over a vocabulary of n_vocab tokens.
  static StepIoLayout make(int n_rows, int n_out, int n_vocab);
};

// What a step's sampler rows point at besides their jobs (device memory).
struct SamplerSources {
  int32_t* token_log = nullptr;  // [n_slots, n_ctx] the sequences' tokens (penalty windows, verified tokens)
  int n_ctx = 0;
  int max_hist = 0;                            // longest penalty window
  SpecDist* proposals = nullptr;               // [n_slots, kProposalRing] this backend's kept proposals
  const SpecDist* linked_proposals = nullptr;  // the linked backend's, or null (none linked)
};

class StepIo {
 public:
  static constexpr int kInFlight = StepGraphs::kParities;

  // d_in, d_out: the device mirrors, lay.in_bytes and lay.out_bytes of device memory. Allocates the pinned
  // blocks: kInFlight of each (inputs, results, logit rules), and [n_out_cap, n_vocab] floats of logits.
  StepIo(const StepIoLayout& lay, int n_out_cap, int n_vocab, void* d_in, void* d_out);
  ~StepIo();
  StepIo(const StepIo&) = delete;
  StepIo& operator=(const StepIo&) = delete;

  const StepIoLayout& layout() const { return lay_; }
  uint8_t* host_in(int parity) const { return h_in_[parity]; }
  uint8_t* host_out(int parity) const { return h_out_[parity]; }
  uint8_t* dev_in() const { return d_in_; }
  uint8_t* dev_out() const { return d_out_; }
  template <class T>
  T* dev_in(size_t offset) const {
    return reinterpret_cast<T*>(d_in_ + offset);
  }
  template <class T>
  T* dev_out(size_t offset) const {
    return reinterpret_cast<T*>(d_out_ + offset);
  }
  const int32_t* dev_tokens_out() const { return dev_out<const int32_t>(lay_.token); }  // sampled tokens
  cudaEvent_t done(int parity) const { return done_ev_[parity]; }  // recorded after each step's commands

  // Stages the rows (padded to n rows with padding rows: sequence -1) and one sampler row per output (n_out,
  // those without a job skipped) into the input block of parity; the logit rules of the jobs (SampleJob::
  // allow, SamplingParams::logit_bias) and of the Output::logits rows in rules[0, n_rules) into its rules
  // block, n_sample tokens' worth of each mask.
  void stage(int parity, const StepRows& rows, int n, int n_out, const SampleJob* jobs, int n_jobs,
             const LogitsRule* rules, int n_rules, int n_sample, const SamplerSources& src);
  // The sampled tokens, logprobs and top tokens of jobs[0, n_jobs) from the result block of parity (a job
  // with logit rules is non-finite when its logits were before the rules: logit_rules' flag).
  void read_results(int parity, const SampleJob* jobs, int n_jobs, SampleResult* results,
                    TokenLogprob* top) const;
  // Logits of output k ([n_vocab] of d_logits [n_out_cap, n_vocab]), downloaded once per step.
  const float* logits(int k, const float* d_logits, cudaStream_t stream);
  void new_step() { std::fill(logits_ready_.begin(), logits_ready_.end(), 0); }

 private:
  void stage_rules(uint8_t* h, int k, const SamplingParams& sp, const uint32_t* allow, int n_sample,
                   SamplerRow& s) const;

  StepIoLayout lay_;
  size_t n_vocab_;
  std::array<uint8_t*, kInFlight> h_in_{};  // by submission parity
  std::array<uint8_t*, kInFlight> h_out_{};
  std::array<uint8_t*, kInFlight> h_rules_{};  // lay_.rules_bytes each
  uint8_t* d_in_ = nullptr;
  uint8_t* d_out_ = nullptr;
  std::array<cudaEvent_t, kInFlight> done_ev_{};
  float* h_logits_ = nullptr;          // [n_out_cap, n_vocab] pinned, filled on demand
  std::vector<uint8_t> logits_ready_;  // [n_out_cap]
};

}  // namespace ultra::cuda
