// AVX2 matmul of TERNARY weights (core/ternary.h), compiled with ULTRA_AVX2_ISA; reached through
// matmul_kernels_avx2() only. The scalar reference is matmul.cpp's ref_rows (weight_at).
//
// No multiplies in the inner loop: a word is broadcast, each half (trits 0..7, 8..15) is ANDed with the
// lanes' +1 bits (2i) and -1 bits (2i + 1) and compared, giving all-ones masks; acc += x & plus,
// acc -= x & minus. The scale multiplies each group's sum once.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/simd_math.h"

namespace ultra::cpu::detail {

namespace {

struct Bits {  // lane i of the low half: bit 2i (+1) and 2i + 1 (-1); the high half: trits 8..15
  __m256i p_lo = _mm256_setr_epi32(1 << 0, 1 << 2, 1 << 4, 1 << 6, 1 << 8, 1 << 10, 1 << 12, 1 << 14);
  __m256i p_hi = _mm256_setr_epi32(1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30);
  __m256i m_lo = _mm256_slli_epi32(p_lo, 1);
  __m256i m_hi = _mm256_slli_epi32(p_hi, 1);
};

inline __m256 half_step(__m256 acc, __m256i wv, __m256i kp, __m256i km, __m256 xv) {
  const __m256 p = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(wv, kp), kp));
  const __m256 m = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(wv, km), km));
  return _mm256_sub_ps(_mm256_add_ps(acc, _mm256_and_ps(p, xv)), _mm256_and_ps(m, xv));
}

struct Ternary {
  static constexpr int kR = 2, kT = 4;

  static float dot_row(const MatmulArgs& a, int64_t r) {
    const uint32_t* w = (const uint32_t*)(a.w + r * a.row_bytes);  // [cols / 16] words
    const float* sc = a.scale + r * a.scale_row_stride;            // [cols / scale_group]
    const int64_t G = a.scale_group, nw = G / 16;
    const Bits b;
    __m256 tot = _mm256_setzero_ps();
    for (int64_t g = 0; g < a.cols / G; ++g) {
      const uint32_t* wg = w + g * nw;
      const float* xg = a.x + g * G;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      int64_t k = 0;
      for (; k + 2 <= nw; k += 2) {
        const __m256i w0 = _mm256_set1_epi32((int)wg[k]), w1 = _mm256_set1_epi32((int)wg[k + 1]);
        a0 = half_step(a0, w0, b.p_lo, b.m_lo, _mm256_loadu_ps(xg + 16 * k));
        a1 = half_step(a1, w0, b.p_hi, b.m_hi, _mm256_loadu_ps(xg + 16 * k + 8));
        a2 = half_step(a2, w1, b.p_lo, b.m_lo, _mm256_loadu_ps(xg + 16 * k + 16));
        a3 = half_step(a3, w1, b.p_hi, b.m_hi, _mm256_loadu_ps(xg + 16 * k + 24));
      }
      if (k < nw) {
        const __m256i w0 = _mm256_set1_epi32((int)wg[k]);
        a0 = half_step(a0, w0, b.p_lo, b.m_lo, _mm256_loadu_ps(xg + 16 * k));
        a1 = half_step(a1, w0, b.p_hi, b.m_hi, _mm256_loadu_ps(xg + 16 * k + 8));
      }
      const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
      tot = _mm256_fmadd_ps(_mm256_set1_ps(sc[g]), s, tot);
    }
    return hsum256(tot);
  }

  template <int R, int T>
  static void tile(const MatmulArgs& a, int64_t r, int t) {
    const int64_t cols = a.cols, G = a.scale_group, nw = G / 16;
    const float* x = a.x + (int64_t)t * cols;  // [T, cols]
    const Bits b;
    float tot[R][T] = {};
    for (int64_t g = 0; g < cols / G; ++g) {
      __m256 acc[R][T];
      for (int j = 0; j < R; ++j)
        for (int i = 0; i < T; ++i) acc[j][i] = _mm256_setzero_ps();
      for (int64_t k = g * nw; k < (g + 1) * nw; ++k) {
        for (int h = 0; h < 2; ++h) {
          const __m256i kp = h ? b.p_hi : b.p_lo, km = h ? b.m_hi : b.m_lo;
          for (int j = 0; j < R; ++j) {
            const __m256i wv = _mm256_set1_epi32((int)((const uint32_t*)(a.w + (r + j) * a.row_bytes))[k]);
            const __m256 p = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(wv, kp), kp));
            const __m256 m = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(wv, km), km));
            for (int i = 0; i < T; ++i) {
              const __m256 xv = _mm256_loadu_ps(x + i * cols + 16 * k + 8 * h);
              acc[j][i] = _mm256_sub_ps(_mm256_add_ps(acc[j][i], _mm256_and_ps(p, xv)), _mm256_and_ps(m, xv));
            }
          }
        }
      }
      for (int j = 0; j < R; ++j) {
        const float s = a.scale[(r + j) * a.scale_row_stride + g];
        for (int i = 0; i < T; ++i) tot[j][i] += s * hsum256(acc[j][i]);
      }
    }
    for (int j = 0; j < R; ++j)
      for (int i = 0; i < T; ++i)
        a.y[(t + i) * a.rows + r + j] = a.bias ? tot[j][i] + a.bias[r + j] : tot[j][i];
  }
};

}  // namespace

void matmul_ternary_avx2(const MatmulArgs& a, int64_t r0, int64_t r1) {
  driver::range_scaled<Ternary>(a, r0, r1);
}

}  // namespace ultra::cpu::detail
