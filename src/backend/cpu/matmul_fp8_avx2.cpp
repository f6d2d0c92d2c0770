// AVX2+FMA+F16C matmul of F8_E4M3 weights (an f32 scale per row, or per row and group of columns), compiled
// with ULTRA_AVX2_ISA; reached through matmul_kernels_avx2() only. Codes are decoded by the bit trick of
// matmul_fp8_avx512.cpp (E4M3 -> half = value * 2^-8, then vcvtph2ps), 8 per step; the column tail (cols % 8)
// is scalar. The scalar reference is matmul.cpp's ref_rows (weight_at).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/simd_math.h"
#include "core/fp8.h"

namespace ultra::cpu::detail {

namespace {

// 8 codes at w + c -> 8 floats (each 2^-8 times its E4M3 value).
inline __m256 load8(const uint8_t* w, int64_t c) {
  const __m128i codes = _mm_loadl_epi64((const __m128i*)(w + c));
  const __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(codes), 7), _mm_set1_epi16((short)0xBFFF));
  return _mm256_cvtph_ps(h);
}
// w[0..n) . x[0..n) with the codes decoded as 2^-8 times their value; scalar tail.
inline float dot_span(const uint8_t* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    a0 = _mm256_fmadd_ps(load8(w, c), _mm256_loadu_ps(x + c), a0);
    a1 = _mm256_fmadd_ps(load8(w, c + 8), _mm256_loadu_ps(x + c + 8), a1);
    a2 = _mm256_fmadd_ps(load8(w, c + 16), _mm256_loadu_ps(x + c + 16), a2);
    a3 = _mm256_fmadd_ps(load8(w, c + 24), _mm256_loadu_ps(x + c + 24), a3);
  }
  for (; c + 8 <= n; c += 8) a0 = _mm256_fmadd_ps(load8(w, c), _mm256_loadu_ps(x + c), a0);
  float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; c < n; ++c) s += fp8_e4m3_to_fp32(w[c]) * (1.0f / 256.0f) * x[c];
  return s;
}

struct Fp8 {
  static constexpr int kR = 2, kT = 4;  // 8 accumulators + 2 weight + 1 activation register of 16

  static float dot_row(const MatmulArgs& a, int64_t r) {
    const uint8_t* w = a.w + r * a.row_bytes;            // [cols] codes
    const float* sc = a.scale + r * a.scale_row_stride;  // [ceil(cols / scale_group)]
    const int64_t cols = a.cols, G = a.scale_group;
    if (G >= cols) return dot_span(w, a.x, cols) * (sc[0] * 256.0f);
    float s = 0;
    for (int64_t g0 = 0; g0 < cols; g0 += G)
      s += dot_span(w + g0, a.x + g0, std::min(G, cols - g0)) * sc[g0 / G];
    return s * 256.0f;
  }

  template <int R, int T>
  static void tile(const MatmulArgs& a, int64_t r, int t) {
    const int64_t cols = a.cols, G = std::min(a.scale_group, a.cols);
    const uint8_t* w = a.w + r * a.row_bytes;  // rows r .. r+R-1, a.row_bytes apart
    const float* x = a.x + (int64_t)t * cols;  // [T, cols]
    float tot[R][T] = {};
    for (int64_t g0 = 0; g0 < cols; g0 += G) {
      const int64_t g1 = std::min(g0 + G, cols);
      __m256 acc[R][T];
      for (int j = 0; j < R; ++j)
        for (int i = 0; i < T; ++i) acc[j][i] = _mm256_setzero_ps();
      int64_t c = g0;
      for (; c + 8 <= g1; c += 8) {
        __m256 wv[R];
        for (int j = 0; j < R; ++j) wv[j] = load8(w + j * a.row_bytes, c);
        for (int i = 0; i < T; ++i) {
          const __m256 xv = _mm256_loadu_ps(x + i * cols + c);
          for (int j = 0; j < R; ++j) acc[j][i] = _mm256_fmadd_ps(wv[j], xv, acc[j][i]);
        }
      }
      for (int j = 0; j < R; ++j) {
        const float sc = a.scale[(r + j) * a.scale_row_stride + g0 / G];
        const uint8_t* wj = w + j * a.row_bytes;
        for (int i = 0; i < T; ++i) {
          float s = hsum256(acc[j][i]);
          for (int64_t k = c; k < g1; ++k) s += fp8_e4m3_to_fp32(wj[k]) * (1.0f / 256.0f) * x[i * cols + k];
          tot[j][i] += s * sc;
        }
      }
    }
    for (int j = 0; j < R; ++j) {
      for (int i = 0; i < T; ++i) {
        const float v = tot[j][i] * 256.0f;
        a.y[(t + i) * a.rows + r + j] = a.bias ? v + a.bias[r + j] : v;
      }
    }
  }
};

}  // namespace

void matmul_fp8_avx2(const MatmulArgs& a, int64_t r0, int64_t r1) {
  driver::range_scaled<Fp8>(a, r0, r1);
}

}  // namespace ultra::cpu::detail
