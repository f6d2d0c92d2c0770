#include "model/shard.h"

#include <algorithm>
#include <initializer_list>
#include <numeric>
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
  if (!tt) fail("tensor parallelism: {} is {}, which is not split by columns yet", what, type_name(w.type));
  if (c0 % tt->block_elems || n % tt->block_elems)
    fail(
        "tensor parallelism: {} would be split inside its {}-element {} blocks (columns {} .. {}); run with "
        "fewer ranks",
        what, tt->block_elems, type_name(w.type), c0, c0 + n);
  WeightView s = w;
  s.data = static_cast<const uint8_t*>(w.data) + row_bytes(*tt, (uint64_t)c0);
  s.cols = n;
  if (w.scale) {
    // F8_E4M3 / TERNARY: element (r, c) takes scale[r * scale_row_stride + c / scale_group]. One scale per
    // row or per tensor (a group as wide as the row) stays the slice's; groups of columns are sliced with the
    // columns, whole groups only (the last one of the row may be partial).
    const int64_t g = w.scale_group > 0 ? w.scale_group : w.cols;
    if (g >= w.cols) {
      s.scale_group = n;
    } else {
      if (c0 % g || (n % g && c0 + n != w.cols))
        fail(
            "tensor parallelism: {} would be split inside its {}-column {} scale groups (columns {} .. {}); "
            "run "
            "with fewer ranks",
            what, g, type_name(w.type), c0, c0 + n);
      s.scale = w.scale + c0 / g;
    }
  }
  return s;
}

// Rank r's part of the heads.
struct Heads {
  int h0, hl;    // query heads [h0, h0 + hl)
  int kv0, kvl;  // the KV heads they read
};

// Query heads [h0, h1) of rank r (ranks differ by one head at most), and the KV heads they read: replicated
// where ranks share one. The shard's own GQA grouping must map its query heads onto them as the model does:
// local head h reads local KV head h / (hl / kvl). Throws naming what does not split.
Heads heads_of(const ModelData& m, int r, int size) {
  const HParams& hp = m.hp;
  const int H = hp.n_heads, KV = hp.n_kv_heads, group = H / KV;
  Heads s;
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
  return s;
}

// Rank r's columns [c0, c0 + cl) of an FFN of width columns: whole blocks of blk columns (the down
// projections' quantization blocks; ranks differ by one block at most). Throws naming what does not split.
struct Cols {
  int64_t c0 = 0, cl = 0;
};
Cols cols_of(const ModelData& m, const char* what, int64_t width, int64_t blk, int r, int size) {
  const int64_t units = width / blk;
  if (units < size)
    fail("{}: the {} width {} is too narrow for {} ranks ({}-column blocks)", m.path, what, width, size, blk);
  Cols c;
  c.c0 = r * units / size * blk;
  // The last rank also takes a partial last unit (a scale group narrower than the others at the row's end).
  c.cl = (r + 1 == size ? width : (r + 1) * units / size * blk) - c.c0;
  return c;
}

// The columns of one quantization block of w (1 for an empty view or a type without blocks).
int64_t block_of(const WeightView& w) {
  const auto tt = w.rows > 0 ? type_traits(w.type) : std::nullopt;
  const int64_t b = tt ? (int64_t)tt->block_elems : 1;
  // F8_E4M3 / TERNARY with scales per group of columns: whole groups too (col_slice).
  return w.scale && w.scale_group > 0 && w.scale_group < w.cols ? std::lcm(b, w.scale_group) : b;
}

// The FFN splits: the dense FFN's (ffn), or each expert's (expert) and the shared expert's (shexp).
struct FfnSplit {
  Cols ffn, expert, shexp;
};

FfnSplit ffn_split_of(const ModelData& m, int r, int size) {
  const HParams& hp = m.hp;
  int64_t dense = 1, expert = 1, shexp = 1;
  for (const LayerWeights& l : m.layers) {  // a split keeps every layer's blocks whole (mixed types)
    dense = std::lcm(dense, block_of(l.w_down));
    shexp = std::lcm(shexp, block_of(l.w_down_shexp));
    for (int e = 0; l.down_exps && e < hp.n_expert; ++e) expert = std::lcm(expert, block_of(l.down_exps[e]));
  }
  FfnSplit s;
  if (!hp.moe()) {
    s.ffn = cols_of(m, "FFN", hp.ffn_dim, dense, r, size);
    return s;
  }
  s.expert = cols_of(m, "expert FFN", hp.expert_ffn_dim, expert, r, size);
  if (hp.shexp_ffn_dim > 0) s.shexp = cols_of(m, "shared expert FFN", hp.shexp_ffn_dim, shexp, r, size);
  return s;
}

// Columns [c0, c0 + cl) of every row of a [rows, width] array: a copy owned by m.
const float* col_copy(ModelData& m, const float* a, int64_t rows, int64_t width, const Cols& c) {
  if (!a) return nullptr;
  std::vector<float>& out = m.owned.emplace_back((size_t)(rows * c.cl));
  for (int64_t i = 0; i < rows; ++i) std::copy_n(a + i * width + c.c0, c.cl, out.data() + i * c.cl);
  return out.data();
}

}  // namespace

void shard_model(ModelData& m, int rank, int size) {
  HParams& hp = m.hp;
  if (size < 1 || rank < 0 || rank >= size) fail("tensor parallelism: rank {} of {}", rank, size);
  if (size == 1) return;
  if (m.tp_size != 1) fail("tensor parallelism: the model is split already");
  const std::string& src = m.path;
  if (size > hp.n_heads) fail("{}: --tp {} is more ranks than the {} attention heads", src, size, hp.n_heads);
  const int64_t V = hp.n_vocab, vs = (V + size - 1) / size, v0 = rank * vs;
  if ((size - 1) * vs >= V) fail("{}: the vocabulary ({}) is too small to split over {} ranks", src, V, size);
  const int64_t vl = std::min(V, v0 + vs) - v0;
  const int E = hp.moe() ? hp.n_expert : 0;
  // Every rank's splits checked on every rank (so that all refuse alike), before anything changes.
  const int hd = hp.head_dim;
  for (int r = 0; r < size; ++r) {
    const Heads h = heads_of(m, r, size);
    const FfnSplit f = ffn_split_of(m, r, size);
    for (size_t il = 0; il < m.layers.size(); ++il) {
      const LayerWeights& l = m.layers[il];
      col_slice(l.wo, (int64_t)h.h0 * hd, (int64_t)h.hl * hd,
                fmt::format("layer {}'s output projection", il));
      if (!hp.moe()) col_slice(l.w_down, f.ffn.c0, f.ffn.cl, fmt::format("layer {}'s down projection", il));
      for (int e = 0; e < E; ++e)
        col_slice(l.down_exps[e], f.expert.c0, f.expert.cl,
                  fmt::format("layer {}'s expert {} down projection", il, e));
      if (hp.shexp_ffn_dim > 0)
        col_slice(l.w_down_shexp, f.shexp.c0, f.shexp.cl,
                  fmt::format("layer {}'s shared expert down projection", il));
    }
  }
  const Heads sh = heads_of(m, rank, size);
  const int q0 = sh.h0, hl = sh.hl, kv0 = sh.kv0, kvl = sh.kvl;
  const FfnSplit fs = ffn_split_of(m, rank, size);
  const Cols ffn = fs.ffn, ex = fs.expert, shx = fs.shexp;

  size_t full = matrix_bytes(m.tok_embd) + (m.output.data != m.tok_embd.data ? matrix_bytes(m.output) : 0);
  const bool tied = m.output.data == m.tok_embd.data;
  m.tok_embd = row_slice(m.tok_embd, v0, vl);
  m.output = row_slice(m.output, v0, vl);
  size_t shard = matrix_bytes(m.tok_embd) + (tied ? 0 : matrix_bytes(m.output));
  for (size_t il = 0; il < m.layers.size(); ++il) {
    LayerWeights& l = m.layers[il];
    const std::initializer_list<const WeightView*> dense = {
        &l.wq,   &l.wk,     &l.wv,           &l.wo,         &l.w_gate,
        &l.w_up, &l.w_down, &l.w_gate_shexp, &l.w_up_shexp, &l.w_down_shexp};
    for (const WeightView* w : dense) full += matrix_bytes(*w);
    l.wq = row_slice(l.wq, (int64_t)q0 * hd, (int64_t)hl * hd);
    l.wk = row_slice(l.wk, (int64_t)kv0 * hd, (int64_t)kvl * hd);
    l.wv = row_slice(l.wv, (int64_t)kv0 * hd, (int64_t)kvl * hd);
    if (l.bq) l.bq += (size_t)q0 * hd;
    if (l.bk) l.bk += (size_t)kv0 * hd;
    if (l.bv) l.bv += (size_t)kv0 * hd;
    l.wo = col_slice(l.wo, (int64_t)q0 * hd, (int64_t)hl * hd, "wo");
    if (l.attn_sinks) l.attn_sinks += q0;
    if (rank != 0) l.bo = nullptr;  // added once, by rank 0, before the sum
    if (!hp.moe()) {
      l.w_gate = row_slice(l.w_gate, ffn.c0, ffn.cl);
      l.w_up = row_slice(l.w_up, ffn.c0, ffn.cl);
      l.w_down = col_slice(l.w_down, ffn.c0, ffn.cl, "w_down");
    }
    l.wqkv = {};  // the fused views no longer match the split ones
    l.w_gate_up = {};
    if (E > 0) {  // every expert by columns; the router (and the shared expert's gate) on every rank
      // [gate x E, up x E, down x E]: the arrays LayerWeights points to.
      std::vector<WeightView>& v = m.owned_views.emplace_back((size_t)3 * E);
      for (int e = 0; e < E; ++e) {
        for (const WeightView* w : {&l.gate_exps[e], &l.up_exps[e], &l.down_exps[e]})
          full += matrix_bytes(*w);
        v[e] = row_slice(l.gate_exps[e], ex.c0, ex.cl);
        v[E + e] = row_slice(l.up_exps[e], ex.c0, ex.cl);
        v[2 * E + e] = col_slice(l.down_exps[e], ex.c0, ex.cl, "down_exps");
      }
      l.gate_exps = v.data();
      l.up_exps = v.data() + E;
      l.down_exps = v.data() + 2 * E;
      for (const WeightView& w : v) shard += matrix_bytes(w);
      l.gate_exps_b = col_copy(m, l.gate_exps_b, E, hp.expert_ffn_dim, ex);
      l.up_exps_b = col_copy(m, l.up_exps_b, E, hp.expert_ffn_dim, ex);
      if (rank != 0) l.down_exps_b = nullptr;  // weighted and added once, by rank 0, before the sum
    }
    if (hp.shexp_ffn_dim > 0) {
      l.w_gate_shexp = row_slice(l.w_gate_shexp, shx.c0, shx.cl);
      l.w_up_shexp = row_slice(l.w_up_shexp, shx.c0, shx.cl);
      l.w_down_shexp = col_slice(l.w_down_shexp, shx.c0, shx.cl, "w_down_shexp");
    }
    for (const WeightView* w : dense) shard += matrix_bytes(*w);
  }
  m.weight_bytes = m.weight_bytes - std::min(m.weight_bytes, full) + shard;
  hp.n_heads = hl;
  hp.n_kv_heads = kvl;
  if (hp.moe()) {
    hp.expert_ffn_dim = (int)ex.cl;
    hp.shexp_ffn_dim = (int)shx.cl;
    hp.ffn_dim = 0;  // no dense FFN runs: the FFN scratch (max_ffn_dim) is the experts' shard's
  } else {
    hp.ffn_dim = (int)ffn.cl;
  }
  m.tp_rank = rank;
  m.tp_size = size;
  m.vocab0 = v0;
  m.vocab_shard = vs;
}

}  // namespace ultra
