// The register tiles and decode rows of the SIMD matmul (matmul_avx2.cpp, matmul_avx512.cpp), written once
// over the vector traits V of simd_traits.h; the driver (matmul_driver.h) walks rows and tokens over them.
// See matmul.cpp for the structure and the Q8_0 arithmetic. Internal linkage (anonymous namespace): each
// ISA file instantiates these with its own V.
//
// Column tails follow V::kMaskedTail: scalar after the horizontal sum (AVX2), or one masked vector step
// (AVX-512).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_panel_driver.h"
#include "backend/cpu/simd_traits.h"
#include "core/dtype.h"

namespace ultra::cpu::detail {
namespace {

// Loaders: W weights from column c of a row -> W floats (load), the same for a masked tail (load_mask,
// AVX-512 only), one weight (scalar, AVX2 tails). Shared with the panel packing of matmul_panel.h.
template <class V>
struct LoadF32 {
  using E = float;
  static typename V::F load(const void* p, int64_t c) { return V::load((const float*)p + c); }
  template <class M>
  static typename V::F load_mask(const void* p, int64_t c, M m) {
    return V::load_mask(m, (const float*)p + c);
  }
  static float scalar(const void* p, int64_t c) { return ((const float*)p)[c]; }
};
template <class V>
struct LoadF16 {
  using E = uint16_t;
  static typename V::F load(const void* p, int64_t c) { return V::load((const uint16_t*)p + c); }
  template <class M>
  static typename V::F load_mask(const void* p, int64_t c, M m) {
    return V::load_mask(m, (const uint16_t*)p + c);
  }
  static float scalar(const void* p, int64_t c) { return _cvtsh_ss(((const uint16_t*)p)[c]); }
};
template <class V>
struct LoadBF16 {
  using E = uint16_t;
  static typename V::F load(const void* p, int64_t c) { return V::load_bf16((const uint16_t*)p + c); }
  template <class M>
  static typename V::F load_mask(const void* p, int64_t c, M m) {
    return V::load_bf16_mask(m, (const uint16_t*)p + c);
  }
  static float scalar(const void* p, int64_t c) { return bf16_to_fp32(((const uint16_t*)p)[c]); }
};

// ---- Q8_0 (cols % 32 == 0) ----
// Block b of a row, weights W k .. W k + W-1: sign-extended to int32, converted, times the block's scale d
// (exact in f32). Own tile/row loops (rather than a loader for tile_f/dot_row_f) so that the scale is
// converted once per block and the block addresses are plain pointer steps.
template <class V>
inline typename V::F q8_scale(const BlockQ8_0& b) {
  return V::set1(_cvtsh_ss(b.d));
}
template <class V>
inline typename V::F q8_part(const BlockQ8_0& b, int k, typename V::F d) {
  return V::mul(V::q8_widen(b.qs + V::W * k), d);
}

// The Q8_0 tag of the driver; its load() (W dequantised weights from column c, a multiple of W) serves the
// panel packing of the prefill GEMM (cols % 32 == 0: columns come in whole blocks, so neither load_mask nor
// scalar serves a tail in practice).
template <class V>
struct LoadQ8 {
  static typename V::F load(const void* p, int64_t c) {
    const BlockQ8_0& b = ((const BlockQ8_0*)p)[c / kQ8_0Block];
    return q8_part<V>(b, (int)(c % kQ8_0Block) / V::W, q8_scale<V>(b));
  }
  template <class M>
  static typename V::F load_mask(const void* p, int64_t c, M) {
    return load(p, c);
  }
  static float scalar(const void* p, int64_t c) {
    const BlockQ8_0& b = ((const BlockQ8_0*)p)[c / kQ8_0Block];
    return _cvtsh_ss(b.d) * (float)b.qs[c % kQ8_0Block];
  }
};

// y[t * ldy + j] = W[j, :] . x[t, :] (+ bias[j]) for j < R, t < T.
template <class V, class L, int R, int T>
inline void tile_f(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                   const float* bias) {
  constexpr int W = V::W;
  typename V::F acc[R][T];
  for (int j = 0; j < R; ++j)
    for (int t = 0; t < T; ++t) acc[j][t] = V::zero();
  int64_t c = 0;
  for (; c + W <= cols; c += W) {
    typename V::F wv[R];
    for (int j = 0; j < R; ++j) wv[j] = L::load(w + j * rb, c);
    for (int t = 0; t < T; ++t) {
      const typename V::F xv = V::load(x + t * cols + c);
      for (int j = 0; j < R; ++j) acc[j][t] = V::fmadd(wv[j], xv, acc[j][t]);
    }
  }
  if constexpr (V::kMaskedTail) {
    if (c < cols) {
      const auto m = V::tail_mask(cols - c);
      typename V::F wv[R];
      for (int j = 0; j < R; ++j) wv[j] = L::load_mask(w + j * rb, c, m);
      for (int t = 0; t < T; ++t) {
        const typename V::F xv = V::load_mask(m, x + t * cols + c);
        for (int j = 0; j < R; ++j) acc[j][t] = V::fmadd(wv[j], xv, acc[j][t]);
      }
    }
  }
  for (int j = 0; j < R; ++j) {
    for (int t = 0; t < T; ++t) {
      float s = V::hsum(acc[j][t]);
      if constexpr (!V::kMaskedTail)
        for (int64_t k = c; k < cols; ++k) s += L::scalar(w + j * rb, k) * x[t * cols + k];
      y[t * ldy + j] = bias ? s + bias[j] : s;
    }
  }
}

// Decode: one row at a time, streaming sequentially through memory (several interleaved row streams
// confuse the hardware prefetchers: 4-row tiles ran Q8_0 at a sixth of the bandwidth), with four
// accumulators to cover the FMA latency.
// Decode reads each weight once, so the row loops request their lines this far ahead into L1 themselves:
// one core's misses alone reach ~7 GB/s on a Skylake-class Xeon, and with the dequantising work between the
// loads the hardware prefetchers fell behind (Q8_0 decode 60 -> 80 tok/s with 2048 bytes, 110M shape).
constexpr int kDecodePrefetchBytes = 2048;

template <class V, class L>
inline float dot_row_f(const uint8_t* w, const float* x, int64_t cols) {
  constexpr int W = V::W;
  constexpr int kLines = W * (int)sizeof(typename L::E) / 16;  // 64-byte lines of one 4 W-column step
  typename V::F a0 = V::zero(), a1 = a0, a2 = a0, a3 = a0;
  int64_t c = 0;
  for (; c + 4 * W <= cols; c += 4 * W) {
    const char* pf = (const char*)w + c * (int64_t)sizeof(typename L::E) + kDecodePrefetchBytes;
    for (int l = 0; l < kLines; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);  // this step's lines, ahead
    a0 = V::fmadd(L::load(w, c), V::load(x + c), a0);
    a1 = V::fmadd(L::load(w, c + W), V::load(x + c + W), a1);
    a2 = V::fmadd(L::load(w, c + 2 * W), V::load(x + c + 2 * W), a2);
    a3 = V::fmadd(L::load(w, c + 3 * W), V::load(x + c + 3 * W), a3);
  }
  for (; c + W <= cols; c += W) a0 = V::fmadd(L::load(w, c), V::load(x + c), a0);
  if constexpr (V::kMaskedTail) {
    if (c < cols) {
      const auto m = V::tail_mask(cols - c);
      a1 = V::fmadd(L::load_mask(w, c, m), V::load_mask(m, x + c), a1);
    }
  }
  float s = V::hsum(V::add(V::add(a0, a1), V::add(a2, a3)));
  if constexpr (!V::kMaskedTail)
    for (; c < cols; ++c) s += L::scalar(w, c) * x[c];
  return s;
}

template <class V, int R, int T>
inline void tile_q8(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                    const float* bias) {
  constexpr int kParts = kQ8_0Block / V::W;  // vectors per block
  typename V::F acc[R][T];
  const BlockQ8_0* wr[R];
  for (int j = 0; j < R; ++j) {
    wr[j] = (const BlockQ8_0*)(w + j * rb);
    for (int t = 0; t < T; ++t) acc[j][t] = V::zero();
  }
  const int64_t nb = cols / kQ8_0Block;
  for (int64_t b = 0; b < nb; ++b) {
    typename V::F d[R];
    for (int j = 0; j < R; ++j) d[j] = q8_scale<V>(wr[j][b]);
    for (int k = 0; k < kParts; ++k) {
      typename V::F wv[R];
      for (int j = 0; j < R; ++j) wv[j] = q8_part<V>(wr[j][b], k, d[j]);
      for (int t = 0; t < T; ++t) {
        const typename V::F xv = V::load(x + t * cols + b * kQ8_0Block + V::W * k);
        for (int j = 0; j < R; ++j) acc[j][t] = V::fmadd(wv[j], xv, acc[j][t]);
      }
    }
  }
  for (int j = 0; j < R; ++j) {
    for (int t = 0; t < T; ++t) {
      const float s = V::hsum(acc[j][t]);
      y[t * ldy + j] = bias ? s + bias[j] : s;
    }
  }
}

// Decode of Q8_0: one sequential stream, four accumulators, 8 / P blocks per step (P = 32 / W vectors per
// block: 2 blocks of AVX2, 4 of AVX-512). A block's products are summed unscaled in P / 2 chains (chain c:
// its vectors c and c + P / 2, one multiply and one FMA) and each chain takes the block's scale in one more
// FMA: 3 arithmetic instructions per 2 W weights instead of 4 (scaling the weights first, as the tiles do,
// which reuse them for several tokens) and a scale broadcast straight from memory. The rounding differs from
// the tiles' (each chain is rounded once more), within the same bound.
template <class V>
inline float dot_row_q8(const uint8_t* w, const float* x, int64_t cols) {
  constexpr int W = V::W, kParts = kQ8_0Block / W, kChains = kParts / 2, kBlocks = 4 / kChains;
  constexpr int kLines = (kBlocks * (int)sizeof(BlockQ8_0) + 63) / 64;  // of one step's blocks
  const BlockQ8_0* b = (const BlockQ8_0*)w;
  const int64_t nb = cols / kQ8_0Block;
  auto chain = [](const BlockQ8_0& blk, const float* xb, int c) {  // sum over vectors c, c + kChains
    return V::fmadd(V::q8_widen(blk.qs + W * (c + kChains)), V::load(xb + W * (c + kChains)),
                    V::mul(V::q8_widen(blk.qs + W * c), V::load(xb + W * c)));
  };
  typename V::F acc[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
  int64_t i = 0;
  for (; i + kBlocks <= nb; i += kBlocks) {
    const float* xi = x + i * kQ8_0Block;
    const char* pf = (const char*)(b + i) + kDecodePrefetchBytes;
    for (int l = 0; l < kLines; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
    for (int k = 0; k < kBlocks; ++k)
      for (int c = 0; c < kChains; ++c)
        acc[k * kChains + c] =
            V::fmadd(chain(b[i + k], xi + k * kQ8_0Block, c), V::f16_bcast(b[i + k].d), acc[k * kChains + c]);
  }
  for (; i < nb; ++i)
    for (int c = 0; c < kChains; ++c)
      acc[c] = V::fmadd(chain(b[i], x + i * kQ8_0Block, c), V::f16_bcast(b[i].d), acc[c]);
  return V::hsum(V::add(V::add(acc[0], acc[1]), V::add(acc[2], acc[3])));
}

// The part of matmul_driver.h's Isa traits that is the same for every instruction set: loader types,
// register tile (kR rows x kT tokens), tile and decode-row kernels, and the packed-panel GEMM of prefill
// steps (panel kernel K, matmul_panel.h). Each ISA file instantiates it as its Isa.
template <class V, int kRows, class K>
struct TileIsa {
  using F32 = LoadF32<V>;
  using F16 = LoadF16<V>;
  using BF16 = LoadBF16<V>;
  using Q8 = LoadQ8<V>;
  static constexpr int kR = kRows, kT = 4;
  // Prefill of at least this many tokens: the packed-panel GEMM.
  static constexpr int kPanelMinTokens = 16;
  static constexpr int kPanelNR = K::kNR;
  static void pack_x(const float* x, int n_tokens, int64_t cols, int j0, int j1, float* xp) {
    panel_driver::pack_x_all<K>(x, n_tokens, cols, j0, j1, xp);
  }
  template <class L>
  static void gemm(const MatmulArgs& a, int64_t r0, int64_t r1) {
    panel_driver::gemm<K, L>(a, r0, r1);
  }
  template <class L, int R, int T>
  static void tile_f(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                     const float* bias) {
    detail::tile_f<V, L, R, T>(w, rb, x, cols, y, ldy, bias);
  }
  template <int R, int T>
  static void tile_q8(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                      const float* bias) {
    detail::tile_q8<V, R, T>(w, rb, x, cols, y, ldy, bias);
  }
  template <class L>
  static float dot_row_f(const uint8_t* w, const float* x, int64_t cols) {
    return detail::dot_row_f<V, L>(w, x, cols);
  }
  static float dot_row_q8(const uint8_t* w, const float* x, int64_t cols) {
    return detail::dot_row_q8<V>(w, x, cols);
  }
};

}  // namespace
}  // namespace ultra::cpu::detail
