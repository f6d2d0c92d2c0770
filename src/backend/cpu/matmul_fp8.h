// The F8_E4M3 matmul (an f32 scale per row, or per row and group of columns) of matmul_fp8_avx2.cpp and
// matmul_fp8_avx512.cpp, written once over the vector traits V of simd_traits.h and walked by
// matmul_driver.h's range_scaled. The scalar reference is matmul.cpp's ref_rows (weight_at).
//
// Decoding W codes without a table (V::fp8): an E4M3 code shifted into an IEEE half, sign.eeee.mmm ->
// s.0eeee.mmm0000000, is the same value times 2^-8 for normals and subnormals alike (both formats keep the
// mantissa's position relative to the exponent; half's bias 15 = E4M3's 7 + 8), so
//   half = (sign_extend_8_to_16(code) << 7) & 0xBFFF     (bit 15: the sign; bit 14 cleared)
// then vcvtph2ps, and the 2^8 goes into the row scale. Exact for every finite code; the NaN codes (refused
// at load) would read as ±480. Column tails follow V::kMaskedTail (scalar, or one masked step).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/simd_traits.h"
#include "core/fp8.h"

namespace ultra::cpu::detail {
namespace {

// w[0..n) . x[0..n) with the codes decoded as 2^-8 times their value: one sequential weight stream, four
// accumulators for the FMA latency.
template <class V>
inline float fp8_dot_span(const uint8_t* w, const float* x, int64_t n) {
  constexpr int W = V::W;
  typename V::F a0 = V::zero(), a1 = a0, a2 = a0, a3 = a0;
  int64_t c = 0;
  for (; c + 4 * W <= n; c += 4 * W) {
    a0 = V::fmadd(V::fp8(w + c), V::load(x + c), a0);
    a1 = V::fmadd(V::fp8(w + c + W), V::load(x + c + W), a1);
    a2 = V::fmadd(V::fp8(w + c + 2 * W), V::load(x + c + 2 * W), a2);
    a3 = V::fmadd(V::fp8(w + c + 3 * W), V::load(x + c + 3 * W), a3);
  }
  for (; c + W <= n; c += W) a0 = V::fmadd(V::fp8(w + c), V::load(x + c), a0);
  if constexpr (V::kMaskedTail) {
    if (c < n) {
      const auto m = V::tail_mask(n - c);
      a1 = V::fmadd(V::fp8_mask(m, w + c), V::load_mask(m, x + c), a1);  // masked-off codes read as +0.0
    }
  }
  float s = V::hsum(V::add(V::add(a0, a1), V::add(a2, a3)));
  if constexpr (!V::kMaskedTail)
    for (; c < n; ++c) s += fp8_e4m3_to_fp32(w[c]) * (1.0f / 256.0f) * x[c];
  return s;
}

// The kernel struct of matmul_driver.h's range_scaled; kRows x 4 tokens of accumulators.
template <class V, int kRows>
struct Fp8 {
  static constexpr int kR = kRows, kT = 4;

  // Decode: per scale group (the whole row, or HF block-wise checkpoints' 128 columns), the span's sum
  // times its scale; the 2^8 the decoding left out once at the end.
  static float dot_row(const MatmulArgs& a, int64_t r) {
    const uint8_t* w = a.w + r * a.row_bytes;            // [cols] codes
    const float* sc = a.scale + r * a.scale_row_stride;  // [ceil(cols / scale_group)]
    const int64_t cols = a.cols, G = a.scale_group;
    if (G >= cols) return fp8_dot_span<V>(w, a.x, cols) * (sc[0] * 256.0f);
    float s = 0;
    for (int64_t g0 = 0; g0 < cols; g0 += G)
      s += fp8_dot_span<V>(w + g0, a.x + g0, std::min(G, cols - g0)) * sc[g0 / G];
    return s * 256.0f;
  }

  // Prefill: R rows x T tokens; each weight vector is decoded once and used for T tokens.
  template <int R, int T>
  static void tile(const MatmulArgs& a, int64_t r, int t) {
    constexpr int W = V::W;
    const int64_t cols = a.cols, G = std::min(a.scale_group, a.cols);
    const uint8_t* w = a.w + r * a.row_bytes;  // rows r .. r+R-1, a.row_bytes apart
    const float* x = a.x + (int64_t)t * cols;  // [T, cols]
    float tot[R][T] = {};
    for (int64_t g0 = 0; g0 < cols; g0 += G) {
      const int64_t g1 = std::min(g0 + G, cols);
      typename V::F acc[R][T];
      for (int j = 0; j < R; ++j)
        for (int i = 0; i < T; ++i) acc[j][i] = V::zero();
      int64_t c = g0;
      for (; c + W <= g1; c += W) {
        typename V::F wv[R];
        for (int j = 0; j < R; ++j) wv[j] = V::fp8(w + j * a.row_bytes + c);
        for (int i = 0; i < T; ++i) {
          const typename V::F xv = V::load(x + i * cols + c);
          for (int j = 0; j < R; ++j) acc[j][i] = V::fmadd(wv[j], xv, acc[j][i]);
        }
      }
      if constexpr (V::kMaskedTail) {
        if (c < g1) {
          const auto m = V::tail_mask(g1 - c);
          typename V::F wv[R];
          for (int j = 0; j < R; ++j) wv[j] = V::fp8_mask(m, w + j * a.row_bytes + c);
          for (int i = 0; i < T; ++i) {
            const typename V::F xv = V::load_mask(m, x + i * cols + c);
            for (int j = 0; j < R; ++j) acc[j][i] = V::fmadd(wv[j], xv, acc[j][i]);
          }
        }
      }
      for (int j = 0; j < R; ++j) {
        const float sc = a.scale[(r + j) * a.scale_row_stride + g0 / G];
        const uint8_t* wj = w + j * a.row_bytes;
        for (int i = 0; i < T; ++i) {
          float s = V::hsum(acc[j][i]);
          if constexpr (!V::kMaskedTail)
            for (int64_t k = c; k < g1; ++k) s += fp8_e4m3_to_fp32(wj[k]) * (1.0f / 256.0f) * x[i * cols + k];
          tot[j][i] += s * sc;
        }
      }
    }
    for (int j = 0; j < R; ++j) {
      for (int i = 0; i < T; ++i) {
        const float v = tot[j][i] * 256.0f;
        a.y[(t + i) * a.rows + r + j] = a.bias ? v + a.bias[r + j] : v;
      }
    }
  }
};

}  // namespace
}  // namespace ultra::cpu::detail
