// The prefill matmul of the SIMD files (matmul_avx2.cpp, matmul_avx512.cpp): an outer-product GEMM over
// packed weight panels, as BLIS-style GEMMs do, written once over the vector traits V of simd_traits.h
// (W floats per vector); matmul_panel_driver.h walks the blocks, matmul_panel_avx2.h / _avx512.h give the
// token tile kNR and the packing of x.
//
// y[t, r] = sum_c W[r, c] x[t, c] for a thread's rows [r0, r1): for each panel of kMR = 2 W rows and each
// block of kKC = 256 columns, the weights are converted to f32 once and packed k-major (p[k][kMR]: the panel
// stays in L1), then every token tile of up to kNR tokens runs the micro-kernel: per column k, two W-row
// vectors of the panel times x[t, k] broadcast for each of the kNR tokens (x of the tile packed k-major
// first, so the broadcasts read one stream), into 2 kNR vector accumulators (2 loads + kNR broadcasts per
// 2 kNR FMAs: FMA-bound, and no horizontal sums). Each column block sums from zero and is then added to y
// (the first one stores), so no FMA chain is longer than kKC columns (one chain over all columns lost 1e-5
// against the dot-product tiles on the bundled model's logits); the last block adds the bias.
//
// Numerics: the products are exact and each (row, token) sum is f32 FMA chains of <= 256 columns in column
// order, added block by block (the dot-product tiles of matmul_tile.h sum W lane chains and then the
// lanes), so results match them and the scalar reference to f32 rounding (~1e-6 relative), not bit for bit.
// Q8_0 weights are dequantised into the panel exactly (q * d is exact in f32), as in the other kernels: no
// activation quantisation.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "backend/cpu/matmul_panel_driver.h"
#include "backend/cpu/simd_traits.h"

namespace ultra::cpu::detail {
namespace {  // internal linkage: instantiated with the ISA flags of one file only
namespace panel {

constexpr int kKC = 256;       // columns per packed block
constexpr int kMC = 128;       // rows per L2 block (kMC / kMR panels)
constexpr int kPrefetchK = 4;  // panel rows requested this many columns ahead (L2 -> L1)

// Packs rows [0, nr) of w (row stride rb bytes; rows nr..kMR-1 as zeros) x columns [kc, kc + kn) into
// p[k][kMR], converting with loader L (matmul_tile.h: L::load(row, c), W f32 from column c). The column tail
// (kn % W) follows V::kMaskedTail: masked loads (L::load_mask) through the transpose, or L::scalar per value.
template <class V, int kMR, class L>
inline void pack(const uint8_t* w, size_t rb, int nr, int64_t kc, int kn, float* p) {
  constexpr int W = V::W;
  const int kv = V::kMaskedTail ? kn : kn / W * W;  // columns packed by transposes
  for (int h = 0; h < kMR; h += W) {
    for (int k0 = 0; k0 < kv; k0 += W) {
      const int kw = V::kMaskedTail && kv - k0 < W ? kv - k0 : W;
      typename V::F v[W];
      if constexpr (V::kMaskedTail) {
        const auto m = V::tail_mask(kw);
        for (int i = 0; i < W; ++i) {
          const int row = h + i;
          if (row >= nr)
            v[i] = V::zero();
          else if (kw == W)
            v[i] = L::load(w + row * rb, kc + k0);
          else
            v[i] = L::load_mask(w + row * rb, kc + k0, m);
        }
      } else {
        for (int i = 0; i < W; ++i) v[i] = h + i < nr ? L::load(w + (h + i) * rb, kc + k0) : V::zero();
      }
      V::transpose(v);
      for (int j = 0; j < kw; ++j) V::store_aligned(p + (size_t)(k0 + j) * kMR + h, v[j]);
    }
    if constexpr (!V::kMaskedTail)
      for (int k = kv; k < kn; ++k)
        for (int i = 0; i < W; ++i)
          p[(size_t)k * kMR + h + i] = h + i < nr ? L::scalar(w + (h + i) * rb, kc + k) : 0.0f;
  }
}

// y[t * ldy + i] (first: =, else +=) sum_k p[k][i] x[k * kNR + t] (+ bias[i]) for i < nr (NV vectors of W
// rows), t < NT.
template <class V, int kMR, int kNR, int NV, int NT>
inline void micro(const float* p, int kn, const float* x, float* y, int64_t ldy, int nr, bool first,
                  const float* bias) {
  constexpr int W = V::W;
  typename V::F acc[NV][NT];
  typename V::RowMask m[NV];
  for (int v = 0; v < NV; ++v) m[v] = V::row_mask(nr - W * v);
  for (int t = 0; t < NT; ++t)
    for (int v = 0; v < NV; ++v) acc[v][t] = V::zero();
  for (int k = 0; k < kn; ++k) {
    typename V::F wv[NV];
    if constexpr (kPrefetchK > 0)
      for (int v = 0; v < NV; ++v)
        if ((W * v) % 16 == 0)  // one request per 64-byte line of the column
          _mm_prefetch((const char*)(p + (size_t)(k + kPrefetchK) * kMR + W * v), _MM_HINT_T0);
    for (int v = 0; v < NV; ++v) wv[v] = V::load_aligned(p + (size_t)k * kMR + W * v);
    for (int t = 0; t < NT; ++t) {
      const typename V::F xb = V::broadcast(x + k * kNR + t);  // packed x tile
      for (int v = 0; v < NV; ++v) acc[v][t] = V::fmadd(wv[v], xb, acc[v][t]);
    }
  }
  for (int v = 0; v < NV; ++v) {
    const typename V::F b = bias ? V::load_rows(bias + W * v, m[v]) : V::zero();
    for (int t = 0; t < NT; ++t) {
      typename V::F r = first ? acc[v][t] : V::add(V::load_rows(y + t * ldy + W * v, m[v]), acc[v][t]);
      if (bias) r = V::add(r, b);
      V::store_rows(y + t * ldy + W * v, m[v], r);
    }
  }
}

// The kernel struct of the shared block walk (matmul_panel_driver.h): panels of two vectors of rows, token
// tiles of NR; X::pack_x(x, ldx, nt, kn, xp) packs a token tile of x (the ISA's own algorithm).
template <class V, int NR, class X>
struct Kernel {
  static constexpr int kVec = V::W, kMR = 2 * V::W, kNR = NR, kKC = panel::kKC, kMC = panel::kMC;
  // P: a loader of matmul_tile.h, or one with its own pack_panel (matmul_blocks.h's block types).
  template <class P>
  static void pack(const uint8_t* w, size_t rb, int nr, int64_t kc, int kn, float* p) {
    if constexpr (requires { P::kPackPanel; })
      P::template pack_panel<kMR>(w, rb, nr, kc, kn, p);
    else
      panel::pack<V, kMR, P>(w, rb, nr, kc, kn, p);
  }
  static void pack_x(const float* x, int64_t ldx, int nt, int kn, float* xp) {
    X::pack_x(x, ldx, nt, kn, xp);
  }
  template <int NV, int NT>
  static void micro(const float* p, int kn, const float* x, int64_t /*ldx: x comes packed*/, float* y,
                    int64_t ldy, int nr, bool first, const float* bias) {
    panel::micro<V, kMR, kNR, NV, NT>(p, kn, x, y, ldy, nr, first, bias);
  }
};

}  // namespace panel
}  // namespace
}  // namespace ultra::cpu::detail
