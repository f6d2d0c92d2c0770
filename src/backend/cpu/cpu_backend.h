// The CPU backend: weights used in place from the mapped file, F32 activations, slotted KV cache in host
// memory, persistent thread pool. Its kernels (ops.h) are the ForwardOps of model/forward.h; sampling runs
// on the same pool, one job per thread at a time. All buffers are allocated in the constructor.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/buffer.h"
#include "core/thread_pool.h"
#include "engine/backend.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace ultra {

namespace dist {
class Communicator;
}

class CpuBackend final : public Backend, private ForwardOps {
 public:
  // params must be resolved (see Context); n_sample: ids below it are sampled.
  CpuBackend(const ModelData& model, const ContextParams& params, int n_sample, bool tp_follower = false);
  ~CpuBackend() override;

  const char* name() const override { return "CPU"; }
  std::string description() const override;  // "CPU (<isa> kernels[; Q8_0 with int8 activations])"
  Footprint footprint() const override;
  void step(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results, TokenLogprob* top,
            StepStats& stats) override;
  const float* logits(int k) override { return logits_.data() + (size_t)k * m_.hp.n_vocab; }
  void apply_rules(int k, const SamplingParams& p, const uint32_t* allow) override {
    apply_logit_rules(p, allow, logits_.data() + (size_t)k * m_.hp.n_vocab, n_sample_);
  }
  bool ranks_in_step() const override;
  void poison_kv(int seq, int from) override;
  // A split model's rank 0 has the other ranks copy their shards of the cache too.
  void copy_kv(int from, int to, int n) override;

  KvCache& kv() { return kv_; }
  ThreadPool& pool() { return pool_; }

 private:
  // ForwardOps
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
  void norm_add(float* x, const float* w, int n_rows, int dim, float eps, float* y) override;
  void gather_rows(const float* x, const int32_t* rows, int n_rows, int dim, float* out) override;
  void moe_route(float* logits, int n, int n_expert, int k, bool norm, int32_t* ids, float* w) override;
  void moe_route_topk_softmax(const float* logits, int n, int n_expert, int k, int32_t* ids,
                              float* w) override;
  void moe_ffn(int il, const LayerWeights& l, const float* xn, int n, const int32_t* ids, const float* w,
               int k, float* x) override;
  void sigmoid_gate_add(const float* y, const float* gate_w, const float* xn, int n, int dim,
                        float* x) override;
  void embed_shard(const WeightView& table, int64_t row0, const int32_t* tokens, int n, float* x) override;
  void all_reduce_sum(float* x, int64_t n) override;
  void gather_vocab(const float* part, int n_rows, float* logits) override;

  // f(begin, end) over [0, n) split across the threads when n >= min_split (a prefill's rows or elements),
  // else f(0, n) here. For the row- and element-wise ops: the split changes no result.
  template <class F>
  void split(int64_t n, int64_t min_split, F&& f);

  const ModelData& m_;
  ContextParams p_;
  int n_sample_;
  ThreadPool pool_;
  KvCache kv_;
  StepBuffers b_;

  Buffer<float> x_;             // [n_batch, dim] residual stream
  Buffer<float> xb_;            // [n_batch, max(dim, q_dim)] normed input / projection output
  Buffer<float> q_;             // [n_batch, n_heads*head_dim]
  Buffer<float> k_;             // [n_batch, n_kv_heads*head_dim]
  Buffer<float> v_;             // [n_batch, n_kv_heads*head_dim]
  Buffer<float> att_;           // [n_batch, n_heads*head_dim]
  Buffer<float> hb_;            // [n_batch, max_ffn_dim]
  Buffer<float> hb2_;           // [n_batch, max_ffn_dim]
  Buffer<float> acc_;           // [n_batch, dim] projection output before the residual add
  Buffer<float> out_x_;         // [n_outputs, dim] output rows, normed
  Buffer<float> logits_;        // [n_outputs, n_vocab]
  Buffer<float> mm_scratch_;    // matmul workspace
  Buffer<float> attn_scratch_;  // attention workspace
  // Mixture of experts (empty for a dense model). A step's n * k (row, expert) pairs, grouped by expert:
  // pair p (in expert order) is row moe_row_[p] of expert e for moe_start_[e] <= p < moe_start_[e + 1].
  Buffer<float> router_;        // [n_batch, n_expert]
  Buffer<int32_t> expert_ids_;  // [n_batch, k]
  Buffer<float> expert_w_;      // [n_batch, k]
  Buffer<float> shexp_out_;     // [n_batch, dim] (shared expert)
  Buffer<int32_t> moe_start_;   // [n_expert + 1]
  Buffer<int32_t> moe_row_;     // [n_batch * k] the row of pair p
  Buffer<int32_t> moe_pair_;    // [n_batch * k] the pair of (row r, slot j), at r * k + j
  Buffer<float> moe_x_;         // [n_batch * k, dim] the pairs' input rows, gathered
  Buffer<float> moe_gate_;      // [n_batch * k, expert_ffn]
  Buffer<float> moe_up_;        // [n_batch * k, expert_ffn]
  Buffer<float> moe_y_;         // [n_batch * k, dim] each pair's expert output
  std::vector<std::unique_ptr<SamplerScratch>> sampler_scratch_;  // [n_threads]
  // Tensor parallelism (a split model; empty otherwise).
  dist::Communicator* comm_ = nullptr;
  bool tp_lead_ = false;      // rank 0: sends each step to the other ranks
  bool tp_stopped_ = false;   // rank 0: a step sent to the other ranks threw before its forward ended
  Buffer<float> vocab_part_;  // [n_outputs, vocab_shard] this rank's logits
  Buffer<float> vocab_all_;   // [tp_size, gather rows, vocab_shard] every rank's, gathered
  Buffer<int32_t> tp_wire_;   // [tp_rows_words(n_batch, n_outputs)] a step's rows, sent
};

}  // namespace ultra
