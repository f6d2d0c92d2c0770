#include "model/shard.h"

#include <algorithm>
#include <optional>
#include <string>

#include "core/error.h"

namespace ultra {

namespace {

size_t matrix_bytes(const WeightView& w) {
  const auto tt = type_traits(w.type);
  return w.rows > 0 && tt ? (size_t)w.rows * row_bytes(*tt, (uint64_t)w.cols) : 0;
}

// Columns [c0, c0 + n) of w as a view of its own (rows keep their stride, row_bytes).
WeightView col_slice(const WeightView& w, int64_t c0, int64_t n, const std::string& what) {
  const auto tt = type_traits(w.type);
  if (!tt || w.scale)
    fail("tensor parallelism: {} is {}, which is not split by columns yet", what, type_name(w.type));
  if (c0 % tt->block_elems || n % tt->block_elems)
    fail(
        "tensor parallelism: {} would be split inside its {}-element {} blocks (columns {} .. {}); run with "
        "fewer ranks",
        what, tt->block_elems, type_name(w.type), c0, c0 + n);
  WeightView s = w;
  s.data = static_cast<const uint8_t*>(w.data) + row_bytes(*tt, (uint64_t)c0);
  s.cols = n;
  return s;
}

}  // namespace

void shard_model(ModelData& m, int rank, int size) {
  HParams& hp = m.hp;
  if (size < 1 || rank < 0 || rank >= size) fail("tensor parallelism: rank {} of {}", rank, size);
  if (size == 1) return;
  if (m.tp_size != 1) fail("tensor parallelism: the model is split already");
  const std::string src = m.path;
  if (hp.moe())
    fail("{}: tensor parallelism does not split mixtures of experts yet ({} experts); run without --tp", src,
         hp.n_expert);
  // Query heads [h0, h1) of this rank (ranks differ by one head at most), and the KV heads they read,
  // [kv0, kv1): replicated where ranks share one. The shard's own GQA grouping must map its query heads onto
  // them as the model does: local head h reads local KV head h / ((h1 - h0) / (kv1 - kv0)).
  const int H = hp.n_heads, KV = hp.n_kv_heads, hd = hp.head_dim, group = H / KV;
  if (size > H) fail("{}: --tp {} is more ranks than the {} attention heads", src, size, H);
  const int h0 = (int)((int64_t)rank * H / size), h1 = (int)((int64_t)(rank + 1) * H / size), hl = h1 - h0;
  const int kv0 = h0 / group, kvl = (h1 - 1) / group + 1 - kv0;
  bool grouped = hl % kvl == 0;
  for (int h = 0; grouped && h < hl; ++h) grouped = (h0 + h) / group - kv0 == h / (hl / kvl);
  if (!grouped)
    fail(
        "{}: the {} query heads of {} KV heads do not split over {} ranks (rank {} would hold query heads "
        "{} .. {} of KV heads {} .. {})",
        src, H, KV, size, rank, h0, h1 - 1, kv0, kv0 + kvl - 1);
  // FFN columns [f0, f0 + fl): whole blocks of the down projection's type (ranks differ by one block).
  const auto down_tt = m.layers.empty() ? std::nullopt : type_traits(m.layers[0].w_down.type);
  const int64_t blk = down_tt ? down_tt->block_elems : 1, units = hp.ffn_dim / blk;
  if (units < size)
    fail("{}: the FFN width {} is too narrow for {} ranks ({}-column blocks)", src, hp.ffn_dim, size, blk);
  const int64_t f0 = rank * units / size * blk, fl = (rank + 1) * units / size * blk - f0;
  const int q0 = h0;
  const int64_t V = hp.n_vocab, vs = (V + size - 1) / size, v0 = rank * vs;
  if ((size - 1) * vs >= V) fail("{}: the vocabulary ({}) is too small to split over {} ranks", src, V, size);
  const int64_t vl = std::min(V, v0 + vs) - v0;

  // Check every column split before changing anything.
  for (size_t il = 0; il < m.layers.size(); ++il) {
    const LayerWeights& l = m.layers[il];
    col_slice(l.wo, (int64_t)q0 * hd, (int64_t)hl * hd, fmt::format("layer {}'s output projection", il));
    col_slice(l.w_down, f0, fl, fmt::format("layer {}'s down projection", il));
  }

  size_t full = matrix_bytes(m.tok_embd) + (m.output.data != m.tok_embd.data ? matrix_bytes(m.output) : 0);
  const bool tied = m.output.data == m.tok_embd.data;
  m.tok_embd = row_slice(m.tok_embd, v0, vl);
  m.output = row_slice(m.output, v0, vl);
  size_t shard = matrix_bytes(m.tok_embd) + (tied ? 0 : matrix_bytes(m.output));
  for (size_t il = 0; il < m.layers.size(); ++il) {
    LayerWeights& l = m.layers[il];
    for (const WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      full += matrix_bytes(*w);
    l.wq = row_slice(l.wq, (int64_t)q0 * hd, (int64_t)hl * hd);
    l.wk = row_slice(l.wk, (int64_t)kv0 * hd, (int64_t)kvl * hd);
    l.wv = row_slice(l.wv, (int64_t)kv0 * hd, (int64_t)kvl * hd);
    if (l.bq) l.bq += (size_t)q0 * hd;
    if (l.bk) l.bk += (size_t)kv0 * hd;
    if (l.bv) l.bv += (size_t)kv0 * hd;
    l.wo = col_slice(l.wo, (int64_t)q0 * hd, (int64_t)hl * hd, "wo");
    if (l.attn_sinks) l.attn_sinks += q0;
    if (rank != 0) l.bo = nullptr;  // added once, by rank 0, before the sum
    l.w_gate = row_slice(l.w_gate, f0, fl);
    l.w_up = row_slice(l.w_up, f0, fl);
    l.w_down = col_slice(l.w_down, f0, fl, "w_down");
    l.wqkv = {};  // the fused views no longer match the split ones
    l.w_gate_up = {};
    for (const WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      shard += matrix_bytes(*w);
  }
  m.weight_bytes = m.weight_bytes - std::min(m.weight_bytes, full) + shard;
  hp.n_heads = hl;
  hp.n_kv_heads = kvl;
  hp.ffn_dim = (int)fl;
  m.tp_rank = rank;
  m.tp_size = size;
  m.vocab0 = v0;
  m.vocab_shard = vs;
}

}  // namespace ultra
