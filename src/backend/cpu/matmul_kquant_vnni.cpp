// Decode of Q4_K, Q5_K, Q6_K, IQ4_XS, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL with int8 activations on AVX512-VNNI
// (the default there, with Q8_0's: cpu_internal.h's q8_int8_enabled()). Compiled with ULTRA_VNNI_ISA; called
// only where cpu_has_avx512_vnni() holds.
//
// x comes quantised per 32 columns as for Q8_0 (quantize_x_q8_*: xq int8, xd f32) with the sums of xq per
// 16 and per 32 columns (MatmulArgs::xs16, xs32). A sub-block's weights are codes c times a scale f plus a
// constant, w = f * (c - k) (Q6_K: k = 32; IQ4_XS: c = level + 128, k = 128) or w = f * c - m (Q4_K), with c
// unsigned bytes: vpdpbusd sums c * xq over 4 columns per lane exactly, and the constant meets the sums of
// xq. The 32-element blocks: per 32 weights one dot-product instruction, a conversion and an FMA, against the
// exact path's ~14 (matmul_blocks.h); the super-block types: per 256 weights four 512-bit dot products, one
// conversion and one FMA (row_q45k, row_q6k, row_iq4xs: x interleaved by prepare_x_interleaved_vnni). The
// result is the reference's (matmul.cpp's range_int8_ref: the exact weights times xq * xd, double sums) up to
// f32 rounding.

// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips these
// (false-positive) warnings once the intrinsics are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/kquant_vnni.h"
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

// The interleaved kernels' finish: lanes 2 j and 2 j + 1 of s (sub-block j's two partial sums) added into
// lane 2 j, lane 2 j + 1 replaced by xsn[2 j + 1] (-sum(xq) over the sub-block), as floats.
inline __m512 pair_sums(__m512i s, const int32_t* xsn) {
  s = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_CDAB));
  return _mm512_cvtepi32_ps(_mm512_mask_loadu_epi32(s, 0xAAAA, xsn));
}

// Q4_K (and Q5_K, whose fifth bits come from qh: bit j of qh[l] for sub-block j) decode with every sub-block
// in each vpdpbusd: dot k (k < 4) multiplies columns 8 k .. 8 k + 7 of all 8
// sub-blocks (qword j of the zmm: sub-block j, the low or high nibbles of qs[32 (j / 2) + 8 k ..]), against x
// permuted to match (prepare_x_interleaved_vnni: xq[64 k + 8 j + c] = x column 32 j + 8 k + c of the
// super-block). The 4 dots accumulate in one int32 vector whose lanes 2 j, 2 j + 1 belong to sub-block j;
// adding each lane pair leaves sub-block j's sum in lane 2 j, and lane 2 j + 1 takes -sum(xq) over sub-block
// j (xsn), so that one conversion and one FMA against [d sc_j xd_j, dmin m_j xd_j] (lanes 2 j, 2 j + 1) take
// the block's codes and its mins at once. Per super-block about 38 vector instructions where row_q5k's loop
// form needs 57.
template <class B>
float row_q45k(const B* b, int64_t nb, const int8_t* xq, const float* xd2, const int32_t* xsn) {
  constexpr bool kQ5 = std::is_same_v<B, BlockQ5_K>;
  const __m512i rot5 = _mm512_setr_epi64(4, 3, 2, 1, 0, 63, 62, 61), m10 = _mm512_set1_epi8(0x10);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i nib_shift = _mm512_setr_epi64(0, 4, 0, 4, 0, 4, 0, 4);
  const __m512i pick[4] = {
      _mm512_setr_epi64(0, 0, 4, 4, 8, 8, 12, 12), _mm512_setr_epi64(1, 1, 5, 5, 9, 9, 13, 13),
      _mm512_setr_epi64(2, 2, 6, 6, 10, 10, 14, 14), _mm512_setr_epi64(3, 3, 7, 7, 11, 11, 15, 15)};
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < nb; ++i) {
    prefetch_block(b + i, sizeof(B));
    // [sc_0, m_0, sc_1, m_1, ...] times [d, dmin, d, dmin, ...] times [xd_0, xd_0, xd_1, xd_1, ...]
    __m256 sc, mn;
    q4k_scales_mins(b[i].scales, &sc, &mn);
    const __m512 scmn = _mm512_permutex2var_ps(
        _mm512_castps256_ps512(sc), _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
        _mm512_castps256_ps512(mn));
    uint32_t ddm;
    std::memcpy(&ddm, &b[i].d, 4);
    const __m512 ddmin = _mm512_cvtph_ps(_mm256_set1_epi32((int)ddm));
    const __m512 f = _mm512_mul_ps(_mm512_mul_ps(scmn, ddmin), _mm512_loadu_ps(xd2 + 16 * i));
    const __m512i q0 = _mm512_loadu_si512(b[i].qs), q1 = _mm512_loadu_si512(b[i].qs + 64);
    const int8_t* x = xq + 256 * i;
    __m512i s = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
      __m512i c =
          _mm512_and_si512(_mm512_srlv_epi64(_mm512_permutex2var_epi64(q0, pick[k], q1), nib_shift), m4);
      if constexpr (kQ5) {  // bit j of qh[8 k ..] (qword k) to bit 4 of qword j: c |= rotl(qh_k, 4 - j) &
                            // 0x10
        int64_t h;
        std::memcpy(&h, b[i].qh + 8 * k, 8);
        c = _mm512_ternarylogic_epi64(c, _mm512_rolv_epi64(_mm512_set1_epi64(h), rot5), m10, 0xF8);
      }
      s = _mm512_dpbusd_epi32(s, c, _mm512_loadu_si512(x + 64 * k));
    }
    acc[i % 2] = _mm512_fmadd_ps(pair_sums(s, xsn + 16 * i), f, acc[i % 2]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
}

// Q6_K decode as row_q4k's: 32-column chunk j = 4 h + m of a block (codes: nibble m / 2 of ql[64 h + 32 (m %
// 2) + l], bits 2 m, 2 m + 1 of qh[32 h + l]) is sub-block j of x; dot k takes columns 8 k .. 8 k + 7 of
// every chunk (one permute and shift each for the ql and qh qwords, the high bits by a rotate into bits 4,
// 5). Dots 0, 1 cover the chunks' first 16 columns (scale sc[2 j]) and 2, 3 the second (sc[2 j + 1]): two
// int32 vectors, each finished as row_q4k's with lane 2 j + 1 at -sum(x_q) over its 16 columns (xsn16)
// against [g, 32 g] (the codes' offset 32), g = d sc xd.
float row_q6k(const BlockQ6_K* b, int64_t nb, const int8_t* xq, const float* xd2, const int32_t* xsn16) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  const __m512i nib_shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
  const __m512i rot = _mm512_setr_epi64(4, 2, 0, 62, 4, 2, 0, 62);  // bits 2 m, 2 m + 1 of each byte to 4, 5
  const __m512i even = _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14);
  const __m512i odd = _mm512_setr_epi32(1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15);
  const __m512 one32 = _mm512_setr_ps(1, 32, 1, 32, 1, 32, 1, 32, 1, 32, 1, 32, 1, 32, 1, 32);
  __m512i pick_l[4], pick_h[4];
  for (int k = 0; k < 4; ++k) {
    pick_l[k] = _mm512_setr_epi64(k, 4 + k, k, 4 + k, 8 + k, 12 + k, 8 + k, 12 + k);
    pick_h[k] = _mm512_setr_epi64(k, k, k, k, 4 + k, 4 + k, 4 + k, 4 + k);
  }
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < nb; ++i) {
    prefetch_block(b + i, sizeof(BlockQ6_K));
    // g_c = d sc_c xd_{c / 2} for the 16 scales c, then [g_2j, 32 g_2j] and [g_2j+1, 32 g_2j+1]
    const __m512 g = _mm512_mul_ps(
        _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b[i].d)),
                      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)b[i].scales)))),
        _mm512_loadu_ps(xd2 + 16 * i));
    const __m512 fa = _mm512_mul_ps(_mm512_permutexvar_ps(even, g), one32);
    const __m512 fb = _mm512_mul_ps(_mm512_permutexvar_ps(odd, g), one32);
    const __m512i l0 = _mm512_loadu_si512(b[i].ql), l1 = _mm512_loadu_si512(b[i].ql + 64);
    const __m512i qh = _mm512_loadu_si512(b[i].qh);
    const int8_t* x = xq + 256 * i;
    __m512i s[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int k = 0; k < 4; ++k) {
      const __m512i lo = _mm512_srlv_epi64(_mm512_permutex2var_epi64(l0, pick_l[k], l1), nib_shift);
      const __m512i hi =
          _mm512_and_si512(_mm512_rolv_epi64(_mm512_permutexvar_epi64(pick_h[k], qh), rot), m30);
      const __m512i c = _mm512_ternarylogic_epi32(lo, m4, hi, 0xEA);  // (lo & m4) | hi
      s[k / 2] = _mm512_dpbusd_epi32(s[k / 2], c, _mm512_loadu_si512(x + 64 * k));
    }
    acc[0] = _mm512_fmadd_ps(pair_sums(s[0], xsn16 + 32 * i), fa, acc[0]);
    acc[1] = _mm512_fmadd_ps(pair_sums(s[1], xsn16 + 32 * i + 16), fb, acc[1]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
}

// IQ4_XS decode as row_q4k's: dot k multiplies columns 8 k .. 8 k + 7 of all 8 sub-blocks (qword j: the low
// nibbles of qs[16 j + 8 (k % 2) ..] for k < 2, the high ones for k >= 2, looked up as levels + 128), with x
// permuted by prepare_x_interleaved_vnni; lane 2 j ends at sum((level + 128) x_q) over sub-block j and lane
// 2 j + 1 at -sum(x_q), against [g_j, 128 g_j], g_j = d (ls_j - 32) xd_j.
float row_iq4xs(const BlockIQ4_XS* b, int64_t nb, const int8_t* xq, const float* xd2, const int32_t* xsn) {
  const __m512i table = _mm512_broadcast_i32x4(_mm256_castsi256_si128(iq4_table()));
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i pick_lo = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14),
                pick_hi = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
  const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512 one128 = _mm512_setr_ps(1, 128, 1, 128, 1, 128, 1, 128, 1, 128, 1, 128, 1, 128, 1, 128);
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < nb; ++i) {
    prefetch_block(b + i, sizeof(BlockIQ4_XS));
    const __m512 g = _mm512_permutexvar_ps(
        dup, _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d)), iq4xs_scales(b[i]))));
    const __m512 f = _mm512_mul_ps(_mm512_mul_ps(g, one128), _mm512_loadu_ps(xd2 + 16 * i));
    const __m512i q0 = _mm512_loadu_si512(b[i].qs), q1 = _mm512_loadu_si512(b[i].qs + 64);
    const __m512i lo = _mm512_permutex2var_epi64(q0, pick_lo, q1),
                  hi = _mm512_permutex2var_epi64(q0, pick_hi, q1);
    const int8_t* x = xq + 256 * i;
    __m512i s = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
      const __m512i src = k % 2 ? hi : lo;
      const __m512i c =
          _mm512_shuffle_epi8(table, _mm512_and_si512(k < 2 ? src : _mm512_srli_epi64(src, 4), m4));
      s = _mm512_dpbusd_epi32(s, c, _mm512_loadu_si512(x + 64 * k));
    }
    acc[i % 2] = _mm512_fmadd_ps(pair_sums(s, xsn + 16 * i), f, acc[i % 2]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
}

// The 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): per block the 32 codes as unsigned bytes c (element
// j: low nibble of qs[j], element j + 16: high nibble, Q5's fifth bit from qh), w = d * (c - K) (+ m for
// Q4_1 / Q5_1; IQ4_NL: c = level + 128, K = 128). One vpdpbusd per block, then d * xd times its sum, and
// (m - d K) * xd times the block's sum of xq.
// Q4_0, Q4_1 and IQ4_NL over whole groups of 8 blocks (256 columns, x interleaved as for the super-block
// types): the 8 blocks are the sub-blocks, their qs gathered as qwords (bytes 0..7 and 8..15 of each block's
// qs), dot k = the low (k < 2) or high nibbles of qword k % 2; [d_j xd_j, K d_j xd_j] (Q4_1: [d_j xd_j, -m_j
// xd_j]) against lane 2 j's sum and lane 2 j + 1's -sum(xq).
template <GgmlType T, class B>
float row_b32i(const B* b, int64_t ng, const int8_t* xq, const float* xd2, const int32_t* xsn) {
  constexpr bool kMin = b32_has_min<T>();
  constexpr int kQs = T == GgmlType::Q4_1 ? 4 : 2;  // offset of qs in the block
  const __m512i table = _mm512_broadcast_i32x4(_mm256_castsi256_si128(iq4_table()));
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i at = _mm512_setr_epi64(0, sizeof(B), 2 * sizeof(B), 3 * sizeof(B), 4 * sizeof(B),
                                       5 * sizeof(B), 6 * sizeof(B), 7 * sizeof(B));
  const __m256i at32 = _mm512_cvtepi64_epi32(at);
  const __m512i even = _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14);
  const float k2 = kMin ? -1.0f : (float)b32_offset<T>();
  const __m512 one_k = _mm512_setr_ps(1, k2, 1, k2, 1, k2, 1, k2, 1, k2, 1, k2, 1, k2, 1, k2);
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t g = 0; g < ng; ++g) {
    const uint8_t* blk = (const uint8_t*)(b + 8 * g);
    prefetch_block(blk, 8 * sizeof(B));
    // the first 4 bytes of each block as halves: [d_j, m_j] (Q4_1) or [d_j, qs bytes]
    const __m512 dm = _mm512_cvtph_ps(_mm256_i32gather_epi32((const int*)blk, at32, 1));
    const __m512 f = _mm512_mul_ps(_mm512_mul_ps(kMin ? dm : _mm512_permutexvar_ps(even, dm), one_k),
                                   _mm512_loadu_ps(xd2 + 16 * g));
    const __m512i lo = _mm512_i64gather_epi64(at, (const long long*)(blk + kQs), 1);
    const __m512i hi = _mm512_i64gather_epi64(at, (const long long*)(blk + kQs + 8), 1);
    const int8_t* x = xq + 256 * g;
    __m512i s = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
      const __m512i src = k % 2 ? hi : lo;
      __m512i c = _mm512_and_si512(k < 2 ? src : _mm512_srli_epi64(src, 4), m4);
      if constexpr (T == GgmlType::IQ4_NL) c = _mm512_shuffle_epi8(table, c);
      s = _mm512_dpbusd_epi32(s, c, _mm512_loadu_si512(x + 64 * k));
    }
    acc[g % 2] = _mm512_fmadd_ps(pair_sums(s, xsn + 16 * g), f, acc[g % 2]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
}

template <GgmlType T, class B>
float row_b32(const B* b, int64_t nb, const int8_t* xq, const float* xd, const float* xs32) {
  const __m256i table = T == GgmlType::IQ4_NL ? iq4_table() : _mm256_setzero_si256();
  constexpr float K = b32_offset<T>();
  constexpr bool has_m = b32_has_min<T>();
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

void prepare_x_interleaved_vnni(int8_t* xq, const float* xd, const float* xs16, const float* xs32,
                                int64_t cols, float* xd2, int32_t* xsn, int32_t* xsn16) {
  for (int64_t i = 0; i < cols / kQK_K; ++i) {
    int8_t* x = xq + kQK_K * i;
    alignas(64) int8_t t[kQK_K];
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 8; ++j) std::memcpy(t + 64 * k + 8 * j, x + 32 * j + 8 * k, 8);
    std::memcpy(x, t, kQK_K);
    for (int j = 0; j < 8; ++j) {
      xd2[16 * i + 2 * j] = xd2[16 * i + 2 * j + 1] = xd[8 * i + j];
      xsn[16 * i + 2 * j] = 0;
      xsn[16 * i + 2 * j + 1] = -(int32_t)xs32[8 * i + j];
      for (int h = 0; h < 2; ++h) {
        xsn16[32 * i + 16 * h + 2 * j] = 0;
        xsn16[32 * i + 16 * h + 2 * j + 1] = -(int32_t)xs16[16 * i + 2 * j + h];
      }
    }
  }
}

void matmul_q4k_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  rows<BlockQ4_K>(a, r0, r1,
                  [&](const BlockQ4_K* b, int64_t nb) { return row_q45k(b, nb, a.xq, a.xd2, a.xsn); });
}
void matmul_q6k_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  rows<BlockQ6_K>(a, r0, r1,
                  [&](const BlockQ6_K* b, int64_t nb) { return row_q6k(b, nb, a.xq, a.xd2, a.xsn16); });
}
void matmul_q5k_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  rows<BlockQ5_K>(a, r0, r1,
                  [&](const BlockQ5_K* b, int64_t nb) { return row_q45k(b, nb, a.xq, a.xd2, a.xsn); });
}

template <GgmlType T, class B>
void matmul_b32_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t nb = a.cols / 32;
  // Q4_0 / Q4_1 / IQ4_NL: whole 256-column groups interleaved (prepare_x_interleaved_vnni), the rest per
  // block
  constexpr bool kGroups = T == GgmlType::Q4_0 || T == GgmlType::Q4_1 || T == GgmlType::IQ4_NL;
  const int64_t ng = kGroups ? a.cols / kQK_K : 0;
  for (int64_t r = r0; r < r1; ++r) {
    const B* b = (const B*)(a.w + r * a.row_bytes);
    float s = row_b32<T>(b + 8 * ng, nb - 8 * ng, a.xq + kQK_K * ng, a.xd + 8 * ng, a.xs32 + 8 * ng);
    if constexpr (kGroups) s += row_b32i<T>(b, ng, a.xq, a.xd2, a.xsn);
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
                    [&](const BlockIQ4_XS* b, int64_t nb) { return row_iq4xs(b, nb, a.xq, a.xd2, a.xsn); });
}

}  // namespace ultra::cpu::detail
