// Prefill of Q4_K, Q5_K, Q6_K, IQ4_XS and the 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) with int8
// activations on AVX512-VNNI: the int8 GEMM of
// matmul_int8_gemm.h (Q8_0's), each type's blocks unpacked into its panels. Compiled with ULTRA_VNNI_ISA;
// called only where cpu_has_avx512_vnni() holds (matmul.cpp, while q8_int8_enabled()).
//
// x comes quantised per 32 columns and packed by pack_x_q8_vnni, as for Q8_0; a weight block's 32-column
// sub-blocks become panel blocks: Q4_K its 4-bit codes (Q5_K: 5-bit) with d * sc and dmin * m per sub-block
// (Scales::Min), Q6_K its 6-bit codes + 96 with d * sc of each 16 columns (Scales::Halves), IQ4_XS its levels
// + 128 with d * (ls - 32) (Scales::Offset128). Per 32 columns, 16 rows and a token: 8 vpdpbusd and 3
// (Offset128), 4 (Min) or 6 (Halves) f32 instructions, against the f32 panel GEMM's 32 FMAs. A panel is
// unpacked once per 128-row x 1024-column block and then serves every token tile. The result is the
// reference's (matmul_kquant_int8_ref: the exact weights times xq * xd, double sums) up to f32 rounding.

// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips these
// (false-positive) warnings once the intrinsics are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/kquant_vnni.h"
#include "backend/cpu/matmul_int8_gemm.h"
#include "core/quants.h"

namespace ultra::cpu::detail {

namespace {

// The super-block sb of the panel's row k (of vector v) as bytes.
inline const uint8_t* block_of(const uint8_t* w, size_t rb, int64_t sb, size_t block_bytes, int row) {
  return w + (size_t)row * rb + sb * block_bytes;
}

// The 8 floats f[j] of each row r < 32 (zero past nr) into panel block j's float at off + r.
template <class F>
inline void scatter_rows(int nr, uint8_t* ps, int64_t pb_bytes, int off, F&& row_values) {
  for (int r = 0; r < kPanelRows; ++r) {
    alignas(32) float f[8] = {};
    if (r < nr) row_values(r, f);
    for (int j = 0; j < 8; ++j) ((float*)(ps + j * pb_bytes + kPanelQuadBytes))[off + r] = f[j];
  }
}

// Rows [0, nr) of Q4_K / Q5_K (B) w, 32-column blocks [b0, b0 + nbk) (whole super-blocks) -> one Scales::Min
// panel; Q5_K's fifth bit of sub-block 2 g + h is bit 2 g + h of qh[l], moved to bit 4.
template <class B>
void pack_q45k(const uint8_t* w, size_t rb, int nr, int64_t b0, int nbk, uint8_t* p) {
  constexpr int64_t kPB = kPanelBlockBytes<Scales::Min>;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m1 = _mm256_set1_epi8(1);
  for (int s = 0; s < nbk / 8; ++s) {
    const int64_t sb = b0 / 8 + s;
    uint8_t* ps = p + 8 * s * kPB;
    for (int v = 0; v < kNV; ++v) {
      const int n = std::clamp(nr - 16 * v, 0, 16);
      for (int g = 0; g < 4; ++g)
        for (int h = 0; h < 2; ++h)  // sub-block 2 g + h: the low (h = 0) or high nibbles of qs[32 g ..]
          transpose_codes(
              [&](int k) {
                if (k >= n) return _mm256_setzero_si256();
                const auto* b = (const B*)block_of(w, rb, sb, sizeof(B), 16 * v + k);
                const __m256i q = _mm256_loadu_si256((const __m256i*)(b->qs + 32 * g));
                const __m256i c = _mm256_and_si256(h ? _mm256_srli_epi16(q, 4) : q, m4);
                if constexpr (std::is_same_v<B, BlockQ4_K>) {
                  return c;
                } else {
                  const __m256i qh = _mm256_loadu_si256((const __m256i*)b->qh);
                  const __m256i bit =
                      _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g + h)), m1);
                  return _mm256_or_si256(c, _mm256_slli_epi16(bit, 4));
                }
              },
              _mm512_setzero_si512(), v, ps + (2 * g + h) * kPB);
    }
    auto scales = [&](int r, float* f, bool mins) {
      const auto* b = (const B*)block_of(w, rb, sb, sizeof(B), r);
      __m256 sc, mn;
      q4k_scales_mins(b->scales, &sc, &mn);
      _mm256_store_ps(f, mins ? _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->dmin)), mn)
                              : _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d)), sc));
    };
    scatter_rows(nr, ps, kPB, 0, [&](int r, float* f) { scales(r, f, false); });
    scatter_rows(nr, ps, kPB, kPanelRows, [&](int r, float* f) { scales(r, f, true); });
  }
}

// Q6_K -> a Scales::Halves panel: 32-column chunk j = 4 h + k of a block is codes q[k] of half h (as
// dequant_block's), its 16-column scales sc[2 j] and sc[2 j + 1].
void pack_q6k(const uint8_t* w, size_t rb, int nr, int64_t b0, int nbk, uint8_t* p) {
  constexpr int64_t kPB = kPanelBlockBytes<Scales::Halves>;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3), k96 = _mm256_set1_epi8(96);
  for (int s = 0; s < nbk / 8; ++s) {
    const int64_t sb = b0 / 8 + s;
    uint8_t* ps = p + 8 * s * kPB;
    for (int v = 0; v < kNV; ++v) {
      const int n = std::clamp(nr - 16 * v, 0, 16);
      for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 4; ++k)
          transpose_codes(
              [&](int i) {
                if (i >= n) return _mm256_setzero_si256();
                const auto* b = (const BlockQ6_K*)block_of(w, rb, sb, sizeof(BlockQ6_K), 16 * v + i);
                const __m256i src = _mm256_loadu_si256((const __m256i*)(b->ql + 64 * h + 32 * (k & 1)));
                const __m256i hb = _mm256_loadu_si256((const __m256i*)(b->qh + 32 * h));
                const __m256i lo =
                    _mm256_and_si256(_mm256_srl_epi16(src, _mm_cvtsi32_si128(4 * (k >> 1))), m4);
                const __m256i hi = _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * k)), m2), 4);
                return _mm256_add_epi8(_mm256_or_si256(lo, hi), k96);
              },
              _mm512_setzero_si512(), v, ps + (4 * h + k) * kPB);
    }
    for (int half = 0; half < 2; ++half)
      scatter_rows(nr, ps, kPB, kPanelRows * half, [&](int r, float* f) {
        const auto* b = (const BlockQ6_K*)block_of(w, rb, sb, sizeof(BlockQ6_K), r);
        // scales 2 j + half for j < 8
        const __m128i sc =
            _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)b->scales),
                             half ? _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0)
                                  : _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0));
        _mm256_store_ps(
            f, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
      });
  }
}

// IQ4_XS -> a Scales::Offset128 panel: sub-block j's levels + 128 (elements 0..15: low nibbles of qs[16 j
// ..], 16..31: high), d * (ls_j - 32).
void pack_iq4xs(const uint8_t* w, size_t rb, int nr, int64_t b0, int nbk, uint8_t* p) {
  constexpr int64_t kPB = kPanelBlockBytes<Scales::Offset128>;
  const __m256i table = iq4_table();
  const __m128i m4 = _mm_set1_epi8(0x0F);
  for (int s = 0; s < nbk / 8; ++s) {
    const int64_t sb = b0 / 8 + s;
    uint8_t* ps = p + 8 * s * kPB;
    for (int v = 0; v < kNV; ++v) {
      const int n = std::clamp(nr - 16 * v, 0, 16);
      for (int j = 0; j < 8; ++j)
        transpose_codes(
            [&](int k) {
              if (k >= n) return _mm256_setzero_si256();
              const auto* b = (const BlockIQ4_XS*)block_of(w, rb, sb, sizeof(BlockIQ4_XS), 16 * v + k);
              const __m128i q = _mm_loadu_si128((const __m128i*)(b->qs + 16 * j));
              return _mm256_shuffle_epi8(
                  table, _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4)));
            },
            _mm512_setzero_si512(), v, ps + j * kPB);
    }
    scatter_rows(nr, ps, kPB, 0, [&](int r, float* f) {
      const auto* b = (const BlockIQ4_XS*)block_of(w, rb, sb, sizeof(BlockIQ4_XS), r);
      _mm256_store_ps(f, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d)), iq4xs_scales(*b)));
    });
  }
}

// The 32-element blocks T (B its struct) -> a panel: Scales::Offset128 (Q4_0, Q5_0, IQ4_NL: codes c - K +
// 128, d_w = d) or Scales::Min (Q4_1, Q5_1: codes c, d_w = d, m_w = -m).
template <GgmlType T, class B>
void pack_b32(const uint8_t* w, size_t rb, int nr, int64_t b0, int nbk, uint8_t* p) {
  constexpr Scales S = b32_has_min<T>() ? Scales::Min : Scales::Offset128;
  constexpr int64_t kPB = kPanelBlockBytes<S>;
  const __m256i table = T == GgmlType::IQ4_NL ? iq4_table() : _mm256_setzero_si256();
  const __m256i add = _mm256_set1_epi8((char)(b32_has_min<T>() ? 0 : 128 - b32_offset<T>()));
  for (int b = 0; b < nbk; ++b) {
    uint8_t* pb = p + b * kPB;
    for (int v = 0; v < kNV; ++v) {
      const int n = std::clamp(nr - 16 * v, 0, 16);
      transpose_codes(
          [&](int k) {
            if (k >= n) return _mm256_setzero_si256();
            return _mm256_add_epi8(codes32<T>(w + (size_t)(16 * v + k) * rb + (b0 + b) * sizeof(B), table),
                                   add);
          },
          _mm512_setzero_si512(), v, pb);
    }
    float* d = (float*)(pb + kPanelQuadBytes);
    for (int r = 0; r < kPanelRows; ++r) {
      const uint8_t* blk = w + (size_t)r * rb + (b0 + b) * sizeof(B);
      uint16_t h[2] = {0, 0};  // d, then Q4_1's / Q5_1's m
      if (r < nr) std::memcpy(h, blk, b32_has_min<T>() ? 4 : 2);
      d[r] = _cvtsh_ss(h[0]);
      if constexpr (S == Scales::Min) d[kPanelRows + r] = -_cvtsh_ss(h[1]);
    }
  }
}

}  // namespace

void matmul_q4k_int8_gemm_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  int8_gemm<Scales::Min>(a, r0, r1, pack_q45k<BlockQ4_K>);
}
void matmul_q5k_int8_gemm_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  int8_gemm<Scales::Min>(a, r0, r1, pack_q45k<BlockQ5_K>);
}
void matmul_q6k_int8_gemm_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  int8_gemm<Scales::Halves>(a, r0, r1, pack_q6k);
}
void matmul_iq4xs_int8_gemm_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  int8_gemm<Scales::Offset128>(a, r0, r1, pack_iq4xs);
}

template <GgmlType T, class B>
void matmul_b32_int8_gemm_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  int8_gemm<b32_has_min<T>() ? Scales::Min : Scales::Offset128>(a, r0, r1, pack_b32<T, B>);
}
template void matmul_b32_int8_gemm_vnni<GgmlType::Q4_0, BlockQ4_0>(const MatmulArgs&, int64_t, int64_t);
template void matmul_b32_int8_gemm_vnni<GgmlType::Q4_1, BlockQ4_1>(const MatmulArgs&, int64_t, int64_t);
template void matmul_b32_int8_gemm_vnni<GgmlType::Q5_0, BlockQ5_0>(const MatmulArgs&, int64_t, int64_t);
template void matmul_b32_int8_gemm_vnni<GgmlType::Q5_1, BlockQ5_1>(const MatmulArgs&, int64_t, int64_t);
template void matmul_b32_int8_gemm_vnni<GgmlType::IQ4_NL, BlockIQ4_NL>(const MatmulArgs&, int64_t, int64_t);

}  // namespace ultra::cpu::detail
