// Test data of the CPU kernel tests (test_cpu_ops, test_backend_ops): random activations, the exact value of
// a weight decoded here independently of the kernels, and a NaN-poisoned KV cache layer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "core/quants.h"
#include "core/ternary.h"
#include "core/views.h"

namespace ultra::test {

constexpr float kGuard = 12345.678f;  // canary written past every output and scratch buffer

// n normal values of standard deviation scale.
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// The exact value of W[r, c] (F32, F16, BF16, Q8_0, F8_E4M3, TERNARY, decoded here; the block types of
// core/quants.h through its dequantize(), which tests/test_quants.cpp holds bit for bit against ggml; NaN for
// other types).
inline double weight_value(const WeightView& w, int64_t r, int64_t c) {
  const uint8_t* row = (const uint8_t*)w.data + r * w.row_bytes;
  switch (w.type) {
    case GgmlType::F32:
      return ((const float*)row)[c];
    case GgmlType::F16:
      return fp16_to_fp32(((const uint16_t*)row)[c]);
    case GgmlType::BF16:
      return bf16_to_fp32(((const uint16_t*)row)[c]);
    case GgmlType::Q8_0: {
      const BlockQ8_0& b = ((const BlockQ8_0*)row)[c / kQ8_0Block];
      return (double)fp16_to_fp32(b.d) * b.qs[c % kQ8_0Block];
    }
    case GgmlType::F8_E4M3:
      return (double)fp8_e4m3_to_fp32(row[c]) * w.scale[r * w.scale_row_stride + c / w.scale_group];
    case GgmlType::TERNARY:
      return ternary_trit(((const uint32_t*)row)[c / kTernaryPerWord], (int)(c % kTernaryPerWord)) *
             (double)w.scale[r * w.scale_row_stride + c / w.scale_group];
    default: {
      if (!is_block_quant(w.type)) return NAN;
      const auto tt = type_traits(w.type);
      float v[kQK_K];
      dequantize(w.type, row + c / tt->block_elems * tt->block_bytes, tt->block_elems, v);
      return v[c % tt->block_elems];
    }
  }
}

// The f16 scale fields (byte offsets) of a block type of core/quants.h.
inline std::vector<size_t> block_f16_fields(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_1:
    case GgmlType::Q5_1:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
      return {0, 2};
    case GgmlType::Q2_K:
      return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case GgmlType::Q3_K:
      return {offsetof(BlockQ3_K, d)};
    case GgmlType::Q6_K:
      return {offsetof(BlockQ6_K, d)};
    case GgmlType::MXFP4:
      return {};
    default:  // Q4_0, Q5_0, IQ4_NL, IQ4_XS, the grid i-quants but IQ1_M (random_blocks sets its d)
      return {0};
  }
}

// Blocks of a block type (core/quants.h's is_block_weight_type) with every code byte random and finite
// scales of magnitude 2^-9 .. 2^-3 (MXFP4: exponents 2^-7 .. 2^-2), either sign for d (dmin / m positive).
inline void random_blocks(GgmlType t, int64_t n_blocks, std::mt19937& rng, uint8_t* out) {
  const auto tt = type_traits(t);
  for (size_t i = 0; i < n_blocks * tt->block_bytes; ++i) out[i] = (uint8_t)rng();
  const auto fields = block_f16_fields(t);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint8_t* blk = out + b * tt->block_bytes;
    if (t == GgmlType::MXFP4) {
      blk[0] = (uint8_t)(120 + rng() % 6);
      continue;
    }
    if (t == GgmlType::IQ1_M) {  // d's 16 bits in the top nibbles of the 4 scale words (bytes 48..55)
      float v = std::ldexp(mant(rng), -(int)(3 + rng() % 7));
      if (rng() % 2) v = -v;
      const uint16_t h = fp32_to_fp16(v);
      for (int k = 0; k < 4; ++k) {
        uint16_t w;
        std::memcpy(&w, blk + 48 + 2 * k, 2);
        w = (uint16_t)((w & 0x0fff) | (((h >> (4 * k)) & 0xf) << 12));
        std::memcpy(blk + 48 + 2 * k, &w, 2);
      }
      continue;
    }
    for (size_t k = 0; k < fields.size(); ++k) {
      float v = std::ldexp(mant(rng), -(int)(3 + rng() % 7));
      if (k == 0 && rng() % 2) v = -v;
      const uint16_t h = fp32_to_fp16(v);
      std::memcpy(blk + fields[k], &h, 2);
    }
  }
}

// A weight matrix [rows, cols] of normal values (std 1) in the type: F32, F16, BF16 and Q8_0 converted from
// them (quantize_row_q8_0, cols % 32 == 0); F8_E4M3 every finite code, TERNARY uniform trits (cols % 16 ==
// 0), each with scales of one per row (group 0), one per tensor (group -1) or one per group columns.
// wide_q8_scales: the Q8_0 blocks scaled by 2^-8 .. 2^8 first, every 7th block all zero. Other types: empty.
struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  WeightView view;
};
inline Weights make_weights(GgmlType type, int64_t rows, int64_t cols, uint32_t seed, int64_t group = 0,
                            bool wide_q8_scales = false) {
  std::mt19937 rng(seed);
  std::vector<float> f = randn(rows * cols, seed);
  size_t rb = 0;
  switch (type) {
    case GgmlType::F32:
      rb = cols * 4;
      break;
    case GgmlType::F16:
    case GgmlType::BF16:
      rb = cols * 2;
      break;
    case GgmlType::Q8_0:
      rb = cols / kQ8_0Block * sizeof(BlockQ8_0);
      break;
    case GgmlType::F8_E4M3:
      rb = cols;
      break;
    case GgmlType::TERNARY:
      rb = cols / kTernaryPerWord * 4;
      break;
    default: {
      if (!is_block_weight_type(type)) return {};
      const auto tt = type_traits(type);
      rb = cols / tt->block_elems * tt->block_bytes;
      Weights w;
      w.bytes.assign(rb * rows, 0);
      random_blocks(type, rows * cols / tt->block_elems, rng, w.bytes.data());
      w.view = WeightView{type, w.bytes.data(), rows, cols, rb};
      return w;
    }
  }
  Weights w;
  w.bytes.assign(rb * rows, 0);
  if (type == GgmlType::Q8_0 && wide_q8_scales) {
    std::uniform_int_distribution<int> ed(-8, 8);
    for (int64_t b = 0; b < rows * cols / kQ8_0Block; ++b) {
      const float s = b % 7 == 3 ? 0.0f : std::ldexp(1.0f, ed(rng));
      for (int i = 0; i < kQ8_0Block; ++i) f[b * kQ8_0Block + i] *= s;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.bytes.data() + r * rb;
    const float* src = f.data() + r * cols;
    switch (type) {
      case GgmlType::F32:
        std::memcpy(row, src, cols * 4);
        break;
      case GgmlType::F16:
        for (int64_t i = 0; i < cols; ++i) ((uint16_t*)row)[i] = fp32_to_fp16(src[i]);
        break;
      case GgmlType::BF16:
        for (int64_t i = 0; i < cols; ++i) ((uint16_t*)row)[i] = fp32_to_bf16(src[i]);
        break;
      case GgmlType::Q8_0:
        cpu::quantize_row_q8_0(src, cols, (BlockQ8_0*)row);
        break;
      case GgmlType::F8_E4M3:
        for (int64_t i = 0; i < cols; ++i) {
          do row[i] = (uint8_t)rng();
          while (fp8_e4m3_is_nan(row[i]));
        }
        break;
      default: {  // TERNARY
        std::vector<int8_t> t(cols);
        for (auto& v : t) v = (int8_t)((int)(rng() % 3) - 1);
        ternary_pack(t.data(), cols, (uint32_t*)row);
        break;
      }
    }
  }
  w.view = WeightView{type, w.bytes.data(), rows, cols, rb};
  if (type == GgmlType::F8_E4M3 || type == GgmlType::TERNARY) {
    const int64_t g = group > 0 ? group : cols;
    const int64_t stride = group < 0 ? 0 : (cols + g - 1) / g;
    w.scales.resize(std::max<int64_t>(1, rows * stride));
    for (auto& s : w.scales)
      s = type == GgmlType::TERNARY ? 0.01f + (rng() % 1000) / 1000.0f
                                    : std::ldexp(1.0f + (rng() % 1000) / 1000.0f, -(int)(rng() % 12));
    w.view.scale = w.scales.data();
    w.view.scale_group = g;
    w.view.scale_row_stride = stride;
  }
  return w;
}

// In every cols-long row of x: a zero 32-block, a block 1000x larger and a block with one non-zero value
// (as far as the row has 2, 3, 4 blocks).
inline void add_x_blocks(std::vector<float>& x, int64_t cols) {
  for (size_t r = 0; r + cols <= x.size(); r += cols) {
    float* xr = x.data() + r;
    if (cols >= 64) std::fill_n(xr + 32, 32, 0.0f);
    if (cols >= 96)
      for (int i = 64; i < 96; ++i) xr[i] *= 1000.0f;
    if (cols >= 128) {
      std::fill_n(xr + 96, 32, 0.0f);
      xr[101] = -3.0f;
    }
  }
}

// A KV cache layer (F32 or F16) poisoned with NaN: a position never written must never be read (NaN
// propagates through any product).
struct Cache {
  std::vector<uint8_t> k, v;
  KvLayerView view;
  Cache(GgmlType type, int n_slots, int n_kv, int max_ctx, int hd) {
    const size_t n = (size_t)n_slots * n_kv * max_ctx * hd, es = type == GgmlType::F32 ? 4 : 2;
    k.resize(n * es);
    v.resize(n * es);
    if (type == GgmlType::F32) {
      std::fill((float*)k.data(), (float*)k.data() + n, NAN);
      std::fill((float*)v.data(), (float*)v.data() + n, NAN);
    } else {
      std::fill((uint16_t*)k.data(), (uint16_t*)k.data() + n, (uint16_t)0x7e00);
      std::fill((uint16_t*)v.data(), (uint16_t*)v.data() + n, (uint16_t)0x7e00);
    }
    view = KvLayerView{type, k.data(), v.data(), n_slots, n_kv, max_ctx, hd};
  }
};

}  // namespace ultra::test
