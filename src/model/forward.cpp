#include "model/forward.h"

#include <cmath>

namespace ultra {

namespace {

// The FFN of a mixture-of-experts layer: x += experts(norm(x)) (+ the gated shared expert). Split over
// ranks (model/shard.h: every expert and the shared expert by columns, the router on every rank), each rank
// routes alike and adds its columns' part; the rank that is not the lead starts from zeros instead of the
// residual, and the caller sums x over the ranks.
void moe_layer(const HParams& hp, const LayerWeights& l, int il, int n, const StepBuffers& b, ForwardOps& ops,
               bool lead) {
  const int dim = hp.dim, k = hp.n_expert_used;
  ops.rmsnorm(b.x, l.ffn_norm, n, dim, hp.rms_eps, b.xb);
  if (!lead) ops.scale(b.x, (int64_t)n * dim, 0.0f);  // x is finite: zeros (the lead adds the residual)
  ops.moe_router(il, l, b.xb, n, b.router);           // [n, n_expert]
  if (hp.expert_topk_softmax)
    ops.moe_route_topk_softmax(b.router, n, hp.n_expert, k, b.expert_ids, b.expert_w);
  else
    ops.moe_route(b.router, n, hp.n_expert, k, hp.expert_norm, b.expert_ids, b.expert_w);
  ops.moe_ffn(il, l, b.xb, n, b.expert_ids, b.expert_w, k, b.x);
  if (hp.shexp_ffn_dim == 0) return;
  ops.matmul(MatmulOp::gate_shexp, l.w_gate_shexp, b.xb, n, b.hb, nullptr, false);  // [n, shexp_ffn]
  ops.matmul(MatmulOp::up_shexp, l.w_up_shexp, b.xb, n, b.hb2, nullptr, false);
  ops.silu_mul(b.hb, b.hb2, (int64_t)n * hp.shexp_ffn_dim, b.hb2);
  ops.matmul(MatmulOp::down_shexp, l.w_down_shexp, b.hb2, n, b.shexp_out, nullptr, false);  // [n, dim]
  ops.sigmoid_gate_add(b.shexp_out, l.ffn_gate_inp_shexp, b.xb, n, dim, b.x);
}

}  // namespace

// llama2.c's forward(), batched over the rows of a step:
//   x = embed(tokens) (* embed_scale: Gemma)
//   per layer: q, k, v = Wq·norm(x) + bq, Wk·norm(x) + bk, Wv·norm(x) + bv
//              q, k = head_norm(q), head_norm(k)                          (Qwen3, Gemma 3)
//              a = Wo · attn(rope(q), rope(k), v) (+ bo)   (soft-capped scores, sliding window: Gemma;
//                  a sink logit per head in the softmax's denominator, + bo: gpt-oss)
//              x += a, or x += post_norm(a)                               (Gemma)
//              m = Wdown · (act(Wgate·norm(x)) * Wup·norm(x))   act: silu (one op where the backend fuses
//                                                                 it), or tanh GELU (Gemma)
//              or, with experts: m = sum over the top k experts e of w_e · FFN_e(norm(x)), routed by
//                 softmax(Wgate_inp·norm(x)) (model/moe.h), + sigmoid(w_shexp·norm(x)) · FFN_shexp(norm(x))
//                 with a shared expert (Qwen2-MoE); gpt-oss: the top k of Wgate_inp·norm(x) + b weighted
//                 by their softmax, biased experts with the clamped SwiGLU
//              x += m, or x += post_ffw_norm(m)                           (Gemma)
//   logits[r] = Wout · norm(x[out_row[r]])  (soft-capped: Gemma 2)
// Split over ranks (w.tp_size > 1, model/shard.h), each rank runs this on its shard: the embedding rows and
// the row-split projections' outputs (Wo, Wdown, the experts' and the shared expert's down projections) are
// summed over the ranks (all_reduce_sum; rank 0 adds the residual and the bias before the sum, the others
// only their part), the logits all-gathered.
void forward(const HParams& hp, const WeightTable& w, const StepRows& rows, const StepBuffers& b,
             ForwardOps& ops) {
  const int n = rows.n, dim = hp.dim;
  const float scale = hp.attn_scale > 0 ? hp.attn_scale : 1.0f / std::sqrt((float)hp.head_dim);

  const bool tp = w.tp_size > 1, lead = w.tp_rank == 0;  // lead: adds the residual (and biases)
  const int64_t nd = (int64_t)n * dim;
  if (tp) {
    ops.embed_shard(w.tok_embd, w.vocab0, rows.token, n, b.x);
    ops.all_reduce_sum(b.x, nd);
  } else {
    ops.embed(w.tok_embd, rows.token, n, b.x);
  }
  if (hp.embed_scale > 0) ops.scale(b.x, (int64_t)n * dim, hp.embed_scale);
  for (int il = 0; il < hp.n_layers; ++il) {
    const LayerWeights& l = w.layers[il];
    float *q = b.q, *k = b.k, *v = b.v;
    if (!ops.norm_qkv(il, l, b.x, n, hp.rms_eps, q, k, v)) {
      ops.rmsnorm(b.x, l.attn_norm, n, dim, hp.rms_eps, b.xb);
      ops.qkv(il, l, b.xb, n, q, k, v);
    }
    if (hp.qk_norm) {  // [n * heads] rows of head_dim, in place
      ops.rmsnorm(q, l.q_norm, n * hp.n_heads, hp.head_dim, hp.rms_eps, q);
      ops.rmsnorm(k, l.k_norm, n * hp.n_kv_heads, hp.head_dim, hp.rms_eps, k);
    }
    ops.rope_kv_write(il, q, hp.n_heads, k, v, hp.n_kv_heads, n, hp.head_dim, rows.pos, rows.seq,
                      hp.rope_interleaved);
    const int window = hp.layer_swa(il) ? hp.sliding_window : 0;
    if (l.attn_sinks)
      ops.attention_sinks(il, q, n, hp.n_heads, rows.pos, rows.seq, scale, window, l.attn_sinks, b.att);
    else
      ops.attention(il, q, n, hp.n_heads, rows.pos, rows.seq, scale, hp.attn_softcap, window, b.att);
    if (hp.post_norms) {
      ops.matmul(MatmulOp::o, l.wo, b.att, n, b.xb, l.bo, false);  // [n, dim]
      if (tp) ops.all_reduce_sum(b.xb, nd);
      ops.norm_add(b.xb, l.attn_post_norm, n, dim, hp.rms_eps, b.x);
    } else {
      ops.matmul(MatmulOp::o, l.wo, b.att, n, b.x, l.bo, lead);
      if (tp) ops.all_reduce_sum(b.x, nd);
    }

    if (hp.moe()) {
      moe_layer(hp, l, il, n, b, ops, lead);
      if (tp) ops.all_reduce_sum(b.x, nd);
      continue;
    }
    float *gate = b.hb, *up = b.hb2;
    if (!ops.norm_gate_up(il, l, b.x, n, hp.rms_eps, gate, up)) {
      ops.rmsnorm(b.x, l.ffn_norm, n, dim, hp.rms_eps, b.xb);
      ops.gate_up(il, l, b.xb, n, gate, up);
    }
    if (!hp.gelu && !hp.post_norms && ops.silu_matmul(l.w_down, gate, up, n, b.x, lead)) {
      if (tp) ops.all_reduce_sum(b.x, nd);
      continue;
    }
    if (hp.gelu)
      ops.gelu_mul(gate, up, (int64_t)n * hp.ffn_dim, b.hb2);
    else
      ops.silu_mul(gate, up, (int64_t)n * hp.ffn_dim, b.hb2);
    if (hp.post_norms) {
      ops.matmul(MatmulOp::down, l.w_down, b.hb2, n, b.xb, nullptr, false);  // [n, dim]
      if (tp) ops.all_reduce_sum(b.xb, nd);
      ops.norm_add(b.xb, l.ffn_post_norm, n, dim, hp.rms_eps, b.x);
    } else {
      ops.matmul(MatmulOp::down, l.w_down, b.hb2, n, b.x, nullptr, lead);
      if (tp) ops.all_reduce_sum(b.x, nd);
    }
  }
  if (rows.n_out == 0) return;
  float* logits = tp ? b.vocab_part : b.logits;  // [n_out, w.output.rows]
  if (rows.n_out != 1 || !ops.norm_matmul1(w.output, w.output_norm, b.x, rows.out_row, hp.rms_eps, logits)) {
    ops.gather_rows(b.x, rows.out_row, rows.n_out, dim, b.xb);
    ops.rmsnorm(b.xb, w.output_norm, rows.n_out, dim, hp.rms_eps, b.out_x);
    ops.matmul(MatmulOp::lm_head, w.output, b.out_x, rows.n_out, logits, nullptr, false);
  }
  if (tp) ops.gather_vocab(b.vocab_part, rows.n_out, b.logits);
  if (hp.final_softcap > 0) ops.softcap(b.logits, (int64_t)rows.n_out * hp.n_vocab, hp.final_softcap);
}

}  // namespace ultra
