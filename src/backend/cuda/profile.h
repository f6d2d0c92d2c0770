// ULTRA_CUDA_PROFILE=1: the CUDA backend runs every step directly, op by op (no graphs), and times every op
// of a single-row step with a pair of events; a table of microseconds per op and step is printed when the
// backend is destroyed (where decode time goes, and the GPU's idle time between steps). StepProfiler keeps
// the events and the table; ProfiledOps is the decorator that puts a pair of events around each op of
// another ForwardOps.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>
#include <utility>
#include <vector>

#include "model/forward.h"

namespace ultra::cuda {

class StepProfiler {
 public:
  static constexpr int kMaxOps = 1024;  // timed ops per step

  explicit StepProfiler(cudaStream_t stream);  // creates the events
  ~StepProfiler();                             // prints the table, destroys the events
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // A step starts: its ops are timed when record (single-row steps).
  void start_step(bool record) {
    recording_ = record;
    n_ops_ = 0;
  }
  // Events before and after an op (name: static storage). keep = false: the op launched nothing, its pair
  // is dropped.
  void begin(const char* op);
  void end(bool keep = true);
  // After the step's completion: adds its op times and wall_us (its host time) to the table.
  void finish_step(double wall_us);

 private:
  void print() const;

  cudaStream_t stream_;
  std::vector<cudaEvent_t> ev_;                           // [2 * kMaxOps]
  std::vector<const char*> name_;                         // [kMaxOps] op of each event pair
  int n_ops_ = 0;                                         // in the current step
  bool recording_ = false;                                // the current step is a single-row step
  std::vector<std::pair<const char*, double>> total_us_;  // per op name
  std::vector<int> calls_;
  int steps_ = 0;
  double gpu_us_ = 0, wall_us_ = 0;
};

// The ops of `inner`, each between a pair of the profiler's events, named by what it computes.
class ProfiledOps final : public ForwardOps {
 public:
  ProfiledOps(ForwardOps& inner, StepProfiler& prof) : in_(inner), p_(prof) {}

  void embed(const WeightView& table, const int32_t* tokens, int n, float* x) override;
  void rmsnorm(const float* x, const float* w, int n_rows, int dim, float eps, float* out) override;
  void matmul(MatmulOp op, const WeightView& w, const float* x, int n, float* y, const float* bias,
              bool accumulate) override;
  void rope(int il, float* q, int n_heads, float* k, int n_kv_heads, int n, int head_dim, const int32_t* pos,
            bool interleaved) override;
  void kv_write(int il, const float* k, const float* v, int n, const int32_t* pos,
                const int32_t* seq) override;
  void attention(int il, const float* q, int n, int n_heads, const int32_t* pos, const int32_t* seq,
                 float scale, float softcap, int window, float* out) override;
  void attention_sinks(int il, const float* q, int n, int n_heads, const int32_t* pos, const int32_t* seq,
                       float scale, int window, const float* sinks, float* out) override;
  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override;
  void gelu_mul(const float* gate, const float* up, int64_t n, float* out) override;
  void scale(float* x, int64_t n, float s) override;
  void softcap(float* x, int64_t n, float cap) override;
  void norm_add(float* y, const float* w, int n_rows, int dim, float eps, float* x) override;
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
  void moe_route_topk_softmax(const float* logits, int n, int n_expert, int k, int32_t* ids,
                              float* w) override;
  void moe_ffn(int il, const LayerWeights& l, const float* xn, int n, const int32_t* ids, const float* w,
               int k, float* x) override;
  void sigmoid_gate_add(const float* y, const float* gate_w, const float* xn, int n, int dim,
                        float* x) override;

 private:
  // name around f(); f returns void, or bool (false: nothing ran, the pair is dropped).
  template <class F>
  auto timed(const char* name, F&& f) {
    p_.begin(name);
    if constexpr (std::is_void_v<decltype(f())>) {
      f();
      p_.end();
    } else {
      const auto r = f();
      p_.end(r);
      return r;
    }
  }

  ForwardOps& in_;
  StepProfiler& p_;
};

}  // namespace ultra::cuda
