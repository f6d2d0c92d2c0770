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

}  // namespace
}  // namespace ultra::cpu::detail
