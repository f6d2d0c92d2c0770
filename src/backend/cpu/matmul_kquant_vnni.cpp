// Decode of Q4_K, Q5_K, Q6_K, IQ4_XS, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL with int8 activations on AVX512-VNNI
// (the default there, with Q8_0's: cpu_internal.h's q8_int8_enabled()). Compiled with ULTRA_VNNI_ISA; called
// only where cpu_has_avx512_vnni() holds.
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

#include <cmath>
#include <cstdint>
#include <cstring>

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

// The 8 scales and 8 mins of a Q4_K / Q5_K block's 12 scale bytes as floats (q4k_scale_min for all j at
// once: the low 6 bits of bytes 0..7, then 4 bits of bytes 8..11 with the top 2 bits of bytes 0..7).
inline void q4k_scales_mins(const uint8_t* q, __m256* sc, __m256* mn) {
  uint32_t u[4];
  std::memcpy(u, q, 12);
  const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);  // mins 4..7
  const uint32_t m03 = u[1] & k1;                         // mins 0..3
  u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);         // scales 4..7
  u[0] &= k1;                                             // scales 0..3
  u[2] = m03;
  *sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)u)));
  *mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(u + 2))));
}

// A Q4_K / Q5_K block's factors for x blocks xd[0..7]: f[j] = d * sc_j * xd_j, and mins +=
// dmin * m_j * xd_j * (the sum of xq over sub-block j).
inline void q4k_block_factors(uint16_t d, uint16_t dmin, const uint8_t* scales, const float* xd,
                              const float* xs32, float* f, __m256* mins) {
  __m256 sc, mn;
  q4k_scales_mins(scales, &sc, &mn);
  const __m256 xdv = _mm256_loadu_ps(xd);
  _mm256_store_ps(f, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(d)), sc), xdv));
  *mins = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dmin)), mn),
                          _mm256_mul_ps(xdv, _mm256_loadu_ps(xs32)), *mins);
}

float row_q4k(const BlockQ4_K* b, int64_t nb, const int8_t* xq, const float* xd, const float* xs32) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, mins = acc0;
  for (int64_t i = 0; i < nb; ++i) {
    prefetch_block(b + i, sizeof(BlockQ4_K));
    alignas(32) float f[8];  // d * sc_j * xd_j
    q4k_block_factors(b[i].d, b[i].dmin, b[i].scales, xd + 8 * i, xs32 + 8 * i, f, &mins);
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
    // f_c = d * sc_c * xd of the sub-block's 32-column x block, sub-blocks 0..7 in fv[0], 8..15 in fv[1]
    const __m128i sc8 = _mm_loadu_si128((const __m128i*)b[i].scales);
    const __m256 dv = _mm256_set1_ps(_cvtsh_ss(b[i].d));
    const __m256 xdv = _mm256_loadu_ps(xd + 8 * i);  // xd of x blocks 8 i .. 8 i + 7
    const __m256i pair_lo = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3),
                  pair_hi = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    const __m256 fv[2] = {
        _mm256_mul_ps(_mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8))),
                      _mm256_permutevar8x32_ps(xdv, pair_lo)),
        _mm256_mul_ps(_mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8)))),
                      _mm256_permutevar8x32_ps(xdv, pair_hi))};
    // the codes' constant: 32 * sum_c f_c * sum(xq over sub-block c)
    offs = _mm256_fmadd_ps(fv[0], _mm256_loadu_ps(xs16 + 16 * i), offs);
    offs = _mm256_fmadd_ps(fv[1], _mm256_loadu_ps(xs16 + 16 * i + 8), offs);
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
        const __m256i sel =
            _mm256_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1);
        const __m256 f = _mm256_permutevar8x32_ps(fv[h], sel);
        const __m256 s = fsum(dot32(q[k], x + 128 * h + 32 * k));
        if (k % 2)
          acc1 = _mm256_fmadd_ps(s, f, acc1);
        else
          acc0 = _mm256_fmadd_ps(s, f, acc0);
      }
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1)) - 32.0f * hsum(offs);
}

// IQ4_NL / IQ4_XS: the 16 levels + 128 as unsigned bytes, in both 128-bit lanes (a vpshufb table).
inline __m256i iq4_table() {
  alignas(16) int8_t lv[16];
  for (int k = 0; k < 16; ++k) lv[k] = (int8_t)(kIq4nlValues[k] + 128);
  return _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)lv));
}

float row_iq4xs(const BlockIQ4_XS* b, int64_t nb, const int8_t* xq, const float* xd, const float* xs32) {
  const __m256i table = iq4_table();
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m256i nib_shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i pair_shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i m4x = _mm256_set1_epi32(0xF), m2x = _mm256_set1_epi32(3);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, offs = acc0;
  for (int64_t i = 0; i < nb; ++i) {
    prefetch_block(b + i, sizeof(BlockIQ4_XS));
    // ls_s = 4 bits of scales_l (nibble s) | 2 bits of scales_h (bits 2s, 2s + 1) << 4, all 8 at once
    uint32_t sl;
    std::memcpy(&sl, b[i].scales_l, 4);
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), nib_shift), m4x);
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b[i].scales_h), pair_shift), m2x);
    const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    alignas(32) float f[8];  // d * (ls_s - 32) * xd_s
    _mm256_store_ps(f, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d)), _mm256_cvtepi32_ps(ls)),
                                     _mm256_loadu_ps(xd + 8 * i)));
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

float row_q5k(const BlockQ5_K* b, int64_t nb, const int8_t* xq, const float* xd, const float* xs32) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m1 = _mm256_set1_epi8(1);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, mins = acc0;
  for (int64_t i = 0; i < nb; ++i) {
    prefetch_block(b + i, sizeof(BlockQ5_K));
    alignas(32) float f[8];  // d * sc_j * xd_j
    q4k_block_factors(b[i].d, b[i].dmin, b[i].scales, xd + 8 * i, xs32 + 8 * i, f, &mins);
    const __m256i qh = _mm256_loadu_si256((const __m256i*)b[i].qh);
    const int8_t* x = xq + 256 * i;
    for (int g = 0; g < 4; ++g) {
      const __m256i q = _mm256_loadu_si256((const __m256i*)(b[i].qs + 32 * g));
      // the fifth bits: bit 2 g (low half) and 2 g + 1 (high half) of qh[l], moved to bit 4
      const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), m1), 4);
      const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), m1), 4);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), h0);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h1);
      acc0 = _mm256_fmadd_ps(fsum(dot32(lo, x + 64 * g)), _mm256_broadcast_ss(f + 2 * g), acc0);
      acc1 = _mm256_fmadd_ps(fsum(dot32(hi, x + 64 * g + 32)), _mm256_broadcast_ss(f + 2 * g + 1), acc1);
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1)) - hsum(mins);
}

// The 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): per block the 32 codes as unsigned bytes c (element
// j: low nibble of qs[j], element j + 16: high nibble, Q5's fifth bit from qh), w = d * (c - K) (+ m for
// Q4_1 / Q5_1; IQ4_NL: c = level + 128, K = 128). One vpdpbusd per block, then d * xd times its sum, and
// (m - d K) * xd times the block's sum of xq.
template <GgmlType T>
inline __m256i codes32(const uint8_t* blk, const __m256i& table) {
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const uint8_t* qs = blk + (T == GgmlType::Q4_0 || T == GgmlType::IQ4_NL ? 2
                             : T == GgmlType::Q4_1 || T == GgmlType::Q5_0 ? (T == GgmlType::Q4_1 ? 4 : 6)
                                                                          : 8);
  const __m128i v = _mm_loadu_si128((const __m128i*)qs);
  __m256i c = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
  if constexpr (T == GgmlType::IQ4_NL) c = _mm256_shuffle_epi8(table, c);
  if constexpr (T == GgmlType::Q5_0 || T == GgmlType::Q5_1) {
    uint32_t qh;
    std::memcpy(&qh, blk + (T == GgmlType::Q5_0 ? 2 : 4), 4);
    // byte j of the vector: bit j of qh (byte j / 8 of qh broadcast, tested against 1 << (j % 8))
    const __m256i bytes = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)qh),
        _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i on = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    c = _mm256_or_si256(c, _mm256_and_si256(on, _mm256_set1_epi8(0x10)));
  }
  return c;
}

template <GgmlType T, class B>
float row_b32(const B* b, int64_t nb, const int8_t* xq, const float* xd, const float* xs32) {
  const __m256i table = T == GgmlType::IQ4_NL ? iq4_table() : _mm256_setzero_si256();
  constexpr float K = T == GgmlType::Q4_0     ? 8.0f
                      : T == GgmlType::Q5_0   ? 16.0f
                      : T == GgmlType::IQ4_NL ? 128.0f
                                              : 0.0f;
  constexpr bool has_m = T == GgmlType::Q4_1 || T == GgmlType::Q5_1;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  float offs = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    if (i % 4 == 0) prefetch_block(b + i, 4 * sizeof(B));
    const uint8_t* blk = reinterpret_cast<const uint8_t*>(b + i);
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const float dx = _cvtsh_ss(dh) * xd[i];
    float c = -K * dx;  // the constant per unit of the block's sum of xq
    if constexpr (has_m) {
      uint16_t mh;
      std::memcpy(&mh, blk + 2, 2);
      c = _cvtsh_ss(mh) * xd[i];
    }
    offs = std::fma(c, xs32[i], offs);
    const __m256 s = fsum(dot32(codes32<T>(blk, table), xq + 32 * i));
    if (i % 2)
      acc1 = _mm256_fmadd_ps(s, _mm256_set1_ps(dx), acc1);
    else
      acc0 = _mm256_fmadd_ps(s, _mm256_set1_ps(dx), acc0);
  }
  return hsum(_mm256_add_ps(acc0, acc1)) + offs;
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
void matmul_q5k_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  rows<BlockQ5_K>(a, r0, r1,
                  [&](const BlockQ5_K* b, int64_t nb) { return row_q5k(b, nb, a.xq, a.xd, a.xs32); });
}

template <GgmlType T, class B>
void matmul_b32_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t nb = a.cols / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const float s = row_b32<T>((const B*)(a.w + r * a.row_bytes), nb, a.xq, a.xd, a.xs32);
    a.y[r] = a.bias ? s + a.bias[r] : s;
  }
}
template void matmul_b32_int8_vnni<GgmlType::Q4_0, BlockQ4_0>(const MatmulArgs&, int64_t, int64_t);
template void matmul_b32_int8_vnni<GgmlType::Q4_1, BlockQ4_1>(const MatmulArgs&, int64_t, int64_t);
template void matmul_b32_int8_vnni<GgmlType::Q5_0, BlockQ5_0>(const MatmulArgs&, int64_t, int64_t);
template void matmul_b32_int8_vnni<GgmlType::Q5_1, BlockQ5_1>(const MatmulArgs&, int64_t, int64_t);
template void matmul_b32_int8_vnni<GgmlType::IQ4_NL, BlockIQ4_NL>(const MatmulArgs&, int64_t, int64_t);

void matmul_iq4xs_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  rows<BlockIQ4_XS>(a, r0, r1,
                    [&](const BlockIQ4_XS* b, int64_t nb) { return row_iq4xs(b, nb, a.xq, a.xd, a.xs32); });
}

}  // namespace ultra::cpu::detail
