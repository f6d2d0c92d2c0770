// The CPU backend: weights used in place from the mapped file, F32 activations, slotted KV cache,
// persistent thread pool. All buffers are allocated in the constructor.
#pragma once

#include <memory>

#include "backend/cpu/ops.h"
#include "core/buffer.h"
#include "core/thread_pool.h"
#include "engine/backend.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace ultra {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, const ContextParams& params);

  StepInputs inputs() override;
  void step(int n_tokens, int n_outputs) override;
  const float* logits() const override { return logits_.data(); }
  int kv_len(int slot) const override { return kv_.n_tokens(slot); }
  void kv_crop(int slot, int n) override { kv_.crop(slot, n); }
  void kv_advance(int slot, int n) override { kv_.advance(slot, n); }
  const ContextParams& params() const override { return p_; }
  int n_vocab() const override { return m_.hp.n_vocab; }
  Footprint footprint() const override;

  KvCache& kv() { return kv_; }
  ThreadPool& pool() { return pool_; }

 private:
  const Model& m_;
  ContextParams p_;
  ThreadPool pool_;
  KvCache kv_;

  Buffer<int32_t> token_, pos_, slot_, out_row_;  // step inputs
  Buffer<float> x_;                               // [n_batch, dim] residual stream
  Buffer<float> xb_;            // [n_batch, max(dim, q_dim)] normed input / projection output
  Buffer<float> q_;             // [n_batch, n_heads*head_dim]
  Buffer<float> k_;             // [n_batch, n_kv_heads*head_dim]
  Buffer<float> v_;             // [n_batch, n_kv_heads*head_dim]
  Buffer<float> att_;           // [n_batch, n_heads*head_dim]
  Buffer<float> hb_;            // [n_batch, ffn_dim]
  Buffer<float> hb2_;           // [n_batch, ffn_dim]
  Buffer<float> out_x_;         // [n_outputs, dim] rows gathered for the output head
  Buffer<float> logits_;        // [n_outputs, n_vocab]
  Buffer<float> mm_scratch_;    // matmul workspace
  Buffer<float> attn_scratch_;  // attention workspace
};

}  // namespace ultra
