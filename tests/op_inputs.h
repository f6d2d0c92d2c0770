// The inputs of the op cases of op_cases.h (seeded by the case) and the magnitudes of their tolerance rules,
// shared by the CPU harness (test_backend_ops.cpp) and the CUDA one (gpu/test_cuda_ops.cpp), so that every
// backend runs the same data against the same scalar references.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <memory>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/quants.h"
#include "cpu_test_data.h"
#include "op_cases.h"

namespace ultra::test {

// Every weight of w as a double, [rows, cols] (block types through dequantize, a row at a time).
inline std::vector<double> decode_weights(const WeightView& w) {
  std::vector<double> wv(w.rows * w.cols);
  if (is_block_weight_type(w.type)) {
    std::vector<float> row(w.cols);
    for (int64_t r = 0; r < w.rows; ++r) {
      dequantize(w.type, (const uint8_t*)w.data + r * w.row_bytes, w.cols, row.data());
      for (int64_t i = 0; i < w.cols; ++i) wv[r * w.cols + i] = row[i];
    }
    return wv;
  }
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t i = 0; i < w.cols; ++i) wv[r * w.cols + i] = weight_value(w, r, i);
  return wv;
}

// Mag::DotF32 of y [nt, rows]: sqrt(cols) * (sum_c |w_rc x_tc| + |bias_r|), wv [rows, cols], x [nt, cols].
inline std::vector<double> dot_magnitudes(const std::vector<double>& wv, int64_t rows, int64_t cols,
                                          const float* x, int nt, const float* bias) {
  std::vector<double> mag(rows * nt);
  for (int t = 0; t < nt; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double s = bias ? std::fabs(bias[r]) : 0.0;
      const double* wr = wv.data() + r * cols;
      const float* xt = x + t * cols;
      for (int64_t i = 0; i < cols; ++i) s += std::fabs(wr[i] * xt[i]);
      mag[t * rows + r] = std::sqrt((double)cols) * s;
    }
  return mag;
}

// Matmul: the weights (host layout), their values, x [tokens, cols] and the bias [rows] (empty without).
struct MatmulInputs {
  Weights wt;
  std::vector<double> wv;
  std::vector<float> x, bias;
  const float* bias_ptr() const { return bias.empty() ? nullptr : bias.data(); }
};
inline std::unique_ptr<MatmulInputs> matmul_inputs(const OpCase& c) {
  auto d = std::make_unique<MatmulInputs>();
  d->wt = make_weights(c.type, c.rows, c.cols, c.seed, c.group, c.data == Data::Q8WideScales);
  d->wv = decode_weights(d->wt.view);
  d->x = randn(c.tokens * c.cols, c.seed + 1);
  if (c.data == Data::XBlocks) add_x_blocks(d->x, c.cols);
  if (c.bias) d->bias = randn(c.rows, c.seed + 2);
  return d;
}

// Gates of scale sd with the exp's edge cases (0, +-large, the flush-to-zero threshold, tiny).
inline std::vector<float> gates(const OpCase& c, float sd) {
  auto g = randn(c.cols, c.seed, sd);
  const float special[] = {0.0f, -100.0f, 100.0f, -87.0f, 88.0f, -1e-8f, 30.0f, -1e6f, -20.0f, 1e4f, -1e4f};
  if (g.size() > 11) std::copy(std::begin(special), std::end(special), g.begin());
  return g;
}

// f32 values for the f16 conversion: normal values, halves' subnormals, overflow to infinity, signed zeros,
// infinities, NaN.
inline std::vector<float> f16_inputs(const OpCase& c) {
  const int64_t n = c.cols;
  auto x = randn(n, c.seed, 1000.0f);
  const float special[] = {0.0f,    -0.0f, 65504.0f, 65520.0f,  -65519.0f, 1e-7f,      -6e-8f,
                           2.9e-8f, 1e5f,  INFINITY, -INFINITY, NAN,       6.1035e-5f, 3.0e-5f};
  for (size_t i = 0; i < std::size(special) && i < (size_t)n; ++i) x[i * 7 % n] = special[i];
  return x;
}

// RoPE of x [tokens, rows heads, cols = head_dim]: positions to 4e4 rad, inverse frequencies, and
// Mag::Pair of every element.
struct RopeInputs {
  std::vector<int32_t> pos;
  std::vector<float> inv, x;
  std::vector<double> mag;
};
inline RopeInputs rope_inputs(const OpCase& c) {
  const int nt = c.tokens, nh = (int)c.rows, hd = (int)c.cols;
  RopeInputs in;
  in.pos.resize(nt);
  for (int t = 0; t < nt; ++t) in.pos[t] = t == 0 ? 0 : (t * 9973 + 3) % 40000;
  in.inv.resize(hd / 2);
  for (int i = 0; i < hd / 2; ++i) in.inv[i] = (float)(1.0 / std::pow(10000.0, 2.0 * i / hd));
  in.x = randn(nt * nh * hd, c.seed);
  in.mag.resize(in.x.size());
  for (size_t th = 0; th < (size_t)nt * nh; ++th)
    for (int i = 0; i < hd / 2; ++i) {
      const size_t i0 = th * hd + (c.interleaved ? 2 * i : i),
                   i1 = th * hd + (c.interleaved ? 2 * i + 1 : i + hd / 2);
      in.mag[i0] = in.mag[i1] = std::fabs(in.x[i0]) + std::fabs(in.x[i1]);
    }
  return in;
}

// Attention: a cache of two slots with ctx positions of history each (written in prefill-like chunks of 64
// by the CPU's kv_write; the rest NaN), and this step's rows: tokens split between the slots (the first
// half on slot 1), consecutive positions from ctx in each (query tiles), their k / v rows (not yet in the
// cache: each backend writes them with its own kv_write) and q.
struct AttentionInputs {
  Cache cache;
  int max_ctx;
  std::vector<int32_t> pos, slot;
  std::vector<float> k, v, q;  // [tokens, kv_heads, cols], [tokens, kv_heads, cols], [tokens, rows, cols]
  std::vector<float> sinks;    // [rows] sink logits (c.sinks), the last head's above every score, or empty
  float vmax = 0;              // Mag::MaxV
  float scale;
  AttentionInputs(const AttentionInputs&) = delete;  // cache.view points into cache
  explicit AttentionInputs(const OpCase& c)
      : cache(c.type, 2, c.kv_heads, c.ctx + c.tokens + 3, (int)c.cols), max_ctx(c.ctx + c.tokens + 3) {
    const int n_kv = c.kv_heads, nh = (int)c.rows, hd = (int)c.cols, nt = c.tokens;
    for (int s = 0; s < 2; ++s) {
      const auto hk = randn((size_t)c.ctx * n_kv * hd, c.seed + 10 + s),
                 hv = randn((size_t)c.ctx * n_kv * hd, c.seed + 20 + s);
      for (float x : hv) vmax = std::max(vmax, std::fabs(x));
      for (int p0 = 0; p0 < c.ctx; p0 += 64) {
        const int n = std::min(64, c.ctx - p0);
        std::vector<int32_t> p(n), sl(n, s);
        for (int i = 0; i < n; ++i) p[i] = p0 + i;
        cpu::kv_write(cache.view, hk.data() + (size_t)p0 * n_kv * hd, hv.data() + (size_t)p0 * n_kv * hd, n,
                      p.data(), sl.data());
      }
    }
    pos.resize(nt);
    slot.resize(nt);
    const int first_half = (nt + 1) / 2;
    for (int t = 0; t < nt; ++t) {
      slot[t] = t < first_half ? 1 : 0;
      pos[t] = c.ctx + (t < first_half ? t : t - first_half);
    }
    k = randn((size_t)nt * n_kv * hd, c.seed + 30);
    v = randn((size_t)nt * n_kv * hd, c.seed + 31);
    for (float x : v) vmax = std::max(vmax, std::fabs(x));
    q = randn((size_t)nt * nh * hd, c.seed + 32, 3.0f);
    scale = 1.0f / std::sqrt((float)hd);
    if (c.sinks) {
      sinks = randn((size_t)nh, c.seed + 33, 2.0f);
      sinks.back() = 50.0f;
    }
  }
};

}  // namespace ultra::test
