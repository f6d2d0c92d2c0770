#include "model/forward.h"

#include <cmath>

namespace ultra {

// llama2.c's forward(), batched over the rows of a step:
//   x = embed(tokens)
//   per layer: x += Wo · attn(rope(Wq·norm(x) + bq), rope(Wk·norm(x) + bk), Wv·norm(x) + bv)
//              x += Wdown · (silu(Wgate·norm(x)) * Wup·norm(x))
//   logits[r] = Wout · norm(x[out_row[r]])
void forward(const HParams& hp, const WeightTable& w, const StepRows& rows, const StepBuffers& b,
             ForwardOps& ops) {
  const int n = rows.n, dim = hp.dim;
  const float scale = 1.0f / std::sqrt((float)hp.head_dim);

  ops.embed(w.tok_embd, rows.token, n, b.x);
  for (int il = 0; il < hp.n_layers; ++il) {
    const LayerWeights& l = w.layers[il];
    ops.rmsnorm(b.x, l.attn_norm, n, dim, hp.rms_eps, b.xb);
    ops.matmul(l.wq, b.xb, n, b.q, l.bq, false);
    ops.matmul(l.wk, b.xb, n, b.k, l.bk, false);
    ops.matmul(l.wv, b.xb, n, b.v, l.bv, false);
    ops.rope(b.q, hp.n_heads, b.k, hp.n_kv_heads, n, hp.head_dim, rows.pos, hp.rope_interleaved);
    ops.kv_write(il, b.k, b.v, n, rows.pos, rows.seq);
    ops.attention(il, b.q, n, hp.n_heads, rows.pos, rows.seq, scale, b.att);
    ops.matmul(l.wo, b.att, n, b.x, nullptr, true);

    ops.rmsnorm(b.x, l.ffn_norm, n, dim, hp.rms_eps, b.xb);
    ops.matmul(l.w_gate, b.xb, n, b.hb, nullptr, false);
    ops.matmul(l.w_up, b.xb, n, b.hb2, nullptr, false);
    ops.silu_mul(b.hb, b.hb2, (int64_t)n * hp.ffn_dim, b.hb2);
    ops.matmul(l.w_down, b.hb2, n, b.x, nullptr, true);
  }
  if (rows.n_out == 0) return;
  ops.gather_rows(b.x, rows.out_row, rows.n_out, dim, b.xb);
  ops.rmsnorm(b.xb, w.output_norm, rows.n_out, dim, hp.rms_eps, b.out_x);
  ops.matmul(w.output, b.out_x, rows.n_out, b.logits, nullptr, false);
}

}  // namespace ultra
