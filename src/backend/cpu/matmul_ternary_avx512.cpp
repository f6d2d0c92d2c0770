// AVX-512 matmul of TERNARY weights (core/ternary.h: 16 trits per u32, scales per row / tensor / group of
// columns), compiled with ULTRA_AVX512_ISA; reached through matmul_kernels_avx512() only. The scalar
// reference is matmul.cpp's ref_rows (weight_at).
//
// No multiplies in the inner loop: a word is broadcast to the 16 lanes, lane i tests its +1 bit (2i) and its
// -1 bit (2i + 1) into two masks, and the activations are added under the first and subtracted under the
// second. The scale multiplies each group's sum once.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_driver.h"

namespace ultra::cpu::detail {

namespace {

inline __m512i plus_bits() {  // lane i: bit 2i
  return _mm512_setr_epi32(1 << 0, 1 << 2, 1 << 4, 1 << 6, 1 << 8, 1 << 10, 1 << 12, 1 << 14, 1 << 16,
                           1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30);
}

// acc += x where the trit is +1, acc -= x where it is -1 (16 lanes = one word).
inline __m512 step(__m512 acc, uint32_t word, __m512 xv, __m512i kp, __m512i km) {
  const __m512i wv = _mm512_set1_epi32((int)word);
  const __mmask16 p = _mm512_test_epi32_mask(wv, kp), m = _mm512_test_epi32_mask(wv, km);
  acc = _mm512_mask_add_ps(acc, p, acc, xv);
  return _mm512_mask_sub_ps(acc, m, acc, xv);
}

struct Ternary {
  static constexpr int kR = 4, kT = 4;

  // Decode: one row, four accumulators (each word's add and sub are dependent), one vector FMA of the scale
  // per group.
  static float dot_row(const MatmulArgs& a, int64_t r) {
    const uint32_t* w = (const uint32_t*)(a.w + r * a.row_bytes);  // [cols / 16] words
    const float* sc = a.scale + r * a.scale_row_stride;            // [cols / scale_group]
    const int64_t G = a.scale_group, nw = G / 16;
    const __m512i kp = plus_bits(), km = _mm512_slli_epi32(kp, 1);
    __m512 tot = _mm512_setzero_ps();
    for (int64_t g = 0; g < a.cols / G; ++g) {
      const uint32_t* wg = w + g * nw;
      const float* xg = a.x + g * G;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      int64_t k = 0;
      for (; k + 4 <= nw; k += 4) {
        a0 = step(a0, wg[k], _mm512_loadu_ps(xg + 16 * k), kp, km);
        a1 = step(a1, wg[k + 1], _mm512_loadu_ps(xg + 16 * k + 16), kp, km);
        a2 = step(a2, wg[k + 2], _mm512_loadu_ps(xg + 16 * k + 32), kp, km);
        a3 = step(a3, wg[k + 3], _mm512_loadu_ps(xg + 16 * k + 48), kp, km);
      }
      for (; k < nw; ++k) a0 = step(a0, wg[k], _mm512_loadu_ps(xg + 16 * k), kp, km);
      const __m512 s = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
      tot = _mm512_fmadd_ps(_mm512_set1_ps(sc[g]), s, tot);
    }
    return _mm512_reduce_add_ps(tot);
  }

  // Prefill: R rows x T tokens; each word's masks are made once and applied to T tokens.
  template <int R, int T>
  static void tile(const MatmulArgs& a, int64_t r, int t) {
    const int64_t cols = a.cols, G = a.scale_group, nw = G / 16;
    const float* x = a.x + (int64_t)t * cols;  // [T, cols]
    const __m512i kp = plus_bits(), km = _mm512_slli_epi32(kp, 1);
    float tot[R][T] = {};
    for (int64_t g = 0; g < cols / G; ++g) {
      __m512 acc[R][T];
      for (int j = 0; j < R; ++j)
        for (int i = 0; i < T; ++i) acc[j][i] = _mm512_setzero_ps();
      for (int64_t k = g * nw; k < (g + 1) * nw; ++k) {
        for (int j = 0; j < R; ++j) {
          const uint32_t word = ((const uint32_t*)(a.w + (r + j) * a.row_bytes))[k];
          const __m512i wv = _mm512_set1_epi32((int)word);
          const __mmask16 p = _mm512_test_epi32_mask(wv, kp), m = _mm512_test_epi32_mask(wv, km);
          for (int i = 0; i < T; ++i) {
            const __m512 xv = _mm512_loadu_ps(x + i * cols + 16 * k);
            acc[j][i] = _mm512_mask_add_ps(acc[j][i], p, acc[j][i], xv);
            acc[j][i] = _mm512_mask_sub_ps(acc[j][i], m, acc[j][i], xv);
          }
        }
      }
      for (int j = 0; j < R; ++j) {
        const float s = a.scale[(r + j) * a.scale_row_stride + g];
        for (int i = 0; i < T; ++i) tot[j][i] += s * _mm512_reduce_add_ps(acc[j][i]);
      }
    }
    for (int j = 0; j < R; ++j)
      for (int i = 0; i < T; ++i)
        a.y[(t + i) * a.rows + r + j] = a.bias ? tot[j][i] + a.bias[r + j] : tot[j][i];
  }
};

}  // namespace

void matmul_ternary_avx512(const MatmulArgs& a, int64_t r0, int64_t r1) {
  driver::range_scaled<Ternary>(a, r0, r1);
}

}  // namespace ultra::cpu::detail
