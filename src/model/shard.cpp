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

// Rank r's part of the heads and of the FFN.
struct Split {
  int h0, hl;      // query heads [h0, h0 + hl)
  int kv0, kvl;    // the KV heads they read
  int64_t f0, fl;  // FFN columns
};

// Query heads [h0, h1) of rank r (ranks differ by one head at most), and the KV heads they read: replicated
// where ranks share one. The shard's own GQA grouping must map its query heads onto them as the model does:
// local head h reads local KV head h / (hl / kvl). FFN columns in whole blocks of the down projection's type
// (ranks differ by one block). Throws naming what does not split.
Split split_of(const ModelData& m, int r, int size) {
  const HParams& hp = m.hp;
  const int H = hp.n_heads, KV = hp.n_kv_heads, group = H / KV;
  Split s;
  s.h0 = (int)((int64_t)r * H / size);
  s.hl = (int)((int64_t)(r + 1) * H / size) - s.h0;
  s.kv0 = s.h0 / group;
  s.kvl = (s.h0 + s.hl - 1) / group + 1 - s.kv0;
  bool grouped = s.hl % s.kvl == 0;
  for (int h = 0; grouped && h < s.hl; ++h) grouped = (s.h0 + h) / group - s.kv0 == h / (s.hl / s.kvl);
  if (!grouped)
    fail(
        "{}: the {} query heads of {} KV heads do not split over {} ranks (rank {} would hold query heads "
        "{} .. {} of KV heads {} .. {})",
        m.path, H, KV, size, r, s.h0, s.h0 + s.hl - 1, s.kv0, s.kv0 + s.kvl - 1);
  const auto tt = m.layers.empty() ? std::nullopt : type_traits(m.layers[0].w_down.type);
  const int64_t blk = tt ? tt->block_elems : 1, units = hp.ffn_dim / blk;
  if (units < size)
    fail("{}: the FFN width {} is too narrow for {} ranks ({}-column blocks)", m.path, hp.ffn_dim, size, blk);
  s.f0 = r * units / size * blk;
  s.fl = (r + 1) * units / size * blk - s.f0;
  return s;
}

}  // namespace

void shard_model(ModelData& m, int rank, int size) {
  HParams& hp = m.hp;
  if (size < 1 || rank < 0 || rank >= size) fail("tensor parallelism: rank {} of {}", rank, size);
  if (size == 1) return;
  if (m.tp_size != 1) fail("tensor parallelism: the model is split already");
  const std::string& src = m.path;
  if (hp.moe())
    fail("{}: tensor parallelism does not split mixtures of experts yet ({} experts); run without --tp", src,
         hp.n_expert);
  if (size > hp.n_heads) fail("{}: --tp {} is more ranks than the {} attention heads", src, size, hp.n_heads);
  const int64_t V = hp.n_vocab, vs = (V + size - 1) / size, v0 = rank * vs;
  if ((size - 1) * vs >= V) fail("{}: the vocabulary ({}) is too small to split over {} ranks", src, V, size);
  const int64_t vl = std::min(V, v0 + vs) - v0;
  // Every rank's splits checked on every rank (so that all refuse alike), before anything changes.
  const int hd = hp.head_dim;
  for (int r = 0; r < size; ++r) {
    const Split s = split_of(m, r, size);
    for (size_t il = 0; il < m.layers.size(); ++il) {
      const LayerWeights& l = m.layers[il];
      col_slice(l.wo, (int64_t)s.h0 * hd, (int64_t)s.hl * hd,
                fmt::format("layer {}'s output projection", il));
      col_slice(l.w_down, s.f0, s.fl, fmt::format("layer {}'s down projection", il));
    }
  }
  const Split sp = split_of(m, rank, size);
  const int q0 = sp.h0, hl = sp.hl, kv0 = sp.kv0, kvl = sp.kvl;
  const int64_t f0 = sp.f0, fl = sp.fl;

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
