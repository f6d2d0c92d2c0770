// Prefill matmul for AVX2+FMA (included by matmul_avx2.cpp only, compiled with its ISA flags): the
// outer-product GEMM over packed weight panels of matmul_panel_avx512.h with 8-wide vectors: panels of
// kMR = 16 rows (two vectors) x kKC = 256 columns (16 KB of f32, k-major), micro-tiles of kNR = 6 tokens,
// 12 vector accumulators (2 loads + 6 broadcasts per 12 FMAs). Same numerics: f32 FMA chains of <= 256
// columns per output, added block by block, weights converted exactly (Q8_0 dequantised exactly), no
// activation quantisation.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace ultra::cpu::detail {
namespace {  // internal linkage: this header is compiled with the AVX2 flags of one file only
namespace panel {

constexpr int kMR = 16;   // rows per panel: two vectors
constexpr int kNR = 6;    // tokens per micro-tile: 2 x 6 accumulators
constexpr int kKC = 256;  // columns per packed block
constexpr int kMC = 128;  // rows per L2 block (kMC / kMR panels)

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
// p[k][kMR]. P::load8(row, c): 8 f32 from column c; P::scalar(row, c): one (column tails).
template <class P>
inline void pack(const uint8_t* w, size_t rb, int nr, int64_t kc, int kn, float* p) {
  const int kv = kn / 8 * 8;
  for (int h = 0; h < kMR; h += 8) {
    for (int k0 = 0; k0 < kv; k0 += 8) {
      __m256 v[8];
      for (int i = 0; i < 8; ++i)
        v[i] = h + i < nr ? P::load8(w + (h + i) * rb, kc + k0) : _mm256_setzero_ps();
      transpose8(v);
      for (int j = 0; j < 8; ++j) _mm256_store_ps(p + (size_t)(k0 + j) * kMR + h, v[j]);
    }
    for (int k = kv; k < kn; ++k)
      for (int i = 0; i < 8; ++i)
        p[(size_t)k * kMR + h + i] = h + i < nr ? P::scalar(w + (h + i) * rb, kc + k) : 0.0f;
  }
}

inline __m256i row_mask(int left) {  // lanes < left
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), idx);
}

// y[t * ldy + i] (first: =, else +=) sum_k p[k][i] x[t * ldx + k] (+ bias[i]) for i < nr (NV vectors of 8
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
    for (int v = 0; v < NV; ++v) wv[v] = _mm256_load_ps(p + (size_t)k * kMR + 8 * v);
    for (int t = 0; t < NT; ++t) {
      const __m256 xb = _mm256_broadcast_ss(x + t * ldx + k);
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

template <int NV>
inline void micro_nt(int nt, const float* p, int kn, const float* x, int64_t ldx, float* y, int64_t ldy,
                     int nr, bool first, const float* bias) {
  switch (nt) {
    case 6:
      return micro<NV, 6>(p, kn, x, ldx, y, ldy, nr, first, bias);
    case 5:
      return micro<NV, 5>(p, kn, x, ldx, y, ldy, nr, first, bias);
    case 4:
      return micro<NV, 4>(p, kn, x, ldx, y, ldy, nr, first, bias);
    case 3:
      return micro<NV, 3>(p, kn, x, ldx, y, ldy, nr, first, bias);
    case 2:
      return micro<NV, 2>(p, kn, x, ldx, y, ldy, nr, first, bias);
    default:
      return micro<NV, 1>(p, kn, x, ldx, y, ldy, nr, first, bias);
  }
}

// Requests the weights of the block packed after (rows [rb, re), columns from kc) into L2 while this one's
// micro-tiles run: a block is kMC short row segments, which the hardware prefetchers (made for long streams)
// fetch late.
template <class Args>
inline void prefetch_next(const Args& a, int64_t rb, int64_t re, int64_t r1, int64_t kc, int kn) {
  int64_t nb = rb, ne = re, nkc = kc + kn;
  if (nkc >= a.cols) nb = re, ne = r1 - re < kMC ? r1 : re + kMC, nkc = 0;
  if (nb >= r1) return;
  const double bpc = (double)a.row_bytes / (double)a.cols;  // bytes per column (rows are contiguous)
  const int64_t b0 = (int64_t)(nkc * bpc), b1 = (int64_t)((nkc + kKC < a.cols ? nkc + kKC : a.cols) * bpc);
  for (int64_t r = nb; r < ne; ++r) {
    const char* row = (const char*)a.w + r * a.row_bytes;
    for (int64_t b = b0 & ~(int64_t)63; b < b1; b += 64) _mm_prefetch(row + b, _MM_HINT_T1);
  }
}

// Rows [r0, r1) of every token, in blocks of kMC rows: per column block, the block's panels are packed into
// an L2-resident buffer (kMC x kKC f32, 128 KB), then each token tile runs over all of them, so that the
// tile's x rows (12 x 1 KB) stay in L1 across the panels while the panels stream from L2 (one sequential
// stream).
template <class P, class Args>
void gemm(const Args& a, int64_t r0, int64_t r1) {
  alignas(64) float buf[kMC * kKC];
  for (int64_t rb = r0; rb < r1; rb += kMC) {
    const int64_t re = r1 - rb < kMC ? r1 : rb + kMC;
    const int np = (int)((re - rb + kMR - 1) / kMR);
    for (int64_t kc = 0; kc < a.cols; kc += kKC) {
      const int kn = a.cols - kc < kKC ? (int)(a.cols - kc) : kKC;
      for (int i = 0; i < np; ++i) {
        const int64_t r = rb + (int64_t)i * kMR;
        const int nr = re - r < kMR ? (int)(re - r) : kMR;
        pack<P>(a.w + r * a.row_bytes, a.row_bytes, nr, kc, kn, buf + (size_t)i * kKC * kMR);
      }
      prefetch_next(a, rb, re, r1, kc, kn);
      const bool first = kc == 0, last = kc + kn == a.cols;
      for (int t = 0; t < a.n_tokens; t += kNR) {
        const int nt = a.n_tokens - t < kNR ? a.n_tokens - t : kNR;
        const float* x = a.x + (int64_t)t * a.cols + kc;
        for (int i = 0; i < np; ++i) {
          const int64_t r = rb + (int64_t)i * kMR;
          const int nr = re - r < kMR ? (int)(re - r) : kMR;
          const float* p = buf + (size_t)i * kKC * kMR;
          const float* bias = a.bias && last ? a.bias + r : nullptr;
          float* y = a.y + (int64_t)t * a.rows + r;
          if (nr > 8)
            micro_nt<2>(nt, p, kn, x, a.cols, y, a.rows, nr, first, bias);
          else
            micro_nt<1>(nt, p, kn, x, a.cols, y, a.rows, nr, first, bias);
        }
      }
    }
  }
}

}  // namespace panel
}  // namespace
}  // namespace ultra::cpu::detail
