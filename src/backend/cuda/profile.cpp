#include "backend/cuda/profile.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>

#include "backend/cuda/device_memory.h"

namespace ultra::cuda {

// ---- StepProfiler ----

StepProfiler::StepProfiler(cudaStream_t stream) : stream_(stream), ev_(2 * kMaxOps), name_(kMaxOps) {
  for (cudaEvent_t& ev : ev_) check(cudaEventCreate(&ev), "event creation");
}

StepProfiler::~StepProfiler() {
  print();
  for (cudaEvent_t ev : ev_)
    if (ev) cudaEventDestroy(ev);
}

void StepProfiler::begin(const char* op) {
  if (!recording_ || n_ops_ >= kMaxOps) return;
  name_[n_ops_] = op;
  cudaEventRecord(ev_[2 * n_ops_], stream_);
}

void StepProfiler::end(bool keep) {
  if (!recording_ || n_ops_ >= kMaxOps) return;
  cudaEventRecord(ev_[2 * n_ops_ + 1], stream_);
  if (keep) ++n_ops_;
}

void StepProfiler::finish_step(double wall_us) {
  if (!recording_ || n_ops_ == 0) return;
  for (int i = 0; i < n_ops_; ++i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, ev_[2 * i], ev_[2 * i + 1]);
    size_t k = 0;
    while (k < total_us_.size() && std::strcmp(total_us_[k].first, name_[i]) != 0) ++k;
    if (k == total_us_.size()) {  // the first steps allocate the table; profiling only
      total_us_.push_back({name_[i], 0.0});
      calls_.push_back(0);
    }
    total_us_[k].second += 1e3 * ms;
    ++calls_[k];
  }
  float ms = 0;
  cudaEventElapsedTime(&ms, ev_[0], ev_[2 * n_ops_ - 1]);
  gpu_us_ += 1e3 * ms;
  wall_us_ += wall_us;
  ++steps_;
}

void StepProfiler::print() const {
  if (steps_ == 0) return;
  const double n = steps_;
  fmt::print(stderr, "\nCUDA profile: {} single-row steps, run op by op (no graph), events around every op\n",
             steps_);
  fmt::print(stderr, "{:<26} {:>10} {:>12} {:>8}\n", "op", "calls/step", "us/step", "share");
  double sum = 0;
  for (const auto& t : total_us_) sum += t.second;
  for (size_t k = 0; k < total_us_.size(); ++k)
    fmt::print(stderr, "{:<26} {:>10.1f} {:>12.1f} {:>7.1f}%\n", total_us_[k].first, calls_[k] / n,
               total_us_[k].second / n, 100 * total_us_[k].second / sum);
  fmt::print(stderr, "{:<26} {:>10} {:>12.1f}\n", "sum of ops", "", sum / n);
  fmt::print(stderr, "{:<26} {:>10} {:>12.1f}   (first op start to last op end: gaps between ops included)\n",
             "GPU time per step", "", gpu_us_ / n);
  fmt::print(stderr, "{:<26} {:>10} {:>12.1f}   (host: staging, launches, synchronisation, results)\n",
             "wall time per step", "", wall_us_ / n);
}

// ---- ProfiledOps ----

namespace {

const char* matmul_row_name(MatmulOp op) {
  static constexpr const char* kNames[kMatmulOps] = {"matmul q",
                                                     "matmul k",
                                                     "matmul v",
                                                     "matmul o (+ residual)",
                                                     "matmul gate",
                                                     "matmul up",
                                                     "matmul down (+ residual)",
                                                     "matmul lm_head",
                                                     "matmul router",
                                                     "matmul gate_shexp",
                                                     "matmul up_shexp",
                                                     "matmul down_shexp"};
  return kNames[(int)op];
}

}  // namespace

void ProfiledOps::embed(const WeightView& table, const int32_t* tokens, int n, float* x) {
  timed("embed", [&] { in_.embed(table, tokens, n, x); });
}
void ProfiledOps::rmsnorm(const float* x, const float* w, int n_rows, int dim, float eps, float* out) {
  timed("rmsnorm", [&] { in_.rmsnorm(x, w, n_rows, dim, eps, out); });
}
void ProfiledOps::matmul(MatmulOp op, const WeightView& w, const float* x, int n, float* y, const float* bias,
                         bool accumulate) {
  timed(matmul_row_name(op), [&] { in_.matmul(op, w, x, n, y, bias, accumulate); });
}
void ProfiledOps::rope(int il, float* q, int n_heads, float* k, int n_kv_heads, int n, int head_dim,
                       const int32_t* pos, bool interleaved) {
  timed("rope", [&] { in_.rope(il, q, n_heads, k, n_kv_heads, n, head_dim, pos, interleaved); });
}
void ProfiledOps::kv_write(int il, const float* k, const float* v, int n, const int32_t* pos,
                           const int32_t* seq) {
  timed("kv_write", [&] { in_.kv_write(il, k, v, n, pos, seq); });
}
void ProfiledOps::attention(int il, const float* q, int n, int n_heads, const int32_t* pos,
                            const int32_t* seq, float scale, float softcap, int window, float* out) {
  timed("attention", [&] { in_.attention(il, q, n, n_heads, pos, seq, scale, softcap, window, out); });
}
void ProfiledOps::attention_sinks(int il, const float* q, int n, int n_heads, const int32_t* pos,
                                  const int32_t* seq, float scale, int window, const float* sinks,
                                  float* out) {
  timed("attention", [&] { in_.attention_sinks(il, q, n, n_heads, pos, seq, scale, window, sinks, out); });
}
void ProfiledOps::silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  timed("silu_mul", [&] { in_.silu_mul(gate, up, n, out); });
}
void ProfiledOps::gelu_mul(const float* gate, const float* up, int64_t n, float* out) {
  timed("gelu_mul", [&] { in_.gelu_mul(gate, up, n, out); });
}
void ProfiledOps::scale(float* x, int64_t n, float s) {
  timed("scale", [&] { in_.scale(x, n, s); });
}
void ProfiledOps::softcap(float* x, int64_t n, float cap) {
  timed("softcap", [&] { in_.softcap(x, n, cap); });
}
void ProfiledOps::norm_add(float* y, const float* w, int n_rows, int dim, float eps, float* x) {
  timed("rmsnorm + add", [&] { in_.norm_add(y, w, n_rows, dim, eps, x); });
}
void ProfiledOps::rope_kv_write(int il, float* q, int n_heads, float* k, const float* v, int n_kv_heads,
                                int n, int head_dim, const int32_t* pos, const int32_t* seq,
                                bool interleaved) {
  timed("rope + kv_write",
        [&] { in_.rope_kv_write(il, q, n_heads, k, v, n_kv_heads, n, head_dim, pos, seq, interleaved); });
}
bool ProfiledOps::silu_matmul(const WeightView& w, const float* gate, const float* up, int n, float* y,
                              bool accumulate) {
  return timed("silu_mul + matmul down (+ residual, fused)",
               [&] { return in_.silu_matmul(w, gate, up, n, y, accumulate); });
}
void ProfiledOps::qkv(int il, const LayerWeights& l, const float* x, int n, float*& q, float*& k, float*& v) {
  timed("matmul qkv", [&] { in_.qkv(il, l, x, n, q, k, v); });
}
void ProfiledOps::gate_up(int il, const LayerWeights& l, const float* x, int n, float*& gate, float*& up) {
  timed("matmul gate_up", [&] { in_.gate_up(il, l, x, n, gate, up); });
}
void ProfiledOps::gather_rows(const float* x, const int32_t* rows, int n_rows, int dim, float* out) {
  timed("gather_rows", [&] { in_.gather_rows(x, rows, n_rows, dim, out); });
}
bool ProfiledOps::norm_qkv(int il, const LayerWeights& l, const float* x, int n, float eps, float*& q,
                           float*& k, float*& v) {
  return timed("rmsnorm + matmul qkv (fused)", [&] { return in_.norm_qkv(il, l, x, n, eps, q, k, v); });
}
bool ProfiledOps::norm_gate_up(int il, const LayerWeights& l, const float* x, int n, float eps, float*& gate,
                               float*& up) {
  return timed("rmsnorm + matmul gate_up (fused)",
               [&] { return in_.norm_gate_up(il, l, x, n, eps, gate, up); });
}
bool ProfiledOps::norm_matmul1(const WeightView& w, const float* norm_w, const float* x, const int32_t* row,
                               float eps, float* y) {
  return timed("gather + rmsnorm + matmul lm_head (fused)",
               [&] { return in_.norm_matmul1(w, norm_w, x, row, eps, y); });
}
void ProfiledOps::moe_router(int il, const LayerWeights& l, const float* xn, int n, float* logits) {
  timed("moe router", [&] { in_.moe_router(il, l, xn, n, logits); });
}
void ProfiledOps::moe_route(float* logits, int n, int n_expert, int k, bool norm, int32_t* ids, float* w) {
  timed("moe route", [&] { in_.moe_route(logits, n, n_expert, k, norm, ids, w); });
}
void ProfiledOps::moe_route_topk_softmax(const float* logits, int n, int n_expert, int k, int32_t* ids,
                                         float* w) {
  timed("moe route", [&] { in_.moe_route_topk_softmax(logits, n, n_expert, k, ids, w); });
}
void ProfiledOps::moe_ffn(int il, const LayerWeights& l, const float* xn, int n, const int32_t* ids,
                          const float* w, int k, float* x) {
  timed("moe experts", [&] { in_.moe_ffn(il, l, xn, n, ids, w, k, x); });
}
void ProfiledOps::sigmoid_gate_add(const float* y, const float* gate_w, const float* xn, int n, int dim,
                                   float* x) {
  timed("shared expert gate", [&] { in_.sigmoid_gate_add(y, gate_w, xn, n, dim, x); });
}

}  // namespace ultra::cuda
