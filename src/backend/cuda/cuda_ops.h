// The ForwardOps of the CUDA backend: model/forward.h's ops as the kernels of kernels.h and moe.h on the
// backend's stream, over device memory it is given (weights, KV cache, workspaces, the one-row fused
// buffers). Single-row steps take the fused views of device_weights.h and the fused launches that
// CudaTuning::fuse enables; CudaTuning::skip leaves ops out (timing only).
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "backend/cuda/device_weights.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/tuning.h"
#include "model/forward.h"

namespace ultra::cuda {

// The device memory the ops work in, owned by the backend.
struct OpsMemory {
  std::vector<KvLayerView> kv;  // [n_layers] the KV cache
  CudaMatmul* mm = nullptr;     // initialised over its workspace
  void* attention_ws = nullptr;
  MoeScratch moe;         // mixture of experts only
  float* qkv1 = nullptr;  // [q_dim + 2 kv_dim] the fused projection of one row
  float* gu1 = nullptr;   // [2 ffn]
};

class CudaOps final : public ForwardOps {
 public:
  CudaOps(const DeviceWeights& w, const OpsMemory& mem, const CudaTuning& tuning, cudaStream_t stream)
      : w_(w), mem_(mem), tune_(tuning), stream_(stream) {}

  // The attention plan of the step being enqueued (its row bucket's, or the direct steps').
  void set_attention_plan(const AttentionPlan* plan) { plan_ = plan; }

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

  // The CudaTuning::kSkip* bit of a matmul (0: never skipped).
  static unsigned skip_bit(MatmulOp op);

 private:
  // A fused launch's result: true when it ran; false when the kernel does not take the case (nothing
  // launched: the caller runs the ops one by one).
  bool fused(cudaError_t e, const char* what);

  const DeviceWeights& w_;
  const OpsMemory& mem_;
  const CudaTuning& tune_;
  cudaStream_t stream_;
  const AttentionPlan* plan_ = nullptr;
};

}  // namespace ultra::cuda
