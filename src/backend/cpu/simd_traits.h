// Vector traits of the SIMD kernels: the kernels (matmul_tile.h, matmul_panel.h, matmul_fp8.h,
// matmul_ternary.h, attention_kernel.h) are written once as templates over a traits type V, and each
// *_avx2.cpp / *_avx512.cpp file instantiates them with its own one:
//   simd::Avx2    (__m256, W = 8)   only where __AVX2__ is defined and __AVX512F__ is not (ULTRA_AVX2_ISA)
//   simd::Avx512  (__m512, W = 16)  only where __AVX512F__ is defined (ULTRA_AVX512_ISA)
// so that a kernel instantiated in a file built for AVX2 can never reach an AVX-512 intrinsic. Both live in
// an anonymous namespace: every instantiation over them has internal linkage, so the AVX2 and AVX-512
// copies of a kernel can never be merged by the linker (see cpu_internal.h).
//
// Common members (all always inlined):
//   using F = the float vector; static constexpr int W = floats per vector;
//   zero(), set1(float), load(const float*), load(const uint16_t*) (F16 -> f32), load_bf16(const uint16_t*),
//   fmadd(a, b, c) = a * b + c, add, sub, mul, and_(a, b) (bitwise), store(float*, F), hsum(F) -> float,
//   sum4(a0, a1, a2, a3) -> __m128 (the four vectors' sums);
//   q8_widen(const int8_t*) (W int8 -> W f32), fp8(const uint8_t*) (W E4M3 codes -> 2^-8 x their value);
//   the ternary hooks (matmul_ternary.h): TernaryBits, ternary_masks(bits, word, part), ternary_apply;
//   the packed-panel hooks (matmul_panel.h): RowMask, row_mask(left), load_rows, store_rows, pack blocks.
// Column tails differ in algorithm and stay so: kMaskedTail false (AVX2) means the kernels finish a row's
// last cols % W columns in scalar code after the horizontal sum; true (AVX-512) means one more masked
// vector step (Mask = __mmask16, tail_mask(n), load_mask(m, p), and the loaders' load_mask) before it.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/simd_math.h"

namespace ultra::cpu::detail::simd {
namespace {

#if defined(__AVX512F__)

// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips these
// (false-positive) warnings once the intrinsics are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

struct Avx512 {
  using F = __m512;
  static constexpr int W = 16;
  static constexpr bool kMaskedTail = true;
  using Mask = __mmask16;

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
  static F widen_bf16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static F load_bf16(const uint16_t* p) { return widen_bf16(_mm256_loadu_si256((const __m256i*)p)); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static float hsum(F v) { return _mm512_reduce_add_ps(v); }
  // Each vector's 256-bit halves added, then the AVX2 scheme (hadd pairs, 128-bit halves added).
  static __m128 sum4(F a0, F a1, F a2, F a3) {
    auto half = [](F v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); };
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(half(a0), half(a1)), _mm256_hadd_ps(half(a2), half(a3)));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  }

  // Masked column tails: lanes < n (0 < n < 16); masked-off lanes read as +0.0.
  static Mask tail_mask(int64_t n) { return (Mask)((1u << n) - 1); }
  static F load_mask(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static F load_mask(Mask m, const uint16_t* p) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
  static F load_bf16_mask(Mask m, const uint16_t* p) { return widen_bf16(_mm256_maskz_loadu_epi16(m, p)); }

  // One f16 broadcast to the 16 lanes (vpbroadcastw from memory + vcvtph2ps).
  static F f16_bcast(uint16_t h) { return _mm512_cvtph_ps(_mm256_set1_epi16((short)h)); }
  // 16 int8 -> 16 f32 (exact).
  static F q8_widen(const int8_t* q) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)q)));
  }
  // 16 E4M3 codes -> 16 floats, each 2^-8 times its value (matmul_fp8.h).
  static F fp8_codes(__m128i codes) {
    const __m256i h =
        _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(codes), 7), _mm256_set1_epi16((short)0xBFFF));
    return _mm512_cvtph_ps(h);
  }
  static F fp8(const uint8_t* p) { return fp8_codes(_mm_loadu_si128((const __m128i*)p)); }
  static F fp8_mask(Mask m, const uint8_t* p) { return fp8_codes(_mm_maskz_loadu_epi8(m, p)); }

  // Packed-panel GEMM (matmul_panel.h): aligned panel loads/stores, a broadcast from memory, row masks of a
  // panel's last vector (lanes < left, all for left >= 16), and the 16 x 16 transpose of the packing.
  static F load_aligned(const float* p) { return _mm512_load_ps(p); }
  static void store_aligned(float* p, F v) { _mm512_store_ps(p, v); }
  static F broadcast(const float* p) { return _mm512_set1_ps(*p); }
  using RowMask = __mmask16;
  static RowMask row_mask(int left) { return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1); }
  static F load_rows(const float* p, RowMask m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store_rows(float* p, RowMask m, F v) { _mm512_mask_storeu_ps(p, m, v); }
  // v[i] = row i (16 floats) -> v[j] = column j.
  static void transpose(F* v) {
    __m512 t[16], r[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
      const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
      const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
      r[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
      r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
      r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
      r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 4; ++j) {
        t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
        t[8 * i + j + 4] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
      }
    for (int j = 0; j < 8; ++j) {
      v[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
      v[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
    }
  }

  // Ternary (matmul_ternary.h): a word's 16 trits are one vector (part 0 only). Lane i tests its +1 bit (2i)
  // and its -1 bit (2i + 1) into two masks; the activations are added under the first and subtracted under
  // the second.
  static constexpr int kTernaryParts = 1;
  struct TernaryBits {
    __m512i kp = _mm512_setr_epi32(1 << 0, 1 << 2, 1 << 4, 1 << 6, 1 << 8, 1 << 10, 1 << 12, 1 << 14, 1 << 16,
                                   1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30);
    __m512i km = _mm512_slli_epi32(kp, 1);
  };
  struct TernaryMasks {
    Mask p, m;
  };
  static TernaryMasks ternary_masks(const TernaryBits& b, uint32_t word, int /*part*/) {
    const __m512i wv = _mm512_set1_epi32((int)word);
    return {_mm512_test_epi32_mask(wv, b.kp), _mm512_test_epi32_mask(wv, b.km)};
  }
  static F ternary_apply(F acc, TernaryMasks t, F xv) {
    acc = _mm512_mask_add_ps(acc, t.p, acc, xv);
    return _mm512_mask_sub_ps(acc, t.m, acc, xv);
  }
};

#elif defined(__AVX2__)

struct Avx2 {
  using F = __m256;
  static constexpr int W = 8;
  static constexpr bool kMaskedTail = false;

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F load(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static F load_bf16(const uint16_t* p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
  }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static float hsum(F v) { return hsum256(v); }
  // [a0 a1 a2 a3] lane sums: hadd pairs within 128-bit halves, then the halves added
  static __m128 sum4(F a0, F a1, F a2, F a3) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  }

  // One f16 broadcast to the 8 lanes (vpbroadcastw from memory + vcvtph2ps).
  static F f16_bcast(uint16_t h) { return _mm256_cvtph_ps(_mm_set1_epi16((short)h)); }
  // 8 int8 -> 8 f32 (exact).
  static F q8_widen(const int8_t* q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)q)));
  }
  // 8 E4M3 codes -> 8 floats, each 2^-8 times its value (matmul_fp8.h).
  static F fp8(const uint8_t* p) {
    const __m128i codes = _mm_loadl_epi64((const __m128i*)p);
    const __m128i h =
        _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(codes), 7), _mm_set1_epi16((short)0xBFFF));
    return _mm256_cvtph_ps(h);
  }

  // Packed-panel GEMM (matmul_panel.h): aligned panel loads/stores, a broadcast from memory, row masks of a
  // panel's last vector (lanes < left), and the 8 x 8 transpose of the packing.
  static F load_aligned(const float* p) { return _mm256_load_ps(p); }
  static void store_aligned(float* p, F v) { _mm256_store_ps(p, v); }
  static F broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  using RowMask = __m256i;
  static RowMask row_mask(int left) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), idx);
  }
  static F load_rows(const float* p, RowMask m) { return _mm256_maskload_ps(p, m); }
  static void store_rows(float* p, RowMask m, F v) { _mm256_maskstore_ps(p, m, v); }
  // v[i] = row i (8 floats) -> v[j] = column j.
  static void transpose(F* v) {
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

  // Ternary (matmul_ternary.h): a word's 16 trits are two vectors, part 0 (trits 0..7) and part 1 (8..15).
  // The broadcast word ANDed with the lanes' +1 bits (2i) and -1 bits (2i + 1) and compared gives all-ones
  // masks; acc += x & plus, acc -= x & minus.
  static constexpr int kTernaryParts = 2;
  struct TernaryBits {  // lane i of part 0: bit 2i (+1) and 2i + 1 (-1); part 1: trits 8..15
    __m256i p_lo = _mm256_setr_epi32(1 << 0, 1 << 2, 1 << 4, 1 << 6, 1 << 8, 1 << 10, 1 << 12, 1 << 14);
    __m256i p_hi = _mm256_setr_epi32(1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30);
    __m256i m_lo = _mm256_slli_epi32(p_lo, 1);
    __m256i m_hi = _mm256_slli_epi32(p_hi, 1);
  };
  struct TernaryMasks {
    F p, m;
  };
  static TernaryMasks ternary_masks(const TernaryBits& b, uint32_t word, int part) {
    const __m256i wv = _mm256_set1_epi32((int)word);
    const __m256i kp = part ? b.p_hi : b.p_lo, km = part ? b.m_hi : b.m_lo;
    return {_mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(wv, kp), kp)),
            _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(wv, km), km))};
  }
  static F ternary_apply(F acc, TernaryMasks t, F xv) {
    return _mm256_sub_ps(_mm256_add_ps(acc, _mm256_and_ps(t.p, xv)), _mm256_and_ps(t.m, xv));
  }
};

#endif

}  // namespace
}  // namespace ultra::cpu::detail::simd
