// Decode of Q4_K, Q6_K and IQ4_XS with int8 activations on AVX512-VNNI (the default there, with Q8_0's:
// cpu_internal.h's q8_int8_enabled()). Compiled with ULTRA_VNNI_ISA; called only where
// cpu_has_avx512_vnni() holds.
//
// x comes quantised per 32 columns as for Q8_0 (quantize_x_q8_*: xq int8, xd f32) with the sums of xq per
// 16 and per 32 columns (MatmulArgs::xs16, xs32). A sub-block's weights are codes c times a scale f plus a
// constant, w = f * (c - k) (Q6_K: k = 32; IQ4_XS: c = level + 128, k = 128) or w = f * c - m (Q4_K), with c
// unsigned bytes: vpdpbusd sums c * xq over 4 columns per lane exactly, and the constant meets the sums of
// xq. Per 32 weights: one dot-product instruction, a conversion and an FMA, against the exact path's ~14
// (matmul_blocks.h). The result is the reference's (matmul.cpp's range_int8_ref: the exact weights times
// xq * xd, double sums) up to f32 rounding.

// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips these
// (false-positive) warnings once the intrinsics are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "core/quants.h"

namespace ultra::cpu::detail {

namespace {

constexpr int kDecodePrefetchBytes = 2048;  // as the other decode loops

inline __m256i dot32(__m256i codes, const int8_t* x) {  // 8 lanes: sums of 4 products each
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, _mm256_loadu_si256((const __m256i*)x));
}
inline __m256 fsum(__m256i v) {  // exact: |sums| < 2^24
  return _mm256_cvtepi32_ps(v);
}
inline float hsum(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
inline void prefetch_block(const void* b, int bytes) {
  const char* pf = (const char*)b + kDecodePrefetchBytes;
  for (int l = 0; l < (bytes + 63) / 64; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
}

float row_q4k(const BlockQ4_K* b, int64_t nb, const int8_t* xq, const float* xd, const float* xs32) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, mins = acc0;
  for (int64_t i = 0; i < nb; ++i) {
    prefetch_block(b + i, sizeof(BlockQ4_K));
    const float d = _cvtsh_ss(b[i].d), dmin = _cvtsh_ss(b[i].dmin);
    alignas(32) float sc[8], mn[8];
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      q4k_scale_min(j, b[i].scales, &s, &m);
      sc[j] = s;
      mn[j] = m;
    }
    const __m256 xdv = _mm256_loadu_ps(xd + 8 * i);
    alignas(32) float f[8];  // d * sc_j * xd_j
    _mm256_store_ps(f, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d), _mm256_load_ps(sc)), xdv));
    // sum_j dmin * m_j * xd_j * sum(xq over sub-block j)
    mins = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_load_ps(mn)),
                           _mm256_mul_ps(xdv, _mm256_loadu_ps(xs32 + 8 * i)), mins);
    const int8_t* x = xq + 256 * i;
    for (int g = 0; g < 4; ++g) {
      const __m256i q = _mm256_loadu_si256((const __m256i*)(b[i].qs + 32 * g));
      const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      acc0 = _mm256_fmadd_ps(fsum(dot32(lo, x + 64 * g)), _mm256_broadcast_ss(f + 2 * g), acc0);
      acc1 = _mm256_fmadd_ps(fsum(dot32(hi, x + 64 * g + 32)), _mm256_broadcast_ss(f + 2 * g + 1), acc1);
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1)) - hsum(mins);
}

float row_q6k(const BlockQ6_K* b, int64_t nb, const int8_t* xq, const float* xd, const float* xs16) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, offs = acc0;
  for (int64_t i = 0; i < nb; ++i) {
    prefetch_block(b + i, sizeof(BlockQ6_K));
    const float d = _cvtsh_ss(b[i].d);
    alignas(32) float f[16];  // d * sc_c * xd of the sub-block's 32-column x block
    for (int c = 0; c < 16; ++c) f[c] = d * b[i].scales[c] * xd[8 * i + c / 2];
    // the codes' constant: 32 * sum_c f_c * sum(xq over sub-block c)
    offs = _mm256_fmadd_ps(_mm256_load_ps(f), _mm256_loadu_ps(xs16 + 16 * i), offs);
    offs = _mm256_fmadd_ps(_mm256_load_ps(f + 8), _mm256_loadu_ps(xs16 + 16 * i + 8), offs);
    const int8_t* x = xq + 256 * i;
    for (int h = 0; h < 2; ++h) {
      const __m256i a = _mm256_loadu_si256((const __m256i*)(b[i].ql + 64 * h));
      const __m256i c = _mm256_loadu_si256((const __m256i*)(b[i].ql + 64 * h + 32));
      const __m256i hb = _mm256_loadu_si256((const __m256i*)(b[i].qh + 32 * h));
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4)),
          _mm256_or_si256(_mm256_and_si256(c, m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4))};
      for (int k = 0; k < 4; ++k) {  // 32 elements: sub-blocks 8h + 2k (lanes 0..3) and 8h + 2k + 1 (4..7)
        const int c0 = 8 * h + 2 * k;
        const __m256 fv = _mm256_set_m128(_mm_set1_ps(f[c0 + 1]), _mm_set1_ps(f[c0]));
        const __m256 s = fsum(dot32(q[k], x + 128 * h + 32 * k));
        if (k % 2)
          acc1 = _mm256_fmadd_ps(s, fv, acc1);
        else
          acc0 = _mm256_fmadd_ps(s, fv, acc0);
      }
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1)) - 32.0f * hsum(offs);
}

float row_iq4xs(const BlockIQ4_XS* b, int64_t nb, const int8_t* xq, const float* xd, const float* xs32) {
  alignas(16) int8_t lv[16];  // the levels + 128, as unsigned bytes
  for (int k = 0; k < 16; ++k) lv[k] = (int8_t)(kIq4nlValues[k] + 128);
  const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)lv));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, offs = acc0;
  for (int64_t i = 0; i < nb; ++i) {
    prefetch_block(b + i, sizeof(BlockIQ4_XS));
    const float d = _cvtsh_ss(b[i].d);
    alignas(32) float f[8];
    for (int s = 0; s < 8; ++s) {
      const int ls =
          ((b[i].scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | (((b[i].scales_h >> (2 * s)) & 3) << 4);
      f[s] = d * (float)(ls - 32) * xd[8 * i + s];
    }
    offs = _mm256_fmadd_ps(_mm256_load_ps(f), _mm256_loadu_ps(xs32 + 8 * i), offs);
    const int8_t* x = xq + 256 * i;
    for (int s = 0; s < 8; ++s) {
      const __m128i v = _mm_loadu_si128((const __m128i*)(b[i].qs + 16 * s));
      const __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
      const __m256 sum = fsum(dot32(_mm256_shuffle_epi8(table, idx), x + 32 * s));
      if (s % 2)
        acc1 = _mm256_fmadd_ps(sum, _mm256_broadcast_ss(f + s), acc1);
      else
        acc0 = _mm256_fmadd_ps(sum, _mm256_broadcast_ss(f + s), acc0);
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1)) - 128.0f * hsum(offs);
}

template <class B, class F>
void rows(const MatmulArgs& a, int64_t r0, int64_t r1, F row) {
  const int64_t nb = a.cols / kQK_K;
  for (int64_t r = r0; r < r1; ++r) {
    const float s = row((const B*)(a.w + r * a.row_bytes), nb);
    a.y[r] = a.bias ? s + a.bias[r] : s;
  }
}

}  // namespace

void matmul_q4k_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  rows<BlockQ4_K>(a, r0, r1,
                  [&](const BlockQ4_K* b, int64_t nb) { return row_q4k(b, nb, a.xq, a.xd, a.xs32); });
}
void matmul_q6k_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  rows<BlockQ6_K>(a, r0, r1,
                  [&](const BlockQ6_K* b, int64_t nb) { return row_q6k(b, nb, a.xq, a.xd, a.xs16); });
}
void matmul_iq4xs_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  rows<BlockIQ4_XS>(a, r0, r1,
                    [&](const BlockIQ4_XS* b, int64_t nb) { return row_iq4xs(b, nb, a.xq, a.xd, a.xs32); });
}

}  // namespace ultra::cpu::detail
