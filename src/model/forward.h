// The forward pass of the Llama family (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, and the mixtures of
// experts Mixtral, Qwen2/3-MoE, gpt-oss), written once over the ops a backend supplies. A backend implements
// ForwardOps with its kernels and owns the buffers; forward() only sequences the ops, so it runs the same on
// host memory (CPU) and device memory (a GPU backend calls it once while capturing a graph). Adding an
// architecture changes this one place.
#pragma once

#include <cstdint>

#include "core/error.h"

#include "core/views.h"
#include "model/hparams.h"
#include "model/model.h"
#include "model/token_feed.h"

namespace ultra {

// The rows of one step, in the memory of the backend that runs it.
struct StepRows {
  int n = 0;                       // rows
  const int32_t* token = nullptr;  // [n] token ids (or what feed[i] says)
  // [n] Backend::submit only (host memory): where each token comes from; null: every token is an id. The
  // backend resolves the others to ids before forward(), which reads ids only.
  const TokenFeed* feed = nullptr;
  const int32_t* pos = nullptr;      // [n] position of each token in its sequence
  const int32_t* seq = nullptr;      // [n] sequence (KV slot) of each token
  int n_out = 0;                     // rows whose logits are computed
  const int32_t* out_row = nullptr;  // [n_out] those rows, ascending
};

// Activations of one step, backend memory, sized for n_batch rows and n_outputs output rows.
struct StepBuffers {
  float* x = nullptr;       // [n_batch, dim] residual stream
  float* xb = nullptr;      // [n_batch, max(dim, q_dim)] normed input / projection output
  float* q = nullptr;       // [n_batch, n_heads * head_dim]
  float* k = nullptr;       // [n_batch, n_kv_heads * head_dim]
  float* v = nullptr;       // [n_batch, n_kv_heads * head_dim]
  float* att = nullptr;     // [n_batch, n_heads * head_dim]
  float* hb = nullptr;      // [n_batch, max_ffn_dim]
  float* hb2 = nullptr;     // [n_batch, max_ffn_dim]
  float* out_x = nullptr;   // [n_outputs, dim] output rows, gathered then normed
  float* logits = nullptr;  // [n_outputs, n_vocab]
  // Tensor parallelism only (WeightTable::tp_size > 1; null otherwise): this rank's logits.
  float* vocab_part = nullptr;  // [n_outputs, vocab_shard]
  // Mixture of experts only (null otherwise).
  float* router = nullptr;        // [n_batch, n_expert] router logits, then probabilities
  int32_t* expert_ids = nullptr;  // [n_batch, n_expert_used] the selected experts of each row
  float* expert_w = nullptr;      // [n_batch, n_expert_used] their weights
  float* shexp_out = nullptr;     // [n_batch, dim] the shared expert's output (Qwen2-MoE)
};

// Which projection of the forward a matmul computes, passed by forward() so that a backend need not guess it
// from the matrix's shape (the CUDA backend names its profile rows and its timing switches by it).
enum class MatmulOp : uint8_t {
  q,
  k,
  v,
  o,  // the attention output projection
  gate,
  up,
  down,
  lm_head,
  router,  // a mixture-of-experts layer's ffn_gate_inp
  gate_shexp,
  up_shexp,
  down_shexp,  // the shared expert's (Qwen2-MoE)
};
constexpr int kMatmulOps = (int)MatmulOp::down_shexp + 1;

// The kernels a backend supplies; all pointers are backend memory. Shapes as in cpu/ops.h.
class ForwardOps {
 public:
  virtual ~ForwardOps() = default;
  // x[t] = row tokens[t] of the embedding table.
  virtual void embed(const WeightView& table, const int32_t* tokens, int n, float* x) = 0;
  virtual void rmsnorm(const float* x, const float* w, int n_rows, int dim, float eps, float* out) = 0;
  // y[n, rows] = x[n, cols] . W^T (+ bias); accumulate: y += instead of y = (the residual add). op: which
  // projection it is.
  virtual void matmul(MatmulOp op, const WeightView& w, const float* x, int n, float* y, const float* bias,
                      bool accumulate) = 0;
  // RoPE in place on q [n, n_heads, head_dim] and k [n, n_kv_heads, head_dim] (one launch on a GPU), with
  // layer il's frequencies (ModelData::layer_rope_inv_freq).
  virtual void rope(int il, float* q, int n_heads, float* k, int n_kv_heads, int n, int head_dim,
                    const int32_t* pos, bool interleaved) = 0;
  // K/V rows of this step into the cache of layer il, then causal attention over it.
  virtual void kv_write(int il, const float* k, const float* v, int n, const int32_t* pos,
                        const int32_t* seq) = 0;
  // Scores s = q.k * scale, then s = tanh(s / softcap) * softcap when softcap > 0 (Gemma 2); window > 0:
  // token at position i attends positions j with i - window < j <= i (sliding-window layers), else [0, i].
  virtual void attention(int il, const float* q, int n, int n_heads, const int32_t* pos, const int32_t* seq,
                         float scale, float softcap, int window, float* out) = 0;
  // attention() (no soft-cap) with per-head sink logits sinks [n_heads] (gpt-oss, LayerWeights::attn_sinks):
  // head h's weights are exp(s_p - m) / (sum_p exp(s_p - m) + exp(sinks[h] - m)), m the max of its scores and
  // the sink. A backend without it refuses gpt-oss at context creation (the default is never reached).
  virtual void attention_sinks(int /*il*/, const float* /*q*/, int /*n*/, int /*n_heads*/,
                               const int32_t* /*pos*/, const int32_t* /*seq*/, float /*scale*/,
                               int /*window*/, const float* /*sinks*/, float* /*out*/) {
    unsupported("attention_sinks");
  }
  virtual void silu_mul(const float* gate, const float* up, int64_t n, float* out) = 0;
  // rope, then kv_write of the rotated k and of v (a backend may do both in one kernel).
  virtual void rope_kv_write(int il, float* q, int n_heads, float* k, const float* v, int n_kv_heads, int n,
                             int head_dim, const int32_t* pos, const int32_t* seq, bool interleaved) {
    rope(il, q, n_heads, k, n_kv_heads, n, head_dim, pos, interleaved);
    kv_write(il, k, v, n, pos, seq);
  }
  // y = W . (silu(gate) * up) (+= with accumulate) in one op, when the backend fuses it: returns false when
  // it does not (the default), and the caller runs silu_mul and matmul.
  virtual bool silu_matmul(const WeightView&, const float*, const float*, int, float*, bool) { return false; }
  // The ops of Gemma 2/3 only; a backend without them refuses those models at context creation (the
  // defaults are never reached).
  // out[i] = gelu_tanh(gate[i]) * up[i] (PyTorch gelu(approximate="tanh")).
  virtual void gelu_mul(const float*, const float*, int64_t, float*) { unsupported("gelu_mul"); }
  // x[i] *= s.
  virtual void scale(float*, int64_t, float) { unsupported("scale"); }
  // x[i] = tanh(x[i] / cap) * cap.
  virtual void softcap(float*, int64_t, float) { unsupported("softcap"); }
  // y[r] += rmsnorm(x[r]) * w for n_rows rows of dim floats; x is overwritten (normed in place).
  virtual void norm_add(float*, const float*, int, int, float, float*) { unsupported("norm_add"); }
  // The q, k, v projections (+ biases) of layer il. q, k, v come in pointing at the step buffers; a backend
  // may instead compute them with one fused matrix [Wq; Wk; Wv] into memory of its own and point them there
  // ([n, dim] rows each, contiguous per projection). The default: three matmuls into the step buffers.
  virtual void qkv(int il, const LayerWeights& l, const float* x, int n, float*& q, float*& k, float*& v) {
    matmul(MatmulOp::q, l.wq, x, n, q, l.bq, false);
    matmul(MatmulOp::k, l.wk, x, n, k, l.bk, false);
    matmul(MatmulOp::v, l.wv, x, n, v, l.bv, false);
  }
  // The gate and up projections of layer il, the same way ([W_gate; W_up] when fused).
  virtual void gate_up(int il, const LayerWeights& l, const float* x, int n, float*& gate, float*& up) {
    matmul(MatmulOp::gate, l.w_gate, x, n, gate, nullptr, false);
    matmul(MatmulOp::up, l.w_up, x, n, up, nullptr, false);
  }
  // The ops of tensor parallelism (model/shard.h) only; a backend without them refuses split models at
  // context creation (the defaults are never reached).
  // x[t] = row tokens[t] - row0 of table where it holds that row, else zeros (its vocabulary shard).
  virtual void embed_shard(const WeightView&, int64_t /*row0*/, const int32_t*, int, float*) {
    unsupported("embed_shard");
  }
  // x[0, n) = the sum of every rank's x[0, n), in rank order (the same bits on every rank).
  virtual void all_reduce_sum(float*, int64_t) { unsupported("all_reduce_sum"); }
  // logits [n_rows, n_vocab] from every rank's part [n_rows, its shard's rows] (WeightTable::vocab_shard
  // rows each, the last rank's fewer).
  virtual void gather_vocab(const float* /*part*/, int /*n_rows*/, float* /*logits*/) {
    unsupported("gather_vocab");
  }
  // out[r] = x[rows[r]] for r < n_rows, rows of dim floats.
  virtual void gather_rows(const float* x, const int32_t* rows, int n_rows, int dim, float* out) = 0;

  // The ops of mixture-of-experts models only; a backend without them refuses those models at context
  // creation (the defaults are never reached).
  // The router's logits [n, n_expert] = l.ffn_gate_inp . xn[r] (+ l.ffn_gate_inp_b, gpt-oss) (a backend may
  // compute them more precisely than its other matmuls: the expert choice is a discrete function of them).
  virtual void moe_router(int /*il*/, const LayerWeights& l, const float* xn, int n, float* logits) {
    matmul(MatmulOp::router, l.ffn_gate_inp, xn, n, logits, l.ffn_gate_inp_b, false);
  }
  // model/moe.h's moe_route over n rows of router logits [n, n_expert] -> ids, w [n, k].
  virtual void moe_route(float*, int /*n*/, int /*n_expert*/, int /*k*/, bool /*norm*/, int32_t*, float*) {
    unsupported("moe_route");
  }
  // model/moe.h's moe_route_topk_softmax (gpt-oss) over n rows.
  virtual void moe_route_topk_softmax(const float*, int /*n*/, int /*n_expert*/, int /*k*/, int32_t*,
                                      float*) {
    unsupported("moe_route_topk_softmax");
  }
  // x[r] += sum over j < k of w[r, j] * down_e . (silu(gate_e . xn[r]) * (up_e . xn[r])), e = ids[r, j]: the
  // selected SwiGLU experts of layer il (l.gate_exps, l.up_exps, l.down_exps) for n rows of normed input xn.
  // gpt-oss: each of the three products adds its bias (l.gate_exps_b ... row e), and the activation is
  // cpu/ops.h's swiglu_oai with hp.swiglu_limit instead of silu(gate) * up.
  virtual void moe_ffn(int /*il*/, const LayerWeights&, const float* /*xn*/, int /*n*/,
                       const int32_t* /*ids*/, const float* /*w*/, int /*k*/, float* /*x*/) {
    unsupported("moe_ffn");
  }
  // x[r] += sigmoid(gate_w . xn[r]) * y[r] for n rows of dim floats (Qwen2-MoE's shared expert).
  virtual void sigmoid_gate_add(const float*, const float*, const float*, int, int, float*) {
    unsupported("sigmoid_gate_add");
  }

  // The rmsnorm before a projection fused into it, where the backend does that (it then need not write the
  // normed rows anywhere); each returns false when it does not (the default), and the caller runs the ops
  // one by one:
  //   norm_qkv:     rmsnorm(x, l.attn_norm) then qkv(il, l, ...)
  //   norm_gate_up: rmsnorm(x, l.ffn_norm) then gate_up(il, l, ...)
  //   norm_matmul1: gather_rows(x, row, 1) then rmsnorm(., norm_w) then matmul(w, ., 1, y): one output row.
  virtual bool norm_qkv(int /*il*/, const LayerWeights&, const float* /*x*/, int /*n*/, float /*eps*/,
                        float*& /*q*/, float*& /*k*/, float*& /*v*/) {
    return false;
  }
  virtual bool norm_gate_up(int /*il*/, const LayerWeights&, const float* /*x*/, int /*n*/, float /*eps*/,
                            float*& /*gate*/, float*& /*up*/) {
    return false;
  }
  virtual bool norm_matmul1(const WeightView& /*w*/, const float* /*norm_w*/, const float* /*x*/,
                            const int32_t* /*row*/, float /*eps*/, float* /*y*/) {
    return false;
  }

 private:
  [[noreturn]] static void unsupported(const char* op) { fail("backend: the {} op is not implemented", op); }
};

// logits[r] = output(norm(x[out_row[r]])) after all layers, for the rows of one step.
void forward(const HParams& hp, const WeightTable& w, const StepRows& rows, const StepBuffers& b,
             ForwardOps& ops);

}  // namespace ultra
