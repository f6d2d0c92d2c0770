// The CUDA backend (Hopper): the Backend of engine/backend.h over its parts, which it wires together at
// construction:
//   size_plan.h      every buffer's size, from which the memory check, the allocations and footprint() read
//   device_memory.h  the one counting allocator (all device memory is allocated at construction)
//   device_weights.h the weights uploaded once, with fused views for single-row steps
//   cuda_ops.h       the forward (model/forward.h) over the kernels of kernels.h and moe.h
//   step_graphs.h    the captured steps, one graph per (row bucket, parity)
//   step_io.h        the pinned input and result blocks of each step in flight, and their staging
//   profile.h        ULTRA_CUDA_PROFILE's decorator of the ops
// and the sampler inside the step.
//
// Steps of up to 32 rows run as CUDA graphs, one per row bucket (1, 2, 4, 8, 16, 32) and one for a full
// prefill chunk of n_batch rows: the first step of a slot runs directly (module loading, cuBLASLt heuristics)
// and is then captured, with its input upload and result download, so a later step is one graph launch and
// one event synchronisation. Rows are padded to the bucket with padding rows (sequence -1) that the kernels
// skip; positions, sequence ids, tokens and sampler settings are read from device memory, so one graph serves
// every position. Other steps (a prefill chunk shorter than n_batch) run directly. Matmuls of more than 32
// rows run on cuBLASLt, which allocates host memory in every direct call (about 4 allocations per matmul,
// measured): only captured steps are allocation-free.
//
// Steps are asynchronous (Backend::submit / complete): two can be outstanding, each with its own pinned
// input and result blocks (and its own set of graphs, whose IO kernels name them), so the host stages and
// launches step k + 1 while step k runs. A token the previous step sampled is fed on the device: the first
// kernel of a step replaces the token of each row fed TokenFeed::prev_output by output token[i] of the
// previous step's results.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <memory>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/device_weights.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/profile.h"
#include "backend/cuda/size_plan.h"
#include "backend/cuda/step_graphs.h"
#include "backend/cuda/step_io.h"
#include "backend/cuda/tuning.h"
#include "engine/backend.h"
#include "model/model.h"

namespace ultra {

namespace cuda {
struct LinkedTokens;
}

class CudaBackend final : public Backend {
 public:
  static constexpr int kInFlight = cuda::StepIo::kInFlight;  // outstanding steps

  // tuning: the ULTRA_CUDA_* settings (tuning.h); its process-wide parts set the kernels' switches.
  CudaBackend(const ModelData& model, const ContextParams& params, int n_sample,
              const cuda::CudaTuning& tuning = cuda::read_cuda_tuning());
  ~CudaBackend() override;

  const char* name() const override { return "CUDA"; }
  Footprint footprint() const override { return plan_.footprint(); }
  void step(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results, TokenLogprob* top,
            StepStats& stats) override;
  bool asynchronous() const override { return !prof_; }  // profiling times each step alone
  void submit(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results,
              TokenLogprob* top, StepStats& stats) override;
  void complete(StepStats& stats) override;
  std::span<const BackendStat> stats() const override;  // graph_launches, launch_us, gpu_idle_us, gpu_gaps
  const float* logits(int k) override;
  // Grammar masks and logit biases are applied in the step, before the sampler (logit_rules(), reading the
  // masks from the step's pinned rules block), to sampled rows and to Output::logits rows alike.
  bool rules_in_step() const override { return true; }
  void logits_rules(const LogitsRule* rules, int n) override {
    logits_rules_ = rules;
    n_logits_rules_ = n;
  }
  void poison_kv(int seq, int from) override;
  // On the stream: one cudaMemcpy2DAsync per layer's K and V (kv_copy) and one copy of the token log's
  // positions [0, n).
  void copy_kv(int from, int to, int n) override;
  // Another CUDA backend on this device: its token log and last results, read by this one's steps after a
  // device-side wait for its last submitted step.
  bool link(const LinkSource& source) override;
  bool speculative_outputs() const override { return true; }

  // For tests and benchmarks.
  int n_graphs() const { return graphs_.count(); }
  int graph_nodes(int slot) const { return graphs_.nodes(slot); }
  const DeviceAllocator& allocator() const { return mem_; }
  const cuda::CudaSizePlan& size_plan() const { return plan_; }
  double last_launch_us() const { return last_launch_us_; }  // host time of the last graph launch call

 private:
  // Enqueues one whole step on the stream: upload of the staged inputs, forward over n rows with n_out
  // outputs, sampling of n_out sampler rows (those with logits_row < 0 are skipped), download of results.
  // parity: the pinned blocks of the step (one of kInFlight).
  void enqueue(int n, int n_out, bool sample, const cuda::AttentionPlan& plan, int parity);

  const ModelData& m_;
  ContextParams p_;
  int n_sample_;
  cuda::CudaTuning tune_;  // the ULTRA_CUDA_* settings it was made with: fusions, skipped ops, profile
  cuda::DeviceInfo dev_;
  cudaStream_t stream_ = nullptr;
  DeviceAllocator mem_;
  cuda::CudaSizePlan plan_;                       // every buffer's size
  std::unique_ptr<cuda::DeviceWeights> weights_;  // laid out before the plan, uploaded after the check
  StepBuffers b_;                                 // device
  int32_t* token_log_ = nullptr;                  // [n_slots, n_ctx] device copy of the sequences' tokens
  CudaBackend* link_ = nullptr;           // the backend whose tokens this one's steps may read (link())
  cuda::LinkedTokens* d_link_ = nullptr;  // device memory: link_'s token log and result tokens
  cuda::SpecDist* proposals_ = nullptr;   // [n_slots, kProposalRing] Output::propose rows' distributions
  cuda::CudaMatmul mm_;
  cuda::SamplerPlan sampler_plan_;
  void* sampler_ws_ = nullptr;
  cuda::AttentionPlan eager_plan_;
  std::array<cuda::AttentionPlan, cuda::StepGraphs::kBuckets.size()> bucket_plans_;
  cuda::OpsMemory ops_mem_;
  std::unique_ptr<cuda::CudaOps> ops_;
  std::unique_ptr<cuda::StepIo> io_;
  cuda::StepGraphs graphs_;
  const LogitsRule* logits_rules_ = nullptr;  // of the next submitted step's Output::logits rows
  int n_logits_rules_ = 0;
  std::unique_ptr<cuda::StepProfiler> prof_;  // ULTRA_CUDA_PROFILE only
  std::unique_ptr<cuda::ProfiledOps> prof_ops_;

  struct Outstanding {  // a submitted step, until complete()
    const SampleJob* jobs = nullptr;
    int n_jobs = 0;
    SampleResult* results = nullptr;
    TokenLogprob* top = nullptr;
    int parity = 0;
    bool replay = false;
    int64_t index = 0;  // submission count
    std::chrono::steady_clock::time_point t0;
  };
  std::array<Outstanding, kInFlight> out_q_{};
  int n_out_q_ = 0;
  int64_t n_submitted_ = 0;
  std::chrono::steady_clock::time_point last_done_{};  // when the host saw the previous step finish

  // ContextParams::gpu_timing: events before / after the replay of step i in gap_ev_[i % 3] (three, so that
  // completing step i can still read step i - 1's while step i + 1 is submitted).
  cudaEvent_t gap_ev_[3][2]{};
  int64_t gap_prev_ = -1;  // submission index of the last completed replay

  double last_launch_us_ = 0;
  // The backend statistics (Context::backend_stats()), cumulative: replayed steps and the host time of
  // their launches; with gpu_timing, the GPU's idle time between consecutive replays over n_gpu_gaps_.
  int64_t n_graph_launches_ = 0;
  double launch_us_ = 0, gpu_idle_us_ = 0;
  int64_t n_gpu_gaps_ = 0;
  mutable std::array<BackendStat, 4> stats_view_{};
};

}  // namespace ultra
