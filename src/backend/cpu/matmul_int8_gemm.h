// The int8 prefill GEMM of AVX512-VNNI (vpdpbusd) shared by the weight types that take it: Q8_0
// (matmul_q8_vnni.cpp) and the k-quants (matmul_kquant_gemm_vnni.cpp). Included only by *_vnni.cpp files
// (internal linkage: each keeps its own copy).
//
// Rows are vector lanes (16 per zmm, kNV = 2 zmm: a 32-row panel), tokens are broadcast (kQ8NT = 6 per tile),
// and each 32-column block of x is 8 vpdpbusd steps of 4 columns: int32 accumulators for the 32 rows x 6
// tokens, which then take the block's scales (a vector of the panel's rows) times the token's d_x in one
// conversion, multiply and FMA per accumulator into f32 ones. vpdpbusd multiplies unsigned (the panel's
// codes) by signed bytes (x); how a type's weights become unsigned codes and scales is the panel's Scales:
//   Offset128  w = d_w * (c - 128) per 32 columns (Q8_0: c = w ^ 0x80; IQ4_XS: c = level + 128): each
//              accumulator starts at -128 * sum(x_q) over the block (the token's correction, packed with x),
//              so that it ends at sum((c - 128) * x_q) exactly;
//   Min        w = d_w * c - m_w per 32 columns (Q4_K: c the 4-bit code, d_w = d * sc, m_w = dmin * m): the
//              accumulator sums c * x_q, and m_w * d_x * sum(x_q) (the token's x_m, packed with x) is
//              subtracted in one more FMA;
//   Halves     w = d_w * (c - 128) per 16 columns (Q6_K: c = q + 96): the two 16-column halves of a block
//              one after the other, each starting at its correction -128 * sum(x_q) over the half.
//
// Packed x (MatmulArgs::xq, pack_x_q8_vnni): token tile j (kQ8NT tokens, zero past n_tokens), block b at byte
// (j * nb + b) * kQ8TileBlockBytes: for column quad q < 8 and token t < kQ8NT, 4 int8 at (q * kQ8NT + t) * 4;
// then per token d_x (f32), the correction -128 * sum(x_q) (int32), x_m = d_x * sum(x_q) (f32) and the
// correction of the first 16 columns (int32), each [kQ8NT]. Packed panel (per row block and column block, on
// the stack): block b at b * kPanelBlockBytes<S>: for quad q and vector v, 16 rows x 4 code bytes at
// (q * kNV + v) * 64; then f32 [32] d_w (Halves: of the first 16 columns), then f32 [32] m_w (Min) or the
// second half's d_w (Halves).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backend/cpu/cpu_internal.h"

namespace ultra::cpu::detail {
namespace {

constexpr int kNV = 2;                         // the panel: 2 vectors of 16 rows
constexpr int kPanelRows = kNV * 16;           // 32
constexpr int kPanelQuadBytes = 8 * kNV * 64;  // 1024
constexpr int kKB = 32;                        // 32-column blocks per column block (1024 columns)
constexpr int kMC = 128;                       // rows per row block (4 panels, <= 160 KiB packed: L2)

constexpr int kXQuadBytes = 8 * kQ8NT * 4;  // 192
constexpr int kXdOff = kXQuadBytes;
constexpr int kXCorrOff = kXdOff + 4 * kQ8NT;
constexpr int kXmOff = kXCorrOff + 4 * kQ8NT;
constexpr int kXCorrLoOff = kXmOff + 4 * kQ8NT;
static_assert(kXCorrLoOff + 4 * kQ8NT == kQ8TileBlockBytes, "packed x block layout");

enum class Scales { Offset128, Min, Halves };
template <Scales S>
constexpr int64_t kPanelBlockBytes = kPanelQuadBytes + (S == Scales::Offset128 ? 1 : 2) * kPanelRows * 4;

// The panel block's codes of vector v (rows 16 v .. 16 v + 15) from row(k), k < 16: the 32 code bytes of the
// block's row k (a __m256i), each xor'ed with bias. A transpose of 16 rows x 8 column quads (dwords) in
// registers: row k and row k + 8 in the two halves of one zmm, then the 8 x 8 dword transpose of both halves
// at once (unpack 32, unpack 64, and one two-source permute per output quad), instead of 8 four-byte stores
// per row.
template <class Row>
inline void transpose_codes(Row&& row, __m512i bias, int v, uint8_t* pb) {
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13),
                hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  __m512i z[8];  // lanes 0-7: row k's 8 quads, lanes 8-15: row k + 8's
  for (int k = 0; k < 8; ++k) z[k] = _mm512_inserti64x4(_mm512_castsi256_si512(row(k)), row(k + 8), 1);
  __m512i t[8], u[8];
  for (int k = 0; k < 8; k += 4) {
    t[k] = _mm512_unpacklo_epi32(z[k], z[k + 1]);
    t[k + 1] = _mm512_unpackhi_epi32(z[k], z[k + 1]);
    t[k + 2] = _mm512_unpacklo_epi32(z[k + 2], z[k + 3]);
    t[k + 3] = _mm512_unpackhi_epi32(z[k + 2], z[k + 3]);
    // u[k + j], per 128-bit lane (rows k..k+3, or k+8..k+11): quad j (lanes 0, 2), j + 4 (lanes 1, 3)
    u[k] = _mm512_unpacklo_epi64(t[k], t[k + 2]);
    u[k + 1] = _mm512_unpackhi_epi64(t[k], t[k + 2]);
    u[k + 2] = _mm512_unpacklo_epi64(t[k + 1], t[k + 3]);
    u[k + 3] = _mm512_unpackhi_epi64(t[k + 1], t[k + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i q_lo = _mm512_permutex2var_epi64(u[j], lo, u[j + 4]);  // quad j of rows 0..15
    const __m512i q_hi = _mm512_permutex2var_epi64(u[j], hi, u[j + 4]);  // quad j + 4
    _mm512_store_si512((void*)(pb + (j * kNV + v) * 64), _mm512_xor_si512(q_lo, bias));
    _mm512_store_si512((void*)(pb + ((j + 4) * kNV + v) * 64), _mm512_xor_si512(q_hi, bias));
  }
}

// acc[v][t] += the products of quads [q0, q1) of the panel block p and the tile's block x.
template <int NV, int NT>
inline void dot_quads(const uint8_t* p, const uint8_t* x, int q0, int q1, __m512i (&ai)[NV][NT]) {
  for (int q = q0; q < q1; ++q) {
    __m512i wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = _mm512_load_si512((const void*)(p + (q * kNV + v) * 64));
    for (int t = 0; t < NT; ++t) {
      int32_t xq4;
      std::memcpy(&xq4, x + (q * kQ8NT + t) * 4, 4);
      const __m512i xv = _mm512_set1_epi32(xq4);
      for (int v = 0; v < NV; ++v) ai[v][t] = _mm512_dpbusd_epi32(ai[v][t], wv[v], xv);
    }
  }
}

// af[v][t] += ai[v][t] * (d_w of the rows * d_x of the token).
template <int NV, int NT>
inline void scale_add(const float* dw, const float* xd, const __m512i (&ai)[NV][NT], __m512 (&af)[NV][NT]) {
  for (int v = 0; v < NV; ++v) {
    const __m512 d = _mm512_load_ps(dw + 16 * v);
    for (int t = 0; t < NT; ++t)
      af[v][t] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[v][t]), _mm512_mul_ps(d, _mm512_set1_ps(xd[t])), af[v][t]);
  }
}

// y[t * ldy + i] (first: =, else +=) for rows i < nr (NV vectors) and tokens t < NT of one panel and tile.
template <Scales S, int NV, int NT>
void micro(const uint8_t* p, const uint8_t* x, int nbk, float* y, int64_t ldy, int nr, bool first,
           const float* bias) {
  __m512 af[NV][NT];
  for (int v = 0; v < NV; ++v)
    for (int t = 0; t < NT; ++t) af[v][t] = _mm512_setzero_ps();
  for (int b = 0; b < nbk; ++b, p += kPanelBlockBytes<S>, x += kQ8TileBlockBytes) {
    const float* xd = (const float*)(x + kXdOff);
    const int32_t* corr = (const int32_t*)(x + kXCorrOff);
    const float* dw = (const float*)(p + kPanelQuadBytes);
    __m512i ai[NV][NT];
    if constexpr (S == Scales::Halves) {
      const int32_t* corr_lo = (const int32_t*)(x + kXCorrLoOff);
      for (int h = 0; h < 2; ++h) {
        for (int t = 0; t < NT; ++t) {
          const __m512i c = _mm512_set1_epi32(h ? corr[t] - corr_lo[t] : corr_lo[t]);
          for (int v = 0; v < NV; ++v) ai[v][t] = c;
        }
        dot_quads<NV, NT>(p, x, 4 * h, 4 * h + 4, ai);
        scale_add<NV, NT>(dw + kPanelRows * h, xd, ai, af);
      }
    } else {
      for (int t = 0; t < NT; ++t) {
        const __m512i c = S == Scales::Offset128 ? _mm512_set1_epi32(corr[t]) : _mm512_setzero_si512();
        for (int v = 0; v < NV; ++v) ai[v][t] = c;
      }
      dot_quads<NV, NT>(p, x, 0, 8, ai);
      scale_add<NV, NT>(dw, xd, ai, af);
      if constexpr (S == Scales::Min) {
        const float* xm = (const float*)(x + kXmOff);
        for (int v = 0; v < NV; ++v) {
          const __m512 m = _mm512_load_ps(dw + kPanelRows + 16 * v);
          for (int t = 0; t < NT; ++t) af[v][t] = _mm512_fnmadd_ps(m, _mm512_set1_ps(xm[t]), af[v][t]);
        }
      }
    }
  }
  for (int v = 0; v < NV; ++v) {
    const int n = nr - 16 * v < 16 ? nr - 16 * v : 16;
    const __mmask16 m = (__mmask16)((1u << n) - 1);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + 16 * v) : _mm512_setzero_ps();
    for (int t = 0; t < NT; ++t) {
      float* yt = y + t * ldy + 16 * v;
      __m512 r = _mm512_add_ps(af[v][t], bv);
      if (!first) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, yt));
      _mm512_mask_storeu_ps(yt, m, r);
    }
  }
}

template <Scales S, int NV, int NT>
void micro_nt(int nt, const uint8_t* p, const uint8_t* x, int nbk, float* y, int64_t ldy, int nr, bool first,
              const float* bias) {
  if constexpr (NT > 1)
    if (nt < NT) return micro_nt<S, NV, NT - 1>(nt, p, x, nbk, y, ldy, nr, first, bias);
  micro<S, NV, NT>(p, x, nbk, y, ldy, nr, first, bias);
}

// Rows [r0, r1) of y for a.n_tokens tokens of the packed x (a.xq). pack(w, row_bytes, nr, b0, nbk, out):
// rows [0, nr) (nr <= 32) of w, 32-column blocks [b0, b0 + nbk), into one panel at out (rows past nr: zero
// codes and scales). Column blocks of kKB blocks, row blocks of kMC rows packed once each and then run for
// every token tile.
template <Scales S, class Pack>
void int8_gemm(const MatmulArgs& a, int64_t r0, int64_t r1, Pack&& pack) {
  constexpr int64_t kPB = kPanelBlockBytes<S>;
  const int64_t nb = a.cols / 32;
  const uint8_t* xp = (const uint8_t*)a.xq;
  alignas(64) uint8_t buf[(kMC / kPanelRows) * kKB * kPB];
  for (int64_t rb = r0; rb < r1; rb += kMC) {
    const int64_t re = r1 - rb < kMC ? r1 : rb + kMC;
    const int np = (int)((re - rb + kPanelRows - 1) / kPanelRows);
    for (int64_t b0 = 0; b0 < nb; b0 += kKB) {
      const int nbk = nb - b0 < kKB ? (int)(nb - b0) : kKB;
      for (int i = 0; i < np; ++i) {
        const int64_t r = rb + i * kPanelRows;
        pack(a.w + r * a.row_bytes, a.row_bytes, (int)std::min<int64_t>(re - r, kPanelRows), b0, nbk,
             buf + (size_t)i * kKB * kPB);
      }
      const bool first = b0 == 0, last = b0 + nbk == nb;
      for (int t = 0; t < a.n_tokens; t += kQ8NT) {
        const int nt = a.n_tokens - t < kQ8NT ? a.n_tokens - t : kQ8NT;
        const uint8_t* x = xp + ((int64_t)(t / kQ8NT) * nb + b0) * kQ8TileBlockBytes;
        for (int i = 0; i < np; ++i) {
          const int64_t r = rb + i * kPanelRows;
          const int nr = (int)std::min<int64_t>(re - r, kPanelRows);
          const uint8_t* p = buf + (size_t)i * kKB * kPB;
          float* y = a.y + (int64_t)t * a.rows + r;
          const float* bias = a.bias && last ? a.bias + r : nullptr;
          if (nr > 16)
            micro_nt<S, 2, kQ8NT>(nt, p, x, nbk, y, a.rows, nr, first, bias);
          else
            micro_nt<S, 1, kQ8NT>(nt, p, x, nbk, y, a.rows, nr, first, bias);
        }
      }
    }
  }
}

}  // namespace
}  // namespace ultra::cpu::detail
