// Prefill matmul for AVX2+FMA (included by matmul_avx2.cpp only, compiled with its ISA flags): the
// outer-product GEMM over packed weight panels of matmul_panel_avx512.h with 8-wide vectors: panels of
// kMR = 16 rows (two vectors) x kKC = 256 columns (16 KB of f32, k-major), micro-tiles of kNR = 6 tokens,
// 12 vector accumulators (2 loads + 6 broadcasts per 12 FMAs). Same numerics: f32 FMA chains of <= 256
// columns per output, added block by block, weights converted exactly (Q8_0 dequantised exactly), no
// activation quantisation.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/matmul_panel_driver.h"

namespace ultra::cpu::detail {
namespace {  // internal linkage: this header is compiled with the AVX2 flags of one file only
namespace panel {

constexpr int kMR = 16;        // rows per panel: two vectors
constexpr int kNR = 6;         // tokens per micro-tile: 2 x 6 accumulators
constexpr int kKC = 256;       // columns per packed block
constexpr int kMC = 128;       // rows per L2 block (kMC / kMR panels)
constexpr int kPrefetchK = 4;  // panel rows requested this many columns ahead (L2 -> L1)

// v[i] = row i (8 floats) -> v[j] = column j.
inline void transpose8(__m256* v) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    s[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm256_permute2f128_ps(s[j], s[j + 4], 0x20);
    v[j + 4] = _mm256_permute2f128_ps(s[j], s[j + 4], 0x31);
  }
}

// Packs rows [0, nr) of w (row stride rb bytes; rows nr..15 as zeros) x columns [kc, kc + kn) into
// p[k][kMR]. P::load(row, c): 8 f32 from column c; P::scalar(row, c): one (column tails).
template <class P>
inline void pack(const uint8_t* w, size_t rb, int nr, int64_t kc, int kn, float* p) {
  const int kv = kn / 8 * 8;
  for (int h = 0; h < kMR; h += 8) {
    for (int k0 = 0; k0 < kv; k0 += 8) {
      __m256 v[8];
      for (int i = 0; i < 8; ++i)
        v[i] = h + i < nr ? P::load(w + (h + i) * rb, kc + k0) : _mm256_setzero_ps();
      transpose8(v);
      for (int j = 0; j < 8; ++j) _mm256_store_ps(p + (size_t)(k0 + j) * kMR + h, v[j]);
    }
    for (int k = kv; k < kn; ++k)
      for (int i = 0; i < 8; ++i)
        p[(size_t)k * kMR + h + i] = h + i < nr ? P::scalar(w + (h + i) * rb, kc + k) : 0.0f;
  }
}

// Packs tokens [0, nt) (nt <= kNR) x columns [0, kn) of x (row stride ldx) into xp[k][kNR], k-major.
inline void pack_x(const float* x, int64_t ldx, int nt, int kn, float* xp) {
  for (int t = 0; t < nt; ++t)
    for (int k = 0; k < kn; ++k) xp[(size_t)k * kNR + t] = x[t * ldx + k];
  for (int t = nt; t < kNR; ++t)
    for (int k = 0; k < kn; ++k) xp[(size_t)k * kNR + t] = 0.0f;
}

inline __m256i row_mask(int left) {  // lanes < left
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), idx);
}

// y[t * ldy + i] (first: =, else +=) sum_k p[k][i] x[k * kNR + t] (+ bias[i]) for i < nr (NV vectors of 8
// rows), t < NT.
template <int NV, int NT>
inline void micro(const float* p, int kn, const float* x, int64_t ldx, float* y, int64_t ldy, int nr,
                  bool first, const float* bias) {
  __m256 acc[NV][NT];
  __m256i m[NV];
  for (int v = 0; v < NV; ++v) m[v] = row_mask(nr - 8 * v);
  for (int t = 0; t < NT; ++t)
    for (int v = 0; v < NV; ++v) acc[v][t] = _mm256_setzero_ps();
  for (int k = 0; k < kn; ++k) {
    __m256 wv[NV];
    if constexpr (kPrefetchK > 0)  // one 64-byte line per column (kMR floats)
      _mm_prefetch((const char*)(p + (size_t)(k + kPrefetchK) * kMR), _MM_HINT_T0);
    for (int v = 0; v < NV; ++v) wv[v] = _mm256_load_ps(p + (size_t)k * kMR + 8 * v);
    for (int t = 0; t < NT; ++t) {
      const __m256 xb = _mm256_broadcast_ss(x + k * kNR + t);  // packed x tile (ldx unused)
      for (int v = 0; v < NV; ++v) acc[v][t] = _mm256_fmadd_ps(wv[v], xb, acc[v][t]);
    }
  }
  for (int v = 0; v < NV; ++v) {
    const __m256 b = bias ? _mm256_maskload_ps(bias + 8 * v, m[v]) : _mm256_setzero_ps();
    for (int t = 0; t < NT; ++t) {
      __m256 r = first ? acc[v][t] : _mm256_add_ps(_mm256_maskload_ps(y + t * ldy + 8 * v, m[v]), acc[v][t]);
      if (bias) r = _mm256_add_ps(r, b);
      _mm256_maskstore_ps(y + t * ldy + 8 * v, m[v], r);
    }
  }
}

// The kernel struct of the shared block walk (matmul_panel_driver.h).
struct Kernel {
  static constexpr int kMR = panel::kMR, kNR = panel::kNR, kKC = panel::kKC, kMC = panel::kMC, kVec = 8;
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
