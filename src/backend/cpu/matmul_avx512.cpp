// AVX-512 (F, BW, VL, DQ, on top of AVX2+FMA+F16C) matmul kernels, compiled with ULTRA_AVX512_ISA; only
// reached through matmul_kernels() after the run-time check of exactly those features (isa.cpp). The driver
// (matmul_driver.h) is the AVX2 kernels' one; the tiles are wider: R rows x T tokens of accumulators, 16
// floats per step, masked loads for the column tail; Q8_0 weights are dequantised in registers (16 int8
// -> int32 -> f32, times the block's f16 scale: exact in f32) and FMA'd against the f32 activations, like
// the float types (see matmul.cpp).
// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips these
// (false-positive) warnings once the intrinsics are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/matmul_panel_avx512.h"
#include "core/dtype.h"

namespace ultra::cpu::detail {

namespace {

struct LoadF32 {
  static constexpr int kBytes = 4;  // per weight
  static __m512 load(const void* p, int64_t c) { return _mm512_loadu_ps((const float*)p + c); }
  static __m512 load_mask(const void* p, int64_t c, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, (const float*)p + c);
  }
};
struct LoadF16 {
  static constexpr int kBytes = 2;
  static __m512 load(const void* p, int64_t c) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)p + c)));
  }
  static __m512 load_mask(const void* p, int64_t c, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t*)p + c));
  }
};
struct LoadBF16 {
  static constexpr int kBytes = 2;
  static __m512 widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 load(const void* p, int64_t c) {
    return widen(_mm256_loadu_si256((const __m256i*)((const uint16_t*)p + c)));
  }
  static __m512 load_mask(const void* p, int64_t c, __mmask16 m) {
    return widen(_mm256_maskz_loadu_epi16(m, (const uint16_t*)p + c));
  }
};

template <class L, int R, int T>
inline void tile_f(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                   const float* bias) {
  __m512 acc[R][T];
  for (int j = 0; j < R; ++j)
    for (int t = 0; t < T; ++t) acc[j][t] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    __m512 wv[R];
    for (int j = 0; j < R; ++j) wv[j] = L::load(w + j * rb, c);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * cols + c);
      for (int j = 0; j < R; ++j) acc[j][t] = _mm512_fmadd_ps(wv[j], xv, acc[j][t]);
    }
  }
  if (c < cols) {
    const __mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
    __m512 wv[R];
    for (int j = 0; j < R; ++j) wv[j] = L::load_mask(w + j * rb, c, m);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * cols + c);
      for (int j = 0; j < R; ++j) acc[j][t] = _mm512_fmadd_ps(wv[j], xv, acc[j][t]);
    }
  }
  for (int j = 0; j < R; ++j) {
    for (int t = 0; t < T; ++t) {
      const float s = _mm512_reduce_add_ps(acc[j][t]);
      y[t * ldy + j] = bias ? s + bias[j] : s;
    }
  }
}

// Decode: one row at a time, streaming sequentially through memory (several interleaved row streams
// confuse the hardware prefetchers on this CPU: 4-row tiles ran Q8_0 at a sixth of the bandwidth), with four
// accumulators to cover the FMA latency.
// Decode reads each weight once, so the row loops request their lines this far ahead into L1 themselves:
// one core's misses alone reach ~7 GB/s on a Skylake-class Xeon, and with the dequantising work between the
// loads the hardware prefetchers fell behind (Q8_0 decode 60 -> 80 tok/s with 2048 bytes, 110M shape).
constexpr int kDecodePrefetchBytes = 2048;

template <class L>
inline float dot_row_f(const uint8_t* w, const float* x, int64_t cols) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t c = 0;
  for (; c + 64 <= cols; c += 64) {
    const char* pf = (const char*)w + c * L::kBytes + kDecodePrefetchBytes;
    for (int l = 0; l < L::kBytes; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);  // this step's lines, ahead
    a0 = _mm512_fmadd_ps(L::load(w, c), _mm512_loadu_ps(x + c), a0);
    a1 = _mm512_fmadd_ps(L::load(w, c + 16), _mm512_loadu_ps(x + c + 16), a1);
    a2 = _mm512_fmadd_ps(L::load(w, c + 32), _mm512_loadu_ps(x + c + 32), a2);
    a3 = _mm512_fmadd_ps(L::load(w, c + 48), _mm512_loadu_ps(x + c + 48), a3);
  }
  for (; c + 16 <= cols; c += 16) a0 = _mm512_fmadd_ps(L::load(w, c), _mm512_loadu_ps(x + c), a0);
  if (c < cols) {
    const __mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
    a1 = _mm512_fmadd_ps(L::load_mask(w, c, m), _mm512_maskz_loadu_ps(m, x + c), a1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

// ---- Q8_0 (cols % 32 == 0) ----
// Block b of a row, weights 16h .. 16h+15: sign-extended to int32, converted, times the block's scale d
// (exact in f32). Own tile/row loops (rather than a loader for tile_f/dot_row_f) so that the scale is
// converted once per block and the block addresses are plain pointer steps.
inline __m512 q8_scale(const BlockQ8_0& b) {
  return _mm512_set1_ps(_cvtsh_ss(b.d));
}
inline __m512 q8_half(const BlockQ8_0& b, int h, __m512 d) {
  const __m128i q = _mm_loadu_si128((const __m128i*)(b.qs + 16 * h));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
}

// Q8_0 has its own tile/row loops; load() (16 dequantised weights from column c, a multiple of 16) serves the
// panel packing of the prefill GEMM (cols % 32 == 0, so no column tail: load_mask is never reached).
struct LoadQ8 {
  static __m512 load(const void* p, int64_t c) {
    const BlockQ8_0& b = ((const BlockQ8_0*)p)[c / kQ8_0Block];
    return q8_half(b, (int)(c % kQ8_0Block) / 16, q8_scale(b));
  }
  static __m512 load_mask(const void* p, int64_t c, __mmask16) { return load(p, c); }
};

template <int R, int T>
inline void tile_q8(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                    const float* bias) {
  __m512 acc[R][T];
  const BlockQ8_0* wr[R];
  for (int j = 0; j < R; ++j) {
    wr[j] = (const BlockQ8_0*)(w + j * rb);
    for (int t = 0; t < T; ++t) acc[j][t] = _mm512_setzero_ps();
  }
  const int64_t nb = cols / kQ8_0Block;
  for (int64_t b = 0; b < nb; ++b) {
    __m512 d[R];
    for (int j = 0; j < R; ++j) d[j] = q8_scale(wr[j][b]);
    for (int h = 0; h < 2; ++h) {
      __m512 wv[R];
      for (int j = 0; j < R; ++j) wv[j] = q8_half(wr[j][b], h, d[j]);
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_loadu_ps(x + t * cols + b * kQ8_0Block + 16 * h);
        for (int j = 0; j < R; ++j) acc[j][t] = _mm512_fmadd_ps(wv[j], xv, acc[j][t]);
      }
    }
  }
  for (int j = 0; j < R; ++j) {
    for (int t = 0; t < T; ++t) {
      const float s = _mm512_reduce_add_ps(acc[j][t]);
      y[t * ldy + j] = bias ? s + bias[j] : s;
    }
  }
}

// Decode: one sequential stream (as dot_row_f), four blocks per step. Each block's 32 products are summed
// unscaled (16 lanes, one multiply and one FMA) and the sum takes the block's scale in one more FMA: per
// block 2 conversions x 2 + 3 arithmetic instructions and a scale broadcast straight from memory, where
// scaling the weights first (as the tiles do, which reuse them for several tokens) costs 2 multiplies more.
// The rounding differs from the tiles' (each block sum is rounded once more), within the same bound.
inline __m512 q8_raw(const BlockQ8_0& b, int h) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b.qs + 16 * h))));
}
inline __m512 q8_block_sum(const BlockQ8_0& b, const float* x) {  // sum_i q_i x_i over the block, unscaled
  return _mm512_fmadd_ps(q8_raw(b, 1), _mm512_loadu_ps(x + 16),
                         _mm512_mul_ps(q8_raw(b, 0), _mm512_loadu_ps(x)));
}
inline __m512 q8_scale_bcast(const BlockQ8_0& b) {  // vpbroadcastw from memory + vcvtph2ps
  return _mm512_cvtph_ps(_mm256_set1_epi16((short)b.d));
}
inline float dot_row_q8(const uint8_t* w, const float* x, int64_t cols) {
  const BlockQ8_0* b = (const BlockQ8_0*)w;
  const int64_t nb = cols / kQ8_0Block;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    const float* xi = x + i * kQ8_0Block;
    const char* pf = (const char*)(b + i) + kDecodePrefetchBytes;  // 136 bytes a step: 3 lines cover it
    _mm_prefetch(pf, _MM_HINT_T0);
    _mm_prefetch(pf + 64, _MM_HINT_T0);
    _mm_prefetch(pf + 128, _MM_HINT_T0);
    const __m512 s0 = q8_block_sum(b[i], xi), s1 = q8_block_sum(b[i + 1], xi + 32);
    const __m512 s2 = q8_block_sum(b[i + 2], xi + 64), s3 = q8_block_sum(b[i + 3], xi + 96);
    a0 = _mm512_fmadd_ps(s0, q8_scale_bcast(b[i]), a0);
    a1 = _mm512_fmadd_ps(s1, q8_scale_bcast(b[i + 1]), a1);
    a2 = _mm512_fmadd_ps(s2, q8_scale_bcast(b[i + 2]), a2);
    a3 = _mm512_fmadd_ps(s3, q8_scale_bcast(b[i + 3]), a3);
  }
  for (; i < nb; ++i) a0 = _mm512_fmadd_ps(q8_block_sum(b[i], x + i * kQ8_0Block), q8_scale_bcast(b[i]), a0);
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

struct Avx512 {
  using F32 = LoadF32;
  using F16 = LoadF16;
  using BF16 = LoadBF16;
  using Q8 = LoadQ8;
  static constexpr int kR = 4, kT = 4;  // 16 accumulators + 4 weight + 1 activation register of 32
  // Prefill of at least this many tokens: the packed-panel GEMM (matmul_panel_avx512.h).
  static constexpr int kPanelMinTokens = 16;
  static constexpr int kPanelNR = panel::kNR;
  static void pack_x(const float* x, int n_tokens, int64_t cols, int j0, int j1, float* xp) {
    panel::pack_x_all(x, n_tokens, cols, j0, j1, xp);
  }
  template <class L>
  static void gemm(const MatmulArgs& a, int64_t r0, int64_t r1) {
    panel::gemm<L>(a, r0, r1);
  }
  template <class L, int R, int T>
  static void tile_f(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                     const float* bias) {
    detail::tile_f<L, R, T>(w, rb, x, cols, y, ldy, bias);
  }
  template <int R, int T>
  static void tile_q8(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                      const float* bias) {
    detail::tile_q8<R, T>(w, rb, x, cols, y, ldy, bias);
  }
  template <class L>
  static float dot_row_f(const uint8_t* w, const float* x, int64_t cols) {
    return detail::dot_row_f<L>(w, x, cols);
  }
  static float dot_row_q8(const uint8_t* w, const float* x, int64_t cols) {
    return detail::dot_row_q8(w, x, cols);
  }
};

}  // namespace

const MatmulKernels& matmul_kernels_avx512() {
  static constexpr MatmulKernels k =
      driver::kernels<Avx512>("avx512", matmul_fp8_avx512, matmul_ternary_avx512);
  return k;
}

}  // namespace ultra::cpu::detail
