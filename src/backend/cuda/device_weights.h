// The CUDA backend's weights on the device: laid out once on the host (which matrices share a block, the
// device layout of the low-bit ones), then uploaded into one allocation of bytes(), and seen through device
// views: the model's weight table, each layer's fused projection views and its experts.
//
// Every matrix keeps its own type (F32 / F16 / BF16; Q8_0 / F8_E4M3 / TERNARY and the GGUF block types
// Q4_0 .. Q5_1, Q4_K .. Q6_K repacked on the host into the device layout of gemv_lowbit.h, their f32 scales
// copied as they are; MXFP4 experts (gpt-oss) repacked into the expert kernels' layout of moe.h, 4.25 bits
// a weight; any other MXFP4 matrix expanded to BF16, exactly), norms, biases and attention sinks as f32; a
// matrix used twice (tied embeddings) is uploaded once. Each layer's Wq, Wk, Wv are placed back to back, as
// are W_gate and W_up, and the biases bq, bk, bv (zeros for a missing one): one view then covers the fused
// matrix [Wq; Wk; Wv] or [W_gate; W_up] for the single-row step, while the separate views (row ranges of it)
// serve the others. No weight is stored twice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "backend/cuda/moe.h"
#include "model/model.h"

namespace ultra::cuda {

// A layer's fused views for single-row steps (null data: not fusable).
struct FusedViews {
  WeightView qkv;                   // [q_dim + 2 kv_dim, dim] = [Wq; Wk; Wv]
  const float* qkv_bias = nullptr;  // [q_dim + 2 kv_dim] or null
  WeightView gate_up;               // [2 ffn_dim, dim] = [W_gate; W_up]
};

// A mixture-of-experts layer: the experts of each kind back to back (moe.h).
struct MoeLayerWeights {
  ExpertWeights gate, up, down;  // with their biases (gpt-oss) or none
  ExpertWeights router;       // one "expert" of n_expert rows (its bias: gpt-oss); null data: through matmul
  float swiglu_limit = 0.0f;  // > 0: the experts' activation is swiglu_oai (gpt-oss), else SwiGLU
};

// Rows [r0, r1) of an MXFP4 matrix (host memory: ggml's block_mxfp4 rows, cols % 32 == 0) as BF16
// [r1 - r0, cols], how DeviceWeights uploads an MXFP4 matrix that is not an expert (the dense matmuls do not
// read MXFP4). Exact: each value is an E2M1 code
// (at most 2 significant bits) times a power of two (E8M0), which BF16's 8-bit significand and f32 exponent
// range hold (2^-128 times the smallest code is a BF16 subnormal; E8M0's largest exponents overflow to inf
// in f32 and BF16 alike), so the upper half of the f32 value is the value.
void expand_mxfp4_rows(const WeightView& w, int64_t r0, int64_t r1, uint16_t* out);

class DeviceWeights {
 public:
  // Lays the weights out (host work only). Throws ultra::Error on a weight type or shape the CUDA kernels do
  // not take. n_ctx: the context length (it picks longrope's RoPE tables).
  DeviceWeights(const ModelData& m, int n_ctx);

  // The bytes of the one device allocation upload() fills.
  size_t bytes() const { return total_; }
  // Copies the weights into base (bytes() of device memory, 256-byte aligned) and makes the device views.
  // progress(done, total) is called every 100 ms after the first second (none: not called).
  void upload(void* base, const std::function<void(size_t done, size_t total)>& progress);

  // The views of the device copies (after upload()).
  const WeightTable& table() const { return w_; }
  const FusedViews& fused(int il) const { return fused_[il]; }
  const MoeLayerWeights& moe(int il) const { return moe_[il]; }
  const float* layer_inv_freq(int il) const { return layer_inv_freq_[il]; }  // [head_dim / 2] of layer il
  float rope_mscale() const { return rope_mscale_; }  // longrope's / YaRN's attention factor on cos, sin

  // The elements of the largest BF16 copy a prefill matmul makes of a low-bit matrix (rows x cols rounded up
  // to 8; 0 when there is none): CudaMatmul's workspace holds it.
  static int64_t max_lowbit_bf16_elems(const ModelData& m);

 private:
  struct Part {
    const void* src;  // null: zeros
    size_t bytes;
    const WeightView* lowbit = nullptr;  // src is this low-bit matrix: repacked row by row (device layout)
    int64_t repeat = 1;                  // bytes / repeat at src, written repeat times (a scale per tensor
                                         // made one per row for a fused view)
    const WeightView* mxfp4 = nullptr;   // src is this MXFP4 matrix: expanded to BF16 row by row, or
    bool mxfp4_native = false;           // repacked into the expert kernels' layout (an expert: moe.h)
  };
  void make_views(const uint8_t* base);

  const ModelData& m_;
  int n_ctx_;
  std::vector<std::vector<Part>> blocks_;  // each block starts 256-byte aligned
  size_t total_ = 0;
  std::vector<bool> fuse_qkv_, fuse_gu_;            // [n_layers]
  std::unordered_map<const void*, size_t> offset_;  // host data -> its offset in the device block
  WeightTable w_;                                   // views of the device copies
  std::vector<FusedViews> fused_;                   // [n_layers]
  std::vector<MoeLayerWeights> moe_;                // [n_layers], empty for a dense model
  std::vector<std::vector<WeightView>> exp_views_;  // [n_layers * 3] device views behind w_'s experts
  std::vector<const float*> layer_inv_freq_;        // [n_layers] each layer's RoPE table
  float rope_mscale_ = 1.0f;
};

}  // namespace ultra::cuda
