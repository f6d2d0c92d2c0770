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
    float *q = b.q, *k = b.k, *v = b.v;
    ops.qkv(il, l, b.xb, n, q, k, v);
    ops.rope(q, hp.n_heads, k, hp.n_kv_heads, n, hp.head_dim, rows.pos, hp.rope_interleaved);
    ops.kv_write(il, k, v, n, rows.pos, rows.seq);
    ops.attention(il, q, n, hp.n_heads, rows.pos, rows.seq, scale, b.att);
    ops.matmul(l.wo, b.att, n, b.x, nullptr, true);

    ops.rmsnorm(b.x, l.ffn_norm, n, dim, hp.rms_eps, b.xb);
    float *gate = b.hb, *up = b.hb2;
    ops.gate_up(il, l, b.xb, n, gate, up);
    ops.silu_mul(gate, up, (int64_t)n * hp.ffn_dim, b.hb2);
    ops.matmul(l.w_down, b.hb2, n, b.x, nullptr, true);
  }
  if (rows.n_out == 0) return;
  ops.gather_rows(b.x, rows.out_row, rows.n_out, dim, b.xb);
  ops.rmsnorm(b.xb, w.output_norm, rows.n_out, dim, hp.rms_eps, b.out_x);
  ops.matmul(w.output, b.out_x, rows.n_out, b.logits, nullptr, false);
}

}  // namespace ultra
