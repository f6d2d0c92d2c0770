// The seam between the engine (ultra::Context) and the hardware. A backend owns the device copies of the
// weights (if any), the KV cache, the activations and the logits of a step, and runs one step: the
// forward (model/forward.h) over the rows, then the sampling of the rows that asked for it. The engine
// owns everything about sequences (lengths, tokens, sampler settings) and has validated the step before
// the backend sees it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/error.h"
#include "model/forward.h"
#include "sampling/sampler.h"
#include "ultra/context.h"

namespace ultra {

struct ModelData;

// One row to sample, with everything the sampling function needs (sampling/sampler.h).
struct SampleJob {
  int out = 0;                             // index of the row among the step's outputs
  const SamplingParams* params = nullptr;  // the sequence's settings
  const int32_t* window = nullptr;         // [n_window] penalty window, host memory
  int n_window = 0;
  int64_t position = 0;  // position of the token being drawn (the RNG counter)
  // Speculative decoding (Output::propose / Output::verify; only on backends with speculative_outputs()).
  // propose: keep the row's filtered distribution for position `position` of the row's sequence, in entry
  // position % kProposalRing of its ring. verify: the token at `position` of the row's sequence (the next
  // row's, in the same step) is a proposal, tested against the row's own distribution; its distribution is
  // the linked backend's ring entry of sequence q_src (q_src >= 0) or a point mass on it (q_src < 0).
  Output kind = Output::sample;
  int32_t q_src = -1;
  // A grammar constraint's allowed tokens (bit t of word t / 32), host memory valid for the call that takes
  // the job (submit / step); null: none. With it or a logit bias the backend applies apply_logit_rules() to
  // the row's logits before sampling (the CPU backend on the host, the CUDA backend in the step).
  const uint32_t* allow = nullptr;
};
// An Output::logits row of a sequence with a grammar or a logit bias: the logits it shows get the rules
// too (speculative decoding samples from them on the host).
struct LogitsRule {
  int out = 0;                             // index of the row among the step's outputs
  const SamplingParams* params = nullptr;  // the sequence's settings (logit_bias)
  const uint32_t* allow = nullptr;         // the grammar's mask as in SampleJob::allow, or null
};
// Ring entries of kept proposals per sequence: a verification reads up to K of them (K <= 64).
constexpr int kProposalRing = 64;

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* name() const = 0;
  // Context::backend_description(): the name and what a person may want to know about how it runs.
  virtual std::string description() const { return name(); }
  virtual Footprint footprint() const = 0;

  // Runs the forward over rows (host arrays, valid for the call), leaving the logits of the output rows
  // available through logits(); then samples jobs[0..n_jobs) into results[j] and top[j * kMaxProbs ...].
  // Preconditions (checked by the engine): rows.n <= n_batch, rows.n_out <= n_outputs, every token, pos,
  // seq in range, jobs[j].out < rows.n_out. Allocates nothing. Adds its times to stats.
  virtual void step(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results,
                    TokenLogprob* top, StepStats& stats) = 0;
  // Context::ranks_in_step(): false once a split model's ranks may be at different points of a step (a
  // collective failed, or the step stopped on rank 0 after the other ranks were sent it). True otherwise.
  virtual bool ranks_in_step() const { return true; }

  // Queued steps (Context::submit). An asynchronous backend returns from submit() once the step is
  // enqueued and writes its results into results/top (which stay valid until then) in complete(), which
  // finishes the oldest submitted step; at most two are outstanding. A row of a submitted step fed
  // TokenFeed::prev_output (rows.feed) takes the token sampled for output token[i] of the step submitted just
  // before it, still outstanding: the backend resolves it on the device. A synchronous backend runs the whole
  // step in submit() (it never sees such rows: its rows.feed is null or all TokenFeed::id).
  virtual bool asynchronous() const { return false; }
  virtual void submit(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results,
                      TokenLogprob* top, StepStats& stats) {
    step(rows, jobs, n_jobs, results, top, stats);
  }
  virtual void complete(StepStats& /*stats*/) {}
  // Context::backend_stats(): the statistics this backend keeps of its own (include/ultra/context.h lists
  // the CUDA backend's); valid until the next call.
  virtual std::span<const BackendStat> stats() const { return {}; }

  // Linked contexts (Context::follow): this backend may take a row's token from another backend's state
  // without a host round trip. A row of a submitted step fed TokenFeed::linked_seq takes the token at its
  // position of slot token[i] in the source's device copy of its sequences (written by a step the source has
  // submitted); one fed TokenFeed::linked_output the token of output token[i] of the source's last submitted
  // step. The step waits on the device for the source's last submitted step. link() returns false when the
  // backend cannot do this (the engine then needs the tokens on the host). host_tokens: the source context's
  // host copy of its sequences, [n_slots, n_ctx] (a backend that resolves on the host reads it when the step
  // runs).
  struct LinkSource {
    Backend* backend = nullptr;
    const int32_t* host_tokens = nullptr;
    int n_ctx = 0;
    int n_slots = 0;
  };
  virtual bool link(const LinkSource& /*source*/) { return false; }
  // Output::propose and Output::verify rows (SampleJob::kind), for samplers with 1 <= top_k <= 1024 below
  // the sampled vocabulary or greedy ones.
  virtual bool speculative_outputs() const { return false; }

  // Logits [n_vocab] of output k of the last step, in host memory (a GPU backend copies them on demand).
  virtual const float* logits(int k) = 0;
  // The logit rules of a step's Output::logits rows (LogitsRule). A backend with rules_in_step() takes them
  // before the step (logits_rules(), valid for the next submit() / step() call, which applies them inside
  // the step); the others get apply_rules() for each after the step has run: apply_logit_rules() on output
  // k's logits.
  virtual bool rules_in_step() const { return false; }
  virtual void logits_rules(const LogitsRule* /*rules*/, int /*n*/) {}
  virtual void apply_rules(int /*k*/, const SamplingParams& /*p*/, const uint32_t* /*allow*/) {
    fail("{}: the logit rules of a logits row are applied inside the step (logits_rules)", name());
  }
  // Context::copy_seq: positions [0, n) of slot `from` become those of slot `to` (every layer's K and V, and
  // what else the backend keeps per position: the CUDA backend's token log), ordered after the steps
  // submitted before it and before those submitted after it. The engine checked from != to, both slots in
  // range, n <= the source's length, and that no step is queued. Allocates nothing.
  virtual void copy_kv(int from, int to, int n) = 0;
  // Tests only: fills positions [from, max_ctx) of slot seq in every layer's K and V with NaN, so that a
  // read of any position past a sequence's length shows in its outputs.
  virtual void poison_kv(int seq, int from) = 0;
};

// params: resolved (no zeros left); n_sample: ids below it are sampled. A split model's (ModelData::comm):
// on rank 0 the backend sends its steps to the other ranks; there (tp_follower) it runs them
// (engine/tensor_parallel.h).
std::unique_ptr<Backend> make_cpu_backend(const ModelData& m, const ContextParams& params, int n_sample,
                                          bool tp_follower = false);
// The footprint make_cpu_backend would allocate (computed without allocating; equals footprint() after).
Footprint plan_cpu_backend(const ModelData& m, const ContextParams& params);
// Throws ultra::Error (one line naming the sizes) when that footprint's KV cache and scratch, plus
// engine_bytes, exceed p.mem_limit or else the memory available (MemAvailable).
void check_cpu_memory(const ModelData& m, const ContextParams& p, size_t engine_bytes);
// Only in builds with ULTRA_HAVE_CUDA (src/backend/cuda/cuda_backend.cpp).
std::unique_ptr<Backend> make_cuda_backend(const ModelData& m, const ContextParams& params, int n_sample);

}  // namespace ultra
