// The CUDA backend (Hopper): weights uploaded once, KV cache and every step buffer allocated at context
// creation through one counting allocator, the forward (model/forward.h) over the kernels of kernels.h,
// and the sampler inside the step. Steps of up to 32 rows run as CUDA graphs, one per row bucket (1, 2, 4,
// 8, 16, 32) and one for a full prefill chunk of n_batch rows: the first step of a slot runs directly (module
// loading, cuBLASLt heuristics) and is then captured, with its input upload and result download, so a later
// step is one graph launch and one event synchronisation. Rows are padded to the bucket with padding rows
// (sequence -1) that the kernels skip; positions, sequence ids, tokens and sampler settings are read from
// device memory, so one graph serves every position. Other steps (a prefill chunk shorter than n_batch) run
// directly. Matmuls of more than 32 rows run on cuBLASLt, which allocates host memory in every direct call
// (about 4 allocations per matmul, measured): only captured steps are allocation-free.
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

#include "backend/cuda/kernels.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/tuning.h"
#include "engine/backend.h"
#include "model/model.h"

namespace ultra {

namespace cuda {
struct LinkedTokens;
}

// Device memory of one backend: every allocation goes through here and is counted; all of them happen at
// construction.
class DeviceAllocator {
 public:
  DeviceAllocator() = default;
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  void* alloc(size_t bytes, const char* what);  // 256-byte aligned; throws ultra::Error naming `what`
  template <class T>
  T* alloc_n(size_t n, const char* what) {
    return static_cast<T*>(alloc(n * sizeof(T), what));
  }
  int n_allocs() const { return (int)ptrs_.size(); }
  size_t bytes() const { return bytes_; }
  // cudaMalloc calls made through any DeviceAllocator of this process (tests).
  static long total_calls();

 private:
  std::vector<void*> ptrs_;
  size_t bytes_ = 0;
};

class CudaBackend final : public Backend, private ForwardOps {
 public:
  static constexpr std::array<int, 6> kBuckets = {1, 2, 4, 8, 16, 32};
  static constexpr int kPrefillSlot = (int)kBuckets.size();  // graph of a full n_batch-row prefill chunk

  // tuning: the ULTRA_CUDA_* settings (tuning.h); its process-wide parts set the kernels' switches.
  CudaBackend(const ModelData& model, const ContextParams& params, int n_sample,
              const cuda::CudaTuning& tuning = cuda::read_cuda_tuning());
  ~CudaBackend() override;

  const char* name() const override { return "CUDA"; }
  Footprint footprint() const override;
  void step(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results, TokenLogprob* top,
            StepStats& stats) override;
  bool asynchronous() const override { return !prof_.on; }  // profiling times each step alone
  void submit(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results,
              TokenLogprob* top, StepStats& stats) override;
  void complete(StepStats& stats) override;
  std::span<const BackendStat> stats() const override;  // graph_launches, launch_us, gpu_idle_us, gpu_gaps
  const float* logits(int k) override;
  void poison_kv(int seq, int from) override;
  // On the stream: one cudaMemcpy2DAsync per layer's K and V (kv_copy) and one copy of the token log's
  // positions [0, n).
  void copy_kv(int from, int to, int n) override;
  // Another CUDA backend on this device: its token log and last results, read by this one's steps after a
  // device-side wait for its last submitted step.
  bool link(const LinkSource& source) override;
  bool speculative_outputs() const override { return true; }

  // For tests and benchmarks.
  int n_graphs() const;
  int graph_nodes(int slot) const { return graph_nodes_[slot]; }
  static constexpr int kInFlight = 2;  // outstanding steps
  const DeviceAllocator& allocator() const { return mem_; }
  double last_launch_us() const { return last_launch_us_; }  // host time of the last graph launch call

 private:
  // ForwardOps
  void embed(const WeightView& table, const int32_t* tokens, int n, float* x) override;
  void rmsnorm(const float* x, const float* w, int n_rows, int dim, float eps, float* out) override;
  void matmul(const WeightView& w, const float* x, int n, float* y, const float* bias,
              bool accumulate) override;
  void rope(int il, float* q, int n_heads, float* k, int n_kv_heads, int n, int head_dim, const int32_t* pos,
            bool interleaved) override;
  void kv_write(int il, const float* k, const float* v, int n, const int32_t* pos,
                const int32_t* seq) override;
  void attention(int il, const float* q, int n, int n_heads, const int32_t* pos, const int32_t* seq,
                 float scale, float softcap, int window, float* out) override;
  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override;
  void gelu_mul(const float* gate, const float* up, int64_t n, float* out) override;
  void scale(float* x, int64_t n, float s) override;
  void softcap(float* x, int64_t n, float cap) override;
  void norm_add(float* y, const float* w, int n_rows, int dim, float eps, float* x) override;
  const float* layer_inv_freq(int il) const;  // RoPE table of layer il (sliding-window layers: their own)
  void rope_kv_write(int il, float* q, int n_heads, float* k, const float* v, int n_kv_heads, int n,
                     int head_dim, const int32_t* pos, const int32_t* seq, bool interleaved) override;
  bool silu_matmul(const WeightView& w, const float* gate, const float* up, int n, float* y,
                   bool accumulate) override;
  void qkv(int il, const LayerWeights& l, const float* x, int n, float*& q, float*& k, float*& v) override;
  void gate_up(int il, const LayerWeights& l, const float* x, int n, float*& gate, float*& up) override;
  void gather_rows(const float* x, const int32_t* rows, int n_rows, int dim, float* out) override;
  bool norm_qkv(int il, const LayerWeights& l, const float* x, int n, float eps, float*& q, float*& k,
                float*& v) override;
  bool norm_gate_up(int il, const LayerWeights& l, const float* x, int n, float eps, float*& gate,
                    float*& up) override;
  bool norm_matmul1(const WeightView& w, const float* norm_w, const float* x, const int32_t* row, float eps,
                    float* y) override;
  void moe_router(int il, const LayerWeights& l, const float* xn, int n, float* logits) override;
  void moe_route(float* logits, int n, int n_expert, int k, bool norm, int32_t* ids, float* w) override;
  void moe_ffn(int il, const LayerWeights& l, const float* xn, int n, const int32_t* ids, const float* w,
               int k, float* x) override;
  void sigmoid_gate_add(const float* y, const float* gate_w, const float* xn, int n, int dim,
                        float* x) override;
  // A fused launch's result: true when it ran; false when the kernel does not take the case (nothing
  // launched: the caller runs the ops one by one).
  bool fused(cudaError_t e, const char* what);

  void check(cudaError_t e, const char* what) const;
  void upload_weights();
  // Enqueues one whole step on the stream: upload of the staged inputs, forward over n rows with n_out
  // outputs, sampling of n_out sampler rows (those with logits_row < 0 are skipped), download of results.
  // h_in / h_out: the pinned blocks of the step (one of kInFlight).
  void enqueue(int n, int n_out, bool sample, const cuda::AttentionPlan& plan, const uint8_t* h_in,
               uint8_t* h_out);

  const ModelData& m_;
  ContextParams p_;
  int n_sample_;
  int n_rows_cap_ = 0;  // rows of the step buffers: n_batch
  int n_out_cap_ = 0;   // output rows: max(n_outputs, the largest bucket)
  int max_hist_ = 0;    // longest penalty window
  cuda::DeviceInfo dev_;
  cudaStream_t stream_ = nullptr;
  DeviceAllocator mem_;
  WeightTable w_;                     // views of the device copies
  struct Fused {                      // per layer, for single-row steps (null data: not fusable)
    WeightView qkv;                   // [q_dim + 2 kv_dim, dim] = [Wq; Wk; Wv]
    const float* qkv_bias = nullptr;  // [q_dim + 2 kv_dim] or null
    WeightView gate_up;               // [2 ffn_dim, dim] = [W_gate; W_up]
  };
  std::vector<Fused> fused_;
  // Mixture of experts: per layer, the experts of each kind back to back (moe.h), and the step's scratch.
  struct MoeLayer {
    cuda::ExpertWeights gate, up, down;
    cuda::ExpertWeights router;  // one "expert" of n_expert rows; null data: through matmul
  };
  std::vector<MoeLayer> moe_;                       // [n_layers], empty for a dense model
  std::vector<std::vector<WeightView>> exp_views_;  // [n_layers * 3] device views behind w_'s expert arrays
  cuda::MoeScratch moe_s_;
  float* qkv1_ = nullptr;  // [q_dim + 2 kv_dim] the fused projection of one row
  float* gu1_ = nullptr;   // [2 ffn_dim]
  // [n_layers] each layer's RoPE table (ModelData::layer_rope_inv_freq), device memory
  std::vector<const float*> layer_inv_freq_;
  float rope_mscale_ = 1.0f;      // longrope's attention factor on cos and sin
  std::vector<KvLayerView> kv_;   // [n_layers] the KV cache, device memory in the layout of kv/layout.h
  size_t kv_bytes_ = 0;           // kv_cache_bytes(.., KvMemory::device)
  size_t weight_bytes_ = 0;       // the weights on the device: the model's, plus the low-bit rows' padding
  StepBuffers b_;                 // device
  int32_t* token_log_ = nullptr;  // [n_slots, n_ctx] device copy of the sequences' tokens
  CudaBackend* link_ = nullptr;   // the backend whose tokens this one's steps may read (link())
  cuda::LinkedTokens* d_link_ = nullptr;  // device memory: link_'s token log and result tokens
  cuda::SpecDist* proposals_ = nullptr;   // [n_slots, kProposalRing] Output::propose rows' distributions
  cuda::CudaMatmul mm_;
  cuda::SamplerPlan sampler_plan_;
  void* sampler_ws_ = nullptr;
  void* attn_ws_ = nullptr;
  cuda::AttentionPlan eager_plan_;
  std::array<cuda::AttentionPlan, kBuckets.size()> bucket_plans_;
  const cuda::AttentionPlan* cur_plan_ = nullptr;
  cuda::CudaTuning tune_;  // the ULTRA_CUDA_* settings it was made with: fusions, skipped ops, profile

  // Step inputs and results: one pinned host block and its device mirror each, same layout.
  struct Layout {
    size_t tok, feed, pos, seq, out_row, srow, in_bytes;              // inputs
    size_t token, logprob, top_token, top_logprob, error, out_bytes;  // results
  } lay_{};
  std::array<uint8_t*, kInFlight> h_in_{};  // by submission parity
  uint8_t* d_in_ = nullptr;
  std::array<uint8_t*, kInFlight> h_out_{};
  uint8_t* d_out_ = nullptr;
  std::array<cudaEvent_t, kInFlight> done_ev_{};  // recorded after each step's commands
  struct Outstanding {                            // a submitted step, until complete()
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
  float* h_logits_ = nullptr;                          // [n_out_cap, n_vocab] pinned, filled on demand
  std::vector<uint8_t> logits_ready_;                  // [n_out_cap]

  // ULTRA_CUDA_PROFILE=1: no graphs; every op of a single-row step is timed with events and a table of
  // microseconds per op and step is printed when the backend is destroyed (where decode time goes, and
  // the GPU's idle time between steps).
  struct Profile {
    bool on = false;
    std::vector<cudaEvent_t> ev;                           // [2 * kMaxOps]
    std::vector<const char*> name;                         // [kMaxOps] op of each event pair
    int n_ops = 0;                                         // in the current step
    bool recording = false;                                // the current step is a single-row step
    std::vector<std::pair<const char*, double>> total_us;  // per op name
    std::vector<int> calls;
    int steps = 0;
    double gpu_us = 0, wall_us = 0;
  } prof_;
  static constexpr int kMaxOps = 1024;
  void prof_begin(const char* op);
  void prof_end();
  void print_profile() const;

  // ContextParams::gpu_timing: events before / after the replay of step i in gap_ev_[i % 3] (three, so that
  // completing step i can still read step i - 1's while step i + 1 is submitted).
  cudaEvent_t gap_ev_[3][2]{};
  int64_t gap_prev_ = -1;  // submission index of the last completed replay

  std::array<std::array<cudaGraphExec_t, kBuckets.size() + 1>, kInFlight> graphs_{};  // [parity][slot]
  std::array<int, kBuckets.size() + 1> graph_nodes_{};
  double last_launch_us_ = 0;
  size_t scratch_bytes_ = 0;
  // The backend statistics (Context::backend_stats()), cumulative: replayed steps and the host time of
  // their launches; with gpu_timing, the GPU's idle time between consecutive replays over n_gpu_gaps_.
  int64_t n_graph_launches_ = 0;
  double launch_us_ = 0, gpu_idle_us_ = 0;
  int64_t n_gpu_gaps_ = 0;
  mutable std::array<BackendStat, 4> stats_view_{};
};

}  // namespace ultra
