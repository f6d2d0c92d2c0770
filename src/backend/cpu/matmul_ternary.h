// The TERNARY matmul (core/ternary.h: 16 trits per u32, scales per row / tensor / group of columns) of
// matmul_ternary_avx2.cpp and matmul_ternary_avx512.cpp, written once over the vector traits V of
// simd_traits.h and walked by matmul_driver.h's range_scaled. The scalar reference is matmul.cpp's ref_rows
// (weight_at).
//
// No multiplies in the inner loop: a word's 16 trits cover V::kTernaryParts vectors; for each, the word
// broadcast gives the lanes' +1 and -1 masks (V::ternary_masks: compares on AVX2, mask registers on
// AVX-512), and V::ternary_apply adds the activations under the first and subtracts them under the second.
// The scale multiplies each group's sum once.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/simd_traits.h"

namespace ultra::cpu::detail {
namespace {

// The kernel struct of matmul_driver.h's range_scaled; kRows x 4 tokens of accumulators.
template <class V, int kRows>
struct Ternary {
  static constexpr int kR = kRows, kT = 4;
  static constexpr int kParts = V::kTernaryParts;  // vectors per word (W * kParts == 16)
  static_assert(V::W * kParts == 16, "a word is 16 trits");

  // Decode: one row, four accumulators (each step's add and sub are dependent), one vector FMA of the scale
  // per group.
  static float dot_row(const MatmulArgs& a, int64_t r) {
    constexpr int W = V::W, kWords = 4 / kParts;                   // words per step of four vectors
    const uint32_t* w = (const uint32_t*)(a.w + r * a.row_bytes);  // [cols / 16] words
    const float* sc = a.scale + r * a.scale_row_stride;            // [cols / scale_group]
    const int64_t G = a.scale_group, nw = G / 16;
    const typename V::TernaryBits b;
    typename V::F tot = V::zero();
    for (int64_t g = 0; g < a.cols / G; ++g) {
      const uint32_t* wg = w + g * nw;
      const float* xg = a.x + g * G;
      // acc + the trits of part p of word wd applied to the W activations at xp
      auto step = [&b](typename V::F acc, uint32_t wd, int p, const float* xp) {
        return V::ternary_apply(acc, V::ternary_masks(b, wd, p), V::load(xp));
      };
      typename V::F a0 = V::zero(), a1 = a0, a2 = a0, a3 = a0;
      int64_t k = 0;
      for (; k + kWords <= nw; k += kWords) {  // vector v of the step: word k + v / kParts, part v % kParts
        a0 = step(a0, wg[k], 0, xg + 16 * k);
        a1 = step(a1, wg[k + 1 / kParts], 1 % kParts, xg + 16 * k + W);
        a2 = step(a2, wg[k + 2 / kParts], 2 % kParts, xg + 16 * k + 2 * W);
        a3 = step(a3, wg[k + 3 / kParts], 3 % kParts, xg + 16 * k + 3 * W);
      }
      for (; k < nw; ++k) {
        a0 = step(a0, wg[k], 0, xg + 16 * k);
        if constexpr (kParts == 2) a1 = step(a1, wg[k], 1, xg + 16 * k + W);
      }
      const typename V::F s = V::add(V::add(a0, a1), V::add(a2, a3));
      tot = V::fmadd(V::set1(sc[g]), s, tot);
    }
    return V::hsum(tot);
  }

  // Prefill: R rows x T tokens; each word's masks are made once and applied to T tokens.
  template <int R, int T>
  static void tile(const MatmulArgs& a, int64_t r, int t) {
    constexpr int W = V::W;
    const int64_t cols = a.cols, G = a.scale_group, nw = G / 16;
    const float* x = a.x + (int64_t)t * cols;  // [T, cols]
    const typename V::TernaryBits b;
    float tot[R][T] = {};
    for (int64_t g = 0; g < cols / G; ++g) {
      typename V::F acc[R][T];
      for (int j = 0; j < R; ++j)
        for (int i = 0; i < T; ++i) acc[j][i] = V::zero();
      for (int64_t k = g * nw; k < (g + 1) * nw; ++k) {
        for (int h = 0; h < kParts; ++h) {
          for (int j = 0; j < R; ++j) {
            const uint32_t word = ((const uint32_t*)(a.w + (r + j) * a.row_bytes))[k];
            const auto m = V::ternary_masks(b, word, h);
            for (int i = 0; i < T; ++i) {
              const typename V::F xv = V::load(x + i * cols + 16 * k + W * h);
              acc[j][i] = V::ternary_apply(acc[j][i], m, xv);
            }
          }
        }
      }
      for (int j = 0; j < R; ++j) {
        const float s = a.scale[(r + j) * a.scale_row_stride + g];
        for (int i = 0; i < T; ++i) tot[j][i] += s * V::hsum(acc[j][i]);
      }
    }
    for (int j = 0; j < R; ++j)
      for (int i = 0; i < T; ++i)
        a.y[(t + i) * a.rows + r + j] = a.bias ? tot[j][i] + a.bias[r + j] : tot[j][i];
  }
};

}  // namespace
}  // namespace ultra::cpu::detail
