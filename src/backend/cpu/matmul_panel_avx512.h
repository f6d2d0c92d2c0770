// Prefill matmul for AVX-512 (included by matmul_avx512.cpp only, compiled with its ISA flags): an
// outer-product GEMM over packed weight panels, as BLIS-style GEMMs do.
//
// y[t, r] = sum_c W[r, c] x[t, c] for a thread's rows [r0, r1): for each panel of kMR = 32 rows and each
// block of kKC = 256 columns, the weights are converted to f32 once and packed k-major (p[k][32], 32 KB: the
// panel stays in L1), then every token tile of up to kNR = 12 tokens runs the micro-kernel: per column k,
// two 16-row vectors of the panel times x[t, k] broadcast for each of the 12 tokens (x of the tile packed
// k-major first, so the broadcasts read one stream), into 24 vector
// accumulators (2 loads + 12 broadcasts per 24 FMAs: FMA-bound, and no horizontal sums). Each column block
// sums from zero and is then added to y (the first one stores), so no FMA chain is longer than kKC columns
// (one chain over all columns lost 1e-5 against the dot-product tiles on the bundled model's logits); the
// last block adds the bias.
//
// Numerics: the products are exact and each (row, token) sum is f32 FMA chains of <= 256 columns in column
// order, added block by block (the dot-product tiles of matmul_driver.h sum 16 lane chains and then the
// lanes), so results match them and the scalar reference to f32 rounding (~1e-6 relative), not bit for bit.
// Q8_0 weights are dequantised into the panel exactly (q * d is exact in f32), as in the other kernels: no
// activation quantisation.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/matmul_panel_driver.h"

namespace ultra::cpu::detail {
namespace {  // internal linkage: this header is compiled with the AVX-512 flags of one file only
namespace panel {

constexpr int kMR = 32;        // rows per panel: two vectors
constexpr int kNR = 12;        // tokens per micro-tile: 2 x 12 accumulators
constexpr int kKC = 256;       // columns per packed block (a panel: 32 KB of f32)
constexpr int kMC = 128;       // rows per L2 block (kMC / kMR panels, 128 KB of f32)
constexpr int kPrefetchK = 4;  // panel rows requested this many columns ahead (L2 -> L1)

// v[i] = row i (16 floats) -> v[j] = column j.
inline void transpose16(__m512* v) {
  __m512 t[16], r[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
      t[8 * i + j + 4] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    v[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    v[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
}

// Packs rows [0, nr) of w (row stride rb bytes; rows nr..31 as zeros) x columns [kc, kc + kn) into
// p[k][kMR], converting with loader L (L::load(row, c): 16 f32 from column c; L::load_mask for a tail).
template <class L>
inline void pack(const uint8_t* w, size_t rb, int nr, int64_t kc, int kn, float* p) {
  for (int h = 0; h < kMR; h += 16) {
    for (int k0 = 0; k0 < kn; k0 += 16) {
      const int kw = kn - k0 < 16 ? kn - k0 : 16;
      const __mmask16 m = (__mmask16)((1u << kw) - 1);
      __m512 v[16];
      for (int i = 0; i < 16; ++i) {
        const int row = h + i;
        if (row >= nr)
          v[i] = _mm512_setzero_ps();
        else if (kw == 16)
          v[i] = L::load(w + row * rb, kc + k0);
        else
          v[i] = L::load_mask(w + row * rb, kc + k0, m);
      }
      transpose16(v);
      for (int j = 0; j < kw; ++j) _mm512_store_ps(p + (size_t)(k0 + j) * kMR + h, v[j]);
    }
  }
}

// Packs tokens [0, nt) (nt <= kNR) x columns [0, kn) of x (row stride ldx) into xp[k][kNR], k-major.
inline void pack_x(const float* x, int64_t ldx, int nt, int kn, float* xp) {
  for (int k0 = 0; k0 < kn; k0 += 16) {
    const int kw = kn - k0 < 16 ? kn - k0 : 16;
    const __mmask16 m = (__mmask16)((1u << kw) - 1);
    __m512 v[16];
    for (int t = 0; t < 16; ++t)
      v[t] = t < nt ? _mm512_maskz_loadu_ps(m, x + t * ldx + k0) : _mm512_setzero_ps();
    transpose16(v);
    for (int j = 0; j < kw; ++j) _mm512_mask_storeu_ps(xp + (size_t)(k0 + j) * kNR, (__mmask16)0x0fff, v[j]);
  }
}

// y[t * ldy + i] (first: =, else +=) sum_k p[k][i] x[k * kNR + t] (+ bias[i]) for i < nr (NV vectors of
// 16 rows), t < NT.
template <int NV, int NT>
inline void micro(const float* p, int kn, const float* x, int64_t ldx, float* y, int64_t ldy, int nr,
                  bool first, const float* bias) {
  __m512 acc[NV][NT];
  __mmask16 m[NV];
  for (int v = 0; v < NV; ++v) {
    const int left = nr - 16 * v;
    m[v] = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
  }
  for (int t = 0; t < NT; ++t)
    for (int v = 0; v < NV; ++v) acc[v][t] = _mm512_setzero_ps();
  for (int k = 0; k < kn; ++k) {
    __m512 wv[NV];
    if constexpr (kPrefetchK > 0)
      for (int v = 0; v < NV; ++v)
        _mm_prefetch((const char*)(p + (size_t)(k + kPrefetchK) * kMR + 16 * v), _MM_HINT_T0);
    for (int v = 0; v < NV; ++v) wv[v] = _mm512_load_ps(p + (size_t)k * kMR + 16 * v);
    for (int t = 0; t < NT; ++t) {
      const __m512 xb = _mm512_set1_ps(x[k * kNR + t]);  // packed x tile (ldx unused)
      for (int v = 0; v < NV; ++v) acc[v][t] = _mm512_fmadd_ps(wv[v], xb, acc[v][t]);
    }
  }
  for (int v = 0; v < NV; ++v) {
    const __m512 b = bias ? _mm512_maskz_loadu_ps(m[v], bias + 16 * v) : _mm512_setzero_ps();
    for (int t = 0; t < NT; ++t) {
      __m512 r =
          first ? acc[v][t] : _mm512_add_ps(_mm512_maskz_loadu_ps(m[v], y + t * ldy + 16 * v), acc[v][t]);
      if (bias) r = _mm512_add_ps(r, b);
      _mm512_mask_storeu_ps(y + t * ldy + 16 * v, m[v], r);
    }
  }
}

// The kernel struct of the shared block walk (matmul_panel_driver.h).
struct Kernel {
  static constexpr int kMR = panel::kMR, kNR = panel::kNR, kKC = panel::kKC, kMC = panel::kMC, kVec = 16;
  template <class P>
  static void pack(const uint8_t* w, size_t rb, int nr, int64_t kc, int kn, float* p) {
    panel::pack<P>(w, rb, nr, kc, kn, p);
  }
  static void pack_x(const float* x, int64_t ldx, int nt, int kn, float* xp) {
    panel::pack_x(x, ldx, nt, kn, xp);
  }
  template <int NV, int NT>
  static void micro(const float* p, int kn, const float* x, int64_t ldx, float* y, int64_t ldy, int nr,
                    bool first, const float* bias) {
    panel::micro<NV, NT>(p, kn, x, ldx, y, ldy, nr, first, bias);
  }
};

// Token tiles [j0, j1) of x, all columns, for MatmulArgs::xp.
inline void pack_x_all(const float* x, int n_tokens, int64_t cols, int j0, int j1, float* xp) {
  panel_driver::pack_x_all<Kernel>(x, n_tokens, cols, j0, j1, xp);
}

// Rows [r0, r1) of every token (MatmulArgs a, pack loader P).
template <class P, class Args>
void gemm(const Args& a, int64_t r0, int64_t r1) {
  panel_driver::gemm<Kernel, P>(a, r0, r1);
}

}  // namespace panel
}  // namespace
}  // namespace ultra::cpu::detail
