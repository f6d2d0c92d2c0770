// AVX-512 matmul of F8_E4M3 weights (an f32 scale per row, or per row and group of columns), compiled with
// ULTRA_AVX512_ISA; reached through matmul_kernels_avx512() only. The scalar reference is matmul.cpp's
// ref_rows (weight_at).
//
// Decoding 16 codes without a table: an E4M3 code shifted into an IEEE half, sign.eeee.mmm ->
// s.0eeee.mmm0000000, is the same value times 2^-8 for normals and subnormals alike (both formats keep the
// mantissa's position relative to the exponent; half's bias 15 = E4M3's 7 + 8), so
//   half = (sign_extend_8_to_16(code) << 7) & 0xBFFF     (bit 15: the sign; bit 14 cleared)
// then vcvtph2ps, and the 2^8 goes into the row scale. Exact for every finite code; the NaN codes (refused
// at load) would read as ±480.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_driver.h"

namespace ultra::cpu::detail {

namespace {

// 16 codes -> 16 floats (each 2^-8 times its E4M3 value).
inline __m512 fp8x16(__m128i codes) {
  const __m256i h =
      _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(codes), 7), _mm256_set1_epi16((short)0xBFFF));
  return _mm512_cvtph_ps(h);
}
inline __m512 load16(const uint8_t* w, int64_t c) {
  return fp8x16(_mm_loadu_si128((const __m128i*)(w + c)));
}
inline __m512 load16_mask(const uint8_t* w, int64_t c, __mmask16 m) {
  return fp8x16(_mm_maskz_loadu_epi8(m, w + c));  // masked-off codes read as 0 -> +0.0
}
// w[0..n) . x[0..n) with the codes decoded as 2^-8 times their value: one sequential weight stream, four
// accumulators for the FMA latency, a masked tail.
inline float dot_span(const uint8_t* w, const float* x, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t c = 0;
  for (; c + 64 <= n; c += 64) {
    a0 = _mm512_fmadd_ps(load16(w, c), _mm512_loadu_ps(x + c), a0);
    a1 = _mm512_fmadd_ps(load16(w, c + 16), _mm512_loadu_ps(x + c + 16), a1);
    a2 = _mm512_fmadd_ps(load16(w, c + 32), _mm512_loadu_ps(x + c + 32), a2);
    a3 = _mm512_fmadd_ps(load16(w, c + 48), _mm512_loadu_ps(x + c + 48), a3);
  }
  for (; c + 16 <= n; c += 16) a0 = _mm512_fmadd_ps(load16(w, c), _mm512_loadu_ps(x + c), a0);
  if (c < n) {
    const __mmask16 m = (__mmask16)((1u << (n - c)) - 1);
    a1 = _mm512_fmadd_ps(load16_mask(w, c, m), _mm512_maskz_loadu_ps(m, x + c), a1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

struct Fp8 {
  static constexpr int kR = 4, kT = 4;  // 16 accumulators + 4 weight + 1 activation register of 32

  // Decode: per scale group (the whole row, or HF block-wise checkpoints' 128 columns), the span's sum
  // times its scale; the 2^8 the decoding left out once at the end.
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

  // Prefill: R rows x T tokens; each weight vector is decoded once and used for T tokens.
  template <int R, int T>
  static void tile(const MatmulArgs& a, int64_t r, int t) {
    const int64_t cols = a.cols, G = std::min(a.scale_group, a.cols);
    const uint8_t* w = a.w + r * a.row_bytes;  // rows r .. r+R-1, a.row_bytes apart
    const float* x = a.x + (int64_t)t * cols;  // [T, cols]
    float tot[R][T] = {};
    for (int64_t g0 = 0; g0 < cols; g0 += G) {
      const int64_t g1 = std::min(g0 + G, cols);
      __m512 acc[R][T];
      for (int j = 0; j < R; ++j)
        for (int i = 0; i < T; ++i) acc[j][i] = _mm512_setzero_ps();
      int64_t c = g0;
      for (; c + 16 <= g1; c += 16) {
        __m512 wv[R];
        for (int j = 0; j < R; ++j) wv[j] = load16(w + j * a.row_bytes, c);
        for (int i = 0; i < T; ++i) {
          const __m512 xv = _mm512_loadu_ps(x + i * cols + c);
          for (int j = 0; j < R; ++j) acc[j][i] = _mm512_fmadd_ps(wv[j], xv, acc[j][i]);
        }
      }
      if (c < g1) {
        const __mmask16 m = (__mmask16)((1u << (g1 - c)) - 1);
        __m512 wv[R];
        for (int j = 0; j < R; ++j) wv[j] = load16_mask(w + j * a.row_bytes, c, m);
        for (int i = 0; i < T; ++i) {
          const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * cols + c);
          for (int j = 0; j < R; ++j) acc[j][i] = _mm512_fmadd_ps(wv[j], xv, acc[j][i]);
        }
      }
      for (int j = 0; j < R; ++j) {
        const float s = a.scale[(r + j) * a.scale_row_stride + g0 / G];
        for (int i = 0; i < T; ++i) tot[j][i] += _mm512_reduce_add_ps(acc[j][i]) * s;
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

void matmul_fp8_avx512(const MatmulArgs& a, int64_t r0, int64_t r1) {
  driver::range_scaled<Fp8>(a, r0, r1);
}

}  // namespace ultra::cpu::detail
