// Block-scale helpers of the k-quants shared by the int8-activation decode (matmul_kquant_vnni.cpp) and
// prefill (matmul_kquant_gemm_vnni.cpp). Included only by *_vnni.cpp files (internal linkage).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/quants.h"

namespace ultra::cpu::detail {
namespace {

// The 8 scales and 8 mins of a Q4_K / Q5_K block's 12 scale bytes as floats (q4k_scale_min for all j at
// once). As dwords u0, u1, u2 of the bytes: scales 0..3 = u0 & 0x3f.., scales 4..7 = (u2 & 0x0f..) | ((u0 >>
// 6) & 3..) << 4, mins 0..3 = u1 & 0x3f.., mins 4..7 = ((u2 >> 4) & 0x0f..) | ((u1 >> 6) & 3..) << 4, formed
// in one register (reads 16 bytes from q: the block's qs follow its scales). Not through a memory copy: a
// vector load of bytes just written by scalar stores cannot take them from the store buffer and waits for
// them to retire, a stall per block that cost the decode loop half its speed.
inline void q4k_scales_mins(const uint8_t* q, __m256* sc, __m256* mn) {
  const __m128i v = _mm_loadu_si128((const __m128i*)q);
  const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));  // u0, u2, u1, u2
  const __m128i b = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));  // u0, u0, u1, u1
  const __m128i six = _mm_and_si128(a, _mm_set1_epi32(0x3f3f3f3f));
  const __m128i hi2 = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(b, 6), _mm_set1_epi32(0x03030303)), 4);
  const __m128i four =
      _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)), _mm_set1_epi32(0x0f0f0f0f));
  const __m128i r = _mm_blend_epi32(six, _mm_or_si128(four, hi2), 0xA);  // scales 0..7, mins 0..7
  *sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(r));
  *mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(r, 8)));
}

// IQ4_NL / IQ4_XS: the 16 levels + 128 as unsigned bytes, in both 128-bit lanes (a vpshufb table).
inline __m256i iq4_table() {
  alignas(16) int8_t lv[16];
  for (int k = 0; k < 16; ++k) lv[k] = (int8_t)(kIq4nlValues[k] + 128);
  return _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)lv));
}

// An IQ4_XS block's 8 sub-block scales ls_s - 32 as floats: ls_s = 4 bits of scales_l (nibble s) | 2 bits of
// scales_h (bits 2s, 2s + 1) << 4, all 8 at once.
inline __m256 iq4xs_scales(const BlockIQ4_XS& b) {
  const __m256i nib_shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i pair_shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  uint32_t sl;
  std::memcpy(&sl, b.scales_l, 4);
  const __m256i lo =
      _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), nib_shift), _mm256_set1_epi32(0xF));
  const __m256i hi =
      _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b.scales_h), pair_shift), _mm256_set1_epi32(3));
  return _mm256_cvtepi32_ps(
      _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32)));
}

// The 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): w = d * (c - K) with c the unsigned code of
// codes32 (+ m for Q4_1 / Q5_1, whose K is 0; IQ4_NL: c = level + 128, K = 128).
template <GgmlType T>
constexpr int b32_offset() {
  return T == GgmlType::Q4_0 ? 8 : T == GgmlType::Q5_0 ? 16 : T == GgmlType::IQ4_NL ? 128 : 0;
}
template <GgmlType T>
constexpr bool b32_has_min() {
  return T == GgmlType::Q4_1 || T == GgmlType::Q5_1;
}
// A block's 32 codes c as unsigned bytes in column order (element j: low nibble of qs[j], element j + 16:
// high nibble; Q5's fifth bit from qh; IQ4_NL looked up in table, iq4_table()).
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

}  // namespace
}  // namespace ultra::cpu::detail
