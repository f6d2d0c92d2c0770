// AVX2+FMA+F16C matmul kernels (compiled with ULTRA_AVX2_ISA; reached through matmul_kernels() only after
// the run-time check). The driver (matmul_driver.h) walks the rows and tokens; this file supplies the
// register tiles. See matmul.cpp for the structure and the Q8_0 arithmetic.
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/matmul_panel_avx2.h"
#include "backend/cpu/simd_math.h"
#include "core/dtype.h"

namespace ultra::cpu::detail {

namespace {

// Loaders: 8 weights -> 8 floats, plus a scalar for tails.
struct LoadF32 {
  using E = float;
  static __m256 load8(const E* p) { return _mm256_loadu_ps(p); }
  static float scalar(E v) { return v; }
};
struct LoadF16 {
  using E = uint16_t;
  static __m256 load8(const E* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static float scalar(E v) { return _cvtsh_ss(v); }
};
struct LoadBF16 {
  using E = uint16_t;
  static __m256 load8(const E* p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
  }
  static float scalar(E v) { return bf16_to_fp32(v); }
};
struct LoadQ8 {};  // tag: Q8_0 has its own tile/row loops

// y[t * ldy + j] = W[j, :] . x[t, :] (+ bias[j]) for j < R, t < T.
template <class L, int R, int T>
inline void tile_f(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                   const float* bias) {
  using E = typename L::E;
  __m256 acc[R][T];
  const E* wr[R];
  for (int j = 0; j < R; ++j) {
    wr[j] = (const E*)(w + j * rb);
    for (int t = 0; t < T; ++t) acc[j][t] = _mm256_setzero_ps();
  }
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    __m256 wv[R];
    for (int j = 0; j < R; ++j) wv[j] = L::load8(wr[j] + c);
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * cols + c);
      for (int j = 0; j < R; ++j) acc[j][t] = _mm256_fmadd_ps(wv[j], xv, acc[j][t]);
    }
  }
  for (int j = 0; j < R; ++j) {
    for (int t = 0; t < T; ++t) {
      float s = hsum256(acc[j][t]);
      for (int64_t k = c; k < cols; ++k) s += L::scalar(wr[j][k]) * x[t * cols + k];
      y[t * ldy + j] = bias ? s + bias[j] : s;
    }
  }
}

// Decode: one row, four accumulators to cover the FMA latency.
// Decode reads each weight once; the row loops request their lines this far ahead into L1 (as
// matmul_avx512.cpp's: the hardware prefetchers alone fell behind on a Skylake-class Xeon).
constexpr int kDecodePrefetchBytes = 2048;

template <class L>
inline float dot_row_f(const uint8_t* wb, const float* x, int64_t cols) {
  using E = typename L::E;
  const E* w = (const E*)wb;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    const char* pf = (const char*)(w + c) + kDecodePrefetchBytes;  // this step's 64 or 128 bytes, ahead
    for (size_t l = 0; l < sizeof(E) / 2; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
    a0 = _mm256_fmadd_ps(L::load8(w + c), _mm256_loadu_ps(x + c), a0);
    a1 = _mm256_fmadd_ps(L::load8(w + c + 8), _mm256_loadu_ps(x + c + 8), a1);
    a2 = _mm256_fmadd_ps(L::load8(w + c + 16), _mm256_loadu_ps(x + c + 16), a2);
    a3 = _mm256_fmadd_ps(L::load8(w + c + 24), _mm256_loadu_ps(x + c + 24), a3);
  }
  for (; c + 8 <= cols; c += 8) a0 = _mm256_fmadd_ps(L::load8(w + c), _mm256_loadu_ps(x + c), a0);
  float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; c < cols; ++c) s += L::scalar(w[c]) * x[c];
  return s;
}

// ---- Q8_0 (cols % 32 == 0) ----
// Block b of a row, weights 8k .. 8k+7: sign-extended to int32, converted, times the block's scale d (exact
// in f32). Own tile/row loops (rather than a loader for tile_f/dot_row_f) so that the scale is converted
// once per block and the block addresses are plain pointer steps.
inline __m256 q8_scale(const BlockQ8_0& b) {
  return _mm256_set1_ps(_cvtsh_ss(b.d));
}
inline __m256 q8_part(const BlockQ8_0& b, int k, __m256 d) {
  const __m128i q = _mm_loadl_epi64((const __m128i*)(b.qs + 8 * k));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
}

template <int R, int T>
inline void tile_q8(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                    const float* bias) {
  __m256 acc[R][T];
  const BlockQ8_0* wr[R];
  for (int j = 0; j < R; ++j) {
    wr[j] = (const BlockQ8_0*)(w + j * rb);
    for (int t = 0; t < T; ++t) acc[j][t] = _mm256_setzero_ps();
  }
  const int64_t nb = cols / kQ8_0Block;
  for (int64_t b = 0; b < nb; ++b) {
    __m256 d[R];
    for (int j = 0; j < R; ++j) d[j] = q8_scale(wr[j][b]);
    for (int k = 0; k < 4; ++k) {
      __m256 wv[R];
      for (int j = 0; j < R; ++j) wv[j] = q8_part(wr[j][b], k, d[j]);
      for (int t = 0; t < T; ++t) {
        const __m256 xv = _mm256_loadu_ps(x + t * cols + b * kQ8_0Block + 8 * k);
        for (int j = 0; j < R; ++j) acc[j][t] = _mm256_fmadd_ps(wv[j], xv, acc[j][t]);
      }
    }
  }
  for (int j = 0; j < R; ++j) {
    for (int t = 0; t < T; ++t) {
      const float s = hsum256(acc[j][t]);
      y[t * ldy + j] = bias ? s + bias[j] : s;
    }
  }
}

// Decode: one sequential stream, two blocks per step on four accumulators. Each half block's 16 products are
// summed unscaled (one multiply and one FMA) and take the block's scale in one more FMA: 3 arithmetic
// instructions per 16 weights instead of 4 (scaling the weights first, as the tiles do, which reuse them
// for several tokens). The rounding differs from the tiles' (within the same bound).
inline __m256 q8_raw(const BlockQ8_0& b, int k) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(b.qs + 8 * k))));
}
inline __m256 q8_scale_bcast(const BlockQ8_0& b) {  // vpbroadcastw from memory + vcvtph2ps
  return _mm256_cvtph_ps(_mm_set1_epi16((short)b.d));
}
// A block's 32 products summed unscaled in two halves: u over its 1st and 3rd 8 columns, v over the 2nd
// and 4th (two independent chains).
struct Q8Sums {
  __m256 u, v;
};
inline Q8Sums q8_block_sums(const BlockQ8_0& b, const float* x) {
  return {
      _mm256_fmadd_ps(q8_raw(b, 2), _mm256_loadu_ps(x + 16), _mm256_mul_ps(q8_raw(b, 0), _mm256_loadu_ps(x))),
      _mm256_fmadd_ps(q8_raw(b, 3), _mm256_loadu_ps(x + 24),
                      _mm256_mul_ps(q8_raw(b, 1), _mm256_loadu_ps(x + 8)))};
}
inline float dot_row_q8(const uint8_t* w, const float* x, int64_t cols) {
  const BlockQ8_0* b = (const BlockQ8_0*)w;
  const int64_t nb = cols / kQ8_0Block;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    const float* xi = x + i * kQ8_0Block;
    const char* pf = (const char*)(b + i) + kDecodePrefetchBytes;  // 68 bytes a step: 2 lines cover it
    _mm_prefetch(pf, _MM_HINT_T0);
    _mm_prefetch(pf + 64, _MM_HINT_T0);
    const Q8Sums s0 = q8_block_sums(b[i], xi), s1 = q8_block_sums(b[i + 1], xi + 32);
    const __m256 d0 = q8_scale_bcast(b[i]), d1 = q8_scale_bcast(b[i + 1]);
    a0 = _mm256_fmadd_ps(s0.u, d0, a0);
    a1 = _mm256_fmadd_ps(s0.v, d0, a1);
    a2 = _mm256_fmadd_ps(s1.u, d1, a2);
    a3 = _mm256_fmadd_ps(s1.v, d1, a3);
  }
  if (i < nb) {
    const Q8Sums s0 = q8_block_sums(b[i], x + i * kQ8_0Block);
    const __m256 d0 = q8_scale_bcast(b[i]);
    a0 = _mm256_fmadd_ps(s0.u, d0, a0);
    a1 = _mm256_fmadd_ps(s0.v, d0, a1);
  }
  return hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

// Loaders of the prefill GEMM's panel packing (matmul_panel_avx2.h): 8 f32 from column c of a row, and one.
template <class L>
struct PackF {
  using E = typename L::E;
  static __m256 load8(const uint8_t* row, int64_t c) { return L::load8((const E*)row + c); }
  static float scalar(const uint8_t* row, int64_t c) { return L::scalar(((const E*)row)[c]); }
};
struct PackQ8 {  // cols % 32 == 0: columns come in whole blocks, so scalar() serves no tail in practice
  static __m256 load8(const uint8_t* row, int64_t c) {
    const BlockQ8_0& b = ((const BlockQ8_0*)row)[c / kQ8_0Block];
    return q8_part(b, (int)(c % kQ8_0Block) / 8, q8_scale(b));
  }
  static float scalar(const uint8_t* row, int64_t c) {
    const BlockQ8_0& b = ((const BlockQ8_0*)row)[c / kQ8_0Block];
    return _cvtsh_ss(b.d) * (float)b.qs[c % kQ8_0Block];
  }
};

struct Avx2 {
  using F32 = LoadF32;
  using F16 = LoadF16;
  using BF16 = LoadBF16;
  using Q8 = LoadQ8;
  static constexpr int kR = 2, kT = 4;  // 8 accumulators + 2 weight + 1 activation register of 16
  // Prefill of at least this many tokens: the packed-panel GEMM (matmul_panel_avx2.h).
  static constexpr int kPanelMinTokens = 16;
  static constexpr int kPanelNR = panel::kNR;
  static void pack_x(const float* x, int n_tokens, int64_t cols, int j0, int j1, float* xp) {
    panel::pack_x_all(x, n_tokens, cols, j0, j1, xp);
  }
  template <class L>
  static void gemm(const MatmulArgs& a, int64_t r0, int64_t r1) {
    if constexpr (std::is_same_v<L, LoadQ8>)
      panel::gemm<PackQ8>(a, r0, r1);
    else
      panel::gemm<PackF<L>>(a, r0, r1);
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

const MatmulKernels& matmul_kernels_avx2() {
  static constexpr MatmulKernels k = driver::kernels<Avx2>("avx2", matmul_fp8_avx2, matmul_ternary_avx2);
  return k;
}

}  // namespace ultra::cpu::detail
