// AVX-512 matmul of F8_E4M3 weights (one f32 scale per row), compiled with ULTRA_AVX512_ISA; reached through
// matmul_kernels_avx512() only. The scalar reference is matmul.cpp's ref_rows (weight_at).
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
// The row's scale times the 2^8 the decoding left out.
inline float row_scale(const MatmulArgs& a, int64_t r) {
  return a.scale[r * a.scale_row_stride] * 256.0f;
}

struct Fp8 {
  static constexpr int kR = 4, kT = 4;  // 16 accumulators + 4 weight + 1 activation register of 32

  // Decode: one sequential weight stream, four accumulators for the FMA latency.
  static float dot_row(const MatmulArgs& a, int64_t r) {
    const uint8_t* w = a.w + r * a.row_bytes;  // [cols] codes
    const float* x = a.x;                      // [cols]
    const int64_t cols = a.cols;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t c = 0;
    for (; c + 64 <= cols; c += 64) {
      a0 = _mm512_fmadd_ps(load16(w, c), _mm512_loadu_ps(x + c), a0);
      a1 = _mm512_fmadd_ps(load16(w, c + 16), _mm512_loadu_ps(x + c + 16), a1);
      a2 = _mm512_fmadd_ps(load16(w, c + 32), _mm512_loadu_ps(x + c + 32), a2);
      a3 = _mm512_fmadd_ps(load16(w, c + 48), _mm512_loadu_ps(x + c + 48), a3);
    }
    for (; c + 16 <= cols; c += 16) a0 = _mm512_fmadd_ps(load16(w, c), _mm512_loadu_ps(x + c), a0);
    if (c < cols) {
      const __mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
      a1 = _mm512_fmadd_ps(load16_mask(w, c, m), _mm512_maskz_loadu_ps(m, x + c), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))) *
           row_scale(a, r);
  }

  // Prefill: R rows x T tokens; each weight vector is decoded once and used for T tokens.
  template <int R, int T>
  static void tile(const MatmulArgs& a, int64_t r, int t) {
    const int64_t cols = a.cols;
    const uint8_t* w = a.w + r * a.row_bytes;  // rows r .. r+R-1, a.row_bytes apart
    const float* x = a.x + (int64_t)t * cols;  // [T, cols]
    __m512 acc[R][T];
    for (int j = 0; j < R; ++j)
      for (int i = 0; i < T; ++i) acc[j][i] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      __m512 wv[R];
      for (int j = 0; j < R; ++j) wv[j] = load16(w + j * a.row_bytes, c);
      for (int i = 0; i < T; ++i) {
        const __m512 xv = _mm512_loadu_ps(x + i * cols + c);
        for (int j = 0; j < R; ++j) acc[j][i] = _mm512_fmadd_ps(wv[j], xv, acc[j][i]);
      }
    }
    if (c < cols) {
      const __mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
      __m512 wv[R];
      for (int j = 0; j < R; ++j) wv[j] = load16_mask(w + j * a.row_bytes, c, m);
      for (int i = 0; i < T; ++i) {
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * cols + c);
        for (int j = 0; j < R; ++j) acc[j][i] = _mm512_fmadd_ps(wv[j], xv, acc[j][i]);
      }
    }
    for (int j = 0; j < R; ++j) {
      const float s = row_scale(a, r + j);
      for (int i = 0; i < T; ++i) {
        const float v = _mm512_reduce_add_ps(acc[j][i]) * s;
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
