// The block walk of the packed-panel prefill GEMM, shared by matmul_panel_avx2.h and matmul_panel_avx512.h
// (each compiled into one ISA file). K is the ISA's kernel struct, with internal linkage:
//   static constexpr int kMR, kNR, kKC, kMC, kVec;  // panel rows, tokens per tile, columns per block, rows
//                                                   // per L2 block, rows per vector
//   template <class P> static void pack(const uint8_t* w, size_t rb, int nr, int64_t kc, int kn, float* p);
//   static void pack_x(const float* x, int64_t ldx, int nt, int kn, float* xp);  // xp[k][kNR], zero past nt
//   template <int NV, int NT> static void micro(const float* p, int kn, const float* x, int64_t ldx, float*
//   y,
//                                               int64_t ldy, int nr, bool first, const float* bias);
//     // y[t * ldy + i] (first: =, else +=) sum_k p[k][i] x[k * kNR + t] (+ bias[i]), i < nr (NV vectors),
//     // t < NT
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace ultra::cpu::detail::panel_driver {

// K::micro<NV, nt> for a run-time nt <= NT.
template <class K, int NV, int NT>
inline void micro_nt(int nt, const float* p, int kn, const float* x, int64_t ldx, float* y, int64_t ldy,
                     int nr, bool first, const float* bias) {
  if constexpr (NT > 1)
    if (nt < NT) return micro_nt<K, NV, NT - 1>(nt, p, kn, x, ldx, y, ldy, nr, first, bias);
  K::template micro<NV, NT>(p, kn, x, ldx, y, ldy, nr, first, bias);
}

// Requests the weights of the block packed after (rows [rb, re), columns from kc) into L2 while this one's
// micro-tiles run: a block is kMC short row segments, which the hardware prefetchers (made for long streams)
// fetch late.
template <class K, class Args>
inline void prefetch_next(const Args& a, int64_t rb, int64_t re, int64_t r1, int64_t kc, int kn) {
  int64_t nb = rb, ne = re, nkc = kc + kn;
  if (nkc >= a.cols) nb = re, ne = r1 - re < K::kMC ? r1 : re + K::kMC, nkc = 0;
  if (nb >= r1) return;
  const double bpc = (double)a.row_bytes / (double)a.cols;  // bytes per column (rows are contiguous)
  const int64_t b0 = (int64_t)(nkc * bpc);
  const int64_t b1 = (int64_t)((nkc + K::kKC < a.cols ? nkc + K::kKC : a.cols) * bpc);
  for (int64_t r = nb; r < ne; ++r) {
    const char* row = (const char*)a.w + r * a.row_bytes;
    for (int64_t b = b0 & ~(int64_t)63; b < b1; b += 64) _mm_prefetch(row + b, _MM_HINT_T1);
  }
}

// Token tiles [j0, j1) of x [n_tokens, cols], every column, packed k-major (MatmulArgs::xp): tile j, column
// k at xp[(j * cols + k) * kNR + t], tokens past n_tokens zero.
template <class K>
void pack_x_all(const float* x, int n_tokens, int64_t cols, int j0, int j1, float* xp) {
  for (int j = j0; j < j1; ++j) {
    const int t = j * K::kNR, nt = n_tokens - t < K::kNR ? n_tokens - t : K::kNR;
    for (int64_t kc = 0; kc < cols; kc += K::kKC) {
      const int kn = cols - kc < K::kKC ? (int)(cols - kc) : K::kKC;
      K::pack_x(x + (int64_t)t * cols + kc, cols, nt, kn, xp + ((int64_t)j * cols + kc) * K::kNR);
    }
  }
}

// Rows [r0, r1) of every token, in blocks of kMC rows: per column block, the block's panels are packed into
// an L2-resident buffer (kMC x kKC f32, 128 KB), then each token tile runs over all of them, so that the
// tile's x, packed k-major (12 or 6 floats per column, one sequential stream), stays in L1 across the panels
// while the panels stream from L2 (one more sequential stream). The tile comes packed from a.xp (the whole
// x packed once per matmul: packing it here, once per row block, read x's rows from L3 again for every
// block, ~15% of the GEMM's time) or, without it, is packed here (K::pack_x). P is the pack loader (weights
// of one type -> f32).
template <class K, class P, class Args>
void gemm(const Args& a, int64_t r0, int64_t r1) {
  alignas(64) float buf[K::kMC * K::kKC];
  alignas(64) float xp[K::kKC * K::kNR];
  for (int64_t rb = r0; rb < r1; rb += K::kMC) {
    const int64_t re = r1 - rb < K::kMC ? r1 : rb + K::kMC;
    const int np = (int)((re - rb + K::kMR - 1) / K::kMR);
    for (int64_t kc = 0; kc < a.cols; kc += K::kKC) {
      const int kn = a.cols - kc < K::kKC ? (int)(a.cols - kc) : K::kKC;
      for (int i = 0; i < np; ++i) {
        const int64_t r = rb + (int64_t)i * K::kMR;
        const int nr = re - r < K::kMR ? (int)(re - r) : K::kMR;
        K::template pack<P>(a.w + r * a.row_bytes, a.row_bytes, nr, kc, kn,
                            buf + (size_t)i * K::kKC * K::kMR);
      }
      prefetch_next<K>(a, rb, re, r1, kc, kn);
      const bool first = kc == 0, last = kc + kn == a.cols;
      for (int t = 0; t < a.n_tokens; t += K::kNR) {
        const int nt = a.n_tokens - t < K::kNR ? a.n_tokens - t : K::kNR;
        const float* x = xp;
        if (a.xp)
          x = a.xp + ((int64_t)(t / K::kNR) * a.cols + kc) * K::kNR;
        else
          K::pack_x(a.x + (int64_t)t * a.cols + kc, a.cols, nt, kn, xp);
        for (int i = 0; i < np; ++i) {
          const int64_t r = rb + (int64_t)i * K::kMR;
          const int nr = re - r < K::kMR ? (int)(re - r) : K::kMR;
          const float* p = buf + (size_t)i * K::kKC * K::kMR;
          float* y = a.y + (int64_t)t * a.rows + r;
          const float* bias = a.bias && last ? a.bias + r : nullptr;
          if (nr > K::kVec)
            micro_nt<K, 2, K::kNR>(nt, p, kn, x, a.cols, y, a.rows, nr, first, bias);
          else
            micro_nt<K, 1, K::kNR>(nt, p, kn, x, a.cols, y, a.rows, nr, first, bias);
        }
      }
    }
  }
}

}  // namespace ultra::cpu::detail::panel_driver
