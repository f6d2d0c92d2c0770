// AVX2+FMA+F16C matmul kernels (compiled with ULTRA_AVX2_ISA; reached through matmul_kernels() only after
// the run-time check). The driver (matmul_driver.h) walks the rows and tokens; this file supplies the
// register tiles (matmul_tile.h, on simd::Avx2). See matmul.cpp for the structure and the Q8_0 arithmetic.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/matmul_panel_avx2.h"
#include "backend/cpu/matmul_tile.h"
#include "backend/cpu/simd_math.h"
#include "backend/cpu/simd_traits.h"
#include "core/dtype.h"

namespace ultra::cpu::detail {

namespace {

// Decode: one sequential stream, two blocks per step on four accumulators. Each half block's 16 products are
// summed unscaled (one multiply and one FMA) and take the block's scale in one more FMA: 3 arithmetic
// instructions per 16 weights instead of 4 (scaling the weights first, as the tiles do, which reuse them
// for several tokens). The rounding differs from the tiles' (within the same bound).
inline __m256 q8_raw(const BlockQ8_0& b, int k) {
  return simd::Avx2::q8_widen(b.qs + 8 * k);
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

// The driver's Isa (matmul_driver.h): the shared tiles and panel GEMM of matmul_tile.h on 8-float vectors,
// this file's decode row of Q8_0. kR = 2: 8 accumulators + 2 weight + 1 activation register of 16.
struct Avx2 : TileIsa<simd::Avx2, 2, panel::KernelAvx2> {
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
